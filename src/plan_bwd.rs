//! Planner of the sm80-path **backward** (FlashAttention-2 style), declared
//! from `plan.rs` as `plan::plan_bwd`.
//!
//! A backward [`KernelPlan`] describes ONE CUBIN with several entry points,
//! all named from the plan's single `entry` base (see [`BwdEntries`]):
//!
//! | symbol | grid | what |
//! |---|---|---|
//! | `{entry}_pre` | `ceil(rows·heads_q / row_warps)` | `Dsum = rowsum(dO∘O)` (f32, LSE layout); zeroes the f32 `dq_accum` workspace (fast mode) |
//! | `{entry}` | `(batch·heads_kv, ceil(seqlen_k / block_n))` | main: one block per kv tile of one kv head; loops over the query heads of its GQA group and the query tiles that see the tile; writes dK, dV; fast mode also adds dQ into `dq_accum` with f32 atomics |
//! | `{entry}_dq_convert` | as `_pre` | fast mode: `dQ = scale · dq_accum` in the element type |
//! | `{entry}_dq` | `(batch·heads_q, ceil(seqlen_q / dq_block_m))` | deterministic mode: one block per query tile recomputes dS and writes dQ (no atomics anywhere) |
//!
//! The main kernel is the plain `entry` (not `{entry}_main`) so that the
//! cache metadata, `attnforge compile` and `attnforge cache ls` — which report
//! the resources of `plan.entry` — show the heaviest kernel. Launch order:
//! `_pre`, main, then `_dq_convert` (fast) or `_dq` (det). `KernelPlan::grid`
//! keeps the forward's rule for lack of a backward variant; the grids above
//! (and [`crate::launch_bwd`]) are authoritative.
//!
//! Tiles of the main kernel: warps are arranged three times over the block,
//! once per product, each warp tile a multiple of 16×16:
//! - **S** phase: `Sᵀ = K Qᵀ` and `dPᵀ = V dOᵀ` over `[block_n × block_m]`,
//!   then `Pᵀ`, `dSᵀ` written to shared memory (elements);
//! - **KV** phase: `dV += Pᵀ dO` over `[block_n × d_v]`, `dK += dSᵀ Q` over
//!   `[block_n × d_qk]` (a warp grid each); these accumulators live in
//!   registers for the whole block;
//! - **dQ** phase (fast mode): `dQ = dS K` over `[block_m × d_qk]`, added to
//!   `dq_accum` with `red.global.add` (on sm_90 one 16-byte
//!   `red.global.add.v4.f32` per four columns: lanes swap halves first).
//!
//! The S and dQ phases walk their warp tiles in column chunks of at most
//! `acc_chunk` f32 accumulators per thread per array, so that next to the
//! dK/dV accumulators the larger tiles (d128: 128 kv rows, d256: 64) stay
//! spill-free; a chunk re-reads its A operand from shared memory.

use serde::{Deserialize, Serialize};

use crate::plan::{entry_name, GridRule, KernelPlan, Template};
use crate::spec::{Arch, AttnSpec};

/// Warps per block of the `_pre` and `_dq_convert` kernels (one warp per
/// `(token, head)` row).
pub const ROW_WARPS: u32 = 4;

/// Register estimate (f32 values per thread, plus a fixed allowance for
/// fragments and addresses) above which a tile shape is not taken.
const REG_BUDGET: u32 = 224;

/// The backward-only part of a plan.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BwdPlan {
    /// Main kernel: query rows per inner step.
    pub block_m: u32,
    /// Main kernel: kv rows per block.
    pub block_n: u32,
    pub num_warps: u32,
    /// Q/dO/LSE/Dsum shared-memory buffers (2 = next query tile prefetched).
    pub q_stages: u32,
    /// Row pitch (elements) of the Pᵀ and dSᵀ tiles in shared memory.
    pub pitch_m: u32,
    /// Warp grids `(rows, cols)` of the three phases (see the module docs).
    pub warps_s: (u32, u32),
    pub warps_dk: (u32, u32),
    pub warps_dv: (u32, u32),
    pub warps_dq: (u32, u32),
    /// Dynamic shared memory of the main kernel, bytes.
    pub main_smem: u32,
    /// Deterministic dQ kernel (`_dq`): query rows per block (16 per warp),
    /// kv rows per step, warps, K/V pipeline depth, shared memory. All 0 in
    /// fast mode.
    pub dq_block_m: u32,
    pub dq_block_n: u32,
    pub dq_warps: u32,
    pub dq_kv_stages: u32,
    pub dq_smem: u32,
    /// Warps per block of `_pre` and `_dq_convert`.
    pub row_warps: u32,
    /// The S and dQ phases walk their warp tiles in column chunks of at most
    /// this many f32 accumulators per thread per array (fewer live registers
    /// next to the dK/dV accumulators; a chunk re-reads its A operand).
    pub acc_chunk: u32,
    /// The dQ phase loads its A operand (dS) into registers once for all its
    /// column chunks instead of once per chunk (d256: +3.6-5.5% on the H200,
    /// where the registers allow it; the compile sweep checks for spills).
    #[serde(default)]
    pub dq_frags_once: bool,
    /// dV and dK are accumulated inside the S phase from the P and dS that
    /// the S phase leaves in registers (its Sᵀ accumulator layout is the
    /// A-operand layout of PᵀdO and dSᵀQ): possible where the three warp grids
    /// coincide with each warp owning whole kv rows of Sᵀ (every query column),
    /// which the planner's d <= 64 shape does. Pᵀ then never goes to shared
    /// memory and the separate dV/dK phase disappears.
    #[serde(default)]
    pub kv_in_regs: bool,
    /// The dQ phase's column-chunk limit when it differs from `acc_chunk`
    /// (0: the same). Under `kv_in_regs` the S phase's accumulators are dead
    /// by the dQ phase, so it takes 32-float chunks (one A-operand read of
    /// dS instead of two at d64).
    #[serde(default)]
    pub dq_chunk: u32,
    /// dK += dSᵀQ after the dQ phase instead of beside dV (FlashAttention-2's
    /// order), so that its MMAs issue while the dQ reductions drain. Measured
    /// at d128 (session 15, one process): +2.6% without a mask, −0.9% causal,
    /// −2..−3% at d256; planned for fast-mode d128 specs without a mask.
    #[serde(default)]
    pub dk_after_dq: bool,
    /// dK += dSᵀQ spread over the dQ phase: after each column chunk's
    /// reductions, that chunk's share of dK's k-steps, so that every burst of
    /// reductions drains under tensor-core work instead of under the next
    /// chunk's first products (which overwrite the registers the queued
    /// reductions still read). Needs every warp in both the dK and dQ grids.
    #[serde(default)]
    pub dk_in_dq: bool,
    /// The main kernel's Q and dO tiles (copied once per query tile) stored
    /// swizzled instead of padded: rows of whole 128-byte lines, each 16-byte
    /// chunk at `chunk ^ (row % 8)` (`templates/common/tile.cuh`). The copies
    /// then write whole shared-memory lines (ncu, session 29: 2.3–2.6× the ideal
    /// wavefronts with padded rows). Needs head dims that are multiples of 64
    /// and dK/dV warp tiles of whole 64-column lines.
    #[serde(default)]
    pub qdo_swizzle: bool,
    /// The wgmma backward's blocks walk their query tiles starting from the
    /// one on their own diagonal (wrapping), not from the first. Without a
    /// mask every kv tile of a head sees every query tile, so head-major
    /// blocks in flight that all start at tile 0 add into the same dQ rows at
    /// the same moment; rotated, they spread their reductions over the head's
    /// rows. Measured (session 30, H100, one process, 8k): d128 +6.4%, d64
    /// +0.5%; the same walk in bwd_sm80.cu moved −0.6..+0.8% (d64/d128/d256)
    /// and was not kept there. Fast mode without a mask (masked walks start at
    /// their own diagonal already).
    #[serde(default)]
    pub walk_rotation: bool,
    /// Fast mode: the f32 dQ accumulator is stored in tiles of this many
    /// tokens (0 in deterministic mode, which has none): tokens in groups of
    /// G, per group and query head the columns in blocks of 8,
    /// `[token / G][head][c / 8][token % G][c % 8]`
    /// (`launch_bwd::dq_acc_index`). A warp's reductions of one MMA
    /// accumulator tile (8 or 16 rows × 8 columns) then land in 2–4 whole
    /// 128-byte lines instead of one line per row: ncu (session 28, d256 8k)
    /// counted 8 L1 tag requests per 8-byte row-major reduction against 1 per
    /// 128 B for FlashAttention-2's permuted accumulator. G = 1 is the
    /// row-major `[token][head][c]`.
    #[serde(default)]
    pub dq_tile_rows: u32,
}

