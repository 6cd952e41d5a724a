//! Launch the **backward** kernels of a `bwd` spec on a caller's stream.
//!
//! Same conventions as the forward ([`crate::launch`]): raw device pointers,
//! element strides with head-dim stride 1, dense `[batch, seq, heads, d]` or
//! THD `[total, heads, d]` with int32 `cu_seqlens`, a `CUstream` from the
//! caller. Inputs: Q, K, V, O, dO (element type) and the forward's LSE (f32,
//! `[batch, heads_q, seqlen_q]` dense, `[heads_q, total_q]` THD). Outputs: dQ
//! (like Q), dK, dV (like K, V; summed over the query heads of each GQA group)
//! and Dsum = rowsum(dO∘O) (f32, same layout as LSE).
//!
//! The scratch memory is stated up front by [`bwd_workspace_bytes`], a pure
//! function of the plan and the problem, so a framework allocates it from its
//! own allocator (16-byte aligned) and passes it in; nothing is allocated
//! here. Fast mode needs an f32 dQ accumulator (`rows · heads_q · d_qk_padded`
//! floats, zeroed by the first kernel); deterministic mode needs none.
//!
//! Kernels, in launch order (see `plan::plan_bwd` for the symbols): `_pre`,
//! main, then `_dq_convert` (fast) or `_dq` (deterministic). [`check_bwd`]
//! validates everything first (pure, unit-tested without a GPU).

use std::ffi::c_void;

use cudarc::driver::{result, sys};

use crate::launch::{
    check_output_disjoint, check_problem, check_tensors, output_rows, FwdProblem, LaunchDims, LaunchError,
    LoadedKernel, TensorArg,
};
use crate::plan::plan_bwd::{BwdEntries, BwdPlan};
use crate::plan::KernelPlan;
use crate::spec::{AttnSpec, Direction, Layout};

/// Required alignment of the workspace pointer, bytes.
pub const WORKSPACE_ALIGN: u64 = 16;

/// Device buffers of one backward call.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BwdArgs {
    pub q: TensorArg,
    pub k: TensorArg,
    pub v: TensorArg,
    /// The forward's output.
    pub o: TensorArg,
    /// Gradient of the loss with respect to O (same shape as O).
    pub d_o: TensorArg,
    /// The forward's f32 LSE (natural log; -inf for rows that see no key).
    pub lse: u64,
    /// f32 output `Dsum = rowsum(dO∘O)`, same layout as `lse`.
    pub dsum: u64,
    /// Outputs, shaped like Q, K, V.
    pub dq: TensorArg,
    pub dk: TensorArg,
    pub dv: TensorArg,
    pub problem: FwdProblem,
}

/// The kernels' parameter block (one for all entry points); layout identical
/// to `BwdParams` in `templates/bwd_sm80.cu` (size and offsets unit-tested).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BwdParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub d_o: u64,
    pub dq: u64,
    pub dk: u64,
    pub dv: u64,
    pub lse: u64,
    pub dsum: u64,
    pub dq_accum: u64,
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
    pub do_sb: i64,
    pub do_ss: i64,
    pub do_sh: i64,
    pub dq_sb: i64,
    pub dq_ss: i64,
    pub dq_sh: i64,
    pub dk_sb: i64,
    pub dk_ss: i64,
    pub dk_sh: i64,
    pub dv_sb: i64,
    pub dv_ss: i64,
    pub dv_sh: i64,
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
    /// Rows of the `_pre`/`_dq_convert` kernels: dense `batch·seqlen_q`, THD `total_q`.
    pub rows: i32,
    pub scale: f32,
    pub scale_log2: f32,
    pub softcap_pre: f32,
    pub softcap_post: f32,
    /// The causal block order in phases (`templates/common/order.cuh`; 1 =
    /// head-major), set by [`launch_bwd`] from the main kernel's grid.
    pub tile_phases: i32,
}

/// One kernel launch of the backward sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BwdStep {
    /// Entry symbol in the CUBIN.
    pub entry: String,
    pub dims: LaunchDims,
}

/// A checked backward call: the parameter block and the launches, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct BwdLaunch {
    pub params: BwdParams,
    pub steps: Vec<BwdStep>,
}

fn invalid(arg: &'static str, reason: impl Into<String>) -> LaunchError {
    LaunchError::InvalidArgument {
        arg,
        reason: reason.into(),
    }
}

