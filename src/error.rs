//! Typed errors, one enum per pipeline stage, and [`Error`](enum@Error) that wraps them.

use thiserror::Error;

/// A spec string or spec value that is not valid.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SpecError {
    #[error("invalid {field} `{value}`: allowed values are {allowed}")]
    InvalidValue {
        field: &'static str,
        value: String,
        allowed: String,
    },
    #[error("cannot parse spec `{input}`: {reason}")]
    Syntax { input: String, reason: String },
    #[error("inconsistent spec: {reason}")]
    Inconsistent { reason: String },
}

/// The planner has no kernel for a valid spec (yet): the reason says which
/// feature is missing, so callers can route the problem elsewhere.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("no generated kernel for `{spec}`: {reason}")]
pub struct PlanError {
    pub spec: String,
    pub reason: String,
}

/// Rendering a template failed (a bug in a template, never user input).
#[derive(Debug, Error)]
#[error("rendering template `{template}` failed: {message}")]
pub struct RenderError {
    pub template: String,
    pub message: String,
}

/// Any error of the pipeline.
#[derive(Debug, Error)]
pub enum Error {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Render(#[from] RenderError),
    #[error(transparent)]
    Compile(#[from] crate::compile::CompileError),
    #[error(transparent)]
    Cache(#[from] attnforge_cache::CacheError),
    #[error(transparent)]
    Launch(#[from] crate::launch::LaunchError),
    /// An sm90a forward whose compiled entry has fewer registers per thread
    /// than its plan's `setmaxnreg` split of the block's register file
    /// assumes: its consumers' `setmaxnreg.inc` would wait forever on the GPU.
    #[error(
        "{entry}: ptxas gave {got} registers per thread where the plan's setmaxnreg split needs {need} at launch \
         (the consumer warpgroups would wait forever); refused"
    )]
    RegisterBudget { entry: String, got: u32, need: u32 },
    #[error("{0}")]
    Other(String),
}
