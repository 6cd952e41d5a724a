//! The generated-kernel backend: spec → plan → (jit memo | cache | NVRTC) →
//! launch, all in Rust.
//!
//! Support is the planner's answer: the problem's spec (from
//! [`ProblemKey::spec`]) goes through [`crate::plan::plan`], and a
//! [`crate::PlanError`]'s reason becomes the decline reason. Before that,
//! two capability rows the planner cannot see: no dropout, no arbitrary
//! attn_mask. The target arch follows the device (sm80/86/89 → their spec
//! arch, 9.0 → sm90a); which template serves it (today the sm80 template for
//! both paths) is the planner's business and shows in `explain`.
//!
//! Backward: declined with [`BWD_UNAVAILABLE`] until `launch_bwd` lands.
//! Wiring it in: set `BWD_UNAVAILABLE` to `None`, fill [`GeneratedBackend::call_bwd`]
//! from `launch_bwd::{BwdArgs, check_bwd, launch_bwd}` (the mapping is
//! written out in its doc comment) and return `bwd_workspace_bytes` from
//! [`Backend::workspace_bytes`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use cudarc::driver::{result, sys};

use crate::jit::{CompiledKernel, Jit};
use crate::launch::{self, FwdArgs, FwdParams, FwdProblem, LaunchDims, LaunchError, LoadedKernel};
use crate::plan::plan;
use crate::spec::{AttnSpec, Direction, Layout};

use super::backend::{Backend, BackendKind, Caps, Support, ALL_MASKS};
use super::context::FwdContext;
use super::problem::{ComputeCapability as Cc, ElemType, Problem, ProblemKey};
use super::{BwdCall, DispatchError, FwdCall};

/// The backend's name in policies and logs.
pub const GENERATED: &str = "generated";

/// Why backward declines in this build (`None` once `launch_bwd` is wired in).
pub const BWD_UNAVAILABLE: Option<&str> = Some("backward kernel not available in this build");

/// The rows the planner does not judge. Head dims, masks, layouts and
/// arch-specific limits are left to `plan()` (`head_dims: None`).
pub const GENERATED_CAPS: Caps = Caps {
    fwd: true,
    bwd: true,
    dtypes: &[ElemType::F16, ElemType::Bf16],
    cc: (Cc::new(8, 0), Cc::new(9, 0)),
    head_dims: None,
    layouts: &[Layout::Dense, Layout::Thd],
    masks: ALL_MASKS,
    softcap: true,
    dropout: false,
    attn_mask: false,
    gqa: true,
    deterministic_bwd: true,
    quirks: &[],
};

/// What runs before a launch: the kernel (from the jit memo on the hot path)
/// and the checked parameter block (`None`: empty problem, nothing to launch).
#[derive(Debug, Clone)]
pub struct PreparedFwd {
    pub kernel: Arc<CompiledKernel>,
    pub launch: Option<(FwdParams, LaunchDims)>,
}

type LoadedMap = HashMap<(usize, AttnSpec), Arc<LoadedKernel>>;

/// The generated-kernel backend over one [`Jit`].
pub struct GeneratedBackend {
    /// `None`: [`Jit::global`], opened on the first kernel request (deciding
    /// and explaining never touch the cache).
    jit: Option<&'static Jit>,
    /// Loaded modules by (CUDA context, spec): one driver call on a hit,
    /// instead of `launch::load`'s context and device queries.
    loaded: RwLock<LoadedMap>,
    driver_ready: AtomicBool,
}

impl std::fmt::Debug for GeneratedBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GeneratedBackend")
            .field("loaded", &self.loaded.read().map(|m| m.len()).unwrap_or(0))
            .finish_non_exhaustive()
    }
}

impl GeneratedBackend {
    pub fn new(jit: &'static Jit) -> Self {
        GeneratedBackend {
            jit: Some(jit),
            loaded: RwLock::new(HashMap::new()),
            driver_ready: AtomicBool::new(false),
        }
    }

