//! A plain C ABI over the dispatch core: pointers, shapes, strides, a stream;
//! no Python. `include/attnforge.h` declares exactly these symbols (a unit
//! test parses the header and compares names, arity, struct fields and
//! constants; another compiles it with `cc` when one is installed).
//!
//! The root crate stays an `rlib`: the `cdylib` that exports these symbols to
//! C comes with the JAX front end as a small wrapper crate
//! (`crate-type = ["cdylib"]`, `pub use attnforge::capi::*;`), so ordinary
//! builds do not pay for a second link.
//!
//! Conventions: every function returns an `int` status (`ATTNFORGE_OK` = 0)
//! except `attnforge_last_error` (message length) and
//! `attnforge_status_string` (static text). No panic crosses the boundary
//! (`catch_unwind` → `ATTNFORGE_ERR_PANIC`). The last error message is per
//! thread. Text outputs are NUL-terminated and truncated to the buffer
//! (`ATTNFORGE_ERR_TRUNCATED` says so).
//!
//! The C ABI uses [`Dispatcher::global`]: the generated backend, the policy
//! from `ATTNFORGE_BACKEND_FWD/BWD`, `ATTNFORGE_DEBUG`, `ATTNFORGE_GENERATED_PATH`.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::dispatch::{
    BwdCall, ComputeCapability, DispatchError, Dispatcher, ElemType, FwdCall, FwdContext, LseLayout, Problem,
    Workspace, GENERATED,
};
use crate::launch::{self, LaunchError, TensorArg};
use crate::spec::{Direction, Layout, Mask};

/// Bumped on any change of a struct layout or a signature.
pub const ATTNFORGE_ABI_VERSION: c_int = 1;

pub const ATTNFORGE_OK: c_int = 0;
pub const ATTNFORGE_ERR_INVALID_ARGUMENT: c_int = 1;
pub const ATTNFORGE_ERR_NO_BACKEND: c_int = 2;
pub const ATTNFORGE_ERR_FRONT_END: c_int = 3;
pub const ATTNFORGE_ERR_BUILD: c_int = 4;
pub const ATTNFORGE_ERR_CUDA: c_int = 5;
pub const ATTNFORGE_ERR_TRUNCATED: c_int = 6;
pub const ATTNFORGE_ERR_PANIC: c_int = 7;

pub const ATTNFORGE_DTYPE_F16: c_int = 0;
pub const ATTNFORGE_DTYPE_BF16: c_int = 1;
pub const ATTNFORGE_DTYPE_F32: c_int = 2;

pub const ATTNFORGE_LAYOUT_DENSE: c_int = 0;
pub const ATTNFORGE_LAYOUT_THD: c_int = 1;

pub const ATTNFORGE_MASK_NONE: c_int = 0;
pub const ATTNFORGE_MASK_CAUSAL_TOP_LEFT: c_int = 1;
pub const ATTNFORGE_MASK_CAUSAL_BOTTOM_RIGHT: c_int = 2;
pub const ATTNFORGE_MASK_WINDOW: c_int = 3;

pub const ATTNFORGE_FLAG_ATTN_MASK: u32 = 1;
pub const ATTNFORGE_FLAG_REQUIRES_GRAD: u32 = 2;
pub const ATTNFORGE_FLAG_DETERMINISTIC: u32 = 4;
pub const ATTNFORGE_FLAG_EQUAL_SEQLENS: u32 = 8;

pub const ATTNFORGE_LSE_DENSE: c_int = 0;
pub const ATTNFORGE_LSE_PACKED: c_int = 1;
pub const ATTNFORGE_LSE_PADDED: c_int = 2;

const KNOWN_FLAGS: u32 = ATTNFORGE_FLAG_ATTN_MASK
    | ATTNFORGE_FLAG_REQUIRES_GRAD
    | ATTNFORGE_FLAG_DETERMINISTIC
    | ATTNFORGE_FLAG_EQUAL_SEQLENS;

/// `attnforge_problem`: one attention call. `size` = `sizeof(attnforge_problem)`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AttnforgeProblem {
    pub size: u32,
    pub dtype: i32,
    pub layout: i32,
    pub mask: i32,
    pub head_dim_qk: u32,
    pub head_dim_v: u32,
    pub batch: u32,
    pub heads_q: u32,
    pub heads_kv: u32,
    pub seqlen_q: u32,
    pub seqlen_k: u32,
    pub total_q: u32,
    pub total_k: u32,
    pub window_left: i32,
    pub window_right: i32,
    pub scale: f32,
    pub softcap: f32,
    pub dropout_p: f32,
    pub flags: u32,
    pub cc_major: i32,
    pub cc_minor: i32,
    pub reserved: u32,
    pub cu_seqlens_q: *const i32,
    pub cu_seqlens_k: *const i32,
}

