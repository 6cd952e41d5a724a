//! Stage 6 of the pipeline: **launch** a compiled kernel on a caller's stream.
//!
//! The launcher takes raw device pointers, shapes, strides and a `CUstream`
//! (so torch and XLA can hand theirs over), checks every argument before
//! anything runs ([`check_fwd`], pure and unit-tested without a GPU), and only
//! then calls the driver. It never launches on invalid input.
//!
//! Tensor conventions (elements, not bytes; the head-dim stride must be 1):
//! - dense: Q/O `[batch, seqlen_q, heads_q, d]`, K/V `[batch, seqlen_k, heads_kv, d]`
//!   with any (batch, seq, head) strides — BSHD, BHSD, SBHD and views into a
//!   packed qkv all fit;
//! - THD (ragged): `[total_tokens, heads, d]`, `cu_seqlens_q/k` int32 prefix sums
//!   of length `batch + 1`; the batch stride is ignored; the sm90a forward also
//!   needs `total_k` (its TMA descriptors bound the K/V reads).
//!
//! The sm90a forward reads through TMA descriptors: a stride of 0 over a
//! dimension longer than 1 (a broadcast view) is refused with a typed error;
//! pass a materialized tensor (the torch front end copies such views).
//!
//! LSE (f32, natural log) is written contiguous: `[batch, heads_q, seqlen_q]`
//! dense, `[heads_q, total_q]` THD. That is the context any backward consumes.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{result, sys};
use thiserror::Error;

use crate::jit::CompiledKernel;
use crate::plan::{GridRule, KernelPlan, Template};
use crate::spec::{Arch, AttnSpec, Direction, Layout, Mask};

#[derive(Debug, Error, Clone, PartialEq)]
pub enum LaunchError {
    #[error("no CUDA driver (libcuda.so) found on this machine")]
    NoDriver,
    #[error("CUDA driver call {call} failed: {code}")]
    Driver { call: &'static str, code: String },
    #[error("invalid argument `{arg}`: {reason}")]
    InvalidArgument { arg: &'static str, reason: String },
    #[error("kernel `{spec}` does not match the problem: {reason}")]
    SpecMismatch { spec: String, reason: String },
}

fn invalid(arg: &'static str, reason: impl Into<String>) -> LaunchError {
    LaunchError::InvalidArgument {
        arg,
        reason: reason.into(),
    }
}

fn driver_err(call: &'static str) -> impl Fn(result::DriverError) -> LaunchError {
    move |e| LaunchError::Driver {
        call,
        code: format!("{e:?}"),
    }
}

/// A Q/K/V/O tensor: device pointer and strides in elements for
/// (batch, seq, head); the head-dim stride is 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TensorArg {
    pub ptr: u64,
    pub stride_batch: i64,
    pub stride_seq: i64,
    pub stride_head: i64,
}

impl TensorArg {
    /// Contiguous BSHD `[b, s, h, d]`.
    pub fn bshd(ptr: u64, seqlen: i64, heads: i64, d: i64) -> Self {
        TensorArg {
            ptr,
            stride_batch: seqlen * heads * d,
            stride_seq: heads * d,
            stride_head: d,
        }
    }
    /// Contiguous BHSD `[b, h, s, d]`.
    pub fn bhsd(ptr: u64, seqlen: i64, heads: i64, d: i64) -> Self {
        TensorArg {
            ptr,
            stride_batch: seqlen * heads * d,
            stride_seq: d,
            stride_head: seqlen * d,
        }
    }
    /// Packed THD `[total, h, d]`.
    pub fn thd(ptr: u64, heads: i64, d: i64) -> Self {
        TensorArg {
            ptr,
            stride_batch: 0,
            stride_seq: heads * d,
            stride_head: d,
        }
    }
}

/// Run-time shape and values of one forward call.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FwdProblem {
    pub batch: u32,
    pub heads_q: u32,
    pub heads_kv: u32,
    /// Dense: the sequence lengths. THD: the maximum lengths over the batch.
    pub seqlen_q: u32,
    pub seqlen_k: u32,
    /// THD only: device pointers to int32 `[batch + 1]` prefix sums, and the totals.
    pub cu_seqlens_q: Option<u64>,
    pub cu_seqlens_k: Option<u64>,
    pub total_q: u32,
    /// THD only: total key tokens (rows of K and V). The sm90a forward needs
    /// it (its TMA descriptors bound the reads); 0 = unknown, which the other
    /// kernels accept.
    pub total_k: u32,
    /// Softmax scale; `None` = 1/sqrt(head_dim_qk).
    pub scale: Option<f32>,
    /// Softcap value (> 0) for softcap specs; must be 0 otherwise.
    pub softcap: f32,
    /// Sliding window (left, right), -1 = unbounded; window specs only.
    pub window: (i32, i32),
}

/// Device buffers of one forward call.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FwdArgs {
    pub q: TensorArg,
    pub k: TensorArg,
    pub v: TensorArg,
    pub o: TensorArg,
    /// f32 LSE output, contiguous in the layout documented above; `None`:
    /// not wanted (inference), the kernel writes O only. A call without it
    /// leaves nothing that a backward could consume.
    pub lse: Option<u64>,
    pub problem: FwdProblem,
}

/// The kernel's parameter block; layout identical to `FwdParams` in
/// `templates/fwd_sm80.cu` (checked by a unit test on the size and by the
/// GPU suite on the values).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FwdParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub lse: u64,
    pub cu_seqlens_q: u64,
    pub cu_seqlens_k: u64,
    pub q_sb: i64,
    pub q_ss: i64,
    pub q_sh: i64,
    pub k_sb: i64,
    pub k_ss: i64,
    pub k_sh: i64,
    pub v_sb: i64,
    pub v_ss: i64,
    pub v_sh: i64,
    pub o_sb: i64,
    pub o_ss: i64,
    pub o_sh: i64,
    pub lse_sb: i64,
    pub lse_sh: i64,
    pub batch: i32,
    pub heads_q: i32,
    pub heads_kv: i32,
    pub gqa_ratio: i32,
    pub seqlen_q: i32,
    pub seqlen_k: i32,
    pub window_left: i32,
    pub window_right: i32,
    pub scale_log2: f32,
    pub softcap_pre: f32,
    pub softcap_post: f32,
    pub num_m_blocks: i32,
    /// The one-tile entry's causal block order in phases
    /// (`templates/common/order.cuh`; 1 = head-major, the checked default).
    pub tile_phases: i32,
    /// Nonzero: the sm90a one-tile entry and the sm80-path forward (without a
    /// mask) take a ragged batch's sequences longest keys first (`ragged_order` in
    /// `templates/common/order.cuh`; batches up to 64 sequences). 0, the
    /// checked default: the grid's order.
    pub ragged_order: i32,
}

/// Grid and block of a checked launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchDims {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub smem: u32,
}

const LOG2_E: f32 = std::f32::consts::LOG2_E;

/// Most work tiles of an sm90a forward launch: the kernel indexes tiles in
/// `int` (one tile per block: `x + y * gridDim.x`; persistent: `tile +=
/// gridDim.x` with at most 65536 blocks), which stays within range.
pub const MAX_PERSISTENT_TILES: u64 = i32::MAX as u64 - 65536;
/// Most blocks of a persistent launch.
pub const MAX_PERSISTENT_GRID: u32 = 65536;
/// [`LoadedKernel::set_persistent_grid`]'s value for "the one-tile entry"
/// (wherever grid.y holds the query blocks; past that only the walk can run).
pub const ONE_TILE: u32 = u32::MAX;

