//! `attnforge._core`: the Rust side of the PyTorch front end.
//!
//! Thin by design: problems in (a dict for people, a flat tuple on the hot
//! path), decisions and explanations out, and the generated kernels launched
//! from raw integers (device pointers, strides in elements, a `CUstream`
//! handle, a workspace pointer) with the GIL released. Torch never appears
//! here: the Python package allocates with torch's caching allocator, passes
//! torch's current stream, and runs the direct backends (torch-flash,
//! torch-cudnn) itself.
//!
//! Errors are typed on the way out: `ValueError` for bad input,
//! `NotImplementedError` when no backend (or not the generated one) supports
//! the problem, `RuntimeError` for build and CUDA failures. No panic crosses
//! into Python (every entry point runs under `catch_unwind`).

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use attnforge::dispatch::context::ContextError;
use attnforge::dispatch::{
    BwdCall, ComputeCapability, DirDecision, DispatchError, Dispatcher, ElemType, FwdCall, FwdContext,
    GeneratedBackend, GeneratedPath, Policy, Problem, Support, Verdict, Workspace, GENERATED,
};
use attnforge::launch::{self, LaunchError, LoadedKernel, TensorArg};
use attnforge::launch_bwd;
use attnforge::spec::{AttnSpec, Direction, Layout, Mask};
use attnforge::Jit;
use cudarc::driver::{result, sys};
use pyo3::exceptions::{PyNotImplementedError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// Bits of the problem tuple's `flags` (the C ABI's values).
const FLAG_ATTN_MASK: u32 = 1;
const FLAG_REQUIRES_GRAD: u32 = 2;
const FLAG_DETERMINISTIC: u32 = 4;
const FLAG_EQUAL_SEQLENS: u32 = 8;
const KNOWN_FLAGS: u32 = FLAG_ATTN_MASK | FLAG_REQUIRES_GRAD | FLAG_DETERMINISTIC | FLAG_EQUAL_SEQLENS;

/// Field order of the hot-path problem tuple (`attnforge._problem.FIELDS`
/// mirrors it; a test compares them).
const TUPLE_FIELDS: [&str; 20] = [
    "dtype",
    "layout",
    "mask",
    "head_dim_qk",
    "head_dim_v",
    "batch",
    "heads_q",
    "heads_kv",
    "seqlen_q",
    "seqlen_k",
    "total_q",
    "total_k",
    "window_left",
    "window_right",
    "scale",
    "softcap",
    "dropout_p",
    "flags",
    "cc_major",
    "cc_minor",
];

/// The torch front end's dispatcher: the generated backend and PyTorch's
/// flash and cuDNN descriptors; policy from the environment.
fn dispatcher() -> &'static Dispatcher {
    static D: OnceLock<Dispatcher> = OnceLock::new();
    D.get_or_init(|| {
        let d = Dispatcher::with_generated(Policy::from_env());
        // Cannot fail on a fresh dispatcher (no duplicate names).
        let _ = d.register_torch();
        d
    })
}

fn value_error(msg: impl Into<String>) -> PyErr {
    PyValueError::new_err(msg.into())
}

/// A dispatch error as the Python exception its kind calls for.
fn py_err(e: DispatchError) -> PyErr {
    let msg = e.to_string();
    match e {
        DispatchError::Problem(_) | DispatchError::UnknownBackend { .. } | DispatchError::DuplicateBackend { .. } => {
            PyValueError::new_err(msg)
        }
        DispatchError::NoBackend { .. }
        | DispatchError::PolicyDeclined { .. }
        | DispatchError::DirectionUnsupported { .. }
        | DispatchError::Context(_) => PyNotImplementedError::new_err(msg),
        DispatchError::ExecutedByFrontEnd { .. } | DispatchError::Build { .. } => PyRuntimeError::new_err(msg),
        DispatchError::Launch(l) => launch_err(l),
    }
}

fn launch_err(e: LaunchError) -> PyErr {
    let msg = e.to_string();
    match e {
        LaunchError::InvalidArgument { .. } | LaunchError::SpecMismatch { .. } => PyValueError::new_err(msg),
        LaunchError::NoDriver | LaunchError::Driver { .. } => PyRuntimeError::new_err(msg),
    }
}

/// Run `f`; a panic becomes a `RuntimeError` instead of crossing into Python.
fn guarded<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(PyRuntimeError::new_err(format!(
                "attnforge internal error (panic): {what}; please report it"
            )))
        }
    }
}

fn parse_mask(s: &str) -> PyResult<Mask> {
    match s.trim().to_ascii_lowercase().as_str() {
        "none" | "" => Ok(Mask::None),
        "causal-tl" | "causal" | "top-left" | "causal-top-left" => Ok(Mask::CausalTopLeft),
        "causal-br" | "bottom-right" | "causal-bottom-right" => Ok(Mask::CausalBottomRight),
        "window" | "sliding-window" => Ok(Mask::SlidingWindow),
        other => Err(value_error(format!(
            "mask `{other}`: allowed values are none, causal-tl, causal-br, window"
        ))),
    }
}

fn parse_layout(s: &str) -> PyResult<Layout> {
    match s.trim().to_ascii_lowercase().as_str() {
        "dense" => Ok(Layout::Dense),
        "thd" | "ragged" | "varlen" => Ok(Layout::Thd),
        other => Err(value_error(format!("layout `{other}`: allowed values are dense, thd"))),
    }
}

fn parse_dtype(s: &str) -> PyResult<ElemType> {
    // Accept torch's spellings too (`torch.bfloat16` -> "torch.bfloat16").
    let t = s.trim().trim_start_matches("torch.");
    t.parse::<ElemType>().map_err(|e| value_error(e.to_string()))
}