/// Tokens per tile of the fast-mode dQ accumulator (`BwdPlan::dq_tile_rows`)
/// of the template (`Template::BwdSm80` or `BwdSm90a`): the rows one
/// reduction instruction covers (8 in the sm80 path's 8-byte reductions, 16 in
/// the wgmma path's 16-byte ones). The wgmma backward of ragged specs without
/// a mask keeps the plain layout (G = 1): with tiles its main kernel spills
/// 4–16 B at d96/d128 (255 registers).
fn dq_tile_rows(spec: &AttnSpec, template: Template) -> u32 {
    use crate::spec::{Layout, Mask};
    match template {
        _ if spec.deterministic => 0,
        Template::BwdSm90a if spec.layout == Layout::Thd && spec.mask == Mask::None => 1,
        Template::BwdSm90a => 16,
        _ => 8,
    }
}

/// Whether the wgmma backward's blocks start their query-tile walks on their
/// own diagonal (`BwdPlan::walk_rotation`): fast mode without a mask, where
/// every block of a head walks the same query tiles and all of them add into dQ.
fn walk_rotation(spec: &AttnSpec) -> bool {
    !spec.deterministic && spec.mask == crate::spec::Mask::None
}

/// The plan's reason for its dQ accumulator (fast mode), by tile rows.
fn dq_tiled_why(g: u32) -> String {
    let head = "fast: dQ accumulated in an f32 workspace with red.global.add, then converted";
    match g {
        1 => format!("{head}; the workspace row-major (tiles spill here)"),
        _ => format!(
            "{head}; the workspace in tiles of {g} tokens x 8 columns, so a warp's reductions of one column block \
             cover {} whole 128-byte lines instead of one line per row",
            g / 4
        ),
    }
}

const WALK_ROTATION_WHY: &str =
    "main: each block starts its query-tile walk on its own diagonal, so the blocks in flight \
     add into different dQ rows (measured at d128 without a mask: +6.4%)";

impl BwdPlan {
    /// The dQ phase's column-chunk limit (f32 per thread per array).
    pub fn dq_chunk(&self) -> u32 {
        if self.dq_chunk > 0 {
            self.dq_chunk
        } else {
            self.acc_chunk
        }
    }
}

/// Entry symbols of a backward CUBIN, derived from `KernelPlan::entry`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BwdEntries {
    pub pre: String,
    pub main: String,
    /// Fast mode only.
    pub dq_convert: String,
    /// Deterministic mode only.
    pub dq: String,
}

impl BwdEntries {
    pub fn of(plan: &KernelPlan) -> Self {
        BwdEntries {
            pre: format!("{}_pre", plan.entry),
            main: plan.entry.clone(),
            dq_convert: format!("{}_dq_convert", plan.entry),
            dq: format!("{}_dq", plan.entry),
        }
    }
}

/// Whether dV and dK can be accumulated from the S phase's registers: the
/// three warp grids are equal and each warp owns whole kv rows of Sᵀ.
fn kv_in_regs(warps_s: (u32, u32), warps_dk: (u32, u32), warps_dv: (u32, u32)) -> bool {
    warps_s.1 == 1 && warps_dk == warps_s && warps_dv == warps_s
}

fn round_up(x: u32, m: u32) -> u32 {
    x.div_ceil(m) * m
}

/// The warp grid `(wr, wc)`, `wr·wc <= warps`, that splits `rows × cols`
/// into warp tiles that are multiples of 16 in both dims (every entry of
/// `cols` must split evenly): most active warps first, then the smallest
/// per-warp `rows + cols[0]` (operand traffic), then more row splits.
pub fn warp_grid(rows: u32, cols: &[u32], warps: u32) -> Option<(u32, u32)> {
    // Preference key: (active warps, -(per-warp rows + cols), row splits).
    type Key = (u32, i64, u32);
    let mut best: Option<(Key, u32, u32)> = None;
    for wr in 1..=warps {
        for wc in 1..=warps / wr {
            if !rows.is_multiple_of(16 * wr) || cols.iter().any(|c| !c.is_multiple_of(16 * wc)) {
                continue;
            }
            let key = (wr * wc, -((rows / wr + cols[0] / wc) as i64), wr);
            if best.is_none_or(|(k, _, _)| key > k) {
                best = Some((key, wr, wc));
            }
        }
    }
    best.map(|(_, wr, wc)| (wr, wc))
}

/// Shared memory of the main kernel: K and V once, Q/dO `q_stages` deep, Pᵀ
/// and dSᵀ, and the f32 LSE/Dsum of each Q stage.
/// `st_tiles`: the Pᵀ and dSᵀ tiles kept in shared memory, 2, or 1 (dSᵀ for the
/// dQ phase) / 0 where [`BwdPlan::kv_in_regs`] keeps P (and dS) in registers.
pub fn main_smem(
    block_m: u32,
    block_n: u32,
    q_stages: u32,
    pitch_qk: u32,
    pitch_v: u32,
    pitch_m: u32,
    st_tiles: u32,
) -> u32 {
    2 * (block_n * (pitch_qk + pitch_v) + q_stages * block_m * (pitch_qk + pitch_v) + st_tiles * block_n * pitch_m)
        + q_stages * 2 * block_m * 4
}

/// Shared memory of the deterministic dQ kernel: Q/dO once, K/V `stages` deep.
pub fn dq_smem(block_m: u32, block_n: u32, stages: u32, pitch_qk: u32, pitch_v: u32) -> u32 {
    2 * (block_m + stages * block_n) * (pitch_qk + pitch_v)
}

struct MainChoice {
    block_m: u32,
    block_n: u32,
    num_warps: u32,
    q_stages: u32,
    warps_s: (u32, u32),
    warps_dk: (u32, u32),
    warps_dv: (u32, u32),
    warps_dq: (u32, u32),
    smem: u32,
    regs: u32,
    acc_chunk: u32,
    /// [`BwdPlan::kv_in_regs`] for these grids (it also sets `smem`).
    kv_in_regs: bool,
}

/// Default column-chunk limit: 16 f32 per array when the dK/dV accumulators
/// already take 96 f32 per thread or more, or with softcap (its tanh terms
/// are live too), else 32. (Checked by the compile sweep: no spills.)
fn default_acc_chunk(persist: u32, softcap: bool) -> u32 {
    if persist >= 96 || softcap {
        16
    } else {
        32
    }
}