    /// Over the process-wide [`Jit::global`].
    pub fn global() -> Self {
        GeneratedBackend {
            jit: None,
            loaded: RwLock::new(HashMap::new()),
            driver_ready: AtomicBool::new(false),
        }
    }

    pub fn jit(&self) -> &'static Jit {
        self.jit.unwrap_or_else(Jit::global)
    }

    /// The launch arguments of a call.
    pub fn fwd_args(call: &FwdCall) -> FwdArgs {
        let p = &call.problem;
        FwdArgs {
            q: call.q,
            k: call.k,
            v: call.v,
            o: call.o,
            lse: call.lse,
            problem: FwdProblem {
                batch: p.batch,
                heads_q: p.heads_q,
                heads_kv: p.heads_kv,
                seqlen_q: p.seqlen_q,
                seqlen_k: p.seqlen_k,
                cu_seqlens_q: call.cu_seqlens_q,
                cu_seqlens_k: call.cu_seqlens_k,
                total_q: p.total_q,
                scale: p.scale,
                softcap: p.softcap,
                window: p.window,
            },
        }
    }

    /// The kernel for `spec`: a jit memo hit on the hot path, else the cache
    /// or NVRTC.
    pub fn kernel(&self, spec: &AttnSpec) -> Result<Arc<CompiledKernel>, DispatchError> {
        if let Some(k) = self.jit().memo_get(spec) {
            return Ok(k);
        }
        self.jit().get_or_build(spec).map_err(|e| DispatchError::Build {
            spec: spec.to_string(),
            message: e.to_string(),
        })
    }

    /// Everything before the launch: kernel lookup and `launch::check_fwd`.
    /// Needs no GPU (the hot-path benchmark times it).
    pub fn prepare_fwd(&self, call: &FwdCall, spec: &AttnSpec) -> Result<PreparedFwd, DispatchError> {
        let kernel = self.kernel(spec)?;
        let launch = launch::check_fwd(&kernel.plan, &Self::fwd_args(call))?;
        Ok(PreparedFwd { kernel, launch })
    }

    fn current_context() -> Option<usize> {
        result::ctx::get_current().ok().flatten().map(|c| c as usize)
    }

    /// The loaded module for the current context, if this backend loaded it
    /// before (one driver call).
    fn loaded_hit(&self, kernel: &CompiledKernel) -> Option<Arc<LoadedKernel>> {
        if !self.driver_ready.load(Ordering::Acquire) {
            return None; // the driver may not even be loadable: ask nothing of it
        }
        let ctx = Self::current_context()?;
        self.loaded.read().ok()?.get(&(ctx, kernel.spec)).cloned()
    }

    /// Load into the current context (initializing the driver and checking
    /// the arch, through `launch::load`) and remember it.
    fn load(&self, kernel: &CompiledKernel) -> Result<Arc<LoadedKernel>, LaunchError> {
        let k = launch::load(kernel)?;
        self.driver_ready.store(true, Ordering::Release);
        if let (Some(ctx), Ok(mut m)) = (Self::current_context(), self.loaded.write()) {
            m.insert((ctx, kernel.spec), k.clone());
        }
        Ok(k)
    }
}

