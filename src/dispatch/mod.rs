//! The intercept layer's Rust core: choose a backend per direction, run it,
//! and hand a backend-neutral context from the forward to the backward.
//!
//! - [`problem`]: the call descriptor ([`Problem`]) and the decision key ([`ProblemKey`]);
//! - [`backend`]: the [`Backend`] trait, call structs, capability data and [`backend::RULES`];
//! - [`generated`]: our kernels (planner-judged), launched from Rust;
//! - [`direct`]: descriptors of kernels a front end executes (PyTorch flash / cuDNN);
//! - [`heuristics`]: ranking table and the pure decision;
//! - [`policy`]: user policy from the API or `ATTNFORGE_BACKEND_FWD/BWD`, `ATTNFORGE_DEBUG`;
//! - [`context`]: [`FwdContext`], LSE layouts and their conversion.
//!
//! [`Dispatcher`] ties them together: a registry, a policy, and a memo of
//! decisions keyed by [`ProblemKey`], so a problem seen before costs one
//! hash-map lookup. See `docs/dispatch.md`.

pub mod backend;
pub mod context;
pub mod direct;
mod error;
pub mod generated;
pub mod heuristics;
pub mod policy;
pub mod problem;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

pub use backend::{Backend, BackendKind, BiasArg, BwdCall, Caps, FwdCall, Support, Workspace};
pub use context::{FwdContext, LseConversion, LseKind, LseLayout, MaskParams, RngState};
pub use direct::{DirectBackend, TORCH_CUDNN, TORCH_FLASH};
pub use error::{DispatchError, Rejection};
pub use generated::{GeneratedBackend, GENERATED};
pub use heuristics::{Chosen, Decision, DirDecision, Ranked, Verdict};
pub use policy::{GeneratedPath, Policy};
pub use problem::{ComputeCapability, ElemType, Problem, ProblemError, ProblemKey, LONG_KEYS};

use crate::spec::Direction;
use problem::BuildKeyHasher;

/// Where debug lines go.
enum Sink {
    Stderr,
    Capture(Mutex<Vec<String>>),
}

type Memo = HashMap<ProblemKey, Arc<Decision>, BuildKeyHasher>;

/// Registry + policy + decision memo. Thread-safe; the hot path takes one
/// read lock.
pub struct Dispatcher {
    backends: RwLock<Vec<Arc<dyn Backend>>>,
    policy: RwLock<Policy>,
    memo: RwLock<Memo>,
    sink: Sink,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("backends", &self.backend_names())
            .field("policy", &self.policy())
            .finish_non_exhaustive()
    }
}

impl Dispatcher {
    /// No backends yet; debug lines (if `policy.debug`) go to stderr.
    pub fn new(policy: Policy) -> Self {
        Dispatcher {
            backends: RwLock::new(Vec::new()),
            policy: RwLock::new(policy),
            memo: RwLock::new(HashMap::with_hasher(BuildKeyHasher)),
            sink: Sink::Stderr,
        }
    }

    /// Like [`Dispatcher::new`], keeping debug lines for [`Dispatcher::captured_log`].
    pub fn capturing(policy: Policy) -> Self {
        Dispatcher {
            sink: Sink::Capture(Mutex::new(Vec::new())),
            ..Self::new(policy)
        }
    }

    /// With the generated backend (over [`crate::Jit::global`]) registered.
    pub fn with_generated(policy: Policy) -> Self {
        let d = Self::new(policy);
        d.push(Arc::new(GeneratedBackend::global()));
        d
    }