fn cc_of(major: i64, minor: i64) -> PyResult<ComputeCapability> {
    match (u8::try_from(major), u8::try_from(minor)) {
        (Ok(ma), Ok(mi)) if ma > 0 && mi <= 9 => Ok(ComputeCapability::new(ma, mi)),
        _ => Err(value_error(format!(
            "compute capability {major}.{minor} is not valid (expected e.g. 9.0)"
        ))),
    }
}

fn u32_field(name: &str, v: i64) -> PyResult<u32> {
    u32::try_from(v).map_err(|_| value_error(format!("`{name}` must be in 0..=4294967295, got {v}")))
}

fn i32_field(name: &str, v: i64) -> PyResult<i32> {
    i32::try_from(v).map_err(|_| value_error(format!("`{name}` must fit in int32, got {v}")))
}

fn scale_of(v: f64) -> Option<f32> {
    (v != 0.0).then_some(v as f32)
}

/// The hot-path form: a flat tuple in [`TUPLE_FIELDS`] order.
fn problem_from_tuple(t: &Bound<'_, PyTuple>) -> PyResult<Problem> {
    if t.len() != TUPLE_FIELDS.len() {
        return Err(value_error(format!(
            "problem tuple has {} fields, expected {} ({})",
            t.len(),
            TUPLE_FIELDS.len(),
            TUPLE_FIELDS.join(", ")
        )));
    }
    let s = |i: usize| -> PyResult<String> {
        t.get_item(i)?
            .extract::<String>()
            .map_err(|_| PyTypeError::new_err(format!("problem field `{}` must be a str", TUPLE_FIELDS[i])))
    };
    let n = |i: usize| -> PyResult<i64> {
        t.get_item(i)?
            .extract::<i64>()
            .map_err(|_| PyTypeError::new_err(format!("problem field `{}` must be an int", TUPLE_FIELDS[i])))
    };
    let f = |i: usize| -> PyResult<f64> {
        t.get_item(i)?
            .extract::<f64>()
            .map_err(|_| PyTypeError::new_err(format!("problem field `{}` must be a float", TUPLE_FIELDS[i])))
    };
    let flags = u32_field("flags", n(17)?)?;
    if flags & !KNOWN_FLAGS != 0 {
        return Err(value_error(format!(
            "problem flags has unknown bits {:#x}",
            flags & !KNOWN_FLAGS
        )));
    }
    Ok(Problem {
        dtype: parse_dtype(&s(0)?)?,
        layout: parse_layout(&s(1)?)?,
        mask: parse_mask(&s(2)?)?,
        head_dim_qk: u32_field("head_dim_qk", n(3)?)?,
        head_dim_v: u32_field("head_dim_v", n(4)?)?,
        batch: u32_field("batch", n(5)?)?,
        heads_q: u32_field("heads_q", n(6)?)?,
        heads_kv: u32_field("heads_kv", n(7)?)?,
        seqlen_q: u32_field("seqlen_q", n(8)?)?,
        seqlen_k: u32_field("seqlen_k", n(9)?)?,
        total_q: u32_field("total_q", n(10)?)?,
        total_k: u32_field("total_k", n(11)?)?,
        window: (i32_field("window_left", n(12)?)?, i32_field("window_right", n(13)?)?),
        scale: scale_of(f(14)?),
        softcap: f(15)? as f32,
        dropout_p: f(16)? as f32,
        attn_mask: flags & FLAG_ATTN_MASK != 0,
        requires_grad: flags & FLAG_REQUIRES_GRAD != 0,
        deterministic: flags & FLAG_DETERMINISTIC != 0,
        thd_equal_seqlens: flags & FLAG_EQUAL_SEQLENS != 0,
        cc: cc_of(n(18)?, n(19)?)?,
    })
}

const DICT_KEYS: &[&str] = &[
    "dtype",
    "head_dim",
    "head_dim_qk",
    "head_dim_v",
    "layout",
    "batch",
    "heads_q",
    "heads_kv",
    "seqlen_q",
    "seqlen_k",
    "total_q",
    "total_k",
    "mask",
    "window",
    "softcap",
    "scale",
    "dropout_p",
    "attn_mask",
    "equal_seqlens",
    "requires_grad",
    "deterministic",
    "arch",
];