fn bwd_plan(plan: &KernelPlan) -> Result<&BwdPlan, LaunchError> {
    match (&plan.bwd, plan.spec.direction) {
        (Some(b), Direction::Bwd) => Ok(b),
        _ => Err(LaunchError::SpecMismatch {
            spec: plan.spec.to_string(),
            reason: "not a backward kernel".into(),
        }),
    }
}

/// Query rows the `_pre`/`_dq_convert` kernels cover: dense `batch·seqlen_q`,
/// THD `total_q`.
fn dq_rows(spec: &AttnSpec, p: &FwdProblem) -> u64 {
    match spec.layout {
        Layout::Dense => p.batch as u64 * p.seqlen_q as u64,
        Layout::Thd => p.total_q as u64,
    }
}

/// Scratch bytes a backward call needs (pure; 0 for deterministic specs and
/// non-backward plans). Fast mode: the f32 dQ accumulator, `round_up(rows, G)
/// · heads_q · head_dim_qk_padded` floats (rows: dense `batch·seqlen_q`, THD
/// `total_q`; G: the plan's `dq_tile_rows`, see [`dq_acc_index`]).
pub fn bwd_workspace_bytes(plan: &KernelPlan, problem: &FwdProblem) -> u64 {
    let Some(bp) = plan.bwd.as_ref() else { return 0 };
    if plan.spec.deterministic {
        return 0;
    }
    let g = bp.dq_tile_rows.max(1) as u64;
    dq_rows(&plan.spec, problem).next_multiple_of(g) * problem.heads_q as u64 * plan.head_dim_qk_padded as u64 * 4
}

/// Float offset of `(token, head, column)` in the fast-mode dQ accumulator of
/// `heads` query heads: the host mirror of `dq_acc_at + dq_acc_col` in
/// `templates/common/bwd_common.cuh`. Tokens in groups of G (the plan's
/// `dq_tile_rows`); per group, per head, the columns in blocks of 8:
/// `[token / G][head][c / 8][token % G][c % 8]`, so the kernels' reductions of
/// one MMA accumulator tile (G rows × 8 columns) are contiguous. G = 1 is the
/// row-major `[token][head][c]`.
pub fn dq_acc_index(bp: &BwdPlan, dqk_padded: u32, heads: u32, token: u64, head: u32, col: u32) -> u64 {
    let g = bp.dq_tile_rows.max(1) as u64;
    let (d, c, t) = (dqk_padded as u64, col as u64, token);
    ((t / g) * heads as u64 + head as u64) * g * d + (c / 8) * g * 8 + (t % g) * 8 + c % 8
}