impl Backend for GeneratedBackend {
    fn name(&self) -> &'static str {
        GENERATED
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Generated
    }

    fn supports(&self, direction: Direction, key: &ProblemKey) -> Result<Support, String> {
        if direction == Direction::Bwd {
            if let Some(reason) = BWD_UNAVAILABLE {
                return Err(reason.into());
            }
        }
        GENERATED_CAPS.check(key, direction)?;
        let spec = key.spec(direction)?;
        let plan = plan(&spec).map_err(|e| e.reason)?;
        Ok(Support {
            spec: Some(spec),
            note: Some(format!(
                "template {}, block_m={} block_n={}",
                plan.template.file(),
                plan.block_m,
                plan.block_n
            )),
        })
    }

    fn workspace_bytes(&self, _direction: Direction, _problem: &Problem) -> usize {
        0
    }

    fn call_fwd(&self, call: &FwdCall, support: &Support) -> Result<FwdContext, DispatchError> {
        let spec = support.spec.ok_or(DispatchError::DirectionUnsupported {
            backend: GENERATED,
            direction: Direction::Fwd,
        })?;
        let ctx = FwdContext::new(self, call)?;
        let args = Self::fwd_args(call);
        let kernel = match self.jit().memo_get(&spec) {
            Some(k) => k,
            None => {
                // First call: refuse bad arguments before compiling or touching the driver.
                let plan = plan(&spec).map_err(|e| DispatchError::Build {
                    spec: spec.to_string(),
                    message: e.to_string(),
                })?;
                launch::check_fwd(&plan, &args)?;
                self.kernel(&spec)?
            }
        };
        let loaded = match self.loaded_hit(&kernel) {
            Some(l) => l,
            None => {
                launch::check_fwd(&kernel.plan, &args)?;
                self.load(&kernel)?
            }
        };
        // SAFETY: the caller of `Dispatcher::fwd` / `attnforge_fwd` promises
        // device pointers of the current context sized for the shapes and
        // strides given, and a stream of that context; `launch_fwd` checks
        // every argument (`check_fwd`) before it launches.
        unsafe { launch::launch_fwd(&loaded, &args, call.stream as sys::CUstream)? };
        Ok(ctx)
    }

    /// Until `launch_bwd` lands this is unreachable (`supports` declines).
    /// The wiring, for whoever lands it:
    /// `BwdArgs { q, k, v, o, d_o, dq, dk, dv, lse: ctx.lse, problem: <FwdProblem
    /// from ctx.problem, ctx.cu_seqlens_*, ctx.scale, ctx.mask> }`, after
    /// `ctx.for_consumer(self)?` (identity for our own contexts; a
    /// non-identity conversion needs the gather kernel, see docs/dispatch.md),
    /// then `check_bwd` + `launch_bwd` on `call.stream` with `call.workspace`.
    fn call_bwd(&self, _call: &BwdCall, _ctx: &FwdContext, _support: &Support) -> Result<(), DispatchError> {
        Err(DispatchError::DirectionUnsupported {
            backend: GENERATED,
            direction: Direction::Bwd,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Mask;

    fn backend() -> GeneratedBackend {
        GeneratedBackend::global()
    }

    fn key(p: Problem) -> ProblemKey {
        p.key()
    }

    const SM90: Cc = Cc::new(9, 0);

    #[test]
    fn forward_support_is_the_planner_answer() {
        let b = backend();
        let p = Problem::dense(ElemType::Bf16, 128, 2, 16, 4, 1000, 1000, SM90).with_mask(Mask::CausalBottomRight);
        let s = b.supports(Direction::Fwd, &key(p)).unwrap();
        assert_eq!(s.spec.unwrap().to_string(), "fwd.bf16.d128.causal-br.dense.sm90a");
        assert!(s.note.unwrap().contains("fwd_sm80.cu"));
        // The planner's reason, verbatim.
        let e = b.supports(Direction::Fwd, &key(p.with_head_dim_v(100))).unwrap_err();
        let spec = AttnSpec {
            head_dim_v: 100,
            ..s.spec.unwrap()
        };
        assert_eq!(e, plan(&spec).unwrap_err().reason);
        assert!(e.contains("head_dim_v"), "{e}");
        assert!(b
            .supports(Direction::Fwd, &key(p.with_attn_mask()))
            .unwrap_err()
            .contains("arbitrary attn_mask unsupported"));
        assert!(b
            .supports(Direction::Fwd, &key(p.with_dropout(0.1)))
            .unwrap_err()
            .contains("dropout"));
        let mut old = p;
        old.cc = Cc::new(7, 5);
        assert!(b.supports(Direction::Fwd, &key(old)).unwrap_err().contains("sm75"));
    }

    #[test]
    fn backward_declines_until_the_kernel_lands() {
        let p = Problem::dense(ElemType::F16, 64, 1, 4, 4, 64, 64, SM90).with_grad();
        assert_eq!(
            backend().supports(Direction::Bwd, &key(p)).unwrap_err(),
            "backward kernel not available in this build"
        );
    }
}