fn try_main(spec: &AttnSpec, t: BwdTiles, dqk: u32, dv: u32, reg_budget: u32) -> Option<MainChoice> {
    let BwdTiles {
        num_warps,
        block_n,
        block_m,
        ..
    } = t;
    let (warps_s, warps_dk, warps_dv) = if t.whole_rows {
        if !block_n.is_multiple_of(16 * num_warps) {
            return None;
        }
        ((num_warps, 1), (num_warps, 1), (num_warps, 1))
    } else {
        (
            warp_grid(block_n, &[block_m], num_warps)?,
            warp_grid(block_n, &[dqk], num_warps)?,
            warp_grid(block_n, &[dv], num_warps)?,
        )
    };
    let warps_dq = warp_grid(block_m, &[dqk], num_warps)?;
    // f32 values per thread (a warp tile of r x c holds r*c/32 per thread).
    let per = |rows: u32, cols: u32| rows * cols / 32;
    let persist = per(block_n / warps_dk.0, dqk / warps_dk.1) + per(block_n / warps_dv.0, dv / warps_dv.1);
    // The S and dQ phases walk their warp tiles in column chunks of at most
    // `acc_chunk` f32 per thread per array (the template's ACC_CHUNK rule).
    let acc_chunk = if t.acc_chunk > 0 {
        t.acc_chunk
    } else {
        default_acc_chunk(persist, spec.softcap)
    };
    let s_arrays = if spec.softcap { 3 } else { 2 };
    let phase_s = s_arrays * per(block_n / warps_s.0, block_m / warps_s.1).min(acc_chunk);
    let phase_dq = if spec.deterministic {
        0
    } else {
        per(block_m / warps_dq.0, dqk / warps_dq.1).min(acc_chunk)
    };
    let regs = persist + phase_s.max(phase_dq) + 48;
    if regs > reg_budget || block_m > 32 * num_warps {
        return None;
    }
    let pitch_m = block_m + 8;
    let limit = spec.arch.max_smem_per_block();
    let kv_in_regs = kv_in_regs(warps_s, warps_dk, warps_dv);
    let st_tiles = match (kv_in_regs, spec.deterministic) {
        (false, _) => 2,
        (true, false) => 1,
        (true, true) => 0,
    };
    for q_stages in [2, 1] {
        if t.q_stages > 0 && q_stages != t.q_stages {
            continue;
        }
        let smem = main_smem(block_m, block_n, q_stages, dqk + 8, dv + 8, pitch_m, st_tiles);
        if smem <= limit {
            return Some(MainChoice {
                block_m,
                block_n,
                num_warps,
                q_stages,
                warps_s,
                warps_dk,
                warps_dv,
                warps_dq,
                smem,
                regs,
                acc_chunk,
                kv_in_regs,
            });
        }
    }
    None
}

/// (dq_block_m, dq_block_n, dq_warps, stages, smem, regs) of the deterministic dQ kernel.
fn try_dq(spec: &AttnSpec, dqk: u32, dv: u32) -> Option<(u32, u32, u32, u32, u32, u32)> {
    let limit = spec.arch.max_smem_per_block();
    let s_arrays = if spec.softcap { 3 } else { 2 };
    for warps in [4, 2, 1] {
        for block_n in [64, 32, 16] {
            // Each warp owns 16 query rows: dQ accumulators 16·dqk/32, S and dP 16·block_n/32.
            let regs = dqk / 2 + s_arrays * block_n / 2 + 48;
            if regs > REG_BUDGET {
                continue;
            }
            let block_m = 16 * warps;
            for stages in [2, 1] {
                let smem = dq_smem(block_m, block_n, stages, dqk + 8, dv + 8);
                if smem <= limit {
                    return Some((block_m, block_n, warps, stages, smem, regs));
                }
            }
        }
    }
    None
}

/// The main-kernel shapes measured fastest on the H200 (`ATTNFORGE_BWD_TUNE=1`,
/// 2026-12-03 22:35, b4 s4096, bf16, non-causal / causal), taken past the
/// register estimate (which cannot see that they fit): d64 4 warps x 128 x 64
/// with 16-float chunks (two blocks per SM), 232 / 208 TFLOP/s against 220 /
/// 201 for 8 x 128 x 128; d128 8 x 128 x 64 with 32-float chunks, 246 / 227
/// against 211 / 197 with 16-float chunks. Both spilled (84 B, 40 B) until the
/// leaner loads, peeled first k-steps and branch-free dQ reductions of that
/// day; the compile sweep checks that every spec of the matrix stays spill-free
/// at them, and the GPU suite runs them. d128 takes it only where it compiles
/// spill-free: dense, and on sm80 (one Q/dO stage) only without a mask
/// (56 B spilled with one); ragged d128 spills 16-96 B on either arch.
fn measured_shape(spec: &AttnSpec, dmax: u32) -> Option<BwdTiles> {
    let t = |num_warps, block_n, block_m, acc_chunk| BwdTiles {
        num_warps,
        block_n,
        block_m,
        q_stages: 0,
        acc_chunk,
        whole_rows: false,
    };
    match dmax {
        // 32-float chunks at d64 (one K/V operand read per query tile instead
        // of two in the S phase; 2026-12-04, `ATTNFORGE_BWD_TUNE=d64`: 274 against
        // 253 TFLOP/s) only where they compile spill-free, sm90a, dense, no mask
        // (16-40 B spilled with a mask, ragged, or on sm80), and where the GPU
        // suite has run them: fast mode without softcap.
        64 if spec.arch == Arch::Sm90a
            && spec.layout == crate::spec::Layout::Dense
            && spec.mask == crate::spec::Mask::None
            && !spec.softcap
            && !spec.deterministic =>
        {
            Some(t(4, 128, 64, 32))
        }
        64 => Some(t(4, 128, 64, 16)),
        128 if spec.layout == crate::spec::Layout::Dense
            && (spec.mask == crate::spec::Mask::None || spec.arch == Arch::Sm90a) =>
        {
            Some(t(8, 128, 64, 32))
        }
        _ => None,
    }
}

/// An explicit main-kernel tile shape (tuning: `plan_bwd_sm80_with`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BwdTiles {
    pub num_warps: u32,
    /// kv rows per block.
    pub block_n: u32,
    /// query rows per inner step.
    pub block_m: u32,
    /// Q/dO buffers; 0 = the most that fit.
    pub q_stages: u32,
    /// Column-chunk limit of the S and dQ accumulators (see [`BwdPlan::acc_chunk`]); 0 = default.
    pub acc_chunk: u32,
    /// Warp grids S, dK and dV of `(num_warps, 1)`: every warp owns whole kv
    /// rows, so that dV and dK come from the S phase's registers
    /// ([`BwdPlan::kv_in_regs`]); false = the grid search of [`warp_grid`].
    #[serde(default)]
    pub whole_rows: bool,
}

/// Plan a backward spec (already validated by `plan()`): on sm90a the wgmma
/// backward where it takes the spec, else (and on sm80) the sm80 instruction
/// path, with the reason in the plan. `None` when no tile shape fits (does
/// not happen for valid specs; the unit test checks every one).
pub fn plan_bwd(spec: &AttnSpec) -> Option<KernelPlan> {
    if spec.arch != Arch::Sm90a {
        return plan_bwd_sm80(spec);
    }
    match plan_bwd_sm90a(spec) {
        Ok(_) if sm80_path_measured_faster(spec) => plan_sm80(spec, Some(SM80_FASTER_AT_D64_CAUSAL)),
        Ok(p) => Some(p),
        Err(why) => plan_sm80(spec, Some(&why)),
    }
}