/// The readable form: a dict of the fields above (unknown keys are errors).
/// Defaults: bf16, d 128 (v = qk), dense, batch 1, 16 heads (kv = q),
/// seqlen 4096 (k = q), THD totals = batch·seqlen, mask none, arch sm90a.
fn problem_from_dict(d: &Bound<'_, PyDict>) -> PyResult<Problem> {
    for (k, _) in d.iter() {
        let k: String = k
            .extract()
            .map_err(|_| PyTypeError::new_err("problem dict keys must be str"))?;
        if !DICT_KEYS.contains(&k.as_str()) {
            return Err(value_error(format!(
                "unknown problem key `{k}` (known: {})",
                DICT_KEYS.join(", ")
            )));
        }
    }
    fn get<'py, T: FromPyObjectOwned<'py>>(d: &Bound<'py, PyDict>, key: &str) -> PyResult<Option<T>> {
        match d.get_item(key)? {
            None => Ok(None),
            Some(v) if v.is_none() => Ok(None),
            Some(v) => v.extract::<T>().map(Some).map_err(|_| {
                let got = v.repr().map(|r| r.to_string()).unwrap_or_else(|_| "?".into());
                PyTypeError::new_err(format!(
                    "problem key `{key}` has the wrong type ({got}; expected {})",
                    std::any::type_name::<T>().rsplit("::").next().unwrap_or("?")
                ))
            }),
        }
    }
    let dtype = parse_dtype(&get::<String>(d, "dtype")?.unwrap_or_else(|| "bf16".into()))?;
    let head_dim_qk = match (get::<i64>(d, "head_dim")?, get::<i64>(d, "head_dim_qk")?) {
        (Some(a), Some(b)) if a != b => {
            return Err(value_error(format!("head_dim {a} and head_dim_qk {b} disagree")));
        }
        (a, b) => u32_field("head_dim", a.or(b).unwrap_or(128))?,
    };
    let head_dim_v = match get::<i64>(d, "head_dim_v")? {
        Some(v) => u32_field("head_dim_v", v)?,
        None => head_dim_qk,
    };
    let layout = parse_layout(&get::<String>(d, "layout")?.unwrap_or_else(|| "dense".into()))?;
    let batch = u32_field("batch", get(d, "batch")?.unwrap_or(1))?;
    let heads_q = u32_field("heads_q", get(d, "heads_q")?.unwrap_or(16))?;
    let heads_kv = match get::<i64>(d, "heads_kv")? {
        Some(v) => u32_field("heads_kv", v)?,
        None => heads_q,
    };
    let seqlen_q = u32_field("seqlen_q", get(d, "seqlen_q")?.unwrap_or(4096))?;
    let seqlen_k = match get::<i64>(d, "seqlen_k")? {
        Some(v) => u32_field("seqlen_k", v)?,
        None => seqlen_q,
    };
    let thd = layout == Layout::Thd;
    let total = |key: &str, len: u32| -> PyResult<u32> {
        match get::<i64>(d, key)? {
            Some(v) => u32_field(key, v),
            None if thd => Ok(batch.saturating_mul(len)),
            None => Ok(0),
        }
    };
    let total_q = total("total_q", seqlen_q)?;
    let total_k = total("total_k", seqlen_k)?;
    let window = get::<(i64, i64)>(d, "window")?;
    let mask = match (get::<String>(d, "mask")?, window) {
        (Some(m), _) => parse_mask(&m)?,
        (None, Some(_)) => Mask::SlidingWindow,
        (None, None) => Mask::None,
    };
    let window = match window {
        Some((l, r)) => (i32_field("window", l)?, i32_field("window", r)?),
        None => (-1, -1),
    };
    let arch = get::<String>(d, "arch")?.unwrap_or_else(|| "sm90a".into());
    let cc: ComputeCapability = arch
        .parse()
        .map_err(|e: attnforge::dispatch::ProblemError| value_error(e.to_string()))?;
    let equal = get::<bool>(d, "equal_seqlens")?.unwrap_or(thd && seqlen_q == seqlen_k);
    Ok(Problem {
        dtype,
        head_dim_qk,
        head_dim_v,
        layout,
        batch,
        heads_q,
        heads_kv,
        seqlen_q,
        seqlen_k,
        total_q,
        total_k,
        mask,
        window,
        softcap: get::<f64>(d, "softcap")?.unwrap_or(0.0) as f32,
        scale: get::<f64>(d, "scale")?.and_then(scale_of),
        dropout_p: get::<f64>(d, "dropout_p")?.unwrap_or(0.0) as f32,
        attn_mask: get(d, "attn_mask")?.unwrap_or(false),
        thd_equal_seqlens: thd && equal,
        requires_grad: get(d, "requires_grad")?.unwrap_or(false),
        deterministic: get(d, "deterministic")?.unwrap_or(false),
        cc,
    })
}

/// A problem from a dict or a hot-path tuple.
fn problem_of(obj: &Bound<'_, PyAny>) -> PyResult<Problem> {
    if let Ok(t) = obj.cast::<PyTuple>() {
        return problem_from_tuple(t);
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        return problem_from_dict(d);
    }
    Err(PyTypeError::new_err("problem must be a dict or a problem tuple"))
}

/// (ptr, stride_batch, stride_seq, stride_head) in elements.
type PyTensor = (u64, i64, i64, i64);

fn tensor(t: PyTensor) -> TensorArg {
    TensorArg {
        ptr: t.0,
        stride_batch: t.1,
        stride_seq: t.2,
        stride_head: t.3,
    }
}

fn opt_ptr(p: u64) -> Option<u64> {
    (p != 0).then_some(p)
}

/// A forward call of the generated backend: the tensors, LSE and
/// `cu_seqlens` pointers (0 = none) and the stream (0 = legacy default).
#[allow(clippy::too_many_arguments)]
fn fwd_call(
    p: Problem,
    [q, k, v, o]: [PyTensor; 4],
    lse: u64,
    cu_seqlens_q: u64,
    cu_seqlens_k: u64,
    stream: u64,
) -> FwdCall {
    let mut call = FwdCall::new(p, tensor(q), tensor(k), tensor(v), tensor(o), lse);
    call.cu_seqlens_q = opt_ptr(cu_seqlens_q);
    call.cu_seqlens_k = opt_ptr(cu_seqlens_k);
    call.stream = stream as usize;
    call
}

/// The generated backend's support for one direction of `p`, from the
/// (memoized) decision: its spec, or why it declines.
fn generated_support(p: &Problem, direction: Direction) -> PyResult<Support> {
    let d = dispatcher();
    let decision = d.decide_problem(p).map_err(py_err)?;
    let side = match direction {
        Direction::Fwd => &decision.fwd,
        Direction::Bwd => &decision.bwd,
    };
    let row = side
        .ranked
        .iter()
        .find(|r| r.backend == GENERATED)
        .ok_or_else(|| PyNotImplementedError::new_err("the generated backend is not registered"))?;
    match &row.verdict {
        Verdict::Rejected(why) => Err(PyNotImplementedError::new_err(format!(
            "the generated {direction} kernel does not support this problem: {why}"
        ))),
        Verdict::Chosen | Verdict::Eligible => {
            let spec = p.key().spec(direction).map_err(PyNotImplementedError::new_err)?;
            Ok(Support {
                spec: Some(spec),
                note: None,
            })
        }
    }
}