    /// The process-wide dispatcher: policy from the environment, the
    /// generated backend registered; front ends register theirs.
    pub fn global() -> &'static Dispatcher {
        static G: OnceLock<Dispatcher> = OnceLock::new();
        G.get_or_init(|| Dispatcher::with_generated(Policy::from_env()))
    }

    fn push(&self, b: Arc<dyn Backend>) {
        b.apply_policy(&self.policy());
        if let Ok(mut v) = self.backends.write() {
            v.push(b);
        }
    }

    fn clear_memo(&self) {
        if let Ok(mut m) = self.memo.write() {
            m.clear();
        }
    }

    /// Add a backend (decisions are recomputed).
    pub fn register(&self, b: Arc<dyn Backend>) -> Result<(), DispatchError> {
        {
            let mut v = self.backends.write().unwrap_or_else(|e| e.into_inner());
            if v.iter().any(|x| x.name() == b.name()) {
                return Err(DispatchError::DuplicateBackend { name: b.name() });
            }
            b.apply_policy(&self.policy());
            v.push(b);
        }
        self.clear_memo();
        Ok(())
    }

    /// Register PyTorch's flash and cuDNN descriptors (what the torch front end does).
    pub fn register_torch(&self) -> Result<(), DispatchError> {
        self.register(Arc::new(DirectBackend::torch_flash()))?;
        self.register(Arc::new(DirectBackend::torch_cudnn()))
    }

    pub fn backend_names(&self) -> Vec<&'static str> {
        self.backends
            .read()
            .map(|v| v.iter().map(|b| b.name()).collect())
            .unwrap_or_default()
    }

    pub fn backend(&self, name: &str) -> Option<Arc<dyn Backend>> {
        self.backends.read().ok()?.iter().find(|b| b.name() == name).cloned()
    }

    pub fn policy(&self) -> Policy {
        self.policy.read().map(|p| p.clone()).unwrap_or_default()
    }

    /// Replace the policy (decisions are recomputed).
    pub fn set_policy(&self, policy: Policy) {
        if let Ok(v) = self.backends.read() {
            for b in v.iter() {
                b.apply_policy(&policy);
            }
        }
        if let Ok(mut p) = self.policy.write() {
            *p = policy;
        }
        self.clear_memo();
    }

    /// The decision for a key: a memo hit on the hot path; computed, stored
    /// and (with `ATTNFORGE_DEBUG`) logged once otherwise.
    #[inline]
    pub fn decide(&self, key: &ProblemKey) -> Arc<Decision> {
        if let Some(d) = self.memo.read().ok().and_then(|m| m.get(key).cloned()) {
            return d;
        }
        self.decide_slow(key)
    }

    #[cold]
    fn decide_slow(&self, key: &ProblemKey) -> Arc<Decision> {
        let policy = self.policy();
        let backends: Vec<Arc<dyn Backend>> = self.backends.read().map(|v| v.clone()).unwrap_or_default();
        let fresh = Arc::new(heuristics::decide(key, &backends, &policy));
        let Ok(mut memo) = self.memo.write() else {
            return fresh;
        };
        if let Some(d) = memo.get(key) {
            return d.clone(); // another thread decided (and logged) first
        }
        memo.insert(*key, fresh.clone());
        drop(memo);
        if policy.debug {
            self.log(format!("attnforge: dispatch {}", fresh.summary()));
        }
        fresh
    }

    fn log(&self, line: String) {
        match &self.sink {
            Sink::Stderr => eprintln!("{line}"),
            Sink::Capture(v) => {
                if let Ok(mut v) = v.lock() {
                    v.push(line);
                }
            }
        }
    }

    /// Debug lines kept by a [`Dispatcher::capturing`] dispatcher.
    pub fn captured_log(&self) -> Vec<String> {
        match &self.sink {
            Sink::Capture(v) => v.lock().map(|v| v.clone()).unwrap_or_default(),
            Sink::Stderr => Vec::new(),
        }
    }

    /// Decisions in the memo.
    pub fn memo_len(&self) -> usize {
        self.memo.read().map(|m| m.len()).unwrap_or(0)
    }

    /// Validate a problem and decide it.
    pub fn decide_problem(&self, problem: &Problem) -> Result<Arc<Decision>, DispatchError> {
        problem.validate()?;
        Ok(self.decide(&problem.key()))
    }

    /// Run the forward on the chosen backend. Direct backends answer
    /// [`DispatchError::ExecutedByFrontEnd`]: the front end runs them (and
    /// builds the context with [`FwdContext::new`]).
    pub fn fwd(&self, call: &FwdCall) -> Result<FwdContext, DispatchError> {
        let d = self.decide_problem(&call.problem)?;
        let c = d.fwd.chosen()?;
        c.backend.call_fwd(call, &c.support)
    }

    /// The backward backend for a context, and the LSE conversion it needs.
    pub fn bwd_route(&self, ctx: &FwdContext) -> Result<(Chosen, LseConversion), DispatchError> {
        let d = self.decide_problem(&ctx.problem)?;
        let c = d.bwd.chosen()?.clone();
        let conv = ctx.for_consumer(c.backend.as_ref())?;
        Ok((c, conv))
    }

    /// Run the backward on the chosen backend with a forward's context.
    pub fn bwd(&self, call: &BwdCall, ctx: &FwdContext) -> Result<(), DispatchError> {
        let (c, conv) = self.bwd_route(ctx)?;
        if conv.needs_device_work() && c.backend.kind() != BackendKind::FrontEnd {
            return Err(DispatchError::Context(context::ContextError::Incompatible {
                from: conv.from.to_string(),
                to: conv.to.to_string(),
                reason: "the device gather kernel for LSE conversion is not written yet".into(),
            }));
        }
        c.backend.call_bwd(call, ctx, &c.support)
    }

    /// Explain the decision for a problem (what `attnforge explain` prints).
    pub fn explain(&self, problem: &Problem) -> Result<String, DispatchError> {
        let d = self.decide_problem(problem)?;
        Ok(format!("problem   {problem}\n{}", d.explain()))
    }

    /// The chosen backend name for one direction (convenience for front ends).
    pub fn chosen_name(&self, problem: &Problem, direction: Direction) -> Result<&'static str, DispatchError> {
        let d = self.decide_problem(problem)?;
        let side = match direction {
            Direction::Fwd => &d.fwd,
            Direction::Bwd => &d.bwd,
        };
        Ok(side.chosen()?.name())
    }
}

#[cfg(test)]
mod tests;