/// Validate a forward call against its plan and build the parameter block.
/// Returns `Ok(None)` when there is nothing to compute (an empty problem).
pub fn check_fwd(plan: &KernelPlan, a: &FwdArgs) -> Result<Option<(FwdParams, LaunchDims)>, LaunchError> {
    let spec: &AttnSpec = &plan.spec;
    let p = &a.problem;
    if spec.direction != Direction::Fwd {
        return Err(LaunchError::SpecMismatch {
            spec: spec.to_string(),
            reason: "not a forward kernel".into(),
        });
    }
    let scale = check_problem(spec, p)?;

    check_tensors(spec.layout, &[("q", &a.q), ("k", &a.k), ("v", &a.v), ("o", &a.o)])?;
    if let Some(lse) = a.lse {
        if lse == 0 || !lse.is_multiple_of(4) {
            return Err(invalid(
                "lse",
                "LSE pointer must be non-null and 4-byte aligned (leave it out for no LSE)",
            ));
        }
    }

    if spec.layout == Layout::Thd && plan.template == Template::FwdSm90a && p.total_k == 0 && p.seqlen_k > 0 {
        return Err(invalid(
            "total_k",
            "the sm90a forward bounds its K/V reads by total_k: give the number of key tokens of the ragged batch",
        ));
    }
    check_output_disjoint(
        spec.layout,
        "o",
        &a.o,
        (
            p.batch,
            output_rows(spec.layout, p.seqlen_q, p.total_q),
            p.heads_q,
            spec.head_dim_v as u32,
        ),
    )?;
    let batch = p.batch;
    if batch == 0 || p.seqlen_q == 0 {
        return Ok(None);
    }
    let (lse_sb, lse_sh) = match spec.layout {
        Layout::Dense => ((p.heads_q as i64) * p.seqlen_q as i64, p.seqlen_q as i64),
        Layout::Thd => {
            if p.total_q == 0 {
                return Ok(None);
            }
            (0, p.total_q as i64)
        }
    };
    let num_m_blocks = p.seqlen_q.div_ceil(plan.block_m);
    let bh = batch as u64 * p.heads_q as u64;
    let tiles = bh * num_m_blocks as u64;
    if plan.template == Template::FwdSm90a && tiles > MAX_PERSISTENT_TILES {
        return Err(invalid(
            "batch",
            format!(
                "batch * heads_q * ceil(seqlen_q / {}) = {tiles} work tiles exceeds {MAX_PERSISTENT_TILES}",
                plan.block_m
            ),
        ));
    }
    let grid = match plan.grid {
        // The walk entry takes any number of query blocks: the launcher
        // walks with it where grid.y would not hold them.
        GridRule::TilesOrWalk => (bh as u32, num_m_blocks, 1),
        GridRule::BatchHeadsByQueryTiles => {
            if num_m_blocks > 65535 {
                return Err(invalid(
                    "seqlen_q",
                    format!(
                        "{} exceeds the grid limit of {} query rows",
                        p.seqlen_q,
                        65535 * plan.block_m
                    ),
                ));
            }
            if bh > i32::MAX as u64 {
                return Err(invalid("batch", "batch * heads_q exceeds 2^31 - 1"));
            }
            // The head-major order numbers the blocks in 32 bits.
            if plan.head_major && bh * num_m_blocks as u64 > u32::MAX as u64 {
                return Err(invalid(
                    "batch",
                    format!("batch * heads_q * {num_m_blocks} query blocks exceeds 2^32 blocks"),
                ));
            }
            (bh as u32, num_m_blocks, 1)
        }
    };
    let (softcap_pre, softcap_post) = if spec.softcap {
        (scale / p.softcap, p.softcap * LOG2_E)
    } else {
        (0.0, 0.0)
    };
    let params = FwdParams {
        q: a.q.ptr,
        k: a.k.ptr,
        v: a.v.ptr,
        o: a.o.ptr,
        lse: a.lse.unwrap_or(0),
        cu_seqlens_q: p.cu_seqlens_q.unwrap_or(0),
        cu_seqlens_k: p.cu_seqlens_k.unwrap_or(0),
        q_sb: a.q.stride_batch,
        q_ss: a.q.stride_seq,
        q_sh: a.q.stride_head,
        k_sb: a.k.stride_batch,
        k_ss: a.k.stride_seq,
        k_sh: a.k.stride_head,
        v_sb: a.v.stride_batch,
        v_ss: a.v.stride_seq,
        v_sh: a.v.stride_head,
        o_sb: a.o.stride_batch,
        o_ss: a.o.stride_seq,
        o_sh: a.o.stride_head,
        lse_sb,
        lse_sh,
        batch: batch as i32,
        heads_q: p.heads_q as i32,
        heads_kv: p.heads_kv as i32,
        gqa_ratio: (p.heads_q / p.heads_kv) as i32,
        seqlen_q: p.seqlen_q as i32,
        seqlen_k: p.seqlen_k as i32,
        window_left: p.window.0,
        window_right: p.window.1,
        scale_log2: scale * LOG2_E,
        softcap_pre,
        softcap_post,
        num_m_blocks: num_m_blocks as i32,
        tile_phases: 1,
        ragged_order: 0,
    };
    let mut params = params;
    if spec.layout == Layout::Thd {
        // The batch stride is meaningless for packed tensors.
        params.q_sb = 0;
        params.k_sb = 0;
        params.v_sb = 0;
        params.o_sb = 0;
    }
    let dims = LaunchDims {
        grid,
        block: (plan.threads(), 1, 1),
        smem: plan.smem_bytes,
    };
    Ok(Some((params, dims)))
}

/// The run-time problem against the spec, for every direction: heads and
/// GQA ratio, sequence-length range, cu_seqlens presence, softcap and window
/// agreement. Returns the softmax scale (default 1/sqrt(head_dim_qk)).
pub(crate) fn check_problem(spec: &AttnSpec, p: &FwdProblem) -> Result<f32, LaunchError> {
    let mismatch = |reason: String| LaunchError::SpecMismatch {
        spec: spec.to_string(),
        reason,
    };
    if p.heads_q == 0 || p.heads_kv == 0 {
        return Err(invalid("heads", "heads_q and heads_kv must be >= 1"));
    }
    if !p.heads_q.is_multiple_of(p.heads_kv) {
        return Err(invalid(
            "heads_kv",
            format!(
                "heads_q ({}) must be a multiple of heads_kv ({}) for GQA/MQA",
                p.heads_q, p.heads_kv
            ),
        ));
    }
    if p.seqlen_q > i32::MAX as u32 || p.seqlen_k > i32::MAX as u32 || p.total_q > i32::MAX as u32 {
        return Err(invalid("seqlen", "sequence lengths must fit in int32"));
    }
    match (spec.layout, p.cu_seqlens_q, p.cu_seqlens_k) {
        (Layout::Thd, Some(cq), Some(ck)) => {
            if cq == 0 || ck == 0 || cq % 4 != 0 || ck % 4 != 0 {
                return Err(invalid(
                    "cu_seqlens",
                    "cu_seqlens pointers must be non-null and 4-byte aligned",
                ));
            }
        }
        (Layout::Thd, _, _) => return Err(mismatch("THD layout needs cu_seqlens_q and cu_seqlens_k".into())),
        (Layout::Dense, None, None) => {}
        (Layout::Dense, _, _) => {
            return Err(mismatch(
                "cu_seqlens given for a dense kernel; use a thd spec for ragged batches".into(),
            ))
        }
    }
    if spec.softcap != (p.softcap != 0.0) {
        return Err(mismatch(if spec.softcap {
            "softcap spec needs a softcap value > 0".into()
        } else {
            format!("softcap {} given to a kernel without softcap", p.softcap)
        }));
    }
    if spec.softcap && !(p.softcap.is_finite() && p.softcap > 0.0) {
        return Err(invalid("softcap", format!("must be finite and > 0, got {}", p.softcap)));
    }
    let window_given = p.window != (-1, -1);
    if spec.mask != Mask::SlidingWindow && window_given {
        return Err(mismatch(format!(
            "window {:?} given to a `{}` kernel",
            p.window, spec.mask
        )));
    }
    if p.window.0 < -1 || p.window.1 < -1 {
        return Err(invalid(
            "window",
            format!("sizes must be >= -1 (-1 = unbounded), got {:?}", p.window),
        ));
    }
    let scale = p.scale.unwrap_or(1.0 / (spec.head_dim_qk as f32).sqrt());
    if !scale.is_finite() || scale <= 0.0 {
        return Err(invalid("scale", format!("must be finite and > 0, got {scale}")));
    }
    Ok(scale)
}