/// Make the primary context of device `ordinal` current on this thread when
/// another device's (or none) is: torch's current device normally is the
/// tensors' already, and then this is two cheap driver queries.
fn bind_device(ordinal: i32) -> Result<(), LaunchError> {
    let drv = |call: &'static str| {
        move |e: result::DriverError| LaunchError::Driver {
            call,
            code: format!("{e:?}"),
        }
    };
    static DRIVER: OnceLock<bool> = OnceLock::new();
    if !*DRIVER.get_or_init(launch::driver_available) {
        // Nothing to bind; the launch reports `NoDriver` after its argument checks.
        return Ok(());
    }
    launch::ensure_context(ordinal)?;
    let mut current: sys::CUdevice = 0;
    // SAFETY: out-parameter query on the current context (ensure_context made one current).
    unsafe { sys::cuCtxGetDevice(&mut current) }
        .result()
        .map_err(drv("cuCtxGetDevice"))?;
    let want = result::device::get(ordinal).map_err(drv("cuDeviceGet"))?;
    if current == want {
        return Ok(());
    }
    static RETAINED: OnceLock<Mutex<HashMap<i32, usize>>> = OnceLock::new();
    let map = RETAINED.get_or_init(Default::default);
    let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
    let ctx = match map.get(&ordinal) {
        Some(&c) => c as sys::CUcontext,
        None => {
            // SAFETY: `want` comes from cuDeviceGet; retained once per device
            // for the life of the process.
            let c = unsafe { result::primary_ctx::retain(want) }.map_err(drv("cuDevicePrimaryCtxRetain"))?;
            map.insert(ordinal, c as usize);
            c
        }
    };
    // SAFETY: a retained primary context.
    unsafe { result::ctx::set_current(ctx) }.map_err(drv("cuCtxSetCurrent"))
}

/// A device ordinal from Python.
fn device_index(device: i64) -> PyResult<i32> {
    i32::try_from(device).map_err(|_| value_error(format!("device index {device} is not valid")))
}

/// The CUDA context current on this thread, if any (one driver call; only
/// asked once the driver has loaded a kernel).
fn current_context() -> Option<usize> {
    result::ctx::get_current().ok().flatten().map(|c| c as usize)
}

/// A generated forward resolved once for one problem signature (the eager
/// fast path of `attnforge.torch` keeps one per signature): the validated
/// problem, the dispatcher's support (spec), the strides of q, k, v and O,
/// the device, and, after the first launch, the kernel loaded in the current
/// CUDA context. A call passes only the data pointers and the stream;
/// `launch::launch_fwd` still checks every argument (`check_fwd`: null and
/// 16-byte alignment of each pointer included) before the driver launches.
#[pyclass(frozen, module = "attnforge._core")]
struct FwdLaunch {
    problem: Problem,
    support: Support,
    spec: AttnSpec,
    /// (batch, seq, head) strides in elements of q, k, v, O.
    strides: [(i64, i64, i64); 4],
    ordinal: i32,
    /// (CUDA context, module) of the last launch through the dispatcher.
    loaded: Mutex<Option<(usize, Arc<LoadedKernel>)>>,
}

impl FwdLaunch {
    #[allow(clippy::too_many_arguments)]
    fn call(&self, q: u64, k: u64, v: u64, o: u64, lse: u64, cu_q: u64, cu_k: u64, stream: u64) -> FwdCall {
        let [sq, sk, sv, so] = self.strides;
        let t = |ptr: u64, s: (i64, i64, i64)| (ptr, s.0, s.1, s.2);
        fwd_call(
            self.problem,
            [t(q, sq), t(k, sk), t(v, sv), t(o, so)],
            lse,
            cu_q,
            cu_k,
            stream,
        )
    }

    fn launch(&self, call: &FwdCall) -> Result<(), DispatchError> {
        let cached = self.loaded.lock().ok().and_then(|g| g.clone());
        if let Some((ctx, kernel)) = cached {
            if current_context() == Some(ctx) {
                let args = GeneratedBackend::fwd_args(call);
                // SAFETY: the caller passes device pointers of this context
                // (torch tensors of the handle's device, whose context is
                // current) sized for the handle's shapes and strides, and a
                // stream of that context; `launch_fwd` checks every argument
                // (`check_fwd`) before it launches.
                unsafe { launch::launch_fwd(&kernel, &args, call.stream as sys::CUstream)? };
                return Ok(());
            }
        }
        // First call, or another context current: the dispatcher's path
        // (argument check, compile or cache, module load), then remember the
        // module for this context.
        bind_device(self.ordinal)?;
        let backend = dispatcher()
            .backend(GENERATED)
            .ok_or(DispatchError::DirectionUnsupported {
                backend: GENERATED,
                direction: Direction::Fwd,
            })?;
        backend.call_fwd(call, &self.support)?;
        // The variant the dispatcher took for this call (by its keys' length).
        let variant = GeneratedBackend::fwd_variant_on(&dispatcher().policy().generated_path, call, &self.spec);
        if let Some(kernel) = Jit::global().memo_get_variant(&self.spec, variant) {
            if let (Ok(loaded), Some(ctx)) = (launch::load(&kernel), current_context()) {
                if let Ok(mut g) = self.loaded.lock() {
                    *g = Some((ctx, loaded));
                }
            }
        }
        Ok(())
    }
}