/// Why dense d <= 64 causal backwards take the sm80 path on Hopper.
const SM80_FASTER_AT_D64_CAUSAL: &str = "dense d <= 64 under a causal mask, where bwd_sm80.cu measured 4-9% faster \
     at d64 (H100, session 32's same-run bench and session 33's interleaved run: 2k 233 against 216-217 TFLOP/s, \
     8k 288-291 against 276-277, 16k 302-304 against 290-291)";

/// Specs the wgmma backward takes but the sm80 instruction path runs faster
/// (measured; see [`SM80_FASTER_AT_D64_CAUSAL`]). Ragged batches and windows
/// are not measured and stay on the wgmma backward.
fn sm80_path_measured_faster(spec: &AttnSpec) -> bool {
    use crate::spec::{Layout, Mask};
    spec.layout == Layout::Dense
        && matches!(spec.mask, Mask::CausalTopLeft | Mask::CausalBottomRight)
        && spec.head_dim_qk.max(spec.head_dim_v) <= 64
}

/// Plan a backward spec on the sm80 instruction path (`bwd_sm80.cu`), for
/// any arch.
pub fn plan_bwd_sm80(spec: &AttnSpec) -> Option<KernelPlan> {
    plan_sm80(spec, None)
}

/// [`plan_bwd_sm80`], naming why an sm90a spec is not on the wgmma backward.
fn plan_sm80(spec: &AttnSpec, not_wgmma: Option<&str>) -> Option<KernelPlan> {
    // Pad the head dims to the mma k-step (16); when no tile shape fits (a
    // prime number of 16-column groups can only be split by rows), pad
    // further so that warps can split the columns.
    [16, 32, 64]
        .into_iter()
        .find_map(|pad| plan_padded(spec, pad, None, not_wgmma))
}

/// Plan with an explicit main-kernel tile shape, skipping the register
/// estimate (tuning: the compiler's report decides). `None` when the shape
/// does not split into warp tiles or does not fit in shared memory.
pub fn plan_bwd_sm80_with(spec: &AttnSpec, tiles: BwdTiles) -> Option<KernelPlan> {
    [16, 32, 64]
        .into_iter()
        .find_map(|pad| plan_padded(spec, pad, Some(tiles), None))
}

fn plan_padded(spec: &AttnSpec, pad: u32, forced: Option<BwdTiles>, not_wgmma: Option<&str>) -> Option<KernelPlan> {
    let mut reasons = Vec::new();
    let dqk = round_up(spec.head_dim_qk as u32, pad);
    let dv = round_up(spec.head_dim_v as u32, pad);
    if dqk != spec.head_dim_qk as u32 || dv != spec.head_dim_v as u32 {
        reasons.push(format!(
            "head dims {}/{} padded to {dqk}/{dv} in shared memory (multiple of {pad}: {}; pad is zero-filled)",
            spec.head_dim_qk,
            spec.head_dim_v,
            if pad == 16 {
                "the mma k-step"
            } else {
                "so that warps split the columns"
            }
        ));
    }
    if spec.arch == Arch::Sm90a {
        reasons.push(match not_wgmma {
            Some(why) => format!("sm90a: the sm80 instruction path (mma.sync), not the wgmma backward: {why}"),
            None => "sm90a: the sm80 instruction path (mma.sync)".into(),
        });
    }
    let dmax = dqk.max(dv);
    // (warps, block_n, block_m), most preferred first. dK/dV accumulators
    // (block_n·(dqk+dv)/threads f32 per thread) stay in registers for the
    // whole block, which bounds block_n·d.
    //
    // First choices timed on the H200 (b4 s4096, `ATTNFORGE_BWD_TUNE=1`,
    // docs/kernels.md): d64 8 x 128 x 128, d128 8 x 128 x 64, d256 8 x 64 x 64
    // (FlashAttention-2's shapes), each the fastest spill-free 8-warp shape.
    let preferred: &[(u32, u32, u32)] = if dmax <= 64 {
        &[
            (8, 128, 128),
            (8, 128, 64),
            (8, 64, 64),
            (4, 64, 64),
            (4, 64, 32),
            (4, 32, 32),
        ]
    } else if dmax <= 128 {
        &[
            (8, 128, 64),
            (8, 64, 64),
            (4, 64, 64),
            (4, 64, 32),
            (4, 32, 32),
            (4, 32, 16),
        ]
    } else {
        &[
            (8, 64, 64),
            (8, 64, 32),
            (8, 32, 32),
            (4, 32, 32),
            (4, 32, 16),
            (2, 32, 16),
            (2, 16, 16),
        ]
    };
    let measured = measured_shape(spec, dmax).filter(|_| forced.is_none());
    // A measured shape that does not fit this arch (sm86/sm89: less shared
    // memory) falls back to the search.
    let measured = measured.and_then(|t| try_main(spec, t, dqk, dv, u32::MAX));
    let measured_used = forced.is_none() && measured.is_some();
    let main = match (forced, measured) {
        (Some(t), _) => try_main(spec, t, dqk, dv, u32::MAX)?,
        (None, Some(m)) => m,
        (None, None) => preferred.iter().find_map(|&(num_warps, block_n, block_m)| {
            let t = BwdTiles {
                num_warps,
                block_n,
                block_m,
                q_stages: 0,
                acc_chunk: 0,
                whole_rows: false,
            };
            try_main(spec, t, dqk, dv, REG_BUDGET)
        })?,
    };
    if measured_used {
        reasons.push(
            "main: the shape measured fastest on the H200 at this head dim (taken past the register estimate; the compile sweep checks it is spill-free)"
                .into(),
        );
    }
    reasons.push(format!(
        "main: {} warps, block_n={} kv rows x block_m={} query rows; warp grids S {:?}, dK {:?}, dV {:?}, dQ {:?}; S/dQ accumulators in chunks of <= {} f32; ~{} regs/thread estimated",
        main.num_warps, main.block_n, main.block_m, main.warps_s, main.warps_dk, main.warps_dv, main.warps_dq, main.acc_chunk, main.regs
    ));
    let kv_in_regs = main.kv_in_regs;
    // Under kv_in_regs nothing of the S phase is live in the dQ phase.
    let dq_chunk = if kv_in_regs { main.acc_chunk.max(32) } else { 0 };
    reasons.push(format!(
        "main: Q/dO {}-stage cp.async pipeline, {}: {} B of shared memory (arch limit {} B)",
        main.q_stages,
        match (kv_in_regs, spec.deterministic) {
            (true, true) => "Pᵀ and dSᵀ stay in registers",
            (true, false) => "dSᵀ through shared memory (for dQ)",
            _ => "Pᵀ/dSᵀ through shared memory",
        },
        main.smem,
        spec.arch.max_smem_per_block()
    ));
    // Measured at d256 (8 x 64 x 64, chunk 16); at d64/d128 the extra
    // fragments spill next to the larger dK/dV warp tiles.
    let dq_frags_once = !spec.deterministic && dmax == 256 && main.acc_chunk == 16;
    if dq_frags_once {
        reasons.push("fast: the dQ phase reads dS from shared memory once for all its column chunks".into());
    }
    if kv_in_regs {
        reasons.push(format!(
            "main: warp grids S, dK and dV coincide ({:?}, whole query rows per warp): dV and dK accumulate in the S phase from P and dS in registers, Pᵀ never goes to shared memory",
            main.warps_s
        ));
        if !spec.deterministic {
            reasons.push(format!(
                "fast: the dQ phase walks its warp tile in chunks of <= {dq_chunk} f32 (the S phase's accumulators are dead by then)"
            ));
        }
    }
    let (dq_block_m, dq_block_n, dq_warps, dq_kv_stages, dq_smem_bytes) = if spec.deterministic {
        let (m, n, w, st, smem, regs) = try_dq(spec, dqk, dv)?;
        reasons.push(format!(
            "det: dQ by a separate kernel, {w} warps x 16 query rows, block_n={n}, {st}-stage K/V: {smem} B, ~{regs} regs; no float atomics, bitwise repeatable"
        ));
        (m, n, w, st, smem)
    } else {
        reasons.push(dq_tiled_why(dq_tile_rows(spec, Template::BwdSm80)));
        (0, 0, 0, 0, 0)
    };
    reasons.push(
        "GQA: each block loops over the query heads of its kv head, so dK/dV need no workspace and no atomics".into(),
    );
    // Measured at d128 (one process on an H100): +2.6% without a mask (session
    // 15); dense causal −0.9% then, +1.7% with the tiled dQ accumulator
    // (session 31). Windows and ragged causal batches were not measured.
    let dk_after_dq = {
        use crate::spec::{Layout, Mask};
        let causal = matches!(spec.mask, Mask::CausalTopLeft | Mask::CausalBottomRight);
        !kv_in_regs
            && !spec.deterministic
            && dmax == 128
            && (spec.mask == Mask::None || (causal && spec.layout == Layout::Dense))
    };
    if dk_after_dq {
        reasons.push(
            "fast: dK after the dQ phase, while its reductions drain (measured at d128 without a mask and dense causal)"
                .into(),
        );
    }
    // Measured at d256 dense (session 28, one process on an H100: +3.4..+4.4%);
    // the ragged sm_90a kernels spill 16-32 B with it.
    let dk_in_dq = !kv_in_regs
        && !spec.deterministic
        && !dk_after_dq
        && dmax == 256
        && spec.layout == crate::spec::Layout::Dense
        && main.warps_dk.0 * main.warps_dk.1 == main.num_warps
        && main.warps_dq.0 * main.warps_dq.1 == main.num_warps;
    if dk_in_dq {
        reasons.push(
            "fast: dK's k-steps spread over the dQ phase, a share after each column chunk's reductions (measured at d256 dense)"
                .into(),
        );
    }
    let qdo_swizzle = dqk.is_multiple_of(64)
        && dv.is_multiple_of(64)
        && (dqk / main.warps_dk.1).is_multiple_of(64)
        && (dv / main.warps_dv.1).is_multiple_of(64);
    if qdo_swizzle {
        reasons.push("main: Q/dO tiles swizzled (whole 128-byte lines per copy), not padded".into());
    }
    let bwd = BwdPlan {
        block_m: main.block_m,
        block_n: main.block_n,
        num_warps: main.num_warps,
        q_stages: main.q_stages,
        pitch_m: main.block_m + 8,
        warps_s: main.warps_s,
        warps_dk: main.warps_dk,
        warps_dv: main.warps_dv,
        warps_dq: main.warps_dq,
        main_smem: main.smem,
        dq_block_m,
        dq_block_n,
        dq_warps,
        dq_kv_stages,
        dq_smem: dq_smem_bytes,
        row_warps: ROW_WARPS,
        acc_chunk: main.acc_chunk,
        dq_frags_once,
        kv_in_regs,
        dq_chunk,
        dk_after_dq,
        dk_in_dq,
        qdo_swizzle,
        walk_rotation: false,
        dq_tile_rows: dq_tile_rows(spec, Template::BwdSm80),
    };
    Some(KernelPlan {
        spec: *spec,
        template: Template::BwdSm80,
        entry: entry_name(spec),
        block_m: main.block_m,
        block_n: main.block_n,
        num_warps: main.num_warps,
        m_tiles_per_warp: main.block_n / main.warps_s.0 / 16,
        stages: main.q_stages,
        head_dim_qk_padded: dqk,
        head_dim_v_padded: dv,
        smem_pitch_qk: dqk + 8,
        smem_pitch_v: dv + 8,
        smem_bytes: main.smem.max(dq_smem_bytes),
        min_blocks_per_sm: 1,
        compile_options: Vec::new(),
        grid: GridRule::BatchHeadsByQueryTiles,
        reasons,
        consumer_pipelined: false,
        pingpong: false,
        softmax_under_pv: false,
        rowsum_mma: false,
        tail_first: false,
        tma_store_o: false,
        q_regs: false,
        smem_swizzle: false,
        head_major: true,
        cluster_m: 1,
        bwd: Some(bwd),
    })
}

