//! Typed errors of the dispatch layer.

use thiserror::Error;

use crate::launch::LaunchError;
use crate::spec::Direction;

use super::context::ContextError;
use super::problem::ProblemError;

/// One backend's decline: (backend, reason).
pub type Rejection = (&'static str, String);

fn list(reasons: &[Rejection]) -> String {
    if reasons.is_empty() {
        return "no backend is registered".into();
    }
    reasons
        .iter()
        .map(|(b, r)| format!("{b}: {r}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Anything the dispatcher refuses or a backend fails at.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum DispatchError {
    #[error(transparent)]
    Problem(#[from] ProblemError),
    #[error("no {direction} backend supports this problem ({})", list(.reasons))]
    NoBackend {
        direction: Direction,
        reasons: Vec<Rejection>,
    },
    #[error("{origin}={policy}: every backend named declines this {direction} problem ({})", list(.reasons))]
    PolicyDeclined {
        direction: Direction,
        origin: String,
        policy: String,
        reasons: Vec<Rejection>,
    },
    #[error("{origin} names unknown backend `{name}` (registered: {})", .known.join(", "))]
    UnknownBackend {
        origin: String,
        name: String,
        known: Vec<&'static str>,
    },
    #[error("backend `{name}` is already registered")]
    DuplicateBackend { name: &'static str },
    #[error("`{backend}` was chosen for {direction}; it is executed by the front end, not by the Rust core")]
    ExecutedByFrontEnd {
        backend: &'static str,
        direction: Direction,
    },
    #[error("`{backend}` does not implement {direction}")]
    DirectionUnsupported {
        backend: &'static str,
        direction: Direction,
    },
    #[error("context from the forward cannot be used: {0}")]
    Context(#[from] ContextError),
    #[error("building the kernel for `{spec}` failed: {message}")]
    Build { spec: String, message: String },
    #[error(transparent)]
    Launch(#[from] LaunchError),
}