#[pymethods]
impl FwdLaunch {
    /// `FwdLaunch(problem, q_strides, k_strides, v_strides, o_strides, device)`:
    /// strides are (batch, seq, head) in elements. Raises what `fwd` would
    /// for a problem or strides the generated forward cannot take.
    #[new]
    fn new(
        problem: &Bound<'_, PyAny>,
        q_strides: (i64, i64, i64),
        k_strides: (i64, i64, i64),
        v_strides: (i64, i64, i64),
        o_strides: (i64, i64, i64),
        device: i64,
    ) -> PyResult<Self> {
        guarded(|| {
            let p = problem_of(problem)?;
            p.validate().map_err(|e| value_error(e.to_string()))?;
            let support = generated_support(&p, Direction::Fwd)?;
            let spec = support.spec.ok_or_else(|| {
                PyNotImplementedError::new_err("the generated forward has no kernel for this problem")
            })?;
            let h = FwdLaunch {
                problem: p,
                support,
                spec,
                strides: [q_strides, k_strides, v_strides, o_strides],
                ordinal: device_index(device)?,
                loaded: Mutex::new(None),
            };
            // The problem and strides against the kernel's plan, with
            // stand-in aligned pointers: what cannot change between calls is
            // refused here, once (cu_seqlens stand in for THD).
            let plan =
                attnforge::plan(&spec).map_err(|e| PyNotImplementedError::new_err(format!("{spec}: {}", e.reason)))?;
            let thd = p.layout == Layout::Thd;
            let cu = if thd { 0x1000 } else { 0 };
            let call = h.call(0x1000, 0x1000, 0x1000, 0x1000, 0x1000, cu, cu, 0);
            launch::check_fwd(&plan, &GeneratedBackend::fwd_args(&call)).map_err(launch_err)?;
            Ok(h)
        })
    }

    /// Launch on `stream` (a `CUstream` handle): O and the f32 LSE into
    /// caller-allocated memory at the given device pointers; `lse` = 0: O
    /// only (no backward follows).
    #[pyo3(signature = (q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, stream))]
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        py: Python<'_>,
        q: u64,
        k: u64,
        v: u64,
        o: u64,
        lse: u64,
        cu_seqlens_q: u64,
        cu_seqlens_k: u64,
        stream: u64,
    ) -> PyResult<()> {
        guarded(|| {
            let call = self.call(q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, stream);
            py.detach(|| self.launch(&call)).map_err(py_err)
        })
    }

    /// The kernel's spec, e.g. `fwd.bf16.d64.causal-tl.dense.sm90a`.
    #[getter]
    fn spec(&self) -> String {
        self.spec.to_string()
    }

    /// Whether a module is remembered for a CUDA context (after a launch).
    #[getter]
    fn loaded(&self) -> bool {
        self.loaded.lock().map(|g| g.is_some()).unwrap_or(false)
    }
}

/// A generated backward resolved once for one problem signature, the
/// backward twin of [`FwdLaunch`] (the eager fast path keeps one per
/// signature, deterministic mode and dO strides): the dispatcher's support
/// (spec), the forward's context (the validated problem, producer, LSE
/// layout, scale, mask; its LSE and `cu_seqlens` pointers are stand-ins a
/// call replaces), the strides of the eight tensors, the workspace size, the
/// device, and, after the first launch, the kernels loaded in the current
/// CUDA context. A call passes only the data pointers and the stream;
/// `launch_bwd::launch_bwd` still checks every argument (`check_bwd`: null
/// and 16-byte alignment of each pointer, LSE and Dsum alignment, the
/// workspace) before the driver launches.
#[pyclass(frozen, module = "attnforge._core")]
struct BwdLaunch {
    support: Support,
    spec: AttnSpec,
    ctx: FwdContext,
    /// (batch, seq, head) strides in elements of q, k, v, O, dO, dQ, dK, dV.
    strides: [(i64, i64, i64); 8],
    /// Dsum + the kernel's scratch; the caller's workspace holds this many bytes.
    workspace_bytes: usize,
    ordinal: i32,
    /// (CUDA context, module) of the last launch through the dispatcher.
    loaded: Mutex<Option<(usize, Arc<LoadedKernel>)>>,
}

impl BwdLaunch {
    /// The backward call and the forward's context of one launch: the
    /// pointers of q, k, v, O, dO, dQ, dK, dV in that order.
    fn call(
        &self,
        ptrs: [u64; 8],
        lse: u64,
        workspace: u64,
        cu_q: u64,
        cu_k: u64,
        stream: u64,
    ) -> (BwdCall, FwdContext) {
        let t = |i: usize| {
            let s = self.strides[i];
            tensor((ptrs[i], s.0, s.1, s.2))
        };
        let call = BwdCall {
            q: t(0),
            k: t(1),
            v: t(2),
            o: t(3),
            d_o: t(4),
            dq: t(5),
            dk: t(6),
            dv: t(7),
            attn_bias: None,
            workspace: Workspace {
                ptr: workspace,
                bytes: self.workspace_bytes,
            },
            stream: stream as usize,
        };
        let mut ctx = self.ctx;
        ctx.lse = lse;
        ctx.cu_seqlens_q = opt_ptr(cu_q);
        ctx.cu_seqlens_k = opt_ptr(cu_k);
        (call, ctx)
    }