/// Validate a backward call against its plan and build the launches.
/// Returns `Ok(None)` when there is nothing to compute.
pub fn check_bwd(
    plan: &KernelPlan,
    a: &BwdArgs,
    workspace: u64,
    workspace_bytes: u64,
) -> Result<Option<BwdLaunch>, LaunchError> {
    let spec: &AttnSpec = &plan.spec;
    let bp = bwd_plan(plan)?;
    let p = &a.problem;
    let scale = check_problem(spec, p)?;

    check_tensors(
        spec.layout,
        &[
            ("q", &a.q),
            ("k", &a.k),
            ("v", &a.v),
            ("o", &a.o),
            ("d_o", &a.d_o),
            ("dq", &a.dq),
            ("dk", &a.dk),
            ("dv", &a.dv),
        ],
    )?;
    let (q_rows, k_rows) = (
        output_rows(spec.layout, p.seqlen_q, p.total_q),
        output_rows(spec.layout, p.seqlen_k, p.total_k),
    );
    let (d_qk, d_v) = (spec.head_dim_qk as u32, spec.head_dim_v as u32);
    check_output_disjoint(spec.layout, "dq", &a.dq, (p.batch, q_rows, p.heads_q, d_qk))?;
    check_output_disjoint(spec.layout, "dk", &a.dk, (p.batch, k_rows, p.heads_kv, d_qk))?;
    check_output_disjoint(spec.layout, "dv", &a.dv, (p.batch, k_rows, p.heads_kv, d_v))?;
    for (name, ptr) in [("lse", a.lse), ("dsum", a.dsum)] {
        if ptr == 0 || !ptr.is_multiple_of(4) {
            return Err(invalid(name, "f32 pointer must be non-null and 4-byte aligned"));
        }
    }
    let need = bwd_workspace_bytes(plan, p);
    if need > 0 {
        if workspace == 0 || !workspace.is_multiple_of(WORKSPACE_ALIGN) {
            return Err(invalid(
                "workspace",
                format!("must be non-null and {WORKSPACE_ALIGN}-byte aligned ({need} bytes needed)"),
            ));
        }
        if workspace_bytes < need {
            return Err(invalid(
                "workspace",
                format!("{workspace_bytes} bytes given, {need} needed (see bwd_workspace_bytes)"),
            ));
        }
    }

    if p.batch == 0 || (p.seqlen_q == 0 && p.seqlen_k == 0) {
        return Ok(None);
    }
    let rows = dq_rows(spec, p);
    if rows > i32::MAX as u64 {
        return Err(invalid("batch", "batch * seqlen_q (THD: total_q) exceeds 2^31 - 1"));
    }
    let (lse_sb, lse_sh) = match spec.layout {
        Layout::Dense => ((p.heads_q as i64) * p.seqlen_q as i64, p.seqlen_q as i64),
        Layout::Thd => (0, p.total_q as i64),
    };
    let grid_y = |len: u32, block: u32, arg: &'static str| -> Result<u32, LaunchError> {
        let n = len.div_ceil(block);
        if n > 65535 {
            return Err(invalid(
                arg,
                format!("{len} exceeds the grid limit of {} rows", 65535 * block),
            ));
        }
        Ok(n)
    };
    let bh_kv = p.batch as u64 * p.heads_kv as u64;
    let bh_q = p.batch as u64 * p.heads_q as u64;
    if bh_q > i32::MAX as u64 {
        return Err(invalid("batch", "batch * heads_q exceeds 2^31 - 1"));
    }
    let row_blocks = (rows * p.heads_q as u64).div_ceil(bp.row_warps as u64);
    if row_blocks > i32::MAX as u64 {
        return Err(invalid("batch", "query rows * heads_q exceed the grid limit"));
    }

    let entries = BwdEntries::of(plan);
    let mut steps = Vec::new();
    let row_step = |entry: String| BwdStep {
        entry,
        dims: LaunchDims {
            grid: (row_blocks as u32, 1, 1),
            block: (bp.row_warps * 32, 1, 1),
            smem: 0,
        },
    };
    if rows > 0 {
        steps.push(row_step(entries.pre.clone()));
    }
    let kv_tiles = grid_y(p.seqlen_k, bp.block_n, "seqlen_k")?;
    if kv_tiles > 0 {
        steps.push(BwdStep {
            entry: entries.main.clone(),
            dims: LaunchDims {
                grid: (bh_kv as u32, kv_tiles, 1),
                block: (bp.num_warps * 32, 1, 1),
                smem: bp.main_smem,
            },
        });
    }
    if rows > 0 {
        if spec.deterministic {
            let q_tiles = grid_y(p.seqlen_q, bp.dq_block_m, "seqlen_q")?;
            steps.push(BwdStep {
                entry: entries.dq.clone(),
                dims: LaunchDims {
                    grid: (bh_q as u32, q_tiles, 1),
                    block: (bp.dq_warps * 32, 1, 1),
                    smem: bp.dq_smem,
                },
            });
        } else {
            steps.push(row_step(entries.dq_convert.clone()));
        }
    }

    let (softcap_pre, softcap_post) = if spec.softcap {
        (scale / p.softcap, p.softcap * std::f32::consts::LOG2_E)
    } else {
        (0.0, 0.0)
    };
    let thd = spec.layout == Layout::Thd;
    // The batch stride is meaningless for packed tensors.
    let sb = |t: &TensorArg| if thd { 0 } else { t.stride_batch };
    let params = BwdParams {
        q: a.q.ptr,
        k: a.k.ptr,
        v: a.v.ptr,
        o: a.o.ptr,
        d_o: a.d_o.ptr,
        dq: a.dq.ptr,
        dk: a.dk.ptr,
        dv: a.dv.ptr,
        lse: a.lse,
        dsum: a.dsum,
        dq_accum: if need > 0 { workspace } else { 0 },
        cu_seqlens_q: p.cu_seqlens_q.unwrap_or(0),
        cu_seqlens_k: p.cu_seqlens_k.unwrap_or(0),
        q_sb: sb(&a.q),
        q_ss: a.q.stride_seq,
        q_sh: a.q.stride_head,
        k_sb: sb(&a.k),
        k_ss: a.k.stride_seq,
        k_sh: a.k.stride_head,
        v_sb: sb(&a.v),
        v_ss: a.v.stride_seq,
        v_sh: a.v.stride_head,
        o_sb: sb(&a.o),
        o_ss: a.o.stride_seq,
        o_sh: a.o.stride_head,
        do_sb: sb(&a.d_o),
        do_ss: a.d_o.stride_seq,
        do_sh: a.d_o.stride_head,
        dq_sb: sb(&a.dq),
        dq_ss: a.dq.stride_seq,
        dq_sh: a.dq.stride_head,
        dk_sb: sb(&a.dk),
        dk_ss: a.dk.stride_seq,
        dk_sh: a.dk.stride_head,
        dv_sb: sb(&a.dv),
        dv_ss: a.dv.stride_seq,
        dv_sh: a.dv.stride_head,
        lse_sb,
        lse_sh,
        batch: p.batch as i32,
        heads_q: p.heads_q as i32,
        heads_kv: p.heads_kv as i32,
        gqa_ratio: (p.heads_q / p.heads_kv) as i32,
        seqlen_q: p.seqlen_q as i32,
        seqlen_k: p.seqlen_k as i32,
        window_left: p.window.0,
        window_right: p.window.1,
        rows: rows as i32,
        scale,
        scale_log2: scale * std::f32::consts::LOG2_E,
        softcap_pre,
        softcap_post,
        tile_phases: 1,
    };
    Ok(Some(BwdLaunch { params, steps }))
}