/// Device tensors: non-null, 16-byte aligned rows (tiles move in 16-byte
/// `cp.async` chunks), strides non-negative multiples of 8 elements (the batch
/// stride is ignored for THD).
pub(crate) fn check_tensors(layout: Layout, tensors: &[(&'static str, &TensorArg)]) -> Result<(), LaunchError> {
    for &(name, t) in tensors {
        if t.ptr == 0 {
            return Err(invalid(name, "null pointer"));
        }
        if t.ptr % 16 != 0 {
            return Err(invalid(name, format!("pointer {:#x} is not 16-byte aligned", t.ptr)));
        }
        let strides: &[i64] = if layout == Layout::Dense {
            &[t.stride_batch, t.stride_seq, t.stride_head]
        } else {
            &[t.stride_seq, t.stride_head]
        };
        for &s in strides {
            if s < 0 || s % 8 != 0 {
                return Err(invalid(
                    name,
                    format!("strides must be non-negative multiples of 8 elements (16 bytes), got {s}"),
                ));
            }
        }
    }
    Ok(())
}

/// The rows of one output head: dense `seqlen`; THD the larger of the
/// total (when given) and the longest sequence.
pub(crate) fn output_rows(layout: Layout, seqlen: u32, total: u32) -> u32 {
    match layout {
        Layout::Dense => seqlen,
        Layout::Thd => seqlen.max(total),
    }
}

/// An output tensor must give every (batch, row, head, column) element its
/// own address: strides that make two of them alias (a zero stride, or a
/// head stride below the head dim) would have blocks race on the same
/// memory and return a wrong answer without an error. Inputs may alias
/// (broadcast views read the same rows). `rows`: the rows the kernels write
/// (dense: seqlen; THD: the larger of the total and the longest sequence, the
/// batch stride being unused), `cols`: the head dim. The test is the usual
/// sufficient one: sorted by stride, each dimension's stride lies past
/// everything the smaller ones span; it accepts every permutation of the
/// dimensions, padded rows and views into a packed buffer.
pub(crate) fn check_output_disjoint(
    layout: Layout,
    name: &'static str,
    t: &TensorArg,
    (batch, rows, heads, cols): (u32, u32, u32, u32),
) -> Result<(), LaunchError> {
    if batch == 0 || rows == 0 || heads == 0 || cols == 0 {
        return Ok(()); // no elements
    }
    // On the stack: this runs before every launch (THD has no batch dimension).
    let batch = if layout == Layout::Dense { batch } else { 1 };
    let mut dims = [
        (1u128, cols, "head-dim"),
        (t.stride_head as u128, heads, "head"),
        (t.stride_seq as u128, rows, "sequence"),
        (t.stride_batch as u128, batch, "batch"),
    ];
    dims.sort_unstable_by_key(|&(stride, _, _)| stride);
    let mut span = 0u128; // the largest offset the smaller dimensions reach
    for (stride, n, what) in dims.into_iter().filter(|&(_, n, _)| n > 1) {
        if stride <= span {
            return Err(invalid(
                name,
                format!(
                    "output elements alias: the {what} stride ({stride} elements, extent {n}) falls within the \
                     {} elements that the smaller dimensions span; an output needs its own address per element",
                    span + 1
                ),
            ));
        }
        span += stride * (n as u128 - 1);
    }
    Ok(())
}

/// Whether a CUDA driver library can be loaded here.
pub fn driver_available() -> bool {
    // SAFETY: probing only dlopens candidate library names.
    unsafe { sys::is_culib_present() }
}

fn init_driver() -> Result<(), LaunchError> {
    static INIT: OnceLock<Result<(), LaunchError>> = OnceLock::new();
    INIT.get_or_init(|| {
        if !driver_available() {
            return Err(LaunchError::NoDriver);
        }
        result::init().map_err(driver_err("cuInit"))
    })
    .clone()
}

/// Make sure a context is current on this thread: keep the caller's (torch's,
/// XLA's) if there is one, else retain device `ordinal`'s primary context.
pub fn ensure_context(ordinal: i32) -> Result<usize, LaunchError> {
    init_driver()?;
    if let Some(ctx) = result::ctx::get_current().map_err(driver_err("cuCtxGetCurrent"))? {
        return Ok(ctx as usize);
    }
    let dev = result::device::get(ordinal).map_err(driver_err("cuDeviceGet"))?;
    // SAFETY: dev comes from cuDeviceGet; the primary context stays retained
    // for the life of the process.
    unsafe {
        let ctx = result::primary_ctx::retain(dev).map_err(driver_err("cuDevicePrimaryCtxRetain"))?;
        result::ctx::set_current(ctx).map_err(driver_err("cuCtxSetCurrent"))?;
        Ok(ctx as usize)
    }
}

/// One attribute of the current context's device.
fn current_device_attribute(attr: sys::CUdevice_attribute) -> Result<i32, LaunchError> {
    init_driver()?;
    let mut dev = 0;
    // SAFETY: plain out-parameter queries on the current context.
    unsafe {
        sys::cuCtxGetDevice(&mut dev)
            .result()
            .map_err(driver_err("cuCtxGetDevice"))?;
        result::device::get_attribute(dev, attr).map_err(driver_err("cuDeviceGetAttribute"))
    }
}

/// Compute capability of the current context's device.
pub fn current_compute_capability() -> Result<(i32, i32), LaunchError> {
    use sys::CUdevice_attribute::*;
    Ok((
        current_device_attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        current_device_attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    ))
}

/// Streaming multiprocessors of the current context's device.
pub fn device_sm_count() -> Result<u32, LaunchError> {
    let n = current_device_attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    Ok(n.max(1) as u32)
}

/// Whether a loaded sm90a forward's ragged one-tile launches take the
/// sequences longest keys first until [`LoadedKernel::set_ragged_order`]
/// says otherwise (head-major plans only). Session 22 on an H100
/// (`gpu_bench --ragged-order`, docs/benchmarks/2026-12-05-s22-ab.md):
/// +0.1..+7.3% on the bench's ragged d128/d256 problems, d256 causal
/// +4.4% / +7.3%; the GPU suite and memcheck passed with it.
pub const RAGGED_ORDER_DEFAULT: bool = true;

/// A kernel loaded into one CUDA context.
#[derive(Debug)]
pub struct LoadedKernel {
    pub spec: AttnSpec,
    pub plan: KernelPlan,
    module: sys::CUmodule,
    func: sys::CUfunction,
    /// Other entry points of the module (backward CUBINs), resolved on first use.
    others: Mutex<HashMap<String, usize>>,
    /// sm90a forward: the tensor maps of the last call and the views they
    /// encode (a pure function of them), so that repeated calls on the same
    /// buffers skip the driver's encoding.
    last_maps: Mutex<Option<([TmaView; 4], [sys::CUtensorMap; 4])>>,
    /// The persistent walk entry of a [`GridRule::TilesOrWalk`] kernel.
    walk: Option<sys::CUfunction>,
    /// The walk entry's blocks that the device holds at once (SMs × resident
    /// blocks per SM, from the driver at load).
    resident: u32,
    /// An explicit block cap that makes every launch walk; 0 = the
    /// launcher's rule ([`crate::plan::sm90a_walk_pays`]).
    persistent_grid: AtomicU32,
    /// Whether one-tile launches of a `cluster_m` 2 plan go as clusters of
    /// two where they can ([`cluster_grid`]); on unless a test turns it off.
    clusters: AtomicBool,
    /// Phases of causal one-tile grids: 0 = the launcher's rule
    /// ([`crate::plan::causal_tile_phases`]), else forced (tests, tuning).
    tile_phases: AtomicU32,
    /// Whether one-tile launches of ragged batches take the sequences
    /// longest keys first ([`RAGGED_ORDER_DEFAULT`] until a test or tuning
    /// run sets it; head-major plans only).
    ragged_order: AtomicBool,
    /// Blocks of the main entry that the device runs at once (SMs × the
    /// driver's occupancy), asked on first use.
    slots: OnceLock<u32>,
}

impl LoadedKernel {
    /// The explicit block cap of walking launches, 0 when the launcher's
    /// rule decides (see [`Self::set_persistent_grid`]).
    pub fn persistent_grid(&self) -> u32 {
        self.persistent_grid.load(Ordering::Relaxed)
    }

    /// The blocks of the walk entry that the device holds at once
    /// ([`MAX_PERSISTENT_GRID`] for kernels without one).
    pub fn resident_blocks(&self) -> u32 {
        self.resident
    }

    /// Whether the module has the persistent walk entry ([`GridRule::TilesOrWalk`]).
    pub fn has_walk(&self) -> bool {
        self.walk.is_some()
    }

    /// Whether a launch with `args` would take the walk entry (checks the
    /// call as [`launch_fwd`] does; `false` for an empty problem).
    pub fn walks(&self, args: &FwdArgs) -> Result<bool, LaunchError> {
        Ok(match check_fwd(&self.plan, args)? {
            Some((_, dims)) => self.entry(&args.problem, dims.grid).0 != self.func,
            None => false,
        })
    }

    /// Whether a launch with `args` would run as clusters of two blocks
    /// (see [`cluster_grid`]; `false` for an empty problem).
    pub fn pairs(&self, args: &FwdArgs) -> Result<bool, LaunchError> {
        Ok(match check_fwd(&self.plan, args)? {
            Some((_, dims)) => self.entry(&args.problem, dims.grid).2 > 1,
            None => false,
        })
    }

    /// Let one-tile launches of a `cluster_m` 2 plan run as clusters of two
    /// (the default) or keep every block alone (tests check both paths of
    /// the same entry). Like [`Self::set_persistent_grid`], it holds for
    /// every user of this loaded kernel.
    pub fn set_clusters(&self, on: bool) {
        self.clusters.store(on, Ordering::Relaxed);
    }

    /// The function, grid and cluster width that a checked call with
    /// one-tile grid `one_tile` launches: the walk entry where
    /// [`walk_grid`] says so, else the plan's entry, as clusters of two
    /// where [`cluster_grid`] allows, else on `one_tile`.
    fn entry(&self, p: &FwdProblem, one_tile: (u32, u32, u32)) -> (sys::CUfunction, (u32, u32, u32), u32) {
        match (
            self.walk,
            walk_grid(
                &self.plan,
                p,
                one_tile,
                self.persistent_grid(),
                self.resident,
                self.ragged_order(),
            ),
        ) {
            (Some(walk), Some(grid)) => (walk, grid, 1),
            _ => match cluster_grid(&self.plan, one_tile) {
                Some(grid) if self.clusters.load(Ordering::Relaxed) => (self.func, grid, 2),
                _ => (self.func, one_tile, 1),
            },
        }
    }

    /// Choose the entry of this kernel's launches: `blocks` in 1..=65536
    /// (larger values clamp to 65536) makes every launch take the walk entry
    /// on at most that many blocks (tests use few to make every block walk
    /// several tiles); [`ONE_TILE`] makes every launch take the one-tile
    /// entry (but those with more query blocks than grid.y holds); 0
    /// restores the launcher's rule: the walk on the resident
    /// blocks where it pays ([`crate::plan::sm90a_walk_pays`]), else one
    /// block per tile. No effect on kernels without a walk entry. The
    /// setting holds for every user of this loaded kernel ([`load`] shares
    /// one per module in a process): for tests and tuning runs.
    pub fn set_persistent_grid(&self, blocks: u32) {
        let cap = match blocks {
            0 | ONE_TILE => blocks,
            b => b.min(MAX_PERSISTENT_GRID),
        };
        self.persistent_grid.store(cap, Ordering::Relaxed);
    }

    /// Force the phases of causal one-tile launches (`templates/common/order.cuh`;
    /// at most [`crate::plan::MAX_TILE_PHASES`]), or 0 for the launcher's rule
    /// ([`crate::plan::causal_tile_phases`]). Like [`Self::set_persistent_grid`],
    /// it holds for every user of this loaded kernel: for tests and tuning runs.
    /// Kernels without a phased order (no causal mask, ragged, softcap in the
    /// backward, the sm80-path forward unless its `head_major` option is on) ignore it.
    pub fn set_tile_phases(&self, phases: u32) {
        self.tile_phases
            .store(phases.min(crate::plan::MAX_TILE_PHASES), Ordering::Relaxed);
    }

    /// Let the forward's launches of ragged (THD) batches take the sequences
    /// longest keys first ([`RAGGED_ORDER_DEFAULT`]; `ragged_order` in
    /// `templates/common/order.cuh`, batches up to 64 sequences), or keep the
    /// grid's batch order (tests check both orders of the same kernel;
    /// `gpu_bench --ragged-order` times them): the sm90a forward's one-tile
    /// entry, and the sm80-path forward without a mask (its grid's own order
    /// runs causal batches faster). Like [`Self::set_persistent_grid`], it
    /// holds for every user of this loaded kernel. The walk entry, dense
    /// kernels and the backward ignore it.
    pub fn set_ragged_order(&self, on: bool) {
        self.ragged_order.store(on, Ordering::Relaxed);
    }

    /// Whether ragged one-tile launches take the sequences longest keys
    /// first (see [`Self::set_ragged_order`]).
    pub fn ragged_order(&self) -> bool {
        self.ragged_order.load(Ordering::Relaxed)
    }

    /// The phases a launch whose heads have `tiles` work tiles each takes:
    /// the forced value of [`Self::set_tile_phases`], else the rule over
    /// [`Self::slots`].
    pub fn phases_for(&self, tiles: u32) -> u32 {
        match self.tile_phases.load(Ordering::Relaxed) {
            0 => crate::plan::causal_tile_phases(tiles, self.slots()),
            n => n,
        }
    }

    /// Blocks of the main entry (the forward's one-tile entry, the backward's
    /// per-key-tile kernel) that the device runs at once: SMs × the driver's
    /// occupancy for the plan's threads and shared memory (at least 1; asked
    /// once).
    pub fn slots(&self) -> u32 {
        *self.slots.get_or_init(|| {
            // The walk entry's resident blocks, where there is one: the same
            // threads and shared memory as the one-tile entry.
            if self.walk.is_some() {
                return self.resident;
            }
            // The backward's main kernel is the plan's entry, as the forward's is.
            let (threads, smem) = match &self.plan.bwd {
                Some(bp) => (bp.num_warps * 32, bp.main_smem),
                None => (self.plan.threads(), self.plan.smem_bytes),
            };
            // SAFETY: `func` is a function of this loaded module.
            let per_sm = unsafe {
                result::occupancy::max_active_block_per_multiprocessor(self.func, threads as i32, smem as usize).ok()
            };
            let sms = device_sm_count().unwrap_or(1);
            sms.saturating_mul(per_sm.unwrap_or(1).max(1) as u32).max(1)
        })
    }

    /// The entry point `name` of this module: the plan's `entry` is the one
    /// [`load`] resolved; any other (the backward's `_pre`, `_dq`, ...) is
    /// looked up once, given the plan's max-dynamic-shared-memory attribute,
    /// and cached.
    pub fn function(&self, name: &str) -> Result<sys::CUfunction, LaunchError> {
        if name == self.plan.entry {
            return Ok(self.func);
        }
        let mut others = self
            .others
            .lock()
            .map_err(|_| invalid("entry", "function cache poisoned"))?;
        if let Some(&f) = others.get(name) {
            return Ok(f as sys::CUfunction);
        }
        let cname = CString::new(name).map_err(|_| invalid("entry", "contains NUL"))?;
        // SAFETY: the module is loaded in this context for the life of `self`.
        let func = unsafe {
            let f = result::module::get_function(self.module, cname).map_err(driver_err("cuModuleGetFunction"))?;
            check_params(f, &self.plan, name)?;
            result::function::set_function_attribute(
                f,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                self.plan.smem_bytes as i32,
            )
            .map_err(driver_err("cuFuncSetAttribute"))?;
            f
        };
        others.insert(name.to_string(), func as usize);
        Ok(func)
    }

    /// The device address and size of the module's global variable `name`
    /// (a tracing build's buffers; see `gpu_bench --trace90`).
    pub fn global(&self, name: &str) -> Result<(u64, usize), LaunchError> {
        let cname = CString::new(name).map_err(|_| invalid("global", "contains NUL"))?;
        // SAFETY: the module is loaded in this context for the life of `self`.
        let (ptr, bytes) =
            unsafe { result::module::get_global(self.module, cname).map_err(driver_err("cuModuleGetGlobal"))? };
        Ok((ptr, bytes))
    }
}

// SAFETY: CUmodule/CUfunction handles are context-bound, not thread-bound; the
// driver API is thread-safe.
unsafe impl Send for LoadedKernel {}
unsafe impl Sync for LoadedKernel {}

impl Drop for LoadedKernel {
    fn drop(&mut self) {
        // SAFETY: the module was loaded by us and is unloaded once.
        unsafe {
            let _ = result::module::unload(self.module);
        }
    }
}

/// Load a compiled kernel into the current context (memoized per context and key).
pub fn load(kernel: &CompiledKernel) -> Result<Arc<LoadedKernel>, LaunchError> {
    type Loaded = Mutex<HashMap<(usize, [u8; 32]), Arc<LoadedKernel>>>;
    static LOADED: OnceLock<Loaded> = OnceLock::new();
    let ctx = ensure_context(0)?;
    let (major, minor) = current_compute_capability()?;
    if !kernel.spec.arch.runs_on(major, minor) {
        return Err(LaunchError::SpecMismatch {
            spec: kernel.spec.to_string(),
            reason: format!(
                "built for {} but the device has compute capability {major}.{minor}; use the {} spec",
                kernel.spec.arch,
                Arch::from_compute_capability(major, minor)
                    .map(|a| a.to_string())
                    .unwrap_or_else(|| "matching".into())
            ),
        });
    }
    let map = LOADED.get_or_init(Default::default);
    let id = (ctx, kernel.key.0);
    if let Some(k) = map.lock().ok().and_then(|m| m.get(&id).cloned()) {
        return Ok(k);
    }
    let entry = CString::new(kernel.plan.entry.clone()).map_err(|_| invalid("entry", "contains NUL"))?;
    // SAFETY: the image is a complete CUBIN produced by NVRTC and verified by hash.
    let loaded = unsafe {
        let module = result::module::load_data(kernel.cubin.as_ptr() as *const c_void)
            .map_err(driver_err("cuModuleLoadData"))?;
        let func = match result::module::get_function(module, entry) {
            Ok(f) => f,
            Err(e) => {
                let _ = result::module::unload(module);
                return Err(driver_err("cuModuleGetFunction")(e));
            }
        };
        if let Err(e) = check_params(func, &kernel.plan, &kernel.plan.entry) {
            let _ = result::module::unload(module);
            return Err(e);
        }
        if let Err(e) = result::function::set_function_attribute(
            func,
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            kernel.plan.smem_bytes as i32,
        ) {
            let _ = result::module::unload(module);
            return Err(driver_err("cuFuncSetAttribute")(e));
        }
        // Kernels with a walk entry: that function (given the same shared
        // memory attribute) and its blocks that the device holds at once.
        let (walk, resident) = if kernel.plan.grid == GridRule::TilesOrWalk {
            match walk_entry(module, &kernel.plan).and_then(|w| {
                let name = format!("{}_walk", kernel.plan.entry);
                w.0.map_or(Ok(()), |f| check_params(f, &kernel.plan, &name)).map(|()| w)
            }) {
                Ok(w) => w,
                Err(e) => {
                    let _ = result::module::unload(module);
                    return Err(e);
                }
            }
        } else {
            (None, MAX_PERSISTENT_GRID)
        };
        LoadedKernel {
            spec: kernel.spec,
            plan: kernel.plan.clone(),
            module,
            func,
            others: Mutex::new(HashMap::new()),
            last_maps: Mutex::new(None),
            walk,
            resident: resident.clamp(1, MAX_PERSISTENT_GRID),
            persistent_grid: AtomicU32::new(0),
            clusters: AtomicBool::new(true),
            tile_phases: AtomicU32::new(0),
            ragged_order: AtomicBool::new(RAGGED_ORDER_DEFAULT),
            slots: OnceLock::new(),
        }
    };
    let loaded = Arc::new(loaded);
    if let Ok(mut m) = map.lock() {
        m.insert(id, loaded.clone());
    }
    Ok(loaded)
}

/// The parameters, in bytes, that this library passes to a kernel of
/// `plan`: the parameter block ([`FwdParams`] or
/// [`crate::launch_bwd::BwdParams`]), then the sm90a forward's three tensor
/// maps (Q, K, V) and, with [`KernelPlan::tma_store_o`], O's. Every entry of
/// a module takes the same.
pub fn expected_params(plan: &KernelPlan) -> &'static [usize] {
    const FWD: [usize; 1] = [std::mem::size_of::<FwdParams>()];
    const FWD90: [usize; 4] = [std::mem::size_of::<FwdParams>(), 128, 128, 128];
    const FWD90_O: [usize; 5] = [std::mem::size_of::<FwdParams>(), 128, 128, 128, 128];
    const BWD: [usize; 1] = [std::mem::size_of::<crate::launch_bwd::BwdParams>()];
    match plan.template {
        Template::FwdSm80 => &FWD,
        Template::FwdSm90a if plan.tma_store_o => &FWD90_O,
        Template::FwdSm90a => &FWD90,
        Template::BwdSm80 | Template::BwdSm90a => &BWD,
    }
}

/// Refuse an entry whose parameters are not the ones [`expected_params`]
/// says this library passes: a cubin built from other templates (another
/// revision's parameter block) would read its parameters past the end of
/// ours. Skipped where the driver cannot tell (before CUDA 12.4, or no
/// answer for the first parameter).
///
/// # Safety
/// `func` must be a function of a module loaded in the current context.
unsafe fn check_params(func: sys::CUfunction, plan: &KernelPlan, name: &str) -> Result<(), LaunchError> {
    let spec = &plan.spec;
    let mut version = 0;
    if sys::cuDriverGetVersion(&mut version) != sys::CUresult::CUDA_SUCCESS || version < 12040 {
        return Ok(());
    }
    let size = |i: usize| {
        let (mut offset, mut size) = (0usize, 0usize);
        (sys::cuFuncGetParamInfo(func, i, &mut offset, &mut size) == sys::CUresult::CUDA_SUCCESS).then_some(size)
    };
    let want = expected_params(plan);
    // A driver that does not answer for the first parameter cannot tell.
    if size(0).is_none() {
        return Ok(());
    }
    // The expected parameters' sizes. (Probing one past the last would catch
    // extra parameters too, but the driver answers that with an error that
    // compute-sanitizer reports as an API error on every load; no template
    // of ours grows a parameter, the parameter block's size is what changes.)
    let got: Vec<usize> = (0..want.len()).map_while(size).collect();
    if got == want {
        return Ok(());
    }
    Err(LaunchError::SpecMismatch {
        spec: spec.to_string(),
        reason: format!(
            "entry `{name}` takes parameters of {got:?} bytes where this library passes {want:?}: \
             the cubin was built from other templates"
        ),
    })
}

/// The walk entry (`{entry}_walk`) of a loaded module, its dynamic shared
/// memory attribute set, and its blocks that the whole device holds at once:
/// SMs × the driver's occupancy for the plan's threads and shared memory.
///
/// # Safety
/// `module` must be a loaded module of the current context.
unsafe fn walk_entry(module: sys::CUmodule, plan: &KernelPlan) -> Result<(Option<sys::CUfunction>, u32), LaunchError> {
    let name = CString::new(format!("{}_walk", plan.entry)).map_err(|_| invalid("entry", "contains NUL"))?;
    let func = result::module::get_function(module, name).map_err(driver_err("cuModuleGetFunction"))?;
    result::function::set_function_attribute(
        func,
        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        plan.smem_bytes as i32,
    )
    .map_err(driver_err("cuFuncSetAttribute"))?;
    let per_sm =
        result::occupancy::max_active_block_per_multiprocessor(func, plan.threads() as i32, plan.smem_bytes as usize)
            .map_err(driver_err("cuOccupancyMaxActiveBlocksPerMultiprocessor"))?;
    Ok((Some(func), device_sm_count()?.saturating_mul(per_sm.max(1) as u32)))
}

/// `FwdParams::ragged_order` of a forward launch of `plan` whose loaded
/// kernel asks for the sequences longest keys first (`on`,
/// [`LoadedKernel::set_ragged_order`]). Its tile numbers are head-major ones:
/// the sm90a forward's query-block-major order keeps the grid's; the sm80-path
/// forward maps either order's blocks (and its template reads it only without
/// a mask). Dense kernels read it not at all.
pub fn ragged_order_param(plan: &KernelPlan, on: bool) -> i32 {
    (on && (plan.head_major || plan.template == Template::FwdSm80)) as i32
}

/// The walk entry's grid for a checked launch of a [`GridRule::TilesOrWalk`]
/// plan whose one-tile grid is `one_tile`, or `None` for the one-tile entry.
/// `cap` is [`LoadedKernel::set_persistent_grid`]'s (0: the launcher's rule,
/// [`crate::plan::sm90a_walk_pays`], which also walks where grid.y cannot
/// hold the query blocks; [`ONE_TILE`]: the one-tile entry wherever grid.y
/// holds the query blocks), `resident` the walk entry's resident blocks,
/// `ragged_order` [`LoadedKernel::ragged_order`]: under the rule a ragged
/// batch walks only where the walk takes its sequences longest keys first
/// ([`crate::plan::sm90a_ragged_walk_ordered`]).
pub fn walk_grid(
    plan: &KernelPlan,
    p: &FwdProblem,
    one_tile: (u32, u32, u32),
    cap: u32,
    resident: u32,
    ragged_order: bool,
) -> Option<(u32, u32, u32)> {
    if plan.grid != GridRule::TilesOrWalk {
        return None;
    }
    // check_fwd kept the tiles below MAX_PERSISTENT_TILES.
    let tiles = one_tile.0 as u64 * one_tile.1 as u64;
    let grid = |cap: u32| tiles.min(cap.clamp(1, MAX_PERSISTENT_GRID) as u64);
    let d = plan.head_dim_qk_padded.max(plan.head_dim_v_padded);
    let ordered = || {
        plan.spec.layout != Layout::Thd
            || crate::plan::sm90a_ragged_walk_ordered(plan.head_major, ragged_order, p.batch, tiles, grid(resident))
    };
    let cap = match cap {
        _ if one_tile.1 > 65535 => resident,
        0 if crate::plan::sm90a_walk_pays(p.seqlen_k, &plan.spec, d, plan.block_m / 64, plan.block_n) && ordered() => {
            resident
        }
        0 | ONE_TILE => return None,
        c => c,
    };
    Some((grid(cap) as u32, 1, 1))
}

/// The grid of a one-tile launch as clusters of two blocks: a `cluster_m` 2
/// plan (dense, no mask: every query block of a head sees the same key
/// tiles) whose heads have an even number of query blocks, so that the
/// blocks 2c and 2c + 1 of a one-dimensional grid over the tiles in
/// head-major order are adjacent query blocks of one head. `None`: launch
/// `one_tile` (batch x heads, query blocks) as it is.
pub fn cluster_grid(plan: &KernelPlan, one_tile: (u32, u32, u32)) -> Option<(u32, u32, u32)> {
    if plan.template != Template::FwdSm90a || plan.cluster_m != 2 || !plan.head_major || !one_tile.1.is_multiple_of(2) {
        return None;
    }
    let tiles = one_tile.0 as u64 * one_tile.1 as u64 * one_tile.2 as u64;
    (tiles <= MAX_PERSISTENT_TILES && one_tile.2 == 1).then_some((tiles as u32, 1, 1))
}

/// Check the arguments and launch the forward kernel on `stream`.
///
/// # Safety
/// The pointers in `args` must be device memory of the current context, large
/// enough for the shapes and strides given, and `stream` a valid stream of
/// that context (or null for the legacy default stream).
pub unsafe fn launch_fwd(k: &LoadedKernel, args: &FwdArgs, stream: sys::CUstream) -> Result<(), LaunchError> {
    let Some((mut params, mut dims)) = check_fwd(&k.plan, args)? else {
        return Ok(());
    };
    let (func, grid, cluster) = k.entry(&args.problem, dims.grid);
    // The one-tile grid's causal order (read by the kernels that have one).
    params.tile_phases = k.phases_for(dims.grid.1) as i32;
    params.ragged_order = ragged_order_param(&k.plan, k.ragged_order());
    dims.grid = grid;
    // The sm90a forward takes its Q/K/V (and with `tma_store_o` O's) tensor
    // maps after the parameter block.
    let n = expected_params(&k.plan).len();
    let mut maps = if k.plan.template == Template::FwdSm90a {
        k.tensor_maps(args)?
    } else {
        [sys::CUtensorMap { opaque: [0; 16] }; 4]
    };
    let [tq, tk, tv, to] = &mut maps;
    let mut kp: [*mut c_void; 5] = [
        &mut params as *mut FwdParams as *mut c_void,
        tq as *mut sys::CUtensorMap as *mut c_void,
        tk as *mut sys::CUtensorMap as *mut c_void,
        tv as *mut sys::CUtensorMap as *mut c_void,
        to as *mut sys::CUtensorMap as *mut c_void,
    ];
    if cluster > 1 {
        return launch_clusters(func, dims, cluster, stream, &mut kp[..n]);
    }
    result::launch_kernel(func, dims.grid, dims.block, dims.smem, stream, &mut kp[..n])
        .map_err(driver_err("cuLaunchKernel"))
}

/// cuLaunchKernelEx with a cluster dimension of `cluster` blocks along x.
///
/// # Safety
/// As [`result::launch_kernel`]: `params` must match the kernel's parameters.
unsafe fn launch_clusters(
    func: sys::CUfunction,
    dims: LaunchDims,
    cluster: u32,
    stream: sys::CUstream,
    params: &mut [*mut c_void],
) -> Result<(), LaunchError> {
    let mut attr: sys::CUlaunchAttribute = std::mem::zeroed();
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim.x = cluster;
    attr.value.clusterDim.y = 1;
    attr.value.clusterDim.z = 1;
    let config = sys::CUlaunchConfig {
        gridDimX: dims.grid.0,
        gridDimY: dims.grid.1,
        gridDimZ: dims.grid.2,
        blockDimX: dims.block.0,
        blockDimY: dims.block.1,
        blockDimZ: dims.block.2,
        sharedMemBytes: dims.smem,
        hStream: stream,
        attrs: &mut attr,
        numAttrs: 1,
    };
    sys::cuLaunchKernelEx(&config, func, params.as_mut_ptr(), std::ptr::null_mut())
        .result()
        .map_err(driver_err("cuLaunchKernelEx"))
}

impl LoadedKernel {
    /// The sm90a forward's tensor maps for a checked call: the last call's
    /// when its views are the same (the maps are a pure function of them),
    /// else encoded by the driver and kept.
    fn tensor_maps(&self, args: &FwdArgs) -> Result<[sys::CUtensorMap; 4], LaunchError> {
        let views = fwd_tma_views(&self.plan, args)?;
        let mut last = self
            .last_maps
            .lock()
            .map_err(|_| invalid("tensor maps", "tensor-map cache poisoned"))?;
        if let Some((v, maps)) = last.as_ref() {
            if *v == views {
                return Ok(*maps);
            }
        }
        let maps = encode_tensor_maps(&self.plan, &views)?;
        *last = Some((views, maps));
        Ok(maps)
    }
}

/// The shape of one TMA descriptor of the sm90a forward: a 4-D tiled view
/// (head-dim column, row, head, batch) of a tensor, strides in bytes, read
/// in boxes of 64 columns (128 bytes, the swizzle width) by `box_rows`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TmaView {
    pub ptr: u64,
    pub dims: [u64; 4],
    pub strides: [u64; 3],
    pub box_rows: u32,
}