    fn launch(&self, call: &BwdCall, ctx: &FwdContext) -> Result<(), DispatchError> {
        let cached = self.loaded.lock().ok().and_then(|g| g.clone());
        if let Some((cu_ctx, kernel)) = cached {
            if current_context() == Some(cu_ctx) {
                // What `GeneratedBackend::call_bwd` does on a hit, less what
                // cannot change between calls (the support, the context's LSE
                // conversion: checked at construction).
                let (args, ws, ws_bytes) = GeneratedBackend::bwd_args(call, ctx, &kernel.plan)?;
                // SAFETY: the caller passes device pointers of this context
                // (torch tensors of the handle's device, whose context is
                // current) sized for the handle's shapes and strides, a
                // workspace of `workspace_bytes` bytes and a stream of that
                // context; `launch_bwd` checks every argument (`check_bwd`)
                // before it launches.
                unsafe { launch_bwd::launch_bwd(&kernel, &args, ws, ws_bytes, call.stream as sys::CUstream)? };
                return Ok(());
            }
        }
        // First call, or another context current: the dispatcher's path
        // (argument check, compile or cache, module load), then remember the
        // module for this context.
        bind_device(self.ordinal)?;
        let backend = dispatcher()
            .backend(GENERATED)
            .ok_or(DispatchError::DirectionUnsupported {
                backend: GENERATED,
                direction: Direction::Bwd,
            })?;
        backend.call_bwd(call, ctx, &self.support)?;
        let variant = GeneratedBackend::bwd_variant_on(&dispatcher().policy().generated_path);
        if let Some(kernel) = Jit::global().memo_get_variant(&self.spec, variant) {
            if let (Ok(loaded), Some(c)) = (launch::load(&kernel), current_context()) {
                if let Ok(mut g) = self.loaded.lock() {
                    *g = Some((c, loaded));
                }
            }
        }
        Ok(())
    }
}

#[pymethods]
impl BwdLaunch {
    /// `BwdLaunch(problem, producer, q_strides, k_strides, v_strides,
    /// o_strides, do_strides, dq_strides, dk_strides, dv_strides, device)`:
    /// strides are (batch, seq, head) in elements; `producer` is the
    /// forward's backend. Raises what `bwd` would for a problem, producer or
    /// strides the generated backward cannot take.
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        problem: &Bound<'_, PyAny>,
        producer: &str,
        q_strides: (i64, i64, i64),
        k_strides: (i64, i64, i64),
        v_strides: (i64, i64, i64),
        o_strides: (i64, i64, i64),
        do_strides: (i64, i64, i64),
        dq_strides: (i64, i64, i64),
        dk_strides: (i64, i64, i64),
        dv_strides: (i64, i64, i64),
        device: i64,
    ) -> PyResult<Self> {
        guarded(|| {
            let mut p = problem_of(problem)?;
            p.requires_grad = true;
            p.validate().map_err(|e| value_error(e.to_string()))?;
            let support = generated_support(&p, Direction::Bwd)?;
            let spec = support.spec.ok_or_else(|| {
                PyNotImplementedError::new_err("the generated backward has no kernel for this problem")
            })?;
            let ordinal = device_index(device)?;
            let d = dispatcher();
            let producer = d.backend(producer).ok_or_else(|| {
                value_error(format!(
                    "unknown producer backend `{producer}` (registered: {})",
                    d.backend_names().join(", ")
                ))
            })?;
            let backend = d
                .backend(GENERATED)
                .ok_or_else(|| PyRuntimeError::new_err("the generated backend is not registered"))?;
            // The context with stand-in LSE and cu_seqlens pointers (a call
            // puts its own in); the LSE conversion it needs depends only on
            // the producer and the problem, so it is judged here, once, as
            // `call_bwd` would per call.
            let thd = p.layout == Layout::Thd;
            let cu = if thd { 0x1000 } else { 0 };
            let fwd = fwd_call(p, [(0, 0, 0, 0); 4], 0x1000, cu, cu, 0);
            let ctx = FwdContext::new(producer.as_ref(), &fwd).map_err(|e| py_err(e.into()))?;
            let conv = ctx.for_consumer(backend.as_ref()).map_err(|e| py_err(e.into()))?;
            if conv.needs_device_work() {
                return Err(py_err(DispatchError::Context(ContextError::Incompatible {
                    from: conv.from.to_string(),
                    to: conv.to.to_string(),
                    reason: "the device gather kernel for LSE conversion is not written yet".into(),
                })));
            }
            let h = BwdLaunch {
                support,
                spec,
                ctx,
                strides: [
                    q_strides, k_strides, v_strides, o_strides, do_strides, dq_strides, dk_strides, dv_strides,
                ],
                workspace_bytes: backend.workspace_bytes(Direction::Bwd, &p),
                ordinal,
                loaded: Mutex::new(None),
            };
            // The problem, strides and workspace split against the kernel's
            // plan, with stand-in aligned pointers: what cannot change
            // between calls is refused here, once.
            let plan =
                attnforge::plan(&spec).map_err(|e| PyNotImplementedError::new_err(format!("{spec}: {}", e.reason)))?;
            let (call, ctx) = h.call([0x1000; 8], 0x1000, 0x1000, cu, cu, 0);
            let (args, ws, ws_bytes) = GeneratedBackend::bwd_args(&call, &ctx, &plan).map_err(py_err)?;
            launch_bwd::check_bwd(&plan, &args, ws, ws_bytes).map_err(launch_err)?;
            Ok(h)
        })
    }

    /// Launch on `stream` (a `CUstream` handle): dQ, dK, dV into
    /// caller-allocated memory at the given device pointers; `workspace`
    /// holds `workspace_bytes` bytes (16-byte aligned); `lse` is the
    /// forward's f32 LSE. `cu_seqlens_q/k` (0 = none) for THD problems.
    #[pyo3(signature = (q, k, v, o, d_o, dq, dk, dv, lse, workspace, stream, cu_seqlens_q=0, cu_seqlens_k=0))]
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        py: Python<'_>,
        q: u64,
        k: u64,
        v: u64,
        o: u64,
        d_o: u64,
        dq: u64,
        dk: u64,
        dv: u64,
        lse: u64,
        workspace: u64,
        stream: u64,
        cu_seqlens_q: u64,
        cu_seqlens_k: u64,
    ) -> PyResult<()> {
        guarded(|| {
            let (call, ctx) = self.call(
                [q, k, v, o, d_o, dq, dk, dv],
                lse,
                workspace,
                cu_seqlens_q,
                cu_seqlens_k,
                stream,
            );
            py.detach(|| self.launch(&call, &ctx)).map_err(py_err)
        })
    }

    /// The kernels' spec, e.g. `bwd.bf16.d64.causal-tl.dense.sm90a`.
    #[getter]
    fn spec(&self) -> String {
        self.spec.to_string()
    }

    /// The forward's backend whose context the backward consumes.
    #[getter]
    fn producer(&self) -> &'static str {
        self.ctx.producer
    }

    /// Bytes of the workspace a call passes (`bwd_workspace_bytes(problem)`).
    #[getter]
    fn workspace_bytes(&self) -> usize {
        self.workspace_bytes
    }

    /// Whether a module is remembered for a CUDA context (after a launch).
    #[getter]
    fn loaded(&self) -> bool {
        self.loaded.lock().map(|g| g.is_some()).unwrap_or(false)
    }
}

