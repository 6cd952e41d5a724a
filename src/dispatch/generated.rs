//! The generated-kernel backend: spec → plan → (jit memo | cache | NVRTC) →
//! launch, all in Rust.
//!
//! Support is the planner's answer: the problem's spec (from
//! [`ProblemKey::spec`]) goes through [`crate::plan::plan_or_main`] for the
//! policy's variant, and a [`crate::PlanError`]'s reason becomes the decline
//! reason. Before that, two capability rows the planner cannot see: no
//! dropout, no arbitrary attn_mask. The target arch follows the device
//! (sm80/86/89 → their spec arch, 9.0 → sm90a); which template serves it (on
//! Hopper the wgmma templates where the planner takes them, else the sm80
//! instruction path) is the planner's business and shows in `explain`.
//!
//! The policy's [`GeneratedPath`] (`ATTNFORGE_GENERATED_PATH=sm80`) makes
//! every kernel of this backend the spec's [`Variant::Sm80Path`] (the sm80
//! instruction path on Hopper too); an invalid value declines every problem
//! with the reason.
//!
//! Backward: `launch_bwd` on a forward context from any backend whose LSE
//! layout matches ours (every dense context; packed THD). The scratch memory
//! is one caller-allocated workspace ([`GeneratedBackend::bwd_workspace`]):
//! `Dsum` (f32, LSE-sized) cut from its front, 16-byte aligned, then the
//! kernel's own workspace (`launch_bwd::bwd_workspace_bytes`: the f32 dQ
//! accumulator in fast mode, nothing in deterministic mode).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use cudarc::driver::{result, sys};

use crate::jit::{CompiledKernel, Jit};
use crate::launch::{self, FwdArgs, FwdParams, FwdProblem, LaunchDims, LaunchError, LoadedKernel};
use crate::launch_bwd::{self, BwdArgs, WORKSPACE_ALIGN};
use crate::plan::{plan_or_main, KernelPlan, Variant};
use crate::spec::{AttnSpec, Direction, Layout};

use super::backend::{Backend, BackendKind, Caps, Support, ALL_MASKS};
use super::context::{ContextError, FwdContext, LseKind, LseLayout};
use super::policy::{GeneratedPath, Policy};
use super::problem::{ComputeCapability as Cc, ElemType, Problem, ProblemKey};
use super::{BwdCall, DispatchError, FwdCall};

/// The backend's name in policies and logs.
pub const GENERATED: &str = "generated";

/// Why backward declines in this build (`None`: `launch_bwd` is wired in).
pub const BWD_UNAVAILABLE: Option<&str> = None;

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

/// How a backward's one workspace is split: `Dsum` (f32, LSE-sized) at
/// offset 0, rounded up to 16 bytes, then the kernel's own scratch
/// (`launch_bwd::bwd_workspace_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BwdWorkspace {
    pub dsum_bytes: u64,
    pub kernel_bytes: u64,
}

impl BwdWorkspace {
    /// The split for `plan` (a backward plan) and a problem whose LSE has
    /// `lse_len` elements.
    pub fn new(plan: &KernelPlan, problem: &FwdProblem, lse_len: usize) -> Self {
        BwdWorkspace {
            dsum_bytes: (4 * lse_len as u64).next_multiple_of(WORKSPACE_ALIGN),
            kernel_bytes: launch_bwd::bwd_workspace_bytes(plan, problem),
        }
    }

    pub fn total(&self) -> u64 {
        self.dsum_bytes + self.kernel_bytes
    }
}

type LoadedMap = HashMap<(usize, AttnSpec, Variant), Arc<LoadedKernel>>;