impl TmaView {
    /// The place of a map the kernel does not take.
    pub const UNUSED: TmaView = TmaView {
        ptr: 0,
        dims: [0; 4],
        strides: [0; 3],
        box_rows: 0,
    };
}

/// The Q, K, V and O views of a checked sm90a forward call (O's read in
/// boxes of 64 rows, one consumer warpgroup's; encoded only for a plan with
/// [`KernelPlan::tma_store_o`], which is dense). Dense tensors are
/// `(d, seqlen, heads, batch)`; THD tensors `(d, total tokens, heads, 1)`:
/// TMA zero-fills what lies past each tensor's last row or column, so a
/// tile never reads outside the caller's allocation. Dimensions of size 1
/// get a nominal stride (the coordinate there is always 0); a stride of 0
/// on a longer dimension (a broadcast view) cannot be described and is
/// refused.
pub fn fwd_tma_views(plan: &KernelPlan, a: &FwdArgs) -> Result<[TmaView; 4], LaunchError> {
    let spec = &plan.spec;
    let p = &a.problem;
    let thd = spec.layout == Layout::Thd;
    let view = |name: &'static str, t: &TensorArg, d: u16, rows: u32, heads: u32, box_rows: u32| {
        let dims = [
            d as u64,
            rows.max(1) as u64,
            heads as u64,
            if thd { 1 } else { p.batch as u64 },
        ];
        let elems = [t.stride_seq, t.stride_head, if thd { 0 } else { t.stride_batch }];
        let mut strides = [0u64; 3];
        for i in 0..3 {
            // check_tensors has made the strides non-negative multiples of 8 elements.
            strides[i] = match (dims[i + 1], elems[i] as u64 * 2) {
                (1, 0) => 16, // never stepped over: any valid stride
                (_, 0) => {
                    return Err(invalid(
                        name,
                        "a stride of 0 over more than one row/head/batch (a broadcast view) cannot be read by the \
                         sm90a forward's TMA; pass a materialized tensor",
                    ))
                }
                (_, bytes) if bytes >= 1 << 40 => {
                    return Err(invalid(name, "strides must be below 2^40 bytes for TMA"))
                }
                (_, bytes) => bytes,
            };
        }
        Ok(TmaView {
            ptr: t.ptr,
            dims,
            strides,
            box_rows,
        })
    };
    let (rows_q, rows_k) = if thd {
        (p.total_q, p.total_k)
    } else {
        (p.seqlen_q, p.seqlen_k)
    };
    Ok([
        view("q", &a.q, spec.head_dim_qk, rows_q, p.heads_q, plan.block_m)?,
        view("k", &a.k, spec.head_dim_qk, rows_k, p.heads_kv, plan.block_n)?,
        view("v", &a.v, spec.head_dim_v, rows_k, p.heads_kv, plan.block_n)?,
        // Without O's map a fixed view, so that a new O never re-encodes the others.
        if plan.tma_store_o {
            view("o", &a.o, spec.head_dim_v, rows_q, p.heads_q, 64)?
        } else {
            TmaView::UNUSED
        },
    ])
}