/// The dispatcher's explanation of a problem (no GPU needed).
#[pyfunction]
fn explain(problem: &Bound<'_, PyAny>) -> PyResult<String> {
    guarded(|| {
        let p = problem_of(problem)?;
        dispatcher().explain(&p).map_err(py_err)
    })
}

/// `(fwd backend, bwd backend, reasons)`: the chosen backend names (`None`
/// where nothing supports the direction) and a dict with `fwd`/`bwd` (the
/// error when none, else `None`), `fwd_spec`/`bwd_spec` (the generated
/// kernel's spec when chosen) and `summary` (one line).
#[pyfunction]
fn decide<'py>(
    py: Python<'py>,
    problem: &Bound<'py, PyAny>,
) -> PyResult<(Option<&'static str>, Option<&'static str>, Bound<'py, PyDict>)> {
    guarded(|| {
        let p = problem_of(problem)?;
        let d = dispatcher().decide_problem(&p).map_err(py_err)?;
        let reasons = PyDict::new(py);
        let side = |s: &DirDecision| -> (Option<&'static str>, Option<String>, Option<String>) {
            match &s.outcome {
                Ok(c) => (Some(c.name()), None, c.spec().map(|s| s.to_string())),
                Err(e) => (None, Some(e.to_string()), None),
            }
        };
        let (f, fe, fs) = side(&d.fwd);
        let (b, be, bs) = side(&d.bwd);
        reasons.set_item("fwd", fe)?;
        reasons.set_item("bwd", be)?;
        reasons.set_item("fwd_spec", fs)?;
        reasons.set_item("bwd_spec", bs)?;
        reasons.set_item("summary", d.summary())?;
        Ok((f, b, reasons))
    })
}

/// Run the generated forward: O and the f32 LSE (dense `[B, H, Sq]`, THD
/// `[H, total_q]`) into caller-allocated memory, on `stream` (a `CUstream`
/// handle; 0 = legacy default), on device `device`. Returns the producer's
/// name ("generated") for the context.
#[pyfunction]
#[pyo3(signature = (problem, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, stream, device))]
#[allow(clippy::too_many_arguments)]
fn fwd(
    py: Python<'_>,
    problem: &Bound<'_, PyAny>,
    q: PyTensor,
    k: PyTensor,
    v: PyTensor,
    o: PyTensor,
    lse: u64,
    cu_seqlens_q: u64,
    cu_seqlens_k: u64,
    stream: u64,
    device: i64,
) -> PyResult<&'static str> {
    guarded(|| {
        let p = problem_of(problem)?;
        p.validate().map_err(|e| value_error(e.to_string()))?;
        let support = generated_support(&p, Direction::Fwd)?;
        let ordinal = device_index(device)?;
        let call = fwd_call(p, [q, k, v, o], lse, cu_seqlens_q, cu_seqlens_k, stream);
        let backend = dispatcher()
            .backend(GENERATED)
            .ok_or_else(|| PyRuntimeError::new_err("the generated backend is not registered"))?;
        py.detach(|| -> Result<(), DispatchError> {
            bind_device(ordinal)?;
            backend.call_fwd(&call, &support).map(|_| ())
        })
        .map_err(py_err)?;
        Ok(GENERATED)
    })
}

/// Run the generated backward on the context of a forward by `producer`
/// (`generated`, `torch-flash`, `torch-cudnn`): dQ, dK, dV into
/// caller-allocated memory; `workspace` holds `bwd_workspace_bytes(problem)`
/// bytes (16-byte aligned).
#[pyfunction]
#[pyo3(signature = (problem, producer, q, k, v, o, d_o, dq, dk, dv, lse, cu_seqlens_q, cu_seqlens_k, workspace, workspace_bytes, stream, device))]
#[allow(clippy::too_many_arguments)]
fn bwd(
    py: Python<'_>,
    problem: &Bound<'_, PyAny>,
    producer: &str,
    q: PyTensor,
    k: PyTensor,
    v: PyTensor,
    o: PyTensor,
    d_o: PyTensor,
    dq: PyTensor,
    dk: PyTensor,
    dv: PyTensor,
    lse: u64,
    cu_seqlens_q: u64,
    cu_seqlens_k: u64,
    workspace: u64,
    workspace_bytes: u64,
    stream: u64,
    device: i64,
) -> PyResult<()> {
    guarded(|| {
        let mut p = problem_of(problem)?;
        p.requires_grad = true;
        p.validate().map_err(|e| value_error(e.to_string()))?;
        let support = generated_support(&p, Direction::Bwd)?;
        let ordinal = device_index(device)?;
        let d = dispatcher();
        let producer = d.backend(producer).ok_or_else(|| {
            value_error(format!(
                "unknown producer backend `{producer}` (registered: {})",
                d.backend_names().join(", ")
            ))
        })?;
        let fwd = fwd_call(p, [q, k, v, o], lse, cu_seqlens_q, cu_seqlens_k, 0);
        let ctx = FwdContext::new(producer.as_ref(), &fwd).map_err(|e| py_err(e.into()))?;
        let call = BwdCall {
            d_o: tensor(d_o),
            q: fwd.q,
            k: fwd.k,
            v: fwd.v,
            o: fwd.o,
            dq: tensor(dq),
            dk: tensor(dk),
            dv: tensor(dv),
            attn_bias: None,
            workspace: Workspace {
                ptr: workspace,
                bytes: usize::try_from(workspace_bytes).map_err(|_| value_error("workspace_bytes too large"))?,
            },
            stream: stream as usize,
        };
        let backend = d
            .backend(GENERATED)
            .ok_or_else(|| PyRuntimeError::new_err("the generated backend is not registered"))?;
        let r = py.detach(|| -> Result<(), DispatchError> {
            bind_device(ordinal)?;
            backend.call_bwd(&call, &ctx, &support)
        });
        r.map_err(py_err)
    })
}