/// `attnforge_tensor`: a device pointer and (batch, seq, head) strides in elements.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AttnforgeTensor {
    pub ptr: *mut c_void,
    pub stride_batch: i64,
    pub stride_seq: i64,
    pub stride_head: i64,
}

/// `attnforge_fwd_context`: what the forward leaves for a backward.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AttnforgeFwdContext {
    pub size: u32,
    pub lse_layout: i32,
    pub lse_dims: [u32; 3],
    pub scale: f32,
    pub backend: [c_char; 32],
}

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

fn set_last_error(msg: String) {
    LAST_ERROR.with(|e| *e.borrow_mut() = msg);
}

/// A failure on its way out: status and message.
struct Failure(c_int, String);

impl From<DispatchError> for Failure {
    fn from(e: DispatchError) -> Self {
        let status = match &e {
            DispatchError::Problem(_) | DispatchError::Context(_) | DispatchError::DuplicateBackend { .. } => {
                ATTNFORGE_ERR_INVALID_ARGUMENT
            }
            DispatchError::NoBackend { .. }
            | DispatchError::PolicyDeclined { .. }
            | DispatchError::UnknownBackend { .. }
            | DispatchError::DirectionUnsupported { .. } => ATTNFORGE_ERR_NO_BACKEND,
            DispatchError::ExecutedByFrontEnd { .. } => ATTNFORGE_ERR_FRONT_END,
            DispatchError::Build { .. } => ATTNFORGE_ERR_BUILD,
            DispatchError::Launch(LaunchError::InvalidArgument { .. } | LaunchError::SpecMismatch { .. }) => {
                ATTNFORGE_ERR_INVALID_ARGUMENT
            }
            DispatchError::Launch(LaunchError::NoDriver | LaunchError::Driver { .. }) => ATTNFORGE_ERR_CUDA,
        };
        Failure(status, e.to_string())
    }
}

fn invalid(msg: impl Into<String>) -> Failure {
    Failure(ATTNFORGE_ERR_INVALID_ARGUMENT, msg.into())
}

/// Run `f`, turn errors and panics into a status and the last error.
fn guard(f: impl FnOnce() -> Result<c_int, Failure>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(status)) => {
            if status == ATTNFORGE_OK {
                set_last_error(String::new());
            }
            status
        }
        Ok(Err(Failure(status, msg))) => {
            set_last_error(msg);
            status
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last_error(format!("internal error (panic): {what}"));
            ATTNFORGE_ERR_PANIC
        }
    }
}

/// Copy `s` into `buf` (NUL-terminated, cut at a char boundary); true if it all fit.
///
/// # Safety
/// `buf` is null or valid for `len` bytes.
unsafe fn write_text(buf: *mut c_char, len: usize, s: &str) -> bool {
    if buf.is_null() || len == 0 {
        return s.is_empty() && buf.is_null();
    }
    let mut n = s.len().min(len - 1);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    // SAFETY: n < len bytes of buf, then the NUL at n < len.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf as *mut u8, n);
        *buf.add(n) = 0;
    }
    n == s.len()
}