/// Encode the sm90a forward's descriptors with the driver (`cuTensorMapEncodeTiled`).
fn encode_tensor_maps(plan: &KernelPlan, views: &[TmaView; 4]) -> Result<[sys::CUtensorMap; 4], LaunchError> {
    let dtype = match plan.spec.dtype {
        crate::spec::DType::F16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        crate::spec::DType::Bf16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
    };
    let mut maps = [sys::CUtensorMap { opaque: [0; 16] }; 4];
    // O's map only where the kernel takes it.
    let n = if plan.tma_store_o { 4 } else { 3 };
    for (map, v) in maps.iter_mut().zip(views.iter()).take(n) {
        let boxes: [u32; 4] = [64, v.box_rows, 1, 1];
        let unit: [u32; 4] = [1; 4];
        // SAFETY: pure host-side encoding into `map`; the arrays outlive the call.
        unsafe {
            sys::cuTensorMapEncodeTiled(
                map,
                dtype,
                4,
                v.ptr as *mut c_void,
                v.dims.as_ptr(),
                v.strides.as_ptr(),
                boxes.as_ptr(),
                unit.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        }
        .result()
        .map_err(|e| LaunchError::Driver {
            call: "cuTensorMapEncodeTiled",
            code: format!("{e:?} for {v:?}"),
        })?;
    }
    Ok(maps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::plan;
    use crate::spec::{Arch, DType};

    #[test]
    fn ragged_order_reaches_both_forwards() {
        let thd = |arch, mask| plan(&AttnSpec::fwd(DType::Bf16, 128, mask, Layout::Thd, arch)).unwrap();
        // The sm80-path forward (an sm80 spec, and the sm80 path of an sm90a one).
        let sm80 = thd(Arch::Sm80, Mask::None);
        assert_eq!(sm80.template, Template::FwdSm80);
        assert!(!sm80.head_major);
        assert_eq!(ragged_order_param(&sm80, true), 1);
        assert_eq!(ragged_order_param(&sm80, false), 0);
        let path = crate::plan::plan_sm80_path(&AttnSpec::fwd(DType::Bf16, 256, Mask::None, Layout::Thd, Arch::Sm90a))
            .unwrap();
        assert_eq!(ragged_order_param(&path, true), 1);
        // The sm90a forward: head-major tile numbers only.
        let mut hopper = thd(Arch::Sm90a, Mask::CausalBottomRight);
        assert_eq!(hopper.template, Template::FwdSm90a);
        assert!(hopper.head_major, "the sm90a forward's default order");
        assert_eq!(ragged_order_param(&hopper, true), 1);
        hopper.head_major = false;
        assert_eq!(ragged_order_param(&hopper, true), 0);
        assert_eq!(ragged_order_param(&hopper, false), 0);
    }

    fn dense_args(b: u32, hq: u32, hkv: u32, sq: u32, sk: u32, d: i64) -> FwdArgs {
        FwdArgs {
            q: TensorArg::bshd(0x1000, sq as i64, hq as i64, d),
            k: TensorArg::bshd(0x2000, sk as i64, hkv as i64, d),
            v: TensorArg::bshd(0x3000, sk as i64, hkv as i64, d),
            o: TensorArg::bshd(0x4000, sq as i64, hq as i64, d),
            lse: Some(0x5000),
            problem: FwdProblem {
                batch: b,
                heads_q: hq,
                heads_kv: hkv,
                seqlen_q: sq,
                seqlen_k: sk,
                window: (-1, -1),
                ..Default::default()
            },
        }
    }

    fn p(mask: Mask, layout: Layout) -> KernelPlan {
        plan(&AttnSpec::fwd(DType::Bf16, 128, mask, layout, Arch::Sm80)).unwrap()
    }

    #[test]
    fn sm90a_clusters_of_two_pair_adjacent_query_blocks_of_one_head() {
        use crate::plan::{default_sm90a_tiles, plan_fwd_sm90a_with, Sm90aFwdTiles};
        let spec = AttnSpec::fwd(DType::Bf16, 128, Mask::None, Layout::Dense, Arch::Sm90a);
        // An option (measured slower): the planner's plan runs alone and
        // leaves cluster_m out of its JSON.
        let alone = plan(&spec).unwrap();
        assert_eq!(alone.cluster_m, 1);
        assert!(!serde_json::to_string(&alone).unwrap().contains("cluster_m"));
        // Two consumers (block_m 128), as the option was built and measured
        // (the planner's d128 tiles without a mask have three since session 41).
        let with = |s: &AttnSpec| {
            plan_fwd_sm90a_with(
                s,
                Sm90aFwdTiles {
                    cluster: true,
                    consumers: 2,
                    block_n: 128,
                    stages: 2,
                    ..default_sm90a_tiles(s)
                },
            )
        };
        let pl = with(&spec);
        assert_eq!(pl.cluster_m, 2, "{pl}");
        assert!(pl.reasons.iter().any(|r| r.contains("clusters of 2")));
        assert!(serde_json::to_string(&pl).unwrap().contains("\"cluster_m\":2"));
        // Even query blocks per head: a 1-D grid over the tiles, pairs (2c, 2c + 1).
        let a = dense_args(2, 8, 2, 1000, 700, 128);
        let (_, dims) = check_fwd(&pl, &a).unwrap().unwrap();
        assert_eq!(dims.grid, (16, 8, 1));
        assert_eq!(cluster_grid(&pl, dims.grid), Some((128, 1, 1)));
        assert_eq!(cluster_grid(&alone, dims.grid), None);
        // Odd query blocks: the blocks run alone on the usual grid.
        let odd = dense_args(2, 8, 2, 300, 700, 128);
        let (_, dims) = check_fwd(&pl, &odd).unwrap().unwrap();
        assert_eq!((dims.grid.1, cluster_grid(&pl, dims.grid)), (3, None));
        // Specs that cannot pair: a mask (tiles of one head see different
        // keys), ragged, one 64-column chunk (d64); and the query-block-major order.
        for s in [
            AttnSpec::fwd(DType::Bf16, 128, Mask::CausalBottomRight, Layout::Dense, Arch::Sm90a),
            AttnSpec::fwd(DType::Bf16, 128, Mask::SlidingWindow, Layout::Dense, Arch::Sm90a),
            AttnSpec::fwd(DType::Bf16, 128, Mask::None, Layout::Thd, Arch::Sm90a),
            AttnSpec::fwd(DType::Bf16, 64, Mask::None, Layout::Dense, Arch::Sm90a),
        ] {
            let p = with(&s);
            assert_eq!(p.cluster_m, 1, "{s}");
            assert_eq!(cluster_grid(&p, (16, 8, 1)), None, "{s}");
        }
        let qbm = Sm90aFwdTiles {
            head_major: false,
            cluster: true,
            consumers: 2,
            ..default_sm90a_tiles(&spec)
        };
        assert_eq!(cluster_grid(&plan_fwd_sm90a_with(&spec, qbm), (16, 8, 1)), None);
        // d256 and (192, 128): two or more chunks of K and of V.
        for (dqk, dv) in [(256, 256), (192, 128), (96, 96)] {
            let s = AttnSpec {
                head_dim_qk: dqk,
                head_dim_v: dv,
                ..spec
            };
            assert_eq!(with(&s).cluster_m, 2, "{s}");
        }
    }

    #[test]
    fn sm90a_tma_views_cover_each_tensor_and_refuse_broadcasts() {
        let pl = plan(&AttnSpec::fwd(DType::Bf16, 128, Mask::None, Layout::Dense, Arch::Sm90a)).unwrap();
        assert_eq!(pl.template, Template::FwdSm90a);
        // BSHD: (d, s, h, b) with the head stride below the row stride.
        let a = dense_args(2, 8, 2, 1000, 700, 128);
        let [q, k, v, o] = fwd_tma_views(&pl, &a).unwrap();
        assert_eq!(o, TmaView::UNUSED, "no O map without tma_store_o");
        assert_eq!(q.dims, [128, 1000, 8, 2]);
        assert_eq!(q.strides, [8 * 128 * 2, 128 * 2, 1000 * 8 * 128 * 2]);
        assert_eq!((q.box_rows, k.box_rows), (pl.block_m, pl.block_n));
        assert_eq!((k.dims, v.ptr), ([128, 700, 2, 2], 0x3000));
        // With TMA stores of O, O's view too: the query rows in boxes of one
        // consumer warpgroup's 64 rows (d128 causal, three consumers, fits).
        let causal = AttnSpec::fwd(DType::Bf16, 128, Mask::CausalTopLeft, Layout::Dense, Arch::Sm90a);
        let tiles = crate::plan::Sm90aFwdTiles {
            tma_store_o: true,
            ..crate::plan::default_sm90a_tiles(&causal)
        };
        let with_o = crate::plan::plan_fwd_sm90a_with(&causal, tiles);
        assert!(with_o.tma_store_o);
        assert_eq!(expected_params(&with_o).len(), 5);
        assert_eq!(expected_params(&pl).len(), 4);
        let [_, _, _, o] = fwd_tma_views(&with_o, &a).unwrap();
        assert_eq!((o.ptr, o.dims, o.box_rows), (0x4000, [128, 1000, 8, 2], 64));
        assert_eq!(o.strides, q.strides);
        // Size-1 dimensions get a nominal stride; a broadcast over more rows is refused.
        let mut one = dense_args(1, 1, 1, 64, 64, 128);
        one.k.stride_batch = 0;
        one.k.stride_head = 0;
        assert_eq!(fwd_tma_views(&pl, &one).unwrap()[1].strides[1..], [16, 16]);
        one.k.stride_seq = 0;
        assert!(matches!(
            fwd_tma_views(&pl, &one),
            Err(LaunchError::InvalidArgument { arg: "k", .. })
        ));
        // THD: rows are the token totals; K/V need total_k.
        let thd = plan(&AttnSpec::fwd(
            DType::Bf16,
            64,
            Mask::CausalBottomRight,
            Layout::Thd,
            Arch::Sm90a,
        ))
        .unwrap();
        let mut t = FwdArgs {
            q: TensorArg::thd(0x1000, 4, 64),
            k: TensorArg::thd(0x2000, 2, 64),
            v: TensorArg::thd(0x3000, 2, 64),
            o: TensorArg::thd(0x4000, 4, 64),
            lse: Some(0x5000),
            problem: FwdProblem {
                batch: 3,
                heads_q: 4,
                heads_kv: 2,
                seqlen_q: 100,
                seqlen_k: 90,
                cu_seqlens_q: Some(0x6000),
                cu_seqlens_k: Some(0x7000),
                total_q: 250,
                total_k: 200,
                window: (-1, -1),
                ..Default::default()
            },
        };
        let [q, k, _, _] = fwd_tma_views(&thd, &t).unwrap();
        assert_eq!((q.dims, k.dims), ([64, 250, 4, 1], [64, 200, 2, 1]));
        assert!(check_fwd(&thd, &t).unwrap().is_some());
        t.problem.total_k = 0;
        assert!(matches!(
            check_fwd(&thd, &t),
            Err(LaunchError::InvalidArgument { arg: "total_k", .. })
        ));
    }

    #[test]
    fn fwd_params_block_has_the_cuda_layout() {
        // 7 pointers + 14 i64, then 8 i32, 3 f32, num_m_blocks, tile_phases,
        // ragged_order: 224 bytes, a multiple of the 8-byte alignment (no
        // padding at the end, as in nvcc's struct).
        assert_eq!(std::mem::offset_of!(FwdParams, batch), 7 * 8 + 14 * 8);
        assert_eq!(std::mem::offset_of!(FwdParams, num_m_blocks), 7 * 8 + 14 * 8 + 11 * 4);
        assert_eq!(std::mem::offset_of!(FwdParams, tile_phases), 7 * 8 + 14 * 8 + 12 * 4);
        assert_eq!(std::mem::offset_of!(FwdParams, ragged_order), 7 * 8 + 14 * 8 + 13 * 4);
        assert_eq!(std::mem::size_of::<FwdParams>(), 224);
    }

    #[test]
    fn every_entry_takes_the_parameters_the_launcher_passes() {
        // What load() checks against the cubin on a GPU, checked here against
        // the rendered source: each `__global__` entry's parameter types.
        let size = |ty: &str| match ty {
            "FwdParams" => std::mem::size_of::<FwdParams>(),
            "BwdParams" => std::mem::size_of::<crate::launch_bwd::BwdParams>(),
            "TmaMap" => 128,
            other => panic!("unknown parameter type {other}"),
        };
        for s in [
            "fwd.bf16.d128.causal-br.thd.sm80",
            "fwd.bf16.d128.none.dense.sm90a",
            "bwd.f16.d64.window.dense.det.sm80",
            "bwd.bf16.d128.causal-tl.dense.sm90a",
        ] {
            let plan = crate::plan::plan(&s.parse().unwrap()).unwrap();
            let src = crate::render::render(&plan).unwrap().source;
            let mut entries = 0;
            for sig in src.split("__global__").skip(1) {
                // Past `void __launch_bounds__(...)` to the entry's own list.
                let sig = match sig.find("__launch_bounds__") {
                    Some(i) => &sig[i + sig[i..].find(')').unwrap() + 1..],
                    None => sig,
                };
                let params = &sig[sig.find('(').unwrap() + 1..sig.find(')').unwrap()];
                let got: Vec<usize> = params
                    .split(',')
                    .map(|p| {
                        let words: Vec<&str> = p.split_whitespace().collect();
                        size(words[words.len() - 2])
                    })
                    .collect();
                assert_eq!(got, expected_params(&plan), "{s}: {params}");
                entries += 1;
            }
            // The forward's one entry (sm90a: and the walk), the backward's
            // preprocess, main and convert or dQ kernels.
            let least = match plan.template {
                Template::FwdSm80 => 1,
                Template::FwdSm90a => 2,
                Template::BwdSm80 | Template::BwdSm90a => 3,
            };
            assert!(entries >= least, "{s}: {entries} entries");
        }
    }

    /// The rule on ragged batches (sessions 46 and 47): past d128 without a
    /// mask the walk at every length, under a mask never (one tile per block,
    /// the short-keys tiles too); and only where the walk takes
    /// the sequences longest keys first (its order table holds the rounds,
    /// at most 64 sequences, `ragged_order` on).
    #[test]
    fn ragged_batches_walk_only_in_the_longest_first_order() {
        let thd = |d, mask| plan(&AttnSpec::fwd(DType::Bf16, d, mask, Layout::Thd, Arch::Sm90a)).unwrap();
        let problem = |batch, seqlen_k| FwdProblem {
            batch,
            heads_q: 8,
            heads_kv: 8,
            seqlen_q: seqlen_k,
            seqlen_k,
            ..Default::default()
        };
        let (none, causal) = (thd(256, Mask::None), thd(256, Mask::CausalBottomRight));
        let rounds = u64::from(crate::plan::SM90A_WALK_ORDER_ROUNDS);
        for keys in [300u32, 1000, 3733, 16384] {
            let m = keys.div_ceil(none.block_m);
            let p = problem(10, keys);
            let grid = (10 * 8, m, 1);
            let walks = (80 * u64::from(m)).div_ceil(132) <= rounds;
            assert_eq!(walk_grid(&none, &p, grid, 0, 132, true).is_some(), walks, "{keys}");
            // Batch order (tile_at's) is never walked under the rule...
            assert_eq!(walk_grid(&none, &p, grid, 0, 132, false), None, "{keys}");
            // ... but is where a cap forces the walk.
            assert!(walk_grid(&none, &p, grid, 3, 132, false).is_some());
            assert_eq!(walk_grid(&causal, &p, grid, 0, 132, true), None, "{keys}");
            // (a cap still forces it)
            assert!(walk_grid(&causal, &p, grid, 3, 132, true).is_some());
        }
        // More sequences than the order takes: one tile per block.
        let m = 2u32;
        assert!(walk_grid(&none, &problem(64, 256), (64 * 8, m, 1), 0, 132, true).is_some());
        assert_eq!(walk_grid(&none, &problem(65, 256), (65 * 8, m, 1), 0, 132, true), None);
        // d128 keeps the keys' thresholds (the walk up to 1024 keys, 2048
        // with three consumers), in the order only.
        let d128 = thd(128, Mask::CausalBottomRight);
        assert!(walk_grid(&d128, &problem(8, 1000), (64, 8, 1), 0, 132, true).is_some());
        assert_eq!(walk_grid(&d128, &problem(8, 1000), (64, 8, 1), 0, 132, false), None);
        assert_eq!(walk_grid(&d128, &problem(8, 3000), (64, 24, 1), 0, 132, true), None);
    }

    #[test]
    fn sm90a_grid_counts_work_tiles_and_refuses_int_overflow() {
        use crate::plan::{default_sm90a_tiles, plan_fwd_sm90a_with, Sm90aFwdTiles};
        let spec = AttnSpec::fwd(DType::Bf16, 128, Mask::CausalBottomRight, Layout::Dense, Arch::Sm90a);
        // The planner's default: one block per work tile, in (batch x heads, query blocks).
        let one = plan(&spec).unwrap();
        let (_, dims) = check_fwd(&one, &dense_args(2, 8, 2, 1000, 700, 128)).unwrap().unwrap();
        assert_eq!(dims.grid, (16, 1000u32.div_ceil(one.block_m), 1));
        // Its tile index (x + y * gridDim.x) is an int too: more tiles are refused
        // (2^20 x 2^11 (batch x heads) x 1 query block = 2^31).
        let many = dense_args(1 << 20, 1 << 11, 1 << 11, 64, 64, 128);
        assert!(matches!(
            check_fwd(&one, &many),
            Err(LaunchError::InvalidArgument { arg: "batch", .. })
        ));
        // The planner's kernel has the walk entry too: one-tile grid from
        // check_fwd, the walk's from walk_grid where it pays.
        assert_eq!(one.grid, GridRule::TilesOrWalk);
        let short = dense_args(4, 8, 2, 1000, 700, 128);
        let (_, dims) = check_fwd(&one, &short).unwrap().unwrap();
        let tiles = 4 * 8 * 1000u32.div_ceil(one.block_m);
        assert_eq!(
            walk_grid(&one, &short.problem, dims.grid, 0, 132, true),
            Some((132, 1, 1))
        );
        assert_eq!(
            walk_grid(&one, &short.problem, dims.grid, 0, 100_000, true),
            Some((tiles, 1, 1))
        );
        assert_eq!(
            walk_grid(&one, &short.problem, dims.grid, 3, 132, true),
            Some((3, 1, 1))
        );
        assert_eq!(walk_grid(&one, &short.problem, dims.grid, ONE_TILE, 132, true), None);
        assert_eq!(
            walk_grid(&one, &short.problem, dims.grid, 1 << 20, 100_000, true),
            Some((tiles, 1, 1))
        );
        // Long keys take the one-tile entry unless a cap forces the walk.
        let long_keys = dense_args(1, 8, 2, 1000, 4096, 128);
        let (_, dims) = check_fwd(&one, &long_keys).unwrap().unwrap();
        assert_eq!(walk_grid(&one, &long_keys.problem, dims.grid, 0, 132, true), None);
        assert_eq!(
            walk_grid(&one, &long_keys.problem, dims.grid, 7, 132, true),
            Some((7, 1, 1))
        );
        // More query blocks than grid.y holds: the walk, whatever the keys.
        let long_q = dense_args(1, 1, 1, 65536 * one.block_m, 8192, 128);
        let (_, dims) = check_fwd(&one, &long_q).unwrap().unwrap();
        assert_eq!(
            walk_grid(&one, &long_q.problem, dims.grid, 0, 132, true),
            Some((132, 1, 1))
        );
        assert_eq!(
            walk_grid(&one, &long_q.problem, dims.grid, ONE_TILE, 132, true),
            Some((132, 1, 1))
        );
        // Without the walk entry, one tile per block (and grid.y's limit).
        let tiles = Sm90aFwdTiles {
            persistent: false,
            ..default_sm90a_tiles(&spec)
        };
        let pl = plan_fwd_sm90a_with(&spec, tiles);
        assert_eq!(pl.grid, GridRule::BatchHeadsByQueryTiles);
        let (_, dims) = check_fwd(&pl, &short).unwrap().unwrap();
        assert_eq!(walk_grid(&pl, &short.problem, dims.grid, 0, 132, true), None);
        assert!(matches!(
            check_fwd(&pl, &long_q),
            Err(LaunchError::InvalidArgument { arg: "seqlen_q", .. })
        ));
        assert!(matches!(
            check_fwd(&pl, &many),
            Err(LaunchError::InvalidArgument { arg: "batch", .. })
        ));
    }

    #[test]
    fn valid_dense_call_builds_grid_and_params() {
        let (params, dims) = check_fwd(&p(Mask::None, Layout::Dense), &dense_args(2, 8, 2, 1000, 700, 128))
            .unwrap()
            .unwrap();
        assert_eq!(dims.grid, (16, 1000u32.div_ceil(128), 1));
        assert_eq!(params.gqa_ratio, 4);
        assert_eq!(params.lse_sb, 8 * 1000);
        let expect = (1.0 / 128f32.sqrt()) * LOG2_E;
        assert!((params.scale_log2 - expect).abs() < 1e-7);
    }

    #[test]
    fn head_major_sm80_grid_stays_below_2_pow_32_blocks() {
        use crate::plan::{default_fwd_tiles, plan_fwd_sm80_with, FwdTiles};
        let spec = AttnSpec::fwd(DType::Bf16, 128, Mask::None, Layout::Dense, Arch::Sm80);
        let order = |head_major| {
            plan_fwd_sm80_with(
                &spec,
                FwdTiles {
                    head_major,
                    ..default_fwd_tiles(&spec)
                },
            )
        };
        // 2^26 (batch, head) pairs of 65 query blocks: 2^32 < blocks, grid.x < 2^31.
        let a = dense_args(1 << 16, 1 << 10, 1 << 10, 65 * order(true).block_m, 64, 128);
        assert!(check_fwd(&order(false), &a).is_ok());
        assert!(matches!(
            check_fwd(&order(true), &a),
            Err(LaunchError::InvalidArgument { arg: "batch", .. })
        ));
        let fits = dense_args(1 << 16, 1 << 10, 1 << 10, 63 * order(true).block_m, 64, 128);
        assert!(check_fwd(&order(true), &fits).is_ok());
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        let pl = p(Mask::None, Layout::Dense);
        let mut a = dense_args(1, 6, 4, 64, 64, 128);
        assert!(matches!(
            check_fwd(&pl, &a),
            Err(LaunchError::InvalidArgument { arg: "heads_kv", .. })
        ));
        a = dense_args(1, 4, 4, 64, 64, 128);
        a.q.ptr = 0x1008;
        assert!(matches!(
            check_fwd(&pl, &a),
            Err(LaunchError::InvalidArgument { arg: "q", .. })
        ));
        a = dense_args(1, 4, 4, 64, 64, 128);
        a.k.stride_seq = 100;
        assert!(matches!(
            check_fwd(&pl, &a),
            Err(LaunchError::InvalidArgument { arg: "k", .. })
        ));
        a = dense_args(1, 4, 4, 64, 64, 128);
        a.problem.softcap = 30.0;
        assert!(matches!(check_fwd(&pl, &a), Err(LaunchError::SpecMismatch { .. })));
        a = dense_args(1, 4, 4, 64, 64, 128);
        a.problem.window = (16, 0);
        assert!(matches!(check_fwd(&pl, &a), Err(LaunchError::SpecMismatch { .. })));
        a = dense_args(1, 4, 4, 64, 64, 128);
        a.problem.cu_seqlens_q = Some(0x100);
        assert!(matches!(check_fwd(&pl, &a), Err(LaunchError::SpecMismatch { .. })));
        a = dense_args(1, 4, 4, 64, 64, 128);
        a.problem.scale = Some(f32::NAN);
        assert!(matches!(
            check_fwd(&pl, &a),
            Err(LaunchError::InvalidArgument { arg: "scale", .. })
        ));
        a = dense_args(1, 4, 4, 64 * 128 * 65536, 64, 128);
        assert!(matches!(check_fwd(&pl, &a), Err(LaunchError::InvalidArgument { .. })));
        let thd = p(Mask::None, Layout::Thd);
        let a = dense_args(1, 4, 4, 64, 64, 128);
        assert!(matches!(check_fwd(&thd, &a), Err(LaunchError::SpecMismatch { .. })));
    }

    #[test]
    fn lse_is_checked_when_given_and_null_in_the_params_when_left_out() {
        let pl = p(Mask::None, Layout::Dense);
        let mut a = dense_args(1, 4, 4, 64, 64, 128);
        for bad in [0, 0x5002] {
            a.lse = Some(bad);
            assert!(matches!(
                check_fwd(&pl, &a),
                Err(LaunchError::InvalidArgument { arg: "lse", .. })
            ));
        }
        a.lse = None;
        let (params, _) = check_fwd(&pl, &a).unwrap().unwrap();
        assert_eq!((params.lse, params.o), (0, 0x4000));
    }

    #[test]
    fn outputs_must_not_alias_inputs_may() {
        let pl = p(Mask::None, Layout::Dense);
        let alias = |a: &FwdArgs| matches!(check_fwd(&pl, a), Err(LaunchError::InvalidArgument { arg: "o", .. }));
        // Every permutation and padding of [b, s, h, d] is accepted: BSHD,
        // BHSD, SBHD, a view into a packed [b, s, 3, h, d] buffer, padded rows.
        let (b, h, s, d) = (2u32, 4u32, 100u32, 128i64);
        let mut a = dense_args(b, h, h, s, s, d);
        assert!(check_fwd(&pl, &a).unwrap().is_some());
        a.o = TensorArg::bhsd(0x4000, s as i64, h as i64, d);
        assert!(check_fwd(&pl, &a).is_ok());
        a.o = TensorArg {
            ptr: 0x4000,
            stride_batch: h as i64 * d,
            stride_seq: b as i64 * h as i64 * d,
            stride_head: d,
        };
        assert!(check_fwd(&pl, &a).is_ok());
        let packed = TensorArg {
            ptr: 0x4000,
            stride_batch: s as i64 * 3 * h as i64 * d,
            stride_seq: 3 * h as i64 * d,
            stride_head: d,
        };
        a.o = packed;
        assert!(check_fwd(&pl, &a).is_ok());
        a.o.stride_seq += 8; // padded rows
        assert!(check_fwd(&pl, &a).is_ok());
        // Aliasing outputs are refused: a zero stride, heads closer than the
        // head dim, rows of a batch inside another's, equal strides.
        for (sb, ss, sh) in [
            (0, h as i64 * d, d),
            (s as i64 * h as i64 * d, 0, d),
            (s as i64 * h as i64 * 64, h as i64 * 64, 64),
            (h as i64 * d, h as i64 * d, d),
            (d, h as i64 * d, d),
        ] {
            a.o = TensorArg {
                ptr: 0x4000,
                stride_batch: sb,
                stride_seq: ss,
                stride_head: sh,
            };
            assert!(alias(&a), "strides {sb} {ss} {sh}");
        }
        // A zero stride is fine where the extent is 1 (one head), and on
        // inputs (a broadcast K/V view).
        let mut one = dense_args(b, 1, 1, s, s, d);
        one.o.stride_head = 0;
        one.k.stride_batch = 0;
        one.v.stride_batch = 0;
        assert!(check_fwd(&pl, &one).unwrap().is_some());
        // THD: the rows are the larger of total_q and the longest sequence.
        let thd = p(Mask::None, Layout::Thd);
        let mut t = FwdArgs {
            q: TensorArg::thd(0x1000, 4, 128),
            k: TensorArg::thd(0x2000, 4, 128),
            v: TensorArg::thd(0x3000, 4, 128),
            o: TensorArg::thd(0x4000, 4, 128),
            lse: Some(0x5000),
            problem: FwdProblem {
                batch: 3,
                heads_q: 4,
                heads_kv: 4,
                seqlen_q: 100,
                seqlen_k: 100,
                cu_seqlens_q: Some(0x6000),
                cu_seqlens_k: Some(0x7000),
                total_q: 250,
                window: (-1, -1),
                ..Default::default()
            },
        };
        assert!(check_fwd(&thd, &t).unwrap().is_some());
        t.o.stride_seq = 0;
        assert!(matches!(
            check_fwd(&thd, &t),
            Err(LaunchError::InvalidArgument { arg: "o", .. })
        ));
        t.problem.total_q = 0;
        assert!(matches!(
            check_fwd(&thd, &t),
            Err(LaunchError::InvalidArgument { arg: "o", .. })
        ));
    }

    #[test]
    fn empty_problems_launch_nothing() {
        let pl = p(Mask::CausalBottomRight, Layout::Dense);
        assert_eq!(check_fwd(&pl, &dense_args(0, 4, 4, 64, 64, 128)).unwrap(), None);
        assert_eq!(check_fwd(&pl, &dense_args(2, 4, 4, 0, 64, 128)).unwrap(), None);
    }
}