/// Shared memory of the sm90a backward's main kernel: K and V once, Q and dO
/// twice, dSᵀ, each as 64-column (128-byte) swizzled chunks; LSE and Dsum
/// twice; 1 KB to align the base to the swizzle period.
pub fn sm90a_main_smem(block_m: u32, dqk: u32, dv: u32) -> u32 {
    let block_n = SM90A_BWD_BLOCK_N;
    2 * (block_n * (dqk + dv) + 2 * block_m * (dqk + dv) + block_n * block_m) + 4 * 4 * block_m + 1024
}

/// How the wgmma backward's two warpgroups share dQ = dS K (the template's
/// DQ_SPLIT): 0 = each over its own 64 kv rows (both add the same dQ tile),
/// 1 = dQ's columns (d128), 2 = dQ's rows (128-row query tiles).
pub fn sm90a_dq_split(d_pad: u32, block_m: u32) -> u32 {
    match (d_pad, block_m) {
        (128, _) => 1,
        (_, 128) => 2,
        _ => 0,
    }
}

/// Tiles of the sm90a backward (fixed by its template): 64-row query tiles,
/// 128 kv rows per block (two warpgroups of 64).
pub const SM90A_BWD_BLOCK_M: u32 = 64;
pub const SM90A_BWD_BLOCK_N: u32 = 128;

/// The Hopper backward (`templates/bwd_sm90a.cu`) for a spec it takes: sm90a,
/// fast mode, equal head dims of at most 128 (padded to 64-column chunks).
/// `Err` says why a spec is not taken. The planner's choice for those specs
/// ([`plan_bwd`]): on the H200 (2026-12-03, `make gpu-bench`) 1.35–1.72× the
/// sm80 path at d128, 1.0–1.2× FlashAttention-2; at d ≤ 64 with 128-row
/// query tiles (2026-12-03 17:30) 1.12–1.35× the 64-row form.
pub fn plan_bwd_sm90a(spec: &AttnSpec) -> Result<KernelPlan, String> {
    plan_bwd_sm90a_with(spec, Sm90aBwdOptions::planned(spec))
}

/// The free choices of the wgmma backward (tuning; [`Sm90aBwdOptions::planned`]
/// is the planner's choice).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Sm90aBwdOptions {
    /// 128-row query tiles (d ≤ 64 only; the warpgroups split dQ's rows);
    /// false = 64-row tiles.
    pub tall_query_tiles: bool,
}

impl Sm90aBwdOptions {
    /// The planner's options for a spec: 128-row query tiles at d ≤ 64
    /// (H200, `make gpu-bench` 2026-12-03 17:30: +20–35% non-causal, +12–24%
    /// causal over 64-row tiles) except ragged THD without a mask, which
    /// NVRTC 13.0 builds at 255 registers with 12 B spilled (the compile
    /// sweep).
    pub fn planned(spec: &AttnSpec) -> Self {
        use crate::spec::{Layout, Mask};
        let small = round_up(spec.head_dim_qk.max(spec.head_dim_v) as u32, 64) <= 64;
        let spills = spec.layout == Layout::Thd && spec.mask == Mask::None;
        Sm90aBwdOptions {
            tall_query_tiles: small && !spills,
        }
    }
}