/// Workspace bytes the generated forward needs (0 today).
#[pyfunction]
fn fwd_workspace_bytes(problem: &Bound<'_, PyAny>) -> PyResult<usize> {
    guarded(|| {
        let p = problem_of(problem)?;
        let b = dispatcher()
            .backend(GENERATED)
            .ok_or_else(|| PyRuntimeError::new_err("the generated backend is not registered"))?;
        Ok(b.workspace_bytes(Direction::Fwd, &p))
    })
}

/// Workspace bytes the generated backward needs: Dsum (f32, LSE-sized,
/// rounded up to 16 bytes) + the f32 dQ accumulator (fast mode).
#[pyfunction]
fn bwd_workspace_bytes(problem: &Bound<'_, PyAny>) -> PyResult<usize> {
    guarded(|| {
        let mut p = problem_of(problem)?;
        p.requires_grad = true;
        p.validate().map_err(|e| value_error(e.to_string()))?;
        let b = dispatcher()
            .backend(GENERATED)
            .ok_or_else(|| PyRuntimeError::new_err("the generated backend is not registered"))?;
        Ok(b.workspace_bytes(Direction::Bwd, &p))
    })
}

/// The registered backends, in registration order.
#[pyfunction]
fn backends() -> Vec<&'static str> {
    dispatcher().backend_names()
}

/// Set the policy: comma lists of backend names per direction (`None` or
/// "auto" = the default ranking), the debug log switch, and the generated
/// backend's instruction path (`planner` or `sm80`).
#[pyfunction]
#[pyo3(signature = (fwd=None, bwd=None, debug=false, generated_path=None))]
fn set_policy(fwd: Option<&str>, bwd: Option<&str>, debug: bool, generated_path: Option<&str>) -> PyResult<()> {
    guarded(|| {
        let d = dispatcher();
        let path = GeneratedPath::parse(generated_path.unwrap_or("planner"));
        if let GeneratedPath::Invalid(v) = &path {
            return Err(value_error(format!("unknown generated path `{v}` (planner or sm80)")));
        }
        let policy = Policy::auto()
            .with_fwd(fwd.unwrap_or("auto"))
            .with_bwd(bwd.unwrap_or("auto"))
            .with_debug(debug)
            .with_generated_path(path);
        for list in [&policy.fwd, &policy.bwd].into_iter().flatten() {
            for name in &list.names {
                if d.backend(name).is_none() {
                    return Err(value_error(format!(
                        "unknown backend `{name}` (registered: {})",
                        d.backend_names().join(", ")
                    )));
                }
            }
        }
        d.set_policy(policy);
        POLICY_EPOCH.fetch_add(1, Ordering::Release);
        Ok(())
    })
}

/// Bumped by every [`set_policy`]: the Python eager fast path keys its cache
/// of decisions on it, so a policy change is never served a stale route.
static POLICY_EPOCH: AtomicU64 = AtomicU64::new(0);

/// How many times the policy was set in this process (see [`set_policy`]).
#[pyfunction]
fn policy_epoch() -> u64 {
    POLICY_EPOCH.load(Ordering::Acquire)
}

/// The policy in effect, as `fwd=... bwd=...`.
#[pyfunction]
fn policy() -> String {
    dispatcher().policy().to_string()
}

/// Whether a CUDA driver library can be loaded in this process.
#[pyfunction]
fn driver_available() -> bool {
    launch::driver_available()
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(explain, m)?)?;
    m.add_function(wrap_pyfunction!(decide, m)?)?;
    m.add_function(wrap_pyfunction!(fwd, m)?)?;
    m.add_function(wrap_pyfunction!(bwd, m)?)?;
    m.add_function(wrap_pyfunction!(fwd_workspace_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(bwd_workspace_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(backends, m)?)?;
    m.add_function(wrap_pyfunction!(set_policy, m)?)?;
    m.add_function(wrap_pyfunction!(policy, m)?)?;
    m.add_function(wrap_pyfunction!(driver_available, m)?)?;
    m.add_function(wrap_pyfunction!(policy_epoch, m)?)?;
    m.add_class::<FwdLaunch>()?;
    m.add_class::<BwdLaunch>()?;
    m.add("PROBLEM_FIELDS", TUPLE_FIELDS.to_vec())?;
    m.add("FLAG_ATTN_MASK", FLAG_ATTN_MASK)?;
    m.add("FLAG_REQUIRES_GRAD", FLAG_REQUIRES_GRAD)?;
    m.add("FLAG_DETERMINISTIC", FLAG_DETERMINISTIC)?;
    m.add("FLAG_EQUAL_SEQLENS", FLAG_EQUAL_SEQLENS)?;
    // Keys from which the ranking treats a problem as long (its one size class).
    m.add("LONG_KEYS", attnforge::dispatch::LONG_KEYS)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