/// The Rust problem of a C problem; `cc_major == 0` asks the current device.
///
/// # Safety
/// `p` is null or points to a readable `attnforge_problem`.
unsafe fn read_problem(p: *const AttnforgeProblem) -> Result<(Problem, Option<u64>, Option<u64>), Failure> {
    if p.is_null() {
        return Err(invalid("problem is NULL"));
    }
    // SAFETY: non-null, and the caller promises a readable struct; the size
    // field is read first so a version skew is reported, not misread.
    let size = unsafe { std::ptr::addr_of!((*p).size).read_unaligned() };
    if size as usize != std::mem::size_of::<AttnforgeProblem>() {
        return Err(invalid(format!(
            "problem.size is {size}, this library's attnforge_problem has {} bytes (header/library version skew?)",
            std::mem::size_of::<AttnforgeProblem>()
        )));
    }
    // SAFETY: as above, the full struct is readable.
    let c = unsafe { p.read_unaligned() };
    let dtype = match c.dtype {
        ATTNFORGE_DTYPE_F16 => ElemType::F16,
        ATTNFORGE_DTYPE_BF16 => ElemType::Bf16,
        ATTNFORGE_DTYPE_F32 => ElemType::F32,
        v => return Err(invalid(format!("problem.dtype {v} is not an ATTNFORGE_DTYPE_* value"))),
    };
    let layout = match c.layout {
        ATTNFORGE_LAYOUT_DENSE => Layout::Dense,
        ATTNFORGE_LAYOUT_THD => Layout::Thd,
        v => {
            return Err(invalid(format!(
                "problem.layout {v} is not an ATTNFORGE_LAYOUT_* value"
            )))
        }
    };
    let mask = match c.mask {
        ATTNFORGE_MASK_NONE => Mask::None,
        ATTNFORGE_MASK_CAUSAL_TOP_LEFT => Mask::CausalTopLeft,
        ATTNFORGE_MASK_CAUSAL_BOTTOM_RIGHT => Mask::CausalBottomRight,
        ATTNFORGE_MASK_WINDOW => Mask::SlidingWindow,
        v => return Err(invalid(format!("problem.mask {v} is not an ATTNFORGE_MASK_* value"))),
    };
    if c.flags & !KNOWN_FLAGS != 0 {
        return Err(invalid(format!(
            "problem.flags has unknown bits {:#x}",
            c.flags & !KNOWN_FLAGS
        )));
    }
    let cc = if c.cc_major == 0 {
        launch::ensure_context(0)
            .and_then(|_| launch::current_compute_capability())
            .map_err(|e| {
                invalid(format!(
                    "cc_major = 0 asks for the current device's compute capability, which failed ({e}); \
                     set cc_major/cc_minor"
                ))
            })?
    } else {
        (c.cc_major, c.cc_minor)
    };
    let cc = match (u8::try_from(cc.0), u8::try_from(cc.1)) {
        (Ok(ma), Ok(mi)) if mi <= 9 => ComputeCapability::new(ma, mi),
        _ => return Err(invalid(format!("compute capability {}.{} is not valid", cc.0, cc.1))),
    };
    let ptr = |x: *const i32| (!x.is_null()).then_some(x as u64);
    let (cu_q, cu_k) = (ptr(c.cu_seqlens_q), ptr(c.cu_seqlens_k));
    let problem = Problem {
        dtype,
        head_dim_qk: c.head_dim_qk,
        head_dim_v: c.head_dim_v,
        layout,
        batch: c.batch,
        heads_q: c.heads_q,
        heads_kv: c.heads_kv,
        seqlen_q: c.seqlen_q,
        seqlen_k: c.seqlen_k,
        total_q: c.total_q,
        total_k: c.total_k,
        mask,
        window: (c.window_left, c.window_right),
        softcap: c.softcap,
        scale: (c.scale != 0.0).then_some(c.scale),
        dropout_p: c.dropout_p,
        attn_mask: c.flags & ATTNFORGE_FLAG_ATTN_MASK != 0,
        thd_equal_seqlens: c.flags & ATTNFORGE_FLAG_EQUAL_SEQLENS != 0 || (cu_q.is_some() && cu_q == cu_k),
        requires_grad: c.flags & ATTNFORGE_FLAG_REQUIRES_GRAD != 0,
        deterministic: c.flags & ATTNFORGE_FLAG_DETERMINISTIC != 0,
        cc,
    };
    Ok((problem, cu_q, cu_k))
}

/// # Safety
/// `t` is null or points to a readable `attnforge_tensor`.
unsafe fn read_tensor(t: *const AttnforgeTensor, name: &str) -> Result<TensorArg, Failure> {
    if t.is_null() {
        return Err(invalid(format!("tensor {name} is NULL")));
    }
    // SAFETY: non-null; the caller promises a readable struct.
    let t = unsafe { t.read_unaligned() };
    Ok(TensorArg {
        ptr: t.ptr as u64,
        stride_batch: t.stride_batch,
        stride_seq: t.stride_seq,
        stride_head: t.stride_head,
    })
}

fn context_out(ctx: &FwdContext) -> AttnforgeFwdContext {
    let (lse_layout, lse_dims) = match ctx.lse_layout {
        LseLayout::Dense { batch, heads, seqlen_q } => (ATTNFORGE_LSE_DENSE, [batch, heads, seqlen_q]),
        LseLayout::Packed { heads, total_q } => (ATTNFORGE_LSE_PACKED, [heads, total_q, 0]),
        LseLayout::Padded {
            batch,
            heads,
            max_seqlen_q,
        } => (ATTNFORGE_LSE_PADDED, [batch, heads, max_seqlen_q]),
    };
    let mut backend = [0 as c_char; 32];
    for (dst, src) in backend.iter_mut().zip(ctx.producer.bytes().take(31)) {
        *dst = src as c_char;
    }
    AttnforgeFwdContext {
        size: std::mem::size_of::<AttnforgeFwdContext>() as u32,
        lse_layout,
        lse_dims,
        scale: ctx.scale,
        backend,
    }
}