/// [`plan_bwd_sm90a`] with explicit options (see [`Sm90aBwdOptions`]).
pub fn plan_bwd_sm90a_with(spec: &AttnSpec, opts: Sm90aBwdOptions) -> Result<KernelPlan, String> {
    let Sm90aBwdOptions { tall_query_tiles } = opts;
    if spec.arch != Arch::Sm90a {
        return Err("the wgmma backward needs sm90a".into());
    }
    if spec.deterministic {
        return Err("deterministic mode: the wgmma backward adds dQ with float atomics".into());
    }
    if spec.head_dim_qk != spec.head_dim_v {
        return Err(format!(
            "head dims {}/{} differ: the wgmma backward takes equal ones",
            spec.head_dim_qk, spec.head_dim_v
        ));
    }
    let d = round_up(spec.head_dim_qk as u32, 64);
    if d > 128 {
        return Err(format!(
            "d={}: dK and dV of 64 kv rows take {} f32 registers per thread at d > 128",
            spec.head_dim_qk, d
        ));
    }
    if tall_query_tiles && d > 64 {
        return Err(format!(
            "d={}: 128-row query tiles need d <= 64 (S, dP and dQ per warpgroup)",
            spec.head_dim_qk
        ));
    }
    let block_m = if tall_query_tiles { 128 } else { SM90A_BWD_BLOCK_M };
    let mut reasons = vec![format!(
        "sm90a: wgmma backward (fast mode), two warpgroups of 64 kv rows, block_n=128, {block_m}-row query tiles; \
         measured on the H200: 1.35-1.72x the sm80 path at d128, 1.1-1.55x at d64 with 128-row query tiles"
    )];
    if d != spec.head_dim_qk as u32 {
        reasons.push(format!(
            "head dim {} padded to {d} in shared memory (64-column chunks; cp.async zero-fills the pad)",
            spec.head_dim_qk
        ));
    }
    let smem = sm90a_main_smem(block_m, d, d);
    reasons.push(format!(
        "main: Sᵀ = K Qᵀ and dPᵀ = V dOᵀ from shared memory; dV += Pᵀ dO and dK += dSᵀ Q with Pᵀ, dSᵀ from registers; \
         dQ = dS K {}; {smem} B shared memory",
        match sm90a_dq_split(d, block_m) {
            1 => "with the warpgroups splitting dQ's columns",
            2 => "with the warpgroups splitting dQ's rows",
            _ => "with each warpgroup over its own kv rows",
        }
    ));
    reasons.push(dq_tiled_why(dq_tile_rows(spec, Template::BwdSm90a)));
    reasons.push(
        "GQA: each block loops over the query heads of its kv head, so dK/dV need no workspace and no atomics".into(),
    );
    if walk_rotation(spec) {
        reasons.push(WALK_ROTATION_WHY.into());
    }
    let bwd = BwdPlan {
        block_m,
        block_n: SM90A_BWD_BLOCK_N,
        num_warps: 8,
        q_stages: 2,
        pitch_m: 64,
        warps_s: (2, 1),
        warps_dk: (2, 1),
        warps_dv: (2, 1),
        warps_dq: (1, 2),
        main_smem: smem,
        dq_block_m: 0,
        dq_block_n: 0,
        dq_warps: 0,
        dq_kv_stages: 0,
        dq_smem: 0,
        row_warps: ROW_WARPS,
        acc_chunk: 0,
        dq_frags_once: false,
        kv_in_regs: false,
        dq_chunk: 0,
        dk_after_dq: false,
        dk_in_dq: false,
        qdo_swizzle: false,
        walk_rotation: walk_rotation(spec),
        dq_tile_rows: dq_tile_rows(spec, Template::BwdSm90a),
    };
    Ok(KernelPlan {
        spec: *spec,
        template: Template::BwdSm90a,
        entry: entry_name(spec),
        block_m,
        block_n: SM90A_BWD_BLOCK_N,
        num_warps: 8,
        m_tiles_per_warp: 1,
        stages: 2,
        head_dim_qk_padded: d,
        head_dim_v_padded: d,
        smem_pitch_qk: 64,
        smem_pitch_v: 64,
        smem_bytes: smem,
        min_blocks_per_sm: 1,
        compile_options: Vec::new(),
        grid: GridRule::BatchHeadsByQueryTiles,
        reasons,
        consumer_pipelined: false,
        pingpong: false,
        softmax_under_pv: false,
        rowsum_mma: false,
        tail_first: false,
        tma_store_o: false,
        q_regs: false,
        smem_swizzle: false,
        head_major: true,
        cluster_m: 1,
        bwd: Some(bwd),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::plan;
    use crate::spec::{DType, Direction, Layout, Mask};

    fn all_bwd_specs() -> Vec<AttnSpec> {
        let mut v = Vec::new();
        for &arch in Arch::ALL {
            for qk in (8..=256).step_by(8) {
                for dv in [qk, 64, 256] {
                    for softcap in [false, true] {
                        for det in [false, true] {
                            v.push(AttnSpec {
                                direction: Direction::Bwd,
                                dtype: DType::Bf16,
                                head_dim_qk: qk as u16,
                                head_dim_v: dv as u16,
                                layout: Layout::Dense,
                                mask: Mask::CausalBottomRight,
                                softcap,
                                deterministic: det,
                                arch,
                            });
                        }
                    }
                }
            }
        }
        v
    }

    #[test]
    fn every_bwd_spec_plans_and_fits() {
        for spec in all_bwd_specs() {
            let p = plan(&spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
            assert_eq!(p, plan(&spec).unwrap());
            let b = p.bwd.as_ref().unwrap();
            // sm90a specs the wgmma backward takes plan on it; the others
            // (and sm80) on the sm80 path, which the checks below describe.
            let wgmma = plan_bwd_sm90a(&spec);
            let routed = wgmma.is_ok() && sm80_path_measured_faster(&spec);
            assert_eq!(p.template == Template::BwdSm90a, wgmma.is_ok() && !routed, "{spec}");
            if routed {
                assert!(
                    p.reasons.iter().any(|r| r.contains(SM80_FASTER_AT_D64_CAUSAL)),
                    "{spec}: the routing reason is in the plan"
                );
            }
            if let Some(w) = wgmma.as_ref().ok().filter(|_| !routed) {
                assert_eq!(*w, p);
                assert!(spec.arch == Arch::Sm90a && !spec.deterministic && spec.head_dim_qk == spec.head_dim_v);
                assert!(
                    p.head_dim_qk_padded <= 128 && p.head_dim_qk_padded.is_multiple_of(64),
                    "{spec}"
                );
                // 128-row query tiles at d <= 64 (not ragged unmasked), 64-row ones above.
                let ragged_unmasked = spec.layout == Layout::Thd && spec.mask == Mask::None;
                let block_m = if p.head_dim_qk_padded <= 64 && !ragged_unmasked {
                    128
                } else {
                    64
                };
                assert_eq!(
                    b.main_smem,
                    sm90a_main_smem(block_m, p.head_dim_qk_padded, p.head_dim_v_padded)
                );
                assert!(b.main_smem <= spec.arch.max_smem_per_block(), "{spec}");
                assert_eq!((b.block_m, b.block_n, b.num_warps), (block_m, 128, 8));
                continue;
            }
            if spec.arch == Arch::Sm90a && !routed {
                let why = plan_bwd_sm90a(&spec).unwrap_err();
                assert!(
                    p.reasons.iter().any(|r| r.contains(&why)),
                    "{spec}: the decline reason is in the plan"
                );
            }
            let limit = spec.arch.max_smem_per_block();
            assert!(
                b.main_smem <= limit && b.dq_smem <= limit && p.smem_bytes <= limit,
                "{spec}"
            );
            for (r, c) in [b.warps_s, b.warps_dk, b.warps_dv, b.warps_dq] {
                assert!(r * c <= b.num_warps && r * c >= 1, "{spec}");
            }
            assert!(b.block_n.is_multiple_of(16 * b.warps_s.0) && b.block_m.is_multiple_of(16 * b.warps_s.1));
            assert!(b.block_n.is_multiple_of(16 * b.warps_dk.0) && b.block_n.is_multiple_of(16 * b.warps_dv.0));
            assert!(p.head_dim_qk_padded.is_multiple_of(16 * b.warps_dk.1));
            assert!(p.head_dim_v_padded.is_multiple_of(16 * b.warps_dv.1));
            assert!(b.block_m.is_multiple_of(16 * b.warps_dq.0));
            assert!(p.head_dim_qk_padded.is_multiple_of(16 * b.warps_dq.1));
            assert!(b.block_m <= 32 * b.num_warps, "LSE/Dsum rows are loaded one per thread");
            assert!(b.acc_chunk == 16 || b.acc_chunk == 32, "{spec}");
            assert_eq!(spec.deterministic, b.dq_warps > 0, "{spec}");
            // dS read once per dQ phase: measured and sweep-checked at d256 only.
            let dmax = p.head_dim_qk_padded.max(p.head_dim_v_padded);
            assert_eq!(
                b.dq_frags_once,
                !spec.deterministic && dmax == 256 && b.acc_chunk == 16,
                "{spec}"
            );
            assert_eq!(b.kv_in_regs, kv_in_regs(b.warps_s, b.warps_dk, b.warps_dv), "{spec}");
            if spec.deterministic {
                assert_eq!(b.dq_block_m, 16 * b.dq_warps);
            }
        }
    }

    #[test]
    fn entries_derive_from_the_base() {
        let spec: AttnSpec = "bwd.bf16.d128.causal-br.dense.det.sm90a".parse().unwrap();
        let p = plan(&spec).unwrap();
        let e = BwdEntries::of(&p);
        assert_eq!(e.main, p.entry);
        assert_eq!(e.pre, format!("{}_pre", p.entry));
        assert_eq!(e.dq, format!("{}_dq", p.entry));
        assert_eq!(p.template, Template::BwdSm80);
    }

    #[test]
    fn dk_after_dq_only_where_measured() {
        let flag = |s: &str| plan_bwd_sm80(&s.parse().unwrap()).unwrap().bwd.unwrap().dk_after_dq;
        assert!(flag("bwd.bf16.d128.none.dense.sm90a"));
        assert!(flag("bwd.f16.d128.none.thd.softcap.sm80"));
        assert!(flag("bwd.bf16.d128.causal-tl.dense.sm90a"));
        assert!(flag("bwd.f16.d128.causal-br.dense.softcap.sm80"));
        for s in [
            "bwd.bf16.d128.causal-br.thd.sm90a",
            "bwd.bf16.d128.window.dense.sm90a",
            "bwd.bf16.d128.none.dense.det.sm90a",
            "bwd.bf16.d256.none.dense.sm90a",
            "bwd.bf16.d64.none.dense.sm90a",
        ] {
            assert!(!flag(s), "{s}");
        }
    }

    #[test]
    fn dk_in_dq_only_where_measured() {
        let flag = |s: &str| plan_bwd_sm80(&s.parse().unwrap()).unwrap().bwd.unwrap().dk_in_dq;
        for s in [
            "bwd.bf16.d256.none.dense.sm90a",
            "bwd.bf16.d256.causal-tl.dense.sm90a",
            "bwd.f16.d256.window.dense.softcap.sm80",
        ] {
            assert!(flag(s), "{s}");
        }
        for s in [
            "bwd.bf16.d256.none.thd.sm90a",
            "bwd.bf16.d256.none.dense.det.sm90a",
            "bwd.bf16.d128.none.dense.sm90a",
            "bwd.bf16.d128.causal-tl.dense.sm90a",
            "bwd.bf16.d64.none.dense.sm90a",
        ] {
            assert!(!flag(s), "{s}");
        }
    }

    #[test]
    fn qdo_swizzle_where_q_and_do_rows_are_whole_lines() {
        let bwd = |s: &str| plan_bwd_sm80(&s.parse().unwrap()).unwrap().bwd.unwrap();
        for s in [
            "bwd.bf16.d64.none.dense.sm90a",
            "bwd.bf16.d64.causal-br.thd.sm80",
            "bwd.bf16.d128.causal-tl.dense.sm90a",
            "bwd.f16.d128.window.thd.softcap.sm80",
            "bwd.bf16.d256.none.dense.sm90a",
            "bwd.bf16.d256.causal-br.thd.sm90a",
            "bwd.bf16.d256.none.dense.det.sm90a",
        ] {
            let b = bwd(s);
            assert!(b.qdo_swizzle, "{s}");
            // The dK/dV warp tiles span whole 64-column lines (sw_addr's XOR).
            let d: u32 = s.split('.').nth(2).unwrap()[1..].parse().unwrap();
            assert_eq!((d / b.warps_dk.1) % 64, 0, "{s}");
            assert_eq!((d / b.warps_dv.1) % 64, 0, "{s}");
        }
        // Rows that are not whole 128-byte lines keep the padded layout.
        for s in [
            "bwd.bf16.d96.none.dense.sm90a",
            "bwd.f16.d40.none.thd.sm86",
            "bwd.bf16.d192v128.none.dense.sm80",
        ] {
            assert!(!bwd(s).qdo_swizzle, "{s}");
        }
        // The wgmma backward has no such tiles.
        let p = plan(&"bwd.bf16.d128.none.dense.sm90a".parse().unwrap()).unwrap();
        assert_eq!(p.template, Template::BwdSm90a);
        assert!(!p.bwd.unwrap().qdo_swizzle);
    }

    #[test]
    fn walk_rotation_in_the_wgmma_backward_without_a_mask() {
        let rot = |p: KernelPlan| {
            let why = p.reasons.iter().any(|r| r.contains("own diagonal"));
            let b = p.bwd.unwrap().walk_rotation;
            assert_eq!(b, why, "the plan says why exactly when it rotates");
            b
        };
        for s in [
            "bwd.bf16.d64.none.dense.sm90a",
            "bwd.bf16.d128.none.thd.sm90a",
            "bwd.f16.d96.none.dense.softcap.sm90a",
        ] {
            let spec = s.parse().unwrap();
            let p = plan(&spec).unwrap();
            assert_eq!(p.template, Template::BwdSm90a, "{s}");
            assert!(rot(p), "{s}");
            // The sm80 path's walk is not rotated (measured: no effect).
            assert!(!rot(plan_bwd_sm80(&spec).unwrap()), "{s} (sm80 path)");
        }
        for s in [
            "bwd.bf16.d128.causal-tl.dense.sm90a",
            "bwd.bf16.d64.causal-br.thd.sm90a",
            "bwd.f16.d128.window.dense.sm90a",
        ] {
            let p = plan(&s.parse().unwrap()).unwrap();
            assert_eq!(p.template, Template::BwdSm90a, "{s}");
            assert!(!rot(p), "{s}");
        }
        let p = plan(&"bwd.bf16.d128.none.dense.det.sm90a".parse().unwrap()).unwrap();
        assert!(!rot(p), "deterministic mode");
    }

    #[test]
    fn explicit_tiles_are_honoured_or_refused() {
        let spec: AttnSpec = "bwd.bf16.d128.causal-br.dense.sm90a".parse().unwrap();
        let t = |num_warps, block_n, block_m, q_stages, acc_chunk| BwdTiles {
            num_warps,
            block_n,
            block_m,
            q_stages,
            acc_chunk,
            whole_rows: false,
        };
        let p = plan_bwd_sm80_with(&spec, t(4, 64, 64, 1, 0)).expect("plans");
        let b = p.bwd.as_ref().unwrap();
        assert_eq!((b.num_warps, b.block_n, b.block_m, b.q_stages), (4, 64, 64, 1));
        assert_eq!(b.acc_chunk, 16, "dK+dV take 128 f32 per thread: default chunk 16");
        assert_eq!(b.main_smem, main_smem(64, 64, 1, 136, 136, 72, 2));
        let p = plan_bwd_sm80_with(&spec, t(8, 128, 64, 0, 32)).expect("plans");
        assert_eq!(p.bwd.as_ref().unwrap().acc_chunk, 32);
        assert_eq!(p.bwd.as_ref().unwrap().q_stages, 2);
        // 8 kv rows cannot be split into 16-row warp tiles; 256 x 256 does not fit.
        assert!(plan_bwd_sm80_with(&spec, t(8, 8, 64, 0, 0)).is_none());
        assert!(plan_bwd_sm80_with(&spec, t(8, 256, 256, 0, 0)).is_none());
        // The sm80 path's default plan is one of the explicit ones.
        let d = plan_bwd_sm80(&spec).unwrap();
        let db = d.bwd.as_ref().unwrap();
        let again = plan_bwd_sm80_with(
            &spec,
            t(db.num_warps, db.block_n, db.block_m, db.q_stages, db.acc_chunk),
        );
        assert_eq!(again.as_ref().and_then(|p| p.bwd.clone()), d.bwd);
    }

    #[test]
    fn default_chunks_follow_the_register_rule() {
        for (s, chunk) in [
            ("bwd.bf16.d96.causal-tl.dense.sm80", 16),
            ("bwd.bf16.d256.causal-br.dense.sm90a", 16),
        ] {
            let spec: AttnSpec = s.parse().unwrap();
            assert_eq!(plan(&spec).unwrap().bwd.unwrap().acc_chunk, chunk, "{s}");
        }
    }

    #[test]
    fn d64_and_d128_take_their_measured_shapes() {
        let shape = |s: &str| {
            let p = plan_bwd_sm80(&s.parse().unwrap()).unwrap();
            let b = p.bwd.unwrap();
            (b.num_warps, b.block_n, b.block_m, b.acc_chunk)
        };
        for s in [
            "bwd.bf16.d64.none.dense.sm80",
            "bwd.f16.d64.none.dense.det.sm90a",
            "bwd.bf16.d64.none.dense.softcap.sm90a",
            "bwd.bf16.d64.causal-tl.dense.sm90a",
            "bwd.bf16.d64.none.thd.sm90a",
            "bwd.bf16.d64.causal-tl.dense.sm80",
            "bwd.bf16.d64.window.thd.softcap.sm80",
        ] {
            assert_eq!(shape(s), (4, 128, 64, 16), "{s}");
        }
        // d64 on sm90a, dense, without a mask, softcap or determinism: 32-float
        // chunks (spill-free there; the GPU suite's d64 no-mask dense cases).
        for s in ["bwd.f16.d64.none.dense.sm90a", "bwd.bf16.d64.none.dense.sm90a"] {
            assert_eq!(shape(s), (4, 128, 64, 32), "{s}");
        }
        for s in [
            "bwd.bf16.d128.none.dense.sm80",
            "bwd.bf16.d128.none.dense.sm90a",
            "bwd.bf16.d128.causal-br.dense.sm90a",
            "bwd.f16.d128.window.dense.softcap.det.sm90a",
        ] {
            assert_eq!(shape(s), (8, 128, 64, 32), "{s}");
        }
        // Ragged d128, and masked d128 on sm80, keep 16-float chunks (32 spill).
        assert_eq!(shape("bwd.bf16.d128.none.thd.sm90a"), (8, 128, 64, 16));
        assert_eq!(shape("bwd.bf16.d128.causal-tl.dense.sm80"), (8, 128, 64, 16));
        // Other head dims keep the general choice (the register estimate).
        assert_eq!(shape("bwd.bf16.d96.none.dense.sm80").0, 8);
        assert_eq!(shape("bwd.bf16.d256.none.dense.sm80").0, 8);
    }

    #[test]
    fn dv_dk_from_registers_where_the_warp_grids_coincide() {
        let planned = |s: &str| plan_bwd_sm80(&s.parse().unwrap()).unwrap().bwd.unwrap().kv_in_regs;
        // The measured d64 shape: S, dK and dV all (4, 1), whole query rows per warp.
        for s in [
            "bwd.bf16.d64.none.dense.sm80",
            "bwd.f16.d64.none.dense.det.sm90a",
            "bwd.bf16.d64.causal-br.thd.sm90a",
            "bwd.bf16.d64.window.thd.softcap.sm80",
        ] {
            assert!(planned(s), "{s}");
        }
        // S (4, 2) against dV (4, 2) at d128: a warp holds half the query
        // columns of its kv rows, so P goes through shared memory.
        for s in [
            "bwd.bf16.d128.none.dense.sm80",
            "bwd.bf16.d256.none.dense.sm80",
            "bwd.bf16.d32.none.dense.sm80",
        ] {
            assert!(!planned(s), "{s}");
        }
        assert!(kv_in_regs((4, 1), (4, 1), (4, 1)) && kv_in_regs((8, 1), (8, 1), (8, 1)));
        assert!(!kv_in_regs((4, 2), (4, 2), (4, 2)) && !kv_in_regs((4, 1), (2, 2), (4, 1)));
        // The plan says so, and its shared memory holds no Pᵀ tile (nor a dSᵀ
        // tile in deterministic mode, which has no dQ phase).
        let p = plan_bwd_sm80(&"bwd.bf16.d64.none.dense.sm80".parse().unwrap()).unwrap();
        assert!(p.reasons.iter().any(|r| r.contains("Pᵀ never goes to shared memory")));
        let b = p.bwd.unwrap();
        assert_eq!(b.main_smem, main_smem(64, 128, 2, 72, 72, 72, 1));
        let det = plan_bwd_sm80(&"bwd.bf16.d64.none.dense.det.sm80".parse().unwrap()).unwrap();
        assert_eq!(det.bwd.unwrap().main_smem, main_smem(64, 128, 2, 72, 72, 72, 0));
    }

    #[test]
    fn wgmma_backward_takes_tall_query_tiles_up_to_d64() {
        for (s, block_m) in [
            ("bwd.bf16.d32.none.dense.sm90a", 128),
            ("bwd.bf16.d64.causal-br.thd.softcap.sm90a", 128),
            ("bwd.bf16.d64.none.thd.sm90a", 64),
            ("bwd.f16.d96.none.dense.sm90a", 64),
            ("bwd.bf16.d128.window.dense.sm90a", 64),
        ] {
            let p = plan_bwd_sm90a(&s.parse().unwrap()).unwrap();
            assert_eq!(p.block_m, block_m, "{s}");
            assert_eq!(p.bwd.unwrap().block_m, block_m, "{s}");
        }
    }

    #[test]
    fn warp_grid_prefers_square_full_grids() {
        assert_eq!(warp_grid(64, &[64], 8), Some((4, 2)));
        assert_eq!(warp_grid(128, &[64], 8), Some((4, 2)));
        assert_eq!(warp_grid(64, &[16], 8), Some((4, 1)));
        assert_eq!(warp_grid(64, &[48, 48], 8), Some((2, 3)));
        assert_eq!(warp_grid(8, &[16], 8), None);
    }
}