/// Check the arguments and launch the backward kernels, in order, on `stream`.
///
/// # Safety
/// The pointers in `args` must be device memory of the current context, large
/// enough for the shapes and strides given; `workspace` must hold
/// `workspace_bytes` bytes of device memory (at least
/// [`bwd_workspace_bytes`]); `stream` must be a valid stream of that context
/// (or null for the legacy default stream). The outputs and the workspace must
/// not be in use by other work on other streams until the launches complete.
pub unsafe fn launch_bwd(
    k: &LoadedKernel,
    args: &BwdArgs,
    workspace: u64,
    workspace_bytes: u64,
    stream: sys::CUstream,
) -> Result<(), LaunchError> {
    let Some(BwdLaunch { mut params, steps }) = check_bwd(&k.plan, args, workspace, workspace_bytes)? else {
        return Ok(());
    };
    // The main kernel's grid (bh_kv, kv tiles) sets the causal order's
    // phases; the deterministic dQ kernel takes the same count. The main
    // kernel is the plan's entry (BwdEntries::main).
    if let Some(step) = steps.iter().find(|s| s.entry == k.plan.entry) {
        params.tile_phases = k.phases_for(step.dims.grid.1) as i32;
    }
    for step in &steps {
        let func = k.function(&step.entry)?;
        let mut kp: [*mut c_void; 1] = [&mut params as *mut BwdParams as *mut c_void];
        let d = step.dims;
        result::launch_kernel(func, d.grid, d.block, d.smem, stream, &mut kp).map_err(|e| LaunchError::Driver {
            call: "cuLaunchKernel",
            code: format!("{e:?} ({})", step.entry),
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::plan;
    use crate::spec::Mask;

    fn args(b: u32, hq: u32, hkv: u32, sq: u32, sk: u32, d: i64) -> BwdArgs {
        let (sq_, sk_) = (sq as i64, sk as i64);
        BwdArgs {
            q: TensorArg::bshd(0x1000, sq_, hq as i64, d),
            k: TensorArg::bshd(0x2000, sk_, hkv as i64, d),
            v: TensorArg::bshd(0x3000, sk_, hkv as i64, d),
            o: TensorArg::bshd(0x4000, sq_, hq as i64, d),
            d_o: TensorArg::bshd(0x5000, sq_, hq as i64, d),
            lse: 0x6000,
            dsum: 0x7000,
            dq: TensorArg::bshd(0x8000, sq_, hq as i64, d),
            dk: TensorArg::bshd(0x9000, sk_, hkv as i64, d),
            dv: TensorArg::bshd(0xa000, sk_, hkv as i64, d),
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

    fn pl(s: &str) -> KernelPlan {
        plan(&s.parse().unwrap()).unwrap()
    }

    #[test]
    fn params_block_has_the_cuda_layout() {
        // 13 pointers + 26 i64, then 10 i32 (the last tile_phases) + 4 f32, no implicit padding.
        assert_eq!(std::mem::size_of::<BwdParams>(), 13 * 8 + 26 * 8 + 14 * 4);
        assert_eq!(std::mem::offset_of!(BwdParams, q_sb), 13 * 8);
        assert_eq!(std::mem::offset_of!(BwdParams, lse_sb), 13 * 8 + 24 * 8);
        assert_eq!(std::mem::offset_of!(BwdParams, batch), 13 * 8 + 26 * 8);
        assert_eq!(std::mem::offset_of!(BwdParams, rows), 13 * 8 + 26 * 8 + 8 * 4);
        assert_eq!(std::mem::offset_of!(BwdParams, softcap_post), 13 * 8 + 26 * 8 + 12 * 4);
    }

    #[test]
    fn fast_mode_launches_pre_main_convert_with_a_workspace() {
        let p = pl("bwd.bf16.d128.causal-br.dense.sm80");
        let a = args(2, 8, 2, 1000, 700, 128);
        let need = bwd_workspace_bytes(&p, &a.problem);
        // 2000 rows are whole tiles of 8 (the sm80 path's dQ tiles).
        assert_eq!(p.bwd.as_ref().unwrap().dq_tile_rows, 8);
        assert_eq!(need, 2 * 1000 * 8 * 128 * 4);
        let l = check_bwd(&p, &a, 0x10_0000, need).unwrap().unwrap();
        let names: Vec<&str> = l.steps.iter().map(|s| s.entry.as_str()).collect();
        assert_eq!(
            names,
            [
                format!("{}_pre", p.entry).as_str(),
                p.entry.as_str(),
                format!("{}_dq_convert", p.entry).as_str()
            ]
        );
        let bp = p.bwd.as_ref().unwrap();
        assert_eq!(l.steps[1].dims.grid, (4, 700u32.div_ceil(bp.block_n), 1));
        assert_eq!(
            l.steps[0].dims.grid.0 as u64,
            (2 * 1000 * 8u64).div_ceil(bp.row_warps as u64)
        );
        assert_eq!(l.params.gqa_ratio, 4);
        assert_eq!(l.params.rows, 2000);
        assert_eq!((l.params.lse_sb, l.params.lse_sh), (8 * 1000, 1000));
        assert_eq!(l.params.dq_accum, 0x10_0000);
        // Too small, unaligned or missing workspace: typed errors.
        for (ptr, bytes) in [(0x10_0000, need - 4), (0x10_0008, need), (0, need)] {
            assert!(matches!(
                check_bwd(&p, &a, ptr, bytes),
                Err(LaunchError::InvalidArgument { arg: "workspace", .. })
            ));
        }
    }

    #[test]
    fn dq_accumulator_layout_is_a_bijection_onto_the_workspace() {
        // Every (token, head, column) has its own float inside the workspace,
        // the 8 columns of a block are contiguous, and a tile of G tokens x 8
        // columns is one contiguous run (what the kernels' reductions rely on).
        for (spec, g) in [
            ("bwd.bf16.d128.causal-br.dense.sm80", 8),
            ("bwd.f16.d64.causal-br.thd.sm90a", 16),
            ("bwd.bf16.d96.none.dense.sm80", 8),
            // The wgmma backward of ragged specs without a mask: row-major.
            ("bwd.bf16.d128.none.thd.sm90a", 1),
        ] {
            let p = pl(spec);
            let bp = p.bwd.as_ref().unwrap();
            assert_eq!(bp.dq_tile_rows, g, "{spec}");
            let d = p.head_dim_qk_padded;
            let (heads, rows) = (3u32, 37u64);
            let prob = FwdProblem {
                batch: 1,
                heads_q: heads,
                heads_kv: 1,
                seqlen_q: rows as u32,
                seqlen_k: 5,
                total_q: rows as u32,
                total_k: 5,
                window: (-1, -1),
                ..Default::default()
            };
            let floats = bwd_workspace_bytes(&p, &prob) / 4;
            assert_eq!(floats, rows.next_multiple_of(g as u64) * heads as u64 * d as u64);
            let mut seen = vec![false; floats as usize];
            for h in 0..heads {
                for t in 0..rows {
                    for c in 0..d {
                        let i = dq_acc_index(bp, d, heads, t, h, c);
                        assert!(i < floats, "{spec}: ({t}, {h}, {c}) -> {i} outside {floats}");
                        assert!(!seen[i as usize], "{spec}: ({t}, {h}, {c}) -> {i} twice");
                        seen[i as usize] = true;
                        if g == 1 {
                            // bwd_sm90a.cu's row-major address (DQ_G == 1).
                            assert_eq!(i, (t * heads as u64 + h as u64) * d as u64 + c as u64);
                        }
                        if c % 8 > 0 {
                            assert_eq!(i, dq_acc_index(bp, d, heads, t, h, c - 1) + 1);
                        }
                    }
                }
                // One tile: G tokens of a group x one column block, contiguous.
                let base = dq_acc_index(bp, d, heads, g as u64, h, 8);
                for k in 0..g as u64 * 8 {
                    assert_eq!(
                        dq_acc_index(bp, d, heads, g as u64 + k / 8, h, 8 + (k % 8) as u32),
                        base + k
                    );
                }
            }
        }
        // Deterministic plans have no accumulator.
        let det = pl("bwd.bf16.d128.none.dense.det.sm80");
        assert_eq!(det.bwd.as_ref().unwrap().dq_tile_rows, 0);
    }

    #[test]
    fn deterministic_mode_needs_no_workspace() {
        let p = pl("bwd.f16.d64.window.thd.softcap.det.sm90a");
        let mut a = args(3, 4, 4, 100, 100, 64);
        for t in [
            &mut a.q, &mut a.k, &mut a.v, &mut a.o, &mut a.d_o, &mut a.dq, &mut a.dk, &mut a.dv,
        ] {
            *t = TensorArg::thd(t.ptr, 4, 64);
        }
        a.problem.cu_seqlens_q = Some(0x100);
        a.problem.cu_seqlens_k = Some(0x200);
        a.problem.total_q = 150;
        a.problem.softcap = 30.0;
        a.problem.window = (16, 0);
        assert_eq!(bwd_workspace_bytes(&p, &a.problem), 0);
        let l = check_bwd(&p, &a, 0, 0).unwrap().unwrap();
        assert_eq!(l.steps.len(), 3);
        assert_eq!(l.steps[2].entry, format!("{}_dq", p.entry));
        let bp = p.bwd.as_ref().unwrap();
        assert_eq!(l.steps[2].dims.grid, (12, 100u32.div_ceil(bp.dq_block_m), 1));
        assert_eq!(l.steps[2].dims.smem, bp.dq_smem);
        assert_eq!((l.params.lse_sb, l.params.lse_sh, l.params.q_sb), (0, 150, 0));
        assert_eq!(l.params.dq_accum, 0);
        let expect = (1.0 / 8f32) / 30.0;
        assert!((l.params.softcap_pre - expect).abs() < 1e-9);
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        let p = pl("bwd.bf16.d128.none.dense.det.sm80");
        let ok = args(1, 4, 4, 64, 64, 128);
        assert!(check_bwd(&p, &ok, 0, 0).is_ok());
        let mut a = ok.clone();
        a.dk.ptr = 0x9008;
        assert!(matches!(
            check_bwd(&p, &a, 0, 0),
            Err(LaunchError::InvalidArgument { arg: "dk", .. })
        ));
        a = ok.clone();
        a.d_o.stride_seq = 100;
        assert!(matches!(
            check_bwd(&p, &a, 0, 0),
            Err(LaunchError::InvalidArgument { arg: "d_o", .. })
        ));
        a = ok.clone();
        a.dsum = 0x7002;
        assert!(matches!(
            check_bwd(&p, &a, 0, 0),
            Err(LaunchError::InvalidArgument { arg: "dsum", .. })
        ));
        // The context of a forward run without an LSE (inference) cannot feed a backward.
        a = ok.clone();
        a.lse = 0;
        assert!(matches!(
            check_bwd(&p, &a, 0, 0),
            Err(LaunchError::InvalidArgument { arg: "lse", .. })
        ));
        a = ok.clone();
        a.problem.heads_kv = 3;
        assert!(matches!(
            check_bwd(&p, &a, 0, 0),
            Err(LaunchError::InvalidArgument { arg: "heads_kv", .. })
        ));
        a = ok.clone();
        a.problem.window = (8, 8);
        assert!(matches!(check_bwd(&p, &a, 0, 0), Err(LaunchError::SpecMismatch { .. })));
        a = ok.clone();
        a.problem.softcap = 10.0;
        assert!(matches!(check_bwd(&p, &a, 0, 0), Err(LaunchError::SpecMismatch { .. })));
        a = ok.clone();
        a.problem.cu_seqlens_q = Some(0x100);
        assert!(matches!(check_bwd(&p, &a, 0, 0), Err(LaunchError::SpecMismatch { .. })));
        a = ok.clone();
        a.problem.scale = Some(-1.0);
        assert!(matches!(
            check_bwd(&p, &a, 0, 0),
            Err(LaunchError::InvalidArgument { arg: "scale", .. })
        ));
        a = ok.clone();
        a.problem.seqlen_k = 70_000 * 128;
        assert!(matches!(
            check_bwd(&p, &a, 0, 0),
            Err(LaunchError::InvalidArgument { arg: "seqlen_k", .. })
        ));
        // A forward plan is not a backward kernel.
        let f = plan(&AttnSpec::fwd(
            crate::spec::DType::Bf16,
            128,
            Mask::None,
            Layout::Dense,
            crate::spec::Arch::Sm80,
        ))
        .unwrap();
        assert!(matches!(
            check_bwd(&f, &ok, 0, 0),
            Err(LaunchError::SpecMismatch { .. })
        ));
        assert_eq!(bwd_workspace_bytes(&f, &ok.problem), 0);
    }

    #[test]
    fn gradients_must_not_alias() {
        let p = pl("bwd.bf16.d64.causal-br.dense.sm80");
        let ok = args(2, 8, 2, 64, 64, 64);
        let need = bwd_workspace_bytes(&p, &ok.problem);
        assert!(check_bwd(&p, &ok, 0x1000, need).unwrap().is_some());
        for name in ["dq", "dk", "dv"] {
            let mut a = ok.clone();
            let t = match name {
                "dq" => &mut a.dq,
                "dk" => &mut a.dk,
                _ => &mut a.dv,
            };
            t.stride_head = 0; // every head on the same rows
            match check_bwd(&p, &a, 0x1000, need) {
                Err(LaunchError::InvalidArgument { arg, .. }) => assert_eq!(arg, name),
                other => panic!("{name}: {other:?}"),
            }
        }
        // MQA: one kv head, whose head stride is never used.
        let mut mqa = args(2, 8, 1, 64, 64, 64);
        mqa.dk.stride_head = 0;
        mqa.dv.stride_head = 0;
        let need = bwd_workspace_bytes(&p, &mqa.problem);
        assert!(check_bwd(&p, &mqa, 0x1000, need).unwrap().is_some());
    }

    #[test]
    fn empty_problems_and_empty_sides() {
        let p = pl("bwd.bf16.d64.causal-br.dense.sm80");
        assert_eq!(
            check_bwd(&p, &args(0, 4, 4, 64, 64, 64), 0x1000, 1 << 30).unwrap(),
            None
        );
        assert_eq!(check_bwd(&p, &args(2, 4, 4, 0, 0, 64), 0x1000, 1 << 30).unwrap(), None);
        // No queries: dK = dV = 0 must still be written by the main kernel.
        let l = check_bwd(&p, &args(2, 4, 4, 0, 64, 64), 0, 0).unwrap().unwrap();
        assert_eq!(l.steps.len(), 1);
        assert_eq!(l.steps[0].entry, p.entry);
        // No keys: dQ = 0 comes from the zeroed accumulator.
        let a = args(2, 4, 4, 64, 0, 64);
        let need = bwd_workspace_bytes(&p, &a.problem);
        let l = check_bwd(&p, &a, 0x1000, need).unwrap().unwrap();
        let names: Vec<&str> = l.steps.iter().map(|s| s.entry.as_str()).collect();
        assert_eq!(names.len(), 2);
        assert!(names[0].ends_with("_pre") && names[1].ends_with("_dq_convert"));
    }
}