/// The ABI version this library implements (`ATTNFORGE_ABI_VERSION`).
#[no_mangle]
pub extern "C" fn attnforge_abi_version() -> c_int {
    ATTNFORGE_ABI_VERSION
}

/// Static text for a status code.
#[no_mangle]
pub extern "C" fn attnforge_status_string(status: c_int) -> *const c_char {
    let s: &'static [u8] = match status {
        ATTNFORGE_OK => b"ok\0",
        ATTNFORGE_ERR_INVALID_ARGUMENT => b"invalid argument\0",
        ATTNFORGE_ERR_NO_BACKEND => b"no backend supports the problem\0",
        ATTNFORGE_ERR_FRONT_END => b"the chosen backend is executed by the front end\0",
        ATTNFORGE_ERR_BUILD => b"building the kernel failed\0",
        ATTNFORGE_ERR_CUDA => b"CUDA driver error\0",
        ATTNFORGE_ERR_TRUNCATED => b"output truncated\0",
        ATTNFORGE_ERR_PANIC => b"internal error\0",
        _ => b"unknown status\0",
    };
    s.as_ptr() as *const c_char
}

/// Copy this thread's last error message into `buf` (NUL-terminated,
/// truncated to `len`); returns the message's full length in bytes (0 = the
/// last call succeeded). `buf` may be NULL to ask for the length.
///
/// # Safety
/// `buf` is NULL or valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn attnforge_last_error(buf: *mut c_char, len: usize) -> usize {
    catch_unwind(|| {
        LAST_ERROR.with(|e| {
            let e = e.borrow();
            // SAFETY: forwarded from the caller.
            unsafe { write_text(buf, len, &e) };
            e.len()
        })
    })
    .unwrap_or(0)
}

/// Run the forward of `problem` on the backend the dispatcher chooses, on
/// `stream` (a `CUstream`; NULL = legacy default stream). `lse` receives the
/// f32 LSE in the layout `ctx_out` reports (dense `[B, H, Sq]`, THD
/// `[H, total_q]`); NULL = not wanted (inference: the generated forward
/// writes O only, and a backward refuses that context). `ctx_out` may be NULL.
///
/// # Safety
/// Struct pointers are NULL or readable; device pointers belong to the
/// current CUDA context and are large enough for the shapes and strides;
/// `ctx_out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn attnforge_fwd(
    problem: *const AttnforgeProblem,
    q: *const AttnforgeTensor,
    k: *const AttnforgeTensor,
    v: *const AttnforgeTensor,
    o: *const AttnforgeTensor,
    lse: *mut f32,
    stream: *mut c_void,
    ctx_out: *mut AttnforgeFwdContext,
) -> c_int {
    guard(|| {
        // SAFETY: forwarded from the caller's contract.
        let (problem, cu_q, cu_k) = unsafe { read_problem(problem)? };
        // SAFETY: as above.
        let (q, k, v, o) = unsafe {
            (
                read_tensor(q, "q")?,
                read_tensor(k, "k")?,
                read_tensor(v, "v")?,
                read_tensor(o, "o")?,
            )
        };
        let mut call = FwdCall::new(problem, q, k, v, o, lse as u64);
        call.cu_seqlens_q = cu_q;
        call.cu_seqlens_k = cu_k;
        call.stream = stream as usize;
        let ctx = Dispatcher::global().fwd(&call)?;
        if !ctx_out.is_null() {
            // SAFETY: non-null, writable per the contract.
            unsafe { ctx_out.write_unaligned(context_out(&ctx)) };
        }
        Ok(ATTNFORGE_OK)
    })
}

/// The workspace bytes the backward of `problem` needs on the backend the
/// dispatcher chooses for it (0 when it needs none), into `*bytes_out`.
///
/// # Safety
/// `problem` is NULL or readable; `bytes_out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn attnforge_bwd_workspace_size(
    problem: *const AttnforgeProblem,
    bytes_out: *mut usize,
) -> c_int {
    guard(|| {
        if bytes_out.is_null() {
            return Err(invalid("bytes_out is NULL"));
        }
        // SAFETY: forwarded from the caller's contract.
        let (problem, _, _) = unsafe { read_problem(problem)? };
        let d = Dispatcher::global();
        let decision = d.decide_problem(&problem)?;
        let chosen = decision.bwd.chosen()?;
        let bytes = chosen.backend.workspace_bytes(Direction::Bwd, &problem);
        // SAFETY: non-null, writable per the contract.
        unsafe { bytes_out.write_unaligned(bytes) };
        Ok(ATTNFORGE_OK)
    })
}