/// The generated-kernel backend over one [`Jit`].
pub struct GeneratedBackend {
    /// `None`: [`Jit::global`], opened on the first kernel request (deciding
    /// and explaining never touch the cache).
    jit: Option<&'static Jit>,
    /// Loaded modules by (CUDA context, spec, variant): one driver call on a hit,
    /// instead of `launch::load`'s context and device queries.
    loaded: RwLock<LoadedMap>,
    driver_ready: AtomicBool,
    /// From the dispatcher's policy ([`Backend::apply_policy`]).
    path: RwLock<GeneratedPath>,
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
            path: RwLock::new(GeneratedPath::Planner),
        }
    }

    /// Over the process-wide [`Jit::global`].
    pub fn global() -> Self {
        GeneratedBackend {
            jit: None,
            loaded: RwLock::new(HashMap::new()),
            driver_ready: AtomicBool::new(false),
            path: RwLock::new(GeneratedPath::Planner),
        }
    }

    pub fn jit(&self) -> &'static Jit {
        self.jit.unwrap_or_else(Jit::global)
    }

    /// The instruction path this backend's kernels take (the policy's).
    pub fn path(&self) -> GeneratedPath {
        self.path.read().map(|p| p.clone()).unwrap_or_default()
    }

    /// The variant of a backward this backend runs.
    pub fn bwd_variant(&self) -> Variant {
        Self::bwd_variant_on(&self.path())
    }

    /// The variant of a backward on `path` (pure), which is also the
    /// forward's before the per-call choice by keys' length.
    pub fn bwd_variant_on(path: &GeneratedPath) -> Variant {
        if *path == GeneratedPath::Sm80 {
            Variant::Sm80Path
        } else {
            Variant::Main
        }
    }

    fn plan_error(spec: &AttnSpec, e: crate::PlanError) -> DispatchError {
        DispatchError::Build {
            spec: spec.to_string(),
            message: e.to_string(),
        }
    }

    /// The launch arguments of a call.
    pub fn fwd_args(call: &FwdCall) -> FwdArgs {
        let p = &call.problem;
        FwdArgs {
            q: call.q,
            k: call.k,
            v: call.v,
            o: call.o,
            lse: (call.lse != 0).then_some(call.lse),
            problem: FwdProblem {
                batch: p.batch,
                heads_q: p.heads_q,
                heads_kv: p.heads_kv,
                seqlen_q: p.seqlen_q,
                seqlen_k: p.seqlen_k,
                cu_seqlens_q: call.cu_seqlens_q,
                cu_seqlens_k: call.cu_seqlens_k,
                total_q: p.total_q,
                total_k: p.total_k,
                scale: p.scale,
                softcap: p.softcap,
                window: p.window,
            },
        }
    }

    /// The run-time problem of a backward, from the forward's context (its
    /// resolved scale and mask parameters, its `cu_seqlens`).
    pub fn bwd_problem(ctx: &FwdContext) -> FwdProblem {
        let p = &ctx.problem;
        FwdProblem {
            batch: p.batch,
            heads_q: p.heads_q,
            heads_kv: p.heads_kv,
            seqlen_q: p.seqlen_q,
            seqlen_k: p.seqlen_k,
            cu_seqlens_q: ctx.cu_seqlens_q,
            cu_seqlens_k: ctx.cu_seqlens_k,
            total_q: p.total_q,
            total_k: p.total_k,
            scale: Some(ctx.scale),
            softcap: ctx.mask.softcap,
            window: ctx.mask.window,
        }
    }

    /// The plan of `spec`'s `variant`: from the jit memo when compiled, else
    /// planned (pure).
    fn plan_of(&self, spec: &AttnSpec, variant: Variant) -> Result<KernelPlan, DispatchError> {
        if let Some(k) = self.jit().memo_get_variant(spec, variant) {
            return Ok(k.plan.clone());
        }
        plan_or_main(spec, variant).map_err(|e| Self::plan_error(spec, e))
    }

    /// The workspace split of a backward of `p` (no GPU, no compile).
    pub fn bwd_workspace(&self, p: &Problem) -> Result<BwdWorkspace, DispatchError> {
        let spec = p
            .key()
            .spec(Direction::Bwd)
            .map_err(|reason| DispatchError::NoBackend {
                direction: Direction::Bwd,
                reasons: vec![(GENERATED, reason)],
            })?;
        let plan = self.plan_of(&spec, self.bwd_variant())?;
        let lse_len = LseLayout::for_problem(LseKind::natural(p.layout), p).map_or(0, |l| l.len());
        let fp = FwdProblem {
            batch: p.batch,
            heads_q: p.heads_q,
            seqlen_q: p.seqlen_q,
            total_q: p.total_q,
            ..Default::default()
        };
        Ok(BwdWorkspace::new(&plan, &fp, lse_len))
    }

    /// The launch arguments of a backward and the kernel's part of the
    /// workspace (pointer, bytes), after checking the caller's workspace
    /// against the split.
    pub fn bwd_args(call: &BwdCall, ctx: &FwdContext, plan: &KernelPlan) -> Result<(BwdArgs, u64, u64), DispatchError> {
        let problem = Self::bwd_problem(ctx);
        let split = BwdWorkspace::new(plan, &problem, ctx.lse_layout.len());
        let ws = call.workspace;
        let bad = |reason: String| {
            DispatchError::Launch(LaunchError::InvalidArgument {
                arg: "workspace",
                reason,
            })
        };
        if ws.ptr == 0 || !ws.ptr.is_multiple_of(WORKSPACE_ALIGN) {
            return Err(bad(format!(
                "must be non-null and {WORKSPACE_ALIGN}-byte aligned ({} bytes needed: {} for Dsum, {} for the kernel)",
                split.total(),
                split.dsum_bytes,
                split.kernel_bytes
            )));
        }
        if (ws.bytes as u64) < split.total() {
            return Err(bad(format!(
                "{} bytes given, {} needed ({} for Dsum, {} for the kernel; see Backend::workspace_bytes)",
                ws.bytes,
                split.total(),
                split.dsum_bytes,
                split.kernel_bytes
            )));
        }
        let args = BwdArgs {
            q: call.q,
            k: call.k,
            v: call.v,
            o: call.o,
            d_o: call.d_o,
            lse: ctx.lse,
            dsum: ws.ptr,
            dq: call.dq,
            dk: call.dk,
            dv: call.dv,
            problem,
        };
        Ok((args, ws.ptr + split.dsum_bytes, ws.bytes as u64 - split.dsum_bytes))
    }

    /// The kernel for `spec`: a jit memo hit on the hot path, else the cache
    /// or NVRTC.
    pub fn kernel(&self, spec: &AttnSpec) -> Result<Arc<CompiledKernel>, DispatchError> {
        self.kernel_variant(spec, Variant::Main)
    }

    /// One variant of the kernel for `spec` (its main kernel where the spec
    /// has no such variant).
    pub fn kernel_variant(&self, spec: &AttnSpec, variant: Variant) -> Result<Arc<CompiledKernel>, DispatchError> {
        if let Some(k) = self.jit().memo_get_variant(spec, variant) {
            return Ok(k);
        }
        self.jit()
            .get_or_build_variant(spec, variant)
            .map_err(|e| DispatchError::Build {
                spec: spec.to_string(),
                message: e.to_string(),
            })
    }

    /// The variant of `spec`'s forward that a call of these shapes takes:
    /// [`Variant::Sm80Path`] on the policy's sm80 path, else
    /// [`Variant::for_keys`] (by the keys' length).
    pub fn fwd_variant(&self, call: &FwdCall, spec: &AttnSpec) -> Variant {
        Self::fwd_variant_on(&self.path(), call, spec)
    }

    /// [`GeneratedBackend::fwd_variant`] on `path` (pure; front ends that
    /// hold the backend as a `dyn Backend` ask it with the dispatcher's policy).
    pub fn fwd_variant_on(path: &GeneratedPath, call: &FwdCall, spec: &AttnSpec) -> Variant {
        match Self::bwd_variant_on(path) {
            Variant::Main => Variant::for_keys(spec, call.problem.seqlen_k),
            forced => forced,
        }
    }

    /// Everything before the launch: kernel lookup and `launch::check_fwd`.
    /// Needs no GPU (the hot-path benchmark times it).
    pub fn prepare_fwd(&self, call: &FwdCall, spec: &AttnSpec) -> Result<PreparedFwd, DispatchError> {
        let kernel = self.kernel_variant(spec, self.fwd_variant(call, spec))?;
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
        self.loaded
            .read()
            .ok()?
            .get(&(ctx, kernel.spec, kernel.variant))
            .cloned()
    }

    /// Load into the current context (initializing the driver and checking
    /// the arch, through `launch::load`) and remember it.
    fn load(&self, kernel: &CompiledKernel) -> Result<Arc<LoadedKernel>, LaunchError> {
        let k = launch::load(kernel)?;
        self.driver_ready.store(true, Ordering::Release);
        if let (Some(ctx), Ok(mut m)) = (Self::current_context(), self.loaded.write()) {
            m.insert((ctx, kernel.spec, kernel.variant), k.clone());
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

    fn apply_policy(&self, policy: &Policy) {
        if let Ok(mut p) = self.path.write() {
            *p = policy.generated_path.clone();
        }
    }

    fn supports(&self, direction: Direction, key: &ProblemKey) -> Result<Support, String> {
        if direction == Direction::Bwd {
            if let Some(reason) = BWD_UNAVAILABLE {
                return Err(reason.into());
            }
        }
        let path = self.path();
        if let GeneratedPath::Invalid(v) = &path {
            return Err(format!(
                "ATTNFORGE_GENERATED_PATH / the policy's generated path is `{v}`: not `planner` or `sm80`"
            ));
        }
        let variant = Self::bwd_variant_on(&path);
        GENERATED_CAPS.check(key, direction)?;
        let spec = key.spec(direction)?;
        let plan = plan_or_main(&spec, variant).map_err(|e| e.reason)?;
        let mut note = format!(
            "template {}, block_m={} block_n={}",
            plan.template.file(),
            plan.block_m,
            plan.block_n
        );
        // The key is length-free; a call takes the variant of its keys' length.
        if variant == Variant::Main {
            for v in crate::plan::variants(&spec).filter(|&v| v != Variant::Main) {
                if let (Some(keys), Ok(Some(p))) = (v.keys(&spec), crate::plan::plan_variant(&spec, v)) {
                    let range = match *keys.start() {
                        0 | 1 => format!("up to {}", keys.end()),
                        a => format!("{a}..={}", keys.end()),
                    };
                    note.push_str(&format!(
                        "; calls of {range} keys: block_m={} block_n={}",
                        p.block_m, p.block_n
                    ));
                }
            }
        }
        Ok(Support {
            spec: Some(spec),
            note: Some(note),
        })
    }

    /// Forward: none. Backward: Dsum (16-byte aligned) + the kernel's scratch
    /// ([`BwdWorkspace`]); 0 for a problem this backend cannot plan.
    fn workspace_bytes(&self, direction: Direction, problem: &Problem) -> usize {
        match direction {
            Direction::Fwd => 0,
            Direction::Bwd => self.bwd_workspace(problem).map_or(0, |w| w.total() as usize),
        }
    }

    fn call_fwd(&self, call: &FwdCall, support: &Support) -> Result<FwdContext, DispatchError> {
        let spec = support.spec.ok_or(DispatchError::DirectionUnsupported {
            backend: GENERATED,
            direction: Direction::Fwd,
        })?;
        let ctx = FwdContext::new(self, call)?;
        let args = Self::fwd_args(call);
        let variant = self.fwd_variant(call, &spec);
        let kernel = match self.jit().memo_get_variant(&spec, variant) {
            Some(k) => k,
            None => {
                // First call: refuse bad arguments before compiling or touching the driver.
                let plan = plan_or_main(&spec, variant).map_err(|e| Self::plan_error(&spec, e))?;
                launch::check_fwd(&plan, &args)?;
                self.kernel_variant(&spec, variant)?
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

    /// The backward on a context from any backend whose LSE layout is ours
    /// (dense, or packed THD): `Dsum` is cut from the front of
    /// `call.workspace`, the rest goes to the kernel ([`BwdWorkspace`]).
    fn call_bwd(&self, call: &BwdCall, ctx: &FwdContext, support: &Support) -> Result<(), DispatchError> {
        let spec = support.spec.ok_or(DispatchError::DirectionUnsupported {
            backend: GENERATED,
            direction: Direction::Bwd,
        })?;
        let conv = ctx.for_consumer(self)?;
        if conv.needs_device_work() {
            return Err(DispatchError::Context(ContextError::Incompatible {
                from: conv.from.to_string(),
                to: conv.to.to_string(),
                reason: "the device gather kernel for LSE conversion is not written yet".into(),
            }));
        }
        let variant = self.bwd_variant();
        let kernel = match self.jit().memo_get_variant(&spec, variant) {
            Some(k) => k,
            None => {
                // First call: refuse bad arguments before compiling or touching the driver.
                let plan = self.plan_of(&spec, variant)?;
                let (args, ws, ws_bytes) = Self::bwd_args(call, ctx, &plan)?;
                launch_bwd::check_bwd(&plan, &args, ws, ws_bytes)?;
                self.kernel_variant(&spec, variant)?
            }
        };
        let (args, ws, ws_bytes) = Self::bwd_args(call, ctx, &kernel.plan)?;
        let loaded = match self.loaded_hit(&kernel) {
            Some(l) => l,
            None => {
                launch_bwd::check_bwd(&kernel.plan, &args, ws, ws_bytes)?;
                self.load(&kernel)?
            }
        };
        // SAFETY: the caller of `Dispatcher::bwd` promises device pointers of
        // the current context sized for the shapes and strides of the
        // context's problem, a workspace of `call.workspace.bytes` bytes and a
        // stream of that context; `launch_bwd` checks every argument
        // (`check_bwd`) before it launches.
        unsafe { launch_bwd::launch_bwd(&loaded, &args, ws, ws_bytes, call.stream as sys::CUstream)? };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::TensorArg;
    use crate::plan::plan;
    use crate::spec::Mask;

    use super::super::Workspace;

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
        assert!(s.note.unwrap().contains("fwd_sm90a.cu"));
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
    fn backward_support_is_the_planner_answer() {
        let b = backend();
        let p = Problem::dense(ElemType::F16, 64, 1, 4, 4, 64, 64, SM90).with_grad();
        let s = b.supports(Direction::Bwd, &key(p)).unwrap();
        assert_eq!(s.spec.unwrap().to_string(), "bwd.f16.d64.none.dense.sm90a");
        assert!(s.note.unwrap().contains("bwd_sm90a.cu"));
        let s = b
            .supports(Direction::Bwd, &key(p.with_deterministic().with_window(8, 0)))
            .unwrap();
        assert_eq!(s.spec.unwrap().to_string(), "bwd.f16.d64.window.dense.det.sm90a");
        // The same capability rows as the forward.
        assert!(b
            .supports(Direction::Bwd, &key(p.with_dropout(0.1)))
            .unwrap_err()
            .contains("dropout"));
        assert!(b
            .supports(Direction::Bwd, &key(p.with_attn_mask()))
            .unwrap_err()
            .contains("attn_mask"));
    }

    fn fast_plan(p: &Problem) -> KernelPlan {
        plan(&p.key().spec(Direction::Bwd).unwrap()).unwrap()
    }

    #[test]
    fn backward_workspace_is_dsum_then_the_kernel_scratch() {
        let b = backend();
        // Dense fast mode: 4·B·H·Sq rounded up to 16, then the f32 dQ accumulator.
        let p = Problem::dense(ElemType::Bf16, 72, 3, 5, 5, 33, 40, SM90).with_grad();
        let fp = fast_plan(&p);
        let dpad = fp.head_dim_qk_padded as u64;
        let dsum = (4 * 3 * 5 * 33u64).next_multiple_of(16);
        assert_eq!(dsum, 1984);
        // The accumulator: per head, 3·33 rows rounded up to whole dQ tiles.
        let g = fp.bwd.as_ref().unwrap().dq_tile_rows as u64;
        assert!(g > 1);
        let kernel = (3 * 33u64).next_multiple_of(g) * 5 * dpad * 4;
        assert_eq!(
            b.bwd_workspace(&p).unwrap(),
            BwdWorkspace {
                dsum_bytes: dsum,
                kernel_bytes: kernel
            }
        );
        assert_eq!(b.workspace_bytes(Direction::Bwd, &p), (dsum + kernel) as usize);
        assert_eq!(b.workspace_bytes(Direction::Fwd, &p), 0);
        // Deterministic: Dsum only.
        assert_eq!(
            b.workspace_bytes(Direction::Bwd, &p.with_deterministic()),
            dsum as usize
        );
        // THD: Dsum is [H, total_q]; the accumulator covers total_q rows.
        let t = Problem::thd(ElemType::F16, 64, 4, 8, 2, (100, 250), (120, 300), SM90).with_grad();
        let ft = fast_plan(&t);
        let dpad = ft.head_dim_qk_padded as u64;
        let g = ft.bwd.as_ref().unwrap().dq_tile_rows as u64;
        assert_eq!(
            b.workspace_bytes(Direction::Bwd, &t) as u64,
            (4 * 8 * 250u64).next_multiple_of(16) + 250u64.next_multiple_of(g) * 8 * dpad * 4
        );
        // Nothing to plan: 0, and the reason as a typed error.
        let mut f32p = p;
        f32p.dtype = ElemType::F32;
        assert_eq!(b.workspace_bytes(Direction::Bwd, &f32p), 0);
        assert!(b.bwd_workspace(&f32p).unwrap_err().to_string().contains("f32"));
    }

    fn bwd_call(sq: i64, sk: i64, h: i64, d: i64) -> BwdCall {
        let t = |ptr: u64, s: i64| TensorArg::bshd(ptr, s, h, d);
        BwdCall {
            d_o: t(0x10_0000, sq),
            q: t(0x20_0000, sq),
            k: t(0x30_0000, sk),
            v: t(0x40_0000, sk),
            o: t(0x50_0000, sq),
            dq: t(0x60_0000, sq),
            dk: t(0x70_0000, sk),
            dv: t(0x80_0000, sk),
            attn_bias: None,
            workspace: Workspace::default(),
            stream: 0,
        }
    }

    fn fwd_ctx(producer: &dyn Backend, p: Problem) -> FwdContext {
        let t = TensorArg::default();
        let mut c = FwdCall::new(p, t, t, t, t, 0x9_0000);
        if p.layout == Layout::Thd {
            c.cu_seqlens_q = Some(0xa_0000);
            c.cu_seqlens_k = Some(0xb_0000);
        }
        FwdContext::new(producer, &c).unwrap()
    }

    #[test]
    fn backward_args_come_from_the_call_and_the_context() {
        let b = backend();
        let p = Problem::dense(ElemType::Bf16, 64, 2, 4, 2, 48, 80, SM90)
            .with_grad()
            .with_scale(0.3)
            .with_window(16, 4);
        let ctx = fwd_ctx(&b, p);
        let pl = fast_plan(&p);
        let need = b.bwd_workspace(&p).unwrap();
        let mut call = bwd_call(48, 80, 4, 64);
        call.workspace = Workspace {
            ptr: 0x100_0000,
            bytes: need.total() as usize + 64,
        };
        let (args, ws, ws_bytes) = GeneratedBackend::bwd_args(&call, &ctx, &pl).unwrap();
        assert_eq!(args.dsum, 0x100_0000);
        assert_eq!(ws, 0x100_0000 + need.dsum_bytes);
        assert_eq!(ws_bytes, need.kernel_bytes + 64);
        assert_eq!((args.lse, args.d_o, args.dv), (0x9_0000, call.d_o, call.dv));
        assert_eq!(args.problem.scale, Some(0.3));
        assert_eq!(args.problem.window, (16, 4));
        assert_eq!((args.problem.heads_q, args.problem.heads_kv), (4, 2));
        let launch = launch_bwd::check_bwd(&pl, &args, ws, ws_bytes).unwrap().unwrap();
        assert_eq!(launch.params.dsum, 0x100_0000);
        assert_eq!(launch.params.dq_accum, ws);
        // Too small, null or unaligned: typed errors naming the workspace.
        for w in [
            Workspace {
                ptr: 0x100_0000,
                bytes: need.total() as usize - 1,
            },
            Workspace {
                ptr: 0,
                bytes: need.total() as usize,
            },
            Workspace {
                ptr: 0x100_0008,
                bytes: need.total() as usize,
            },
        ] {
            call.workspace = w;
            let e = GeneratedBackend::bwd_args(&call, &ctx, &pl).unwrap_err();
            assert!(
                matches!(
                    e,
                    DispatchError::Launch(LaunchError::InvalidArgument { arg: "workspace", .. })
                ),
                "{e:?}"
            );
            assert!(e.to_string().contains("for Dsum"), "{e}");
        }
    }

    #[test]
    fn backward_refuses_bad_input_before_compiling_or_touching_the_driver() {
        let b = backend();
        let p = Problem::dense(ElemType::F16, 64, 1, 4, 4, 64, 64, SM90)
            .with_grad()
            .with_mask(Mask::CausalBottomRight);
        let s = b.supports(Direction::Bwd, &key(p)).unwrap();
        let ctx = fwd_ctx(&b, p);
        let mut call = bwd_call(64, 64, 4, 64);
        call.workspace = Workspace {
            ptr: 0x100_0000,
            bytes: b.workspace_bytes(Direction::Bwd, &p),
        };
        call.dk.ptr = 0;
        let e = b.call_bwd(&call, &ctx, &s).unwrap_err();
        assert!(
            matches!(e, DispatchError::Launch(LaunchError::InvalidArgument { arg: "dk", .. })),
            "{e:?}"
        );
        // A context from torch's cuDNN (dense LSE) is consumed as is: the same check answers.
        let cudnn = super::super::DirectBackend::torch_cudnn();
        let e = b.call_bwd(&call, &fwd_ctx(&cudnn, p), &s).unwrap_err();
        assert!(matches!(e, DispatchError::Launch(_)), "{e:?}");
        // A padded THD LSE would need the device gather kernel: refused.
        let t = Problem::thd(ElemType::F16, 64, 2, 4, 4, (64, 100), (64, 100), SM90).with_grad();
        let padded = super::super::DirectBackend::torch_flash().with_thd_lse(LseKind::Padded);
        let st = b.supports(Direction::Bwd, &key(t)).unwrap();
        let e = b.call_bwd(&call, &fwd_ctx(&padded, t), &st).unwrap_err();
        assert!(e.to_string().contains("gather kernel"), "{e}");
        // No spec in the support: not ours to run.
        assert!(matches!(
            b.call_bwd(&call, &ctx, &Support::default()),
            Err(DispatchError::DirectionUnsupported { .. })
        ));
    }
}