/// Run the backward of `problem` on the backend the dispatcher chooses, on
/// `stream`. `lse` is the forward's f32 LSE in attnforge's layout (dense
/// `[B, H, Sq]`, THD `[H, total_q]`: what `attnforge_fwd` writes, and what
/// FlashAttention-2 and cuDNN write for the same problems). Outputs: `dq`
/// (like `q`), `dk`, `dv` (like `k`, `v`). `workspace`: at least
/// `attnforge_bwd_workspace_size` bytes of device memory, 16-byte aligned,
/// not used by other work until the backward completes.
///
/// # Safety
/// Struct pointers are NULL or readable; device pointers belong to the
/// current CUDA context and are large enough for the shapes and strides; the
/// workspace holds `workspace_bytes` bytes.
#[no_mangle]
pub unsafe extern "C" fn attnforge_bwd(
    problem: *const AttnforgeProblem,
    q: *const AttnforgeTensor,
    k: *const AttnforgeTensor,
    v: *const AttnforgeTensor,
    o: *const AttnforgeTensor,
    d_o: *const AttnforgeTensor,
    dq: *const AttnforgeTensor,
    dk: *const AttnforgeTensor,
    dv: *const AttnforgeTensor,
    lse: *const f32,
    workspace: *mut c_void,
    workspace_bytes: usize,
    stream: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: forwarded from the caller's contract.
        let (problem, cu_q, cu_k) = unsafe { read_problem(problem)? };
        let mut problem = problem;
        problem.requires_grad = true;
        // SAFETY: as above.
        let call = unsafe {
            BwdCall {
                q: read_tensor(q, "q")?,
                k: read_tensor(k, "k")?,
                v: read_tensor(v, "v")?,
                o: read_tensor(o, "o")?,
                d_o: read_tensor(d_o, "d_o")?,
                dq: read_tensor(dq, "dq")?,
                dk: read_tensor(dk, "dk")?,
                dv: read_tensor(dv, "dv")?,
                attn_bias: None,
                workspace: Workspace {
                    ptr: workspace as u64,
                    bytes: workspace_bytes,
                },
                stream: stream as usize,
            }
        };
        let d = Dispatcher::global();
        // The C ABI's forward is the generated one: its context, rebuilt from
        // the problem (scale, mask, cu_seqlens) and the caller's LSE.
        let producer = d.backend(GENERATED).ok_or_else(|| {
            Failure(
                ATTNFORGE_ERR_NO_BACKEND,
                "the generated backend is not registered".into(),
            )
        })?;
        let mut fwd = FwdCall::new(problem, call.q, call.k, call.v, call.o, lse as u64);
        fwd.cu_seqlens_q = cu_q;
        fwd.cu_seqlens_k = cu_k;
        let ctx = FwdContext::new(producer.as_ref(), &fwd).map_err(DispatchError::from)?;
        d.bwd(&call, &ctx)?;
        Ok(ATTNFORGE_OK)
    })
}

/// Write the dispatcher's explanation for `problem` (chosen backends, every
/// candidate with its reason, the kernel spec) into `buf`. Needs no GPU when
/// `cc_major` is set. `ATTNFORGE_ERR_TRUNCATED` when `buf` is too small
/// (the text is cut, NUL-terminated; `attnforge_last_error` gives the length
/// needed).
///
/// # Safety
/// `problem` is NULL or readable; `buf` is NULL or valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn attnforge_explain(problem: *const AttnforgeProblem, buf: *mut c_char, len: usize) -> c_int {
    guard(|| {
        // SAFETY: forwarded from the caller's contract.
        let (problem, _, _) = unsafe { read_problem(problem)? };
        let text = Dispatcher::global().explain(&problem)?;
        // SAFETY: forwarded from the caller's contract.
        if unsafe { write_text(buf, len, &text) } {
            Ok(ATTNFORGE_OK)
        } else {
            Err(Failure(
                ATTNFORGE_ERR_TRUNCATED,
                format!("explanation needs {} bytes plus the NUL; buffer has {len}", text.len()),
            ))
        }
    })
}

#[cfg(test)]
mod tests;
