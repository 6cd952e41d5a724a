//! Stage 2 of the pipeline: the **planner**, a pure function spec → [`KernelPlan`].
//!
//! The plan fixes everything the template needs besides the spec itself: which
//! template, tile sizes, warps, pipeline depth, shared memory, extra compile
//! options, the entry symbol and the grid rule. It records why each choice was
//! made (`reasons`), which `attnforge plan SPEC` prints.
//!
//! Planning is deterministic and does no I/O: the same spec always gives the
//! same plan, and the plan is part of the cache key.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::PlanError;

#[path = "plan_bwd.rs"]
pub mod plan_bwd;
use crate::spec::{Arch, AttnSpec, Direction, Layout, Mask};

/// Which template file renders the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Template {
    /// FlashAttention-2-style forward on the sm80 instruction path:
    /// `mma.sync` m16n8k16, `ldmatrix`, `cp.async`. Runs on sm80..sm90a.
    FwdSm80,
    /// FlashAttention-2-style backward on the same instruction path; one
    /// CUBIN with several entry points (see [`plan_bwd`]).
    BwdSm80,
    /// Hopper forward: TMA into 128-byte-swizzled shared memory, `wgmma`, a
    /// producer warpgroup and two consumer warpgroups. sm90a only.
    FwdSm90a,
    /// Hopper backward (fast mode): every product on `wgmma`, two warpgroups
    /// of 64 kv rows, cp.async into 128-byte-swizzled shared memory; the same
    /// entry points and parameters as [`Template::BwdSm80`]. sm90a only.
    BwdSm90a,
}

impl Template {
    /// File name under `templates/`.
    pub const fn file(self) -> &'static str {
        match self {
            Template::FwdSm80 => "fwd_sm80.cu",
            Template::BwdSm80 => "bwd_sm80.cu",
            Template::FwdSm90a => "fwd_sm90a.cu",
            Template::BwdSm90a => "bwd_sm90a.cu",
        }
    }
}

/// How the launcher derives the grid from run-time shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GridRule {
    /// `grid.x = batch * heads_q` (fits 2^31-1), `grid.y = ceil(max_seqlen_q / block_m)`
    /// (≤ 65535). Blocks walk `y` in reverse so that, under a causal mask,
    /// the longest query tiles start first (the sm90a forward maps the
    /// linear block index to a work tile, in that order or head-major).
    BatchHeadsByQueryTiles,
    /// The sm90a forward's two entries: one tile per block as in
    /// [`Self::BatchHeadsByQueryTiles`] (the plan's `entry`), or the
    /// persistent walk (`{entry}_walk`), which the launcher takes where it
    /// pays ([`sm90a_walk_pays`]): the work tiles are `batch * heads_q *
    /// ceil(max_seqlen_q / block_m)` (kept below 2^31 - 65536), `grid.x =
    /// min(tiles, resident blocks)`, and each block walks tiles in a snake
    /// over rounds of the grid, the last query block of every (batch, head)
    /// first.
    TilesOrWalk,
}

/// Everything the template and the launcher need, besides the spec.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KernelPlan {
    pub spec: AttnSpec,
    pub template: Template,
    /// Kernel entry symbol (`extern "C"`), unique per spec.
    pub entry: String,
    /// Query rows per block.
    pub block_m: u32,
    /// Key/value rows per main-loop step.
    pub block_n: u32,
    pub num_warps: u32,
    /// 16-row MMA tiles per warp (block_m = 16 · m_tiles_per_warp · num_warps).
    pub m_tiles_per_warp: u32,
    /// K/V shared-memory buffers (cp.async pipeline depth).
    pub stages: u32,
    /// Head dims rounded up to the MMA k-step (16); the pad is zero-filled.
    pub head_dim_qk_padded: u32,
    pub head_dim_v_padded: u32,
    /// Shared-memory row pitch in elements (padded to avoid ldmatrix bank conflicts).
    pub smem_pitch_qk: u32,
    pub smem_pitch_v: u32,
    /// Dynamic shared memory per block, bytes.
    pub smem_bytes: u32,
    /// `__launch_bounds__` min blocks per SM.
    pub min_blocks_per_sm: u32,
    /// Options added after the compile stage's base options, in this order.
    pub compile_options: Vec<String>,
    pub grid: GridRule,
    /// One line per decision, for `attnforge plan`.
    pub reasons: Vec<String>,
    /// sm90a forward only: each consumer warpgroup issues the next tile's
    /// S = QKᵀ before this tile's P·V and does the softmax while both run
    /// (measured faster at d ≤ 64 only; docs/kernels.md). Absent elsewhere.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub consumer_pipelined: bool,
    /// sm90a forward only (with `consumer_pipelined`): the two consumer
    /// warpgroups take turns at the tensor cores through two named barriers,
    /// so that one issues its GEMMs while the other does its softmax
    /// (ping-pong). Absent elsewhere.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pingpong: bool,
    /// sm90a forward only (with `consumer_pipelined`): a warpgroup's softmax
    /// of the next tile runs while its previous P·V is still on the tensor
    /// cores; V's wait sits between the softmax and the P·V wait, so that
    /// ptxas cannot hoist that wait above the softmax (it does, to interleave
    /// P's packing). With it, the softmax keeps a lazy reference max (raised
    /// only past a slack of 8, log2 domain) and the warp skips O's rescale when no row
    /// raised it; the two were measured together. Off at block_n > 160
    /// (both measured slower at 176). Absent elsewhere.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub softmax_under_pv: bool,
    /// sm90a forward only: each row's sum of probabilities comes from the
    /// tensor cores, one `wgmma m64n8k16` beside every P·V k-step that
    /// multiplies the same P registers by a 16 × 8 block of ones (a 1 KB
    /// swizzle atom in shared memory, written once per block), instead of a
    /// FADD per probability in the softmax. The sums then come from the
    /// 16-bit P that the numerator uses. Absent elsewhere.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rowsum_mma: bool,
    /// sm90a forward only, causal masks: a sequence's query blocks are
    /// aligned to its end (the last block ends at the last row), so that
    /// the partial block is the first and shortest one, not the last and
    /// longest; its rows before 0 are TMA's zero fill (or the previous
    /// sequence's tokens in a ragged batch), are masked as any row and
    /// never stored. Absent elsewhere.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tail_first: bool,
    /// sm90a forward only, dense: each consumer warpgroup stages its 64
    /// rows of O in shared memory (64-column chunks, 128-byte swizzle) and
    /// one thread writes them with TMA stores through a fourth tensor map
    /// (O's), so that the warpgroup goes on to the next tile while they run,
    /// instead of 16-byte stores from registers. Planned only where the
    /// staging fits beside the ring without shrinking it. Absent elsewhere.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tma_store_o: bool,
    /// sm90a forward only: each consumer warpgroup copies its 64 rows of Q
    /// from shared memory into registers (the A fragments of every k-step,
    /// `ldmatrix`) as soon as they land, releases the Q buffer at once, and
    /// issues S = QK^T as register-sourced `wgmma` (only K read from shared
    /// memory): half the shared-memory reads of S at block_n 128, and the
    /// walk's producer loads the next tile's Q under this tile's key loop.
    /// Costs 4 registers per thread per 16 columns of Q (32 at d128); planned
    /// up to d 128. Absent elsewhere.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub q_regs: bool,
    /// sm80-path forward: its K tiles, and where [`fwd_swizzled_tiles`] says
    /// so its Q and V tiles, stored swizzled in shared memory instead of
    /// padded (rows of whole 128-byte lines, each 16-byte chunk at
    /// `chunk ^ (row % 8)`; `templates/common/tile.cuh`), so that each cp.async
    /// line lands in one shared-memory line (ncu, session 29: padded rows cost
    /// 2.6× the ideal wavefronts). Planned by [`fwd_swizzle`];
    /// `smem_pitch_*` and `smem_bytes` keep the padded rows' figures (the pads
    /// go unused), so the tile choices are those of the padded layout.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub smem_swizzle: bool,
    /// The work tiles walk one (batch, head) at a time, its tiles
    /// consecutive, instead of all heads of one tile at a time. sm90a
    /// forward: query blocks (the blocks in flight share K and V in L2).
    /// Backward: kv tiles (they share Q, dO, LSE and the dQ accumulator), and
    /// in deterministic mode the dQ kernel's query tiles (K and V). sm80
    /// forward: query blocks, as FlashAttention-2's grid orders them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub head_major: bool,
    /// sm90a forward only: 2 = the one-tile entry can run as clusters of two
    /// blocks on adjacent query blocks of one head, each block loading half
    /// of every K/V tile (its 64-column chunks of one parity) and
    /// multicasting it to both, so each K/V byte read from L2 feeds 256
    /// query rows (the launcher takes it when a head's query blocks pair up;
    /// the same entry runs alone otherwise). 1 elsewhere (absent from JSON).
    #[serde(default = "one_u32", skip_serializing_if = "is_one_u32")]
    pub cluster_m: u32,
    /// Backward plans only: the tiles of the backward kernels (the fields
    /// above describe its main kernel). Absent from forward plans' JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bwd: Option<plan_bwd::BwdPlan>,
}

fn one_u32() -> u32 {
    1
}
fn is_one_u32(x: &u32) -> bool {
    *x == 1
}

impl KernelPlan {
    pub fn threads(&self) -> u32 {
        self.num_warps * 32
    }
}

fn round_up(x: u32, m: u32) -> u32 {
    x.div_ceil(m) * m
}

/// Entry symbol for a spec: the canonical string with `.`/`-` turned into `_`.
pub fn entry_name(spec: &AttnSpec) -> String {
    let s: String = spec
        .to_string()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("attnforge_{s}")
}

/// Shared memory of the sm80 forward: Q tile once, K and V tiles `stages` deep.
fn fwd_smem(block_m: u32, block_n: u32, stages: u32, pitch_qk: u32, pitch_v: u32) -> u32 {
    2 * (block_m * pitch_qk + stages * block_n * (pitch_qk + pitch_v))
}

/// Plan a spec. Pure and deterministic.
pub fn plan(spec: &AttnSpec) -> Result<KernelPlan, PlanError> {
    spec.validate().map_err(|e| PlanError {
        spec: spec.to_string(),
        reason: e.to_string(),
    })?;
    match spec.direction {
        Direction::Fwd if spec.arch == Arch::Sm90a => Ok(plan_fwd_sm90a(spec)),
        Direction::Fwd => Ok(plan_fwd_sm80(spec)),
        Direction::Bwd => plan_bwd::plan_bwd(spec).ok_or_else(|| PlanError {
            spec: spec.to_string(),
            reason: "no backward tile shape fits this arch's shared memory and registers".into(),
        }),
    }
}

/// The spec's kernel on the sm80 instruction path (`fwd_sm80.cu`,
/// `bwd_sm80.cu`: mma.sync, cp.async) for any arch, sm90a included where the
/// planner takes the wgmma templates: for comparing the two paths on Hopper
/// and for timing changes to the sm80 path there (`attnforge compile --path
/// sm80`). On sm90a the first reason names the planner's own template.
pub fn plan_sm80_path(spec: &AttnSpec) -> Result<KernelPlan, PlanError> {
    Ok(sm80_path_and_main(spec)?.0)
}

/// [`plan_sm80_path`]'s plan and whether the planner's own template differs
/// (the spec then has a [`Variant::Sm80Path`]), planning the spec once.
fn sm80_path_and_main(spec: &AttnSpec) -> Result<(KernelPlan, bool), PlanError> {
    let planned = plan(spec)?;
    let mut p = match spec.direction {
        Direction::Fwd => plan_fwd_sm80(spec),
        Direction::Bwd => plan_bwd::plan_bwd_sm80(spec).ok_or_else(|| PlanError {
            spec: spec.to_string(),
            reason: "no sm80-path backward tile shape fits this arch's shared memory and registers".into(),
        })?,
    };
    let differs = planned.template != p.template;
    if !differs {
        // The planner takes the sm80 path itself: its plan (and its reasons,
        // e.g. why not the wgmma backward) is the one that runs.
        return Ok((planned, false));
    }
    p.reasons.insert(
        0,
        format!(
            "sm80 instruction path requested: {} instead of the planner's {}",
            p.template.file(),
            planned.template.file()
        ),
    );
    Ok((p, true))
}

/// Tile shape of the sm80 forward: warps per block, 16-row MMA tiles per
/// warp, keys per main-loop step, K/V buffers (2: the next tile's K and V
/// load under this one; 1: FlashAttention-2's order, V under S and the next
/// K under the softmax and P V, in half the shared memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FwdTiles {
    pub num_warps: u32,
    pub m_tiles_per_warp: u32,
    pub block_n: u32,
    pub stages: u32,
    /// Blocks take one (batch, head)'s query blocks consecutively (see
    /// [`KernelPlan::head_major`]) rather than one query block of every head.
    pub head_major: bool,
}

/// The tile shape the planner picks for a spec (see `docs/kernels.md` for the
/// measurements behind it).
pub fn default_fwd_tiles(spec: &AttnSpec) -> FwdTiles {
    fwd_tiles_with_reason(spec).0
}

/// Shared-memory row pitches (elements) of the sm80-path forward's Q/K and V
/// tiles: the head dims padded to the k-step (16) plus a 16-byte pad, which
/// puts the 8 rows of every `ldmatrix` in 8 distinct bank groups (the row
/// pitch in 16-byte units is odd).
fn fwd_pitches(spec: &AttnSpec) -> (u32, u32) {
    (
        round_up(spec.head_dim_qk as u32, 16) + 8,
        round_up(spec.head_dim_v as u32, 16) + 8,
    )
}

/// The planner's tile shape and why (`attnforge plan` prints the reason).
fn fwd_tiles_with_reason(spec: &AttnSpec) -> (FwdTiles, &'static str) {
    let dmax = round_up(spec.head_dim_qk.max(spec.head_dim_v) as u32, 16);
    // Measured on the H200 (docs/kernels.md, fwd tuning): two m16 tiles per
    // warp halve the shared-memory reads of K and V per MMA and win where
    // registers allow it. Since the S k-loop is unrolled by four rather than
    // fully at mt=2 (2026-12-03), every d128 variant fits in registers but
    // the ragged windowed ones (20 B spilled on sm_80; 12-24 B with softcap);
    // the compile sweep checks the rest.
    let d128_fits_mt2 = !(spec.layout == Layout::Thd && spec.mask == Mask::SlidingWindow);
    // One K and one V buffer in FlashAttention-2's order (V loads under S,
    // the next K under the softmax and P V) against the double-buffered
    // order, `gpu_bench --tune` on the H200 (2026-12-04, s8k, non-causal /
    // causal): d128 4x2 bn32 342 / 334 TFLOP/s against 328 / 313; d256 8x1
    // bn64 293 / 301 against 291 / 285 (and 135 KB of shared memory instead
    // of 203 KB, so bn64 fits sm80's 163 KB too). d64 keeps bn64 double-
    // buffered: one buffer at bn64 measured 308 / 304 against 320 / 317,
    // and bn128 (331 / 328) spills on sm_80 in 33 of the 44 d <= 64 specs.
    let causal = matches!(spec.mask, Mask::CausalTopLeft | Mask::CausalBottomRight);
    let dense_unmasked_hopper =
        spec.arch == Arch::Sm90a && spec.layout == Layout::Dense && spec.mask == Mask::None && !spec.softcap;
    let ((num_warps, m_tiles_per_warp, block_n, stages), why) = if dmax <= 64 && dense_unmasked_hopper {
        // Session 33 on H100s (docs/kernels.md, fwd_sm80 v12): bn128 with
        // two K/V buffers in head-major order (92 KB a block, two blocks per
        // SM) against the former bn64 in query-block-major order, +5.7% /
        // +4.9% at 2k / 8k in a same-process A/B (15 rounds), +11% / +8% in
        // the tune; 1.12-1.14x FlashAttention-2 interleaved. Under a causal
        // mask bn128 ties bn64 (and spills 8 B with two buffers).
        (
            (4, 2, 128, 2),
            "dense d <= 64 without a mask or softcap on Hopper: 128-key steps, two K/V buffers (measured best, session 33)",
        )
    } else if dmax <= 64 {
        (
            (4, 2, 64, 2),
            "d <= 64: 64-key steps, two K/V buffers (bn128 spills on most sm80 specs)",
        )
    } else if dmax <= 128 {
        // 48-key steps (session 27, `gpu_bench --tune` and a same-process
        // A/B on an H100, docs/kernels.md): +2% / +7% over bn32 at d128 2k
        // without a mask / causal, +2% / +8% at 8k; spill-free since the
        // epilogue re-forms its coordinates (fwd_block). Without a mask and
        // softcap on dense tensors, two K/V buffers at bn48 gain 4-5% more
        // on Hopper (87 KB a block; on sm80's 164 KB per SM two such blocks
        // would not fit, so one buffer there). Ragged causal specs spill at
        // bn48 and keep bn32.
        if !d128_fits_mt2 {
            (
                (4, 1, 64, 2),
                "ragged windowed d96/d128: one m16 tile per warp (two spill)",
            )
        } else if spec.layout == Layout::Thd && causal {
            ((4, 2, 32, 1), "ragged causal d96/d128: 32-key steps (48 spill)")
        } else if dense_unmasked_hopper {
            (
                (4, 2, 48, 2),
                "dense d96/d128 without a mask or softcap on Hopper: 48-key steps, two K/V buffers (measured best, session 27)",
            )
        } else {
            (
                (4, 2, 48, 1),
                "d96/d128: 48-key steps, one K/V buffer (+2..+11% over 32-key steps, session 27)",
            )
        }
    } else {
        // d > 128: FlashAttention-2's shape, 128 query rows over 8 warps
        // (H200 `gpu_bench --tune`, 2026-12-03, d256 s8k: 285 TFLOP/s against
        // 241 for 4 warps x 1 tile, bn 32), with the widest key step that
        // fits one K and one V buffer: bn96 on Hopper (session 27's tune on
        // an H100, d256: +3% / +1% at 2k, +6% / +2% at 8k, non-causal /
        // causal, over bn64), bn80 in sm80's 163 KB, bn64 below that.
        let (pitch_qk, pitch_v) = fwd_pitches(spec);
        let limit = spec.arch.max_smem_per_block();
        let bn = [96, 80]
            .into_iter()
            .find(|&bn| fwd_smem(128, bn, 1, pitch_qk, pitch_v) <= limit)
            .unwrap_or(64);
        (
            (8, 1, bn, 1),
            "d > 128: 8 warps, the widest key step of 96/80/64 whose one K/V buffer fits the arch's shared memory (else 64, halved until it fits)",
        )
    };
    let tiles = FwdTiles {
        num_warps,
        m_tiles_per_warp,
        block_n,
        stages,
        // FlashAttention-2's (and the sm90a forward's) head-major order, for
        // dense problems without a mask (d > 64 since session 32, every d
        // since session 33): session 32's tunes on an H100 (12 and 4
        // balanced rounds, one machine) put it at +5.0% / +7.5% at d128 2k,
        // +1.9% / +1.8% at 8k, and d256 at +1% (2k) and +4% (8k), where the
        // blocks in flight of the query-block-major order read every head's
        // K and V from DRAM (a 58% L2 hit rate at d128 2k against
        // FlashAttention-2's 87%, session 27). A same-process
        // A/B on another machine the same day read d128 2k at -2.1%; session
        // 26's at -4.0..+5.3%. Under masks the query-block-major order (the
        // longest tiles of every head first) stays: -2..-4% head-major at
        // d128 and d256 causal. d <= 64 too since session 33 (the bn128
        // shape above was measured head-major; bn64 alone read -1..+11%).
        head_major: spec.layout == Layout::Dense && spec.mask == Mask::None,
    };
    (tiles, why)
}

/// The sm80-path forward's tile shapes that `gpu_bench --tune` times (each in
/// both block orders) for a spec: the planner's shape first, then the
/// alternatives for its head dim (in the planner's block order). The GPU suite checks every one for
/// correctness, so that a shape the tune favours can become the default
/// without a kernel nobody ran.
pub fn fwd_tile_candidates(spec: &AttnSpec) -> Vec<FwdTiles> {
    let dmax = round_up(spec.head_dim_qk.max(spec.head_dim_v) as u32, 16);
    let shapes: &[(u32, u32, u32, u32)] = if dmax <= 64 {
        &[(4, 2, 64, 2), (4, 2, 128, 1), (4, 2, 128, 2)]
    } else if dmax <= 128 {
        &[
            (4, 2, 48, 2),
            (4, 2, 48, 1),
            (4, 2, 32, 1),
            (4, 2, 64, 1),
            (4, 2, 32, 2),
        ]
    } else {
        // 4 x 1: block_m 64 with two blocks per SM on Hopper (FlashAttention-2's
        // d256 shape), whose second block runs while the first is in its
        // prologue or epilogue (session 32: 2k loses 5% of a block there).
        &[
            (8, 1, 96, 1),
            (8, 1, 80, 1),
            (8, 1, 64, 1),
            (8, 1, 64, 2),
            (4, 1, 64, 1),
            (4, 1, 32, 1),
        ]
    };
    let planner = default_fwd_tiles(spec);
    let mut out = vec![planner];
    out.extend(
        shapes
            .iter()
            .map(|&(num_warps, m_tiles_per_warp, block_n, stages)| FwdTiles {
                num_warps,
                m_tiles_per_warp,
                block_n,
                stages,
                head_major: planner.head_major,
            })
            .filter(|t| *t != planner),
    );
    out
}

fn plan_fwd_sm80(spec: &AttnSpec) -> KernelPlan {
    let (tiles, why) = fwd_tiles_with_reason(spec);
    let mut p = plan_fwd_sm80_with(spec, tiles);
    p.reasons.insert(
        p.reasons.len().min(1),
        format!(
            "tile shape {}x{}xbn{}: {why}",
            tiles.num_warps, tiles.m_tiles_per_warp, tiles.block_n
        ),
    );
    p
}

/// The sm80 forward plan with a given tile shape (for tuning sweeps; the
/// planner uses [`default_fwd_tiles`]). `block_n` shrinks to fit the arch's
/// shared memory.
pub fn plan_fwd_sm80_with(spec: &AttnSpec, tiles: FwdTiles) -> KernelPlan {
    let mut reasons = Vec::new();
    let dqk = round_up(spec.head_dim_qk as u32, 16);
    let dv = round_up(spec.head_dim_v as u32, 16);
    if dqk != spec.head_dim_qk as u32 || dv != spec.head_dim_v as u32 {
        reasons.push(format!(
            "head dims {}/{} padded to {dqk}/{dv} in shared memory (mma k-step is 16; pad is zero-filled)",
            spec.head_dim_qk, spec.head_dim_v
        ));
    }
    let (pitch_qk, pitch_v) = fwd_pitches(spec);
    let dmax = dqk.max(dv);
    let template = Template::FwdSm80;

    // Warps own 16-row MMA tiles; a wider block_n amortizes the softmax
    // bookkeeping, a narrower one keeps the S/P registers in bounds.
    let FwdTiles {
        num_warps,
        m_tiles_per_warp,
        mut block_n,
        stages,
        head_major,
    } = tiles;
    let block_m = 16 * m_tiles_per_warp * num_warps;
    reasons.push(format!(
        "d={dmax}: {num_warps} warps x {m_tiles_per_warp} m16 tile(s) -> block_m={block_m}; O accumulators {} f32 regs/thread",
        m_tiles_per_warp * dv / 2
    ));

    let stages = stages.clamp(1, 2); // the template's two orders
    let limit = spec.arch.max_smem_per_block();
    while block_n > 16 && fwd_smem(block_m, block_n, stages, pitch_qk, pitch_v) > limit {
        block_n /= 2;
    }
    let smem_bytes = fwd_smem(block_m, block_n, stages, pitch_qk, pitch_v);
    reasons.push(if stages == 1 {
        format!(
            "block_n={block_n}, one K and one V buffer (V loads under S, the next K under the softmax and P V): \
             {smem_bytes} B shared memory (arch limit {limit} B)"
        )
    } else {
        format!("block_n={block_n}, {stages}-stage cp.async K/V pipeline: {smem_bytes} B shared memory (arch limit {limit} B)")
    });
    // One block's barrier and load waits hide behind another block's MMAs
    // when two fit on an SM; launch bounds then cap registers at 255.
    let min_blocks_per_sm = if num_warps <= 4 { 2 } else { 1 };
    if head_major {
        reasons.push(
            "head-major block order: one (batch, head)'s query blocks run consecutively (longest causal first), \
             so the blocks in flight share its K and V in L2"
                .into(),
        );
    }
    let smem_swizzle = fwd_swizzle(spec, dqk, dv);
    if smem_swizzle {
        let (tiles, rest) = match fwd_swizzled_tiles(smem_swizzle, dqk, dv) {
            [true, _, true] => ("Q/K/V tiles", ""),
            _ => ("K tiles", "; Q and V padded (at d128 their swizzled reads spill)"),
        };
        reasons.push(format!(
            "{tiles} swizzled in shared memory (whole 128-byte lines per copy), not padded{rest}"
        ));
    }

    KernelPlan {
        spec: *spec,
        template,
        entry: entry_name(spec),
        block_m,
        block_n,
        num_warps,
        m_tiles_per_warp,
        stages,
        head_dim_qk_padded: dqk,
        head_dim_v_padded: dv,
        smem_pitch_qk: pitch_qk,
        smem_pitch_v: pitch_v,
        smem_bytes,
        min_blocks_per_sm,
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
        smem_swizzle,
        head_major,
        cluster_m: 1,
        bwd: None,
    }
}

/// Which of the sm80-path forward's Q, K and V tiles a plan with
/// [`KernelPlan::smem_swizzle`] (`swizzle`) stores swizzled: all three, but at
/// d128, where the key loop runs at 254-255 registers, K alone. V's swizzled
/// reads (four XORed addresses across the P V product's column blocks) spill
/// 8-20 B there; Q, copied once per block, gains little.
pub fn fwd_swizzled_tiles(swizzle: bool, dqk: u32, dv: u32) -> [bool; 3] {
    [swizzle && dqk != 128, swizzle, swizzle && dv != 128]
}

/// Whether the sm80-path forward stores its tiles swizzled
/// ([`KernelPlan::smem_swizzle`]): at d64, d128 and d256 (at d128 K alone,
/// [`fwd_swizzled_tiles`]).
/// Measured in one process on an H100: d64/d256 +3..+10% (session 29), d128
/// +1.2..+3.8% (session 30).
/// Not planned where it spills: d192 under masks (16-32 B), d256 ragged batches
/// under a mask on sm_90a (8 B), and d128 under a sliding window or, on the
/// sm80-family archs, under a causal mask (4-16 B); the compile sweep checks
/// the rest.
pub fn fwd_swizzle(spec: &AttnSpec, dqk: u32, dv: u32) -> bool {
    match (dqk, dv) {
        (64, 64) => true,
        (256, 256) => !(spec.layout == Layout::Thd && spec.mask != Mask::None && spec.arch == Arch::Sm90a),
        (128, 128) => match spec.mask {
            Mask::None => true,
            Mask::CausalTopLeft | Mask::CausalBottomRight => spec.arch == Arch::Sm90a,
            _ => false,
        },
        _ => false,
    }
}

/// Consumer warpgroups of the sm90a forward by default (64 query rows each).
pub const SM90A_CONSUMERS: u32 = 2;
/// Registers per thread after `setmaxnreg`: the producer warpgroup gives
/// registers back to 24, the consumers take what is left of the SM's 64K.
pub const SM90A_PRODUCER_REGS: u32 = 24;

/// Registers per consumer thread with `consumers` consumer warpgroups and
/// `blocks` blocks per SM: a block is launched with the registers
/// `__launch_bounds__` leaves it (65536 / blocks per block, a multiple of 8
/// per thread, at most 248), the producer gives back all but 24 and the
/// consumers take the rest, a multiple of 8 (`setmaxnreg`), at most 240
/// (one block: 240 for two consumers, 160 for three). `setmaxnreg.inc`
/// waits for registers the block does not have, so this must never exceed
/// the launch allocation (`jit::compile_plan` refuses a cubin whose entries
/// have fewer registers than [`sm90a_launch_regs`]).
pub const fn sm90a_consumer_regs(consumers: u32, blocks: u32) -> u32 {
    let threads = 128 * (consumers + 1);
    let launch = sm90a_launch_regs(consumers, blocks);
    let per = (launch * threads - 128 * SM90A_PRODUCER_REGS) / (128 * consumers);
    let per = per - per % 8;
    if per > 240 {
        240
    } else {
        per
    }
}

/// Registers per thread at launch of an sm90a forward block with
/// `consumers` consumer warpgroups, `blocks` per SM (see
/// [`sm90a_consumer_regs`]).
pub const fn sm90a_launch_regs(consumers: u32, blocks: u32) -> u32 {
    let threads = 128 * (consumers + 1);
    let per = 65536 / (blocks * threads);
    let per = per - per % 8;
    if per > 248 {
        248
    } else {
        per
    }
}

/// Shared memory of the sm90a forward: Q once, K and V `stages` deep, each as
/// 64-column (128-byte) swizzled chunks; 1 KB to align the base to the
/// swizzle period, and the mbarriers (Q full and empty; K and V full and
/// empty per stage).
fn fwd_sm90a_smem(block_m: u32, block_n: u32, stages: u32, qk_chunks: u32, v_chunks: u32) -> u32 {
    let tiles = 128 * (block_m * qk_chunks + stages * block_n * (qk_chunks + v_chunks));
    tiles + 1024 + 8 * (2 + 4 * stages)
}

/// Whether the sm90a forward of `spec` should take its persistent walk entry
/// ([`GridRule::TilesOrWalk`]) for keys this long (dense `seqlen_k`, ragged
/// maximum) at head dim `d` (the larger of the plan's d_qk and d_v), with
/// `consumers` consumer warpgroups (block_m / 64); the spec's mask and layout
/// count. H200,
/// 2026-12-04 (`gpu_bench --tune90`, same process,
/// docs/benchmarks/2026-12-04-s9-tune90.md and -s10-tune90.md): the walk
/// overlaps a tile's epilogue with the next one's Q load and wins where tiles
/// are short (seqlen 512: +5..11% at every head dim but d256 causal, -3.5%
/// and +4% in two runs; 2k: d64 causal +5%, d64 without a mask +1% / -5%,
/// d128 -0..10%, d256 mixed), while at 8k and 16k one block per tile is
/// 3..20% faster (a static walk cannot balance causal tile lengths as the
/// hardware's block dispatch does), and the walk given one block per tile
/// ran 10..15% under the one-tile entry (d128 8k: 614 vs 719 TFLOP/s).
/// H100, 2026-12-05 (session 24, tune90, docs/benchmarks/2026-12-05-s24-gpu.md):
/// d256 causal at seqlen 512 runs 15% faster one tile per block (288 vs 250
/// at block_n 80, 292 vs 261 at 64), but at 1024 the walk is ahead again
/// (418 vs 405, 442 vs 414), so past d128 a mask keeps one tile per block up
/// to [`SM90A_ONE_TILE_MASKED_MAX_KEYS`]; three consumers under a mask walk
/// up to 2k (d128 causal 2k: 487 walk vs 472 one tile).
///
/// Ragged batches past d128 (session 46, H100, `gpu_bench --ragged-order`,
/// `docs/benchmarks/2026-12-07-s46-gpu.md`): since the walk takes their
/// sequences longest keys first (its order table), without a mask it leads
/// the one-tile entry at every length measured (d256: +4.2% / +1.8% on the
/// bench's and the seed-11 lengths of up to 3.7k tokens, +20.9% on 64..1024),
/// so it walks at every length. Under a mask the main plan's walk trails the
/// one-tile entry (-5.7% on 64..1024, -15..21% on the longer draws), and so
/// does the short-keys tiles' (block_n 64, calls up to 1024 keys; session 47,
/// H100, same process, `docs/benchmarks/2026-12-07-s47-gpu.md`: 257.1 against
/// 289.6 TFLOP/s one tile per block in the same longest-first order, 311.8 in
/// batch order, on 64..1024 tokens at d256 causal), so a masked ragged batch
/// past d128 takes one tile per block at every length. The launcher walks a
/// ragged batch only where the walk takes that order
/// ([`sm90a_ragged_walk_ordered`]).
pub fn sm90a_walk_pays(seqlen_k: u32, spec: &AttnSpec, d: u32, consumers: u32, block_n: u32) -> bool {
    let masked = spec.mask != Mask::None;
    if spec.layout == Layout::Thd && d > 128 {
        return !masked;
    }
    if masked && d > 128 && seqlen_k <= SM90A_ONE_TILE_MASKED_MAX_KEYS {
        return false;
    }
    seqlen_k <= SM90A_WALK_MAX_KEYS
        || (sm90a_walks_to_2k(spec, d, consumers, block_n) && seqlen_k <= 2 * SM90A_WALK_MAX_KEYS)
}

/// Where the sm90a forward walks up to twice [`SM90A_WALK_MAX_KEYS`]: at
/// d <= 64 under a mask, at d 65..128 with three consumers (a causal main
/// plan, or [`Variant::MidKeys`] without a mask; d128 at 2k: 619.5 TFLOP/s on
/// the walk against 601.8 one tile per block, H100, session 34), and past
/// d128 on dense tensors without a mask since the walk passes its turns
/// across tiles (d256 at 2k: 692.2 and 696.0 against 667.1 and 673.9 in two
/// pairs of the same tune, the walk ahead in 6 of 7 rounds of each; H100,
/// session 35, `docs/benchmarks/2026-12-06-s35-gpu.md` call B; ragged batches
/// keep their longest-first one-tile order there, unmeasured on the walk).
/// d64 without a mask stays one tile per block (492.6 against 492.5), and
/// d256 under a mask at block_n 80 too (539.8 and 543.5 against 529.6 and
/// 542.0: inside the rounds' spread). At block_n 64 (the d256 causal
/// short-keys tiles, which dense calls take up to 2k keys) the walk leads at
/// 2k: 561.7 against 544.0 one tile per block, ahead in all 5 rounds (H100,
/// session 41, `docs/benchmarks/2026-12-07-s41-gpu.md`).
fn sm90a_walks_to_2k(spec: &AttnSpec, d: u32, consumers: u32, block_n: u32) -> bool {
    let masked = spec.mask != Mask::None;
    match d {
        0..=64 => masked,
        65..=128 => consumers >= 3,
        _ => spec.layout == Layout::Dense && (!masked || block_n <= 64),
    }
}

/// A second plan of the same spec that the launcher takes per call, by the
/// length of the keys (see [`Variant::for_keys`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum Variant {
    /// The planner's plan ([`plan`]).
    #[default]
    Main,
    /// Short keys (at most [`SHORT_KEYS_MAX`], [`ONE_CONSUMER_KEYS_MAX`] for
    /// the one-consumer tiles): the sm90a forward's tiles measured faster at
    /// seqlen 512 and 1024 where they differ from the main plan's
    /// ([`short_keys_tiles_why`]): one consumer at three blocks per SM (d <=
    /// 64) or two consumers (d128) where the main plan has three under a
    /// causal mask, block_n 64 at d256 causal, block_n 128 at d128 without a
    /// mask, TMA stores of O at dense d <= 64 without a mask.
    ShortKeys,
    /// Keys of medium length ([`Variant::keys`]): two consumers at block_n
    /// 128 for keys of 769..=1024 after the one-consumer short-keys tiles,
    /// where d <= 64 causal has three ([`mid_keys_tiles_why`]). (Until
    /// session 41 also dense d 80..128 without a mask, up to 2048 keys: three
    /// consumers at block_n 80 where the main plan had two at block_n 176;
    /// the main plan has them now.)
    MidKeys,
    /// The sm80 instruction path ([`plan_sm80_path`]) where the planner takes
    /// the wgmma templates (sm90a): asked for by name only (the opt-in
    /// `generated-sm80` backend, `attnforge compile --path sm80`), never
    /// chosen per call. Specs whose main plan is already on that path have
    /// no such variant.
    Sm80Path,
}

/// The longest keys (dense `seqlen_k`, ragged maximum) that take
/// [`Variant::ShortKeys`] where a spec has one (but see
/// [`ONE_CONSUMER_KEYS_MAX`]).
pub const SHORT_KEYS_MAX: u32 = 1024;

/// The longest keys that take [`Variant::ShortKeys`] where its tiles are one
/// consumer warpgroup at several blocks per SM (d <= 64 causal). H100,
/// tune90 on the walk (docs/benchmarks/2026-12-07-s38-gpu.md, -s39-gpu.md):
/// +9.3% against two consumers at block_n 128 at 512 keys, +6.6% against the
/// same with three stages at 768, -3.6% at 1024. Keys from here to
/// [`SHORT_KEYS_MAX`] take [`Variant::MidKeys`].
pub const ONE_CONSUMER_KEYS_MAX: u32 = 768;

/// The longest keys that any variant serves ([`Variant::for_keys`] takes
/// the main plan past it without looking at the spec): the short-keys tiles
/// of dense d > 192 causal specs ([`short_keys_end`]); the mid-keys variant
/// ends at [`SHORT_KEYS_MAX`].
pub const MID_KEYS_MAX: u32 = 2048;

impl Variant {
    /// The variant a call with keys this long takes (dense `seqlen_k`,
    /// ragged `max_seqlen_k`). Pure and cheap (the hot path asks it).
    pub fn for_keys(spec: &AttnSpec, seqlen_k: u32) -> Variant {
        // No variant's range reaches past MID_KEYS_MAX (tested over the
        // coverage matrix): long calls skip the look at the spec's tiles.
        if seqlen_k > MID_KEYS_MAX {
            return Variant::Main;
        }
        match key_ranges(spec) {
            (Some(short), _) if short.contains(&seqlen_k) => Variant::ShortKeys,
            (_, Some(mid)) if mid.contains(&seqlen_k) => Variant::MidKeys,
            _ => Variant::Main,
        }
    }

    /// The keys (dense `seqlen_k`, ragged maximum) whose calls take this
    /// variant of `spec`: `None` for [`Variant::Main`] and
    /// [`Variant::Sm80Path`] (not chosen by length) and where the spec has no
    /// such variant.
    pub fn keys(self, spec: &AttnSpec) -> Option<std::ops::RangeInclusive<u32>> {
        match self {
            Variant::ShortKeys => key_ranges(spec).0,
            Variant::MidKeys => key_ranges(spec).1,
            Variant::Main | Variant::Sm80Path => None,
        }
    }

    /// A suffix for file names and logs: "" for the main plan.
    pub const fn suffix(self) -> &'static str {
        match self {
            Variant::Main => "",
            Variant::ShortKeys => ".short",
            Variant::MidKeys => ".mid",
            Variant::Sm80Path => ".sm80path",
        }
    }
}

/// The key ranges of [`Variant::ShortKeys`] and [`Variant::MidKeys`] for
/// `spec` (`None` where it has no such variant), from one look at its
/// short-keys tiles: one consumer at several blocks per SM serves up to
/// [`ONE_CONSUMER_KEYS_MAX`] and hands the rest up to [`SHORT_KEYS_MAX`] on to
/// the mid-keys tiles, which every such spec has ([`mid_keys_tiles_why`]).
fn key_ranges(
    spec: &AttnSpec,
) -> (
    Option<std::ops::RangeInclusive<u32>>,
    Option<std::ops::RangeInclusive<u32>>,
) {
    match short_keys_tiles(spec) {
        Some(t) if hands_short_keys_on(&t) => (
            Some(0..=ONE_CONSUMER_KEYS_MAX),
            Some(ONE_CONSUMER_KEYS_MAX + 1..=SHORT_KEYS_MAX),
        ),
        short => (short.map(|_| 0..=short_keys_end(spec)), None),
    }
}

/// The longest keys of [`Variant::ShortKeys`] where it does not hand keys on
/// to [`Variant::MidKeys`]: [`SHORT_KEYS_MAX`], but [`MID_KEYS_MAX`] for dense
/// d > 192 causal specs (their short-keys tiles, block_n 64, on the walk,
/// where the main plan has block_n 80 one tile per block at 2k: 561.7 against
/// 535.1 TFLOP/s, ahead in all 5 rounds; H100, session 41, tune90,
/// docs/benchmarks/2026-12-07-s41-gpu.md).
fn short_keys_end(spec: &AttnSpec) -> u32 {
    let causal = matches!(spec.mask, Mask::CausalTopLeft | Mask::CausalBottomRight);
    let dmax = round_up(spec.head_dim_qk.max(spec.head_dim_v) as u32, 16);
    if causal && spec.layout == Layout::Dense && dmax > 192 {
        MID_KEYS_MAX
    } else {
        SHORT_KEYS_MAX
    }
}

/// Whether short-keys tiles serve only up to [`ONE_CONSUMER_KEYS_MAX`] and
/// hand the keys after it on to [`Variant::MidKeys`]: one consumer at several
/// blocks per SM (d <= 64 causal), which trails two consumers at 1024 keys.
fn hands_short_keys_on(short: &Sm90aFwdTiles) -> bool {
    short.blocks_per_sm > 1
}

/// The tiles of [`Variant::ShortKeys`] for `spec`, if it has that variant,
/// with why (for the plan's reasons). sm90a forwards only:
/// - under a causal mask where the main plan has three consumer warpgroups:
///   two at block_n 128, with Q in registers ([`KernelPlan::q_regs`]; H100,
///   session 45, tune90 on the walk at d128 512, 5 rounds: 317.5 TFLOP/s
///   against 313.2 with v25's second Q buffer (sessions 43 and 44:
///   +1.4..2.6% over one buffer; an option until session 45, removed once Q
///   in registers freed the one buffer earlier), 312.3 with both and 305.6
///   with neither; at d64's one consumer 254.0 against 252.1).
///   H200 (session 14) and H100 (sessions 23 and 24,
///   tune90, docs/benchmarks/2026-12-05-s24-gpu.md): at seqlen 512, 192-row
///   query tiles cover the causal triangle with 59% useful scores (128-row
///   tiles: 80%) and leave a consumer idle in the last tile; two consumers at
///   block_n 128 ran d64 217.6 vs 189.4 TFLOP/s (+15%) and d128 291.5 vs
///   252.7 (+15%) on the walk, while at 2k three consumers are ahead (d64 368
///   vs 335, d128 487 vs 472); at d <= 64 (session 38, H100, tune90, 5
///   rounds, docs/benchmarks/2026-12-07-s38-gpu.md) one consumer at block_n
///   64 with three blocks per SM instead: 248.4 vs 227.3 (+9.3%) at 512 and
///   329.1 vs 283.1 (+16%) at 2k, both on the walk, but at 1024 305.9
///   against 317.3 for two consumers with three stages (session 39), so calls
///   take these tiles up to [`ONE_CONSUMER_KEYS_MAX`] keys and the mid-keys
///   variant up to 1024 (d128: 277.0 vs 290.6 at two blocks per SM, so two
///   consumers);
/// - d > 192 under a causal mask: block_n 64 instead of 80 (512 keys in 8
///   whole tiles; tune90, 7 rounds: 291.7 vs 287.6 at 512, one tile per
///   block; 441.9 vs 418.5 at 1024 on the walk), and on dense tensors up to
///   2048 keys ([`short_keys_end`]);
/// - dense d <= 64 without a mask or softcap: the main plan's tiles with
///   TMA stores of O ([`KernelPlan::tma_store_o`]). H100, same-process A/B,
///   7 rounds (docs/benchmarks/2026-12-07-s41-gpu.md call I): 384.4 vs 379.5
///   at 512 on the walk (ahead in every round), 476.3 vs 480.8 at 2k and
///   542.3 vs 542.1 at 8k one tile per block;
/// - dense d 80..128 without a mask or softcap: two consumers at block_n 128
///   where the main plan has three at block_n 80 (tune90 on the walk, H100,
///   session 40: 498.3 vs 435.1 at 512; against the main plan's block_n 176
///   of before session 41: 487.7 vs 470.7 at 512, 556.1 vs 537.1 at 1024).
///   Not ragged: a batch of short sequences ends each one anywhere in a key
///   tile, where block_n 128 pads half a tile (64 keys) on average against
///   block_n 80's 40; on 33 sequences of 91..975 tokens the main plan walked
///   460.3 against 435.7 (H100, session 48, two pairs, and 458.2 vs 434.5 in
///   session 47; docs/benchmarks/2026-12-08-s48-gpu.md).
pub fn short_keys_tiles_why(spec: &AttnSpec) -> Option<(Sm90aFwdTiles, &'static str)> {
    if spec.direction != Direction::Fwd || spec.arch != Arch::Sm90a || spec.validate().is_err() {
        return None;
    }
    let causal = matches!(spec.mask, Mask::CausalTopLeft | Mask::CausalBottomRight);
    let dmax = round_up(spec.head_dim_qk.max(spec.head_dim_v) as u32, 16);
    let main = default_sm90a_tiles(spec);
    let short = |consumers, block_n| Sm90aFwdTiles {
        consumers,
        block_n,
        stages: 2,
        ..main
    };
    if causal && main.consumers >= 3 && dmax <= 64 {
        Some((
            Sm90aFwdTiles {
                blocks_per_sm: 3,
                q_regs: true,
                ..short(1, 64)
            },
            "one consumer warpgroup at block_n 64, three blocks per SM: blocks of 64 query rows hide each other's \
             softmax where a causal tile has few keys; measured +9.3% at seqlen 512 (and +16% at 2k) on the walk \
             against two consumers at block_n 128, which beat block_m 192 by 15%; Q in registers +0.8% at 512",
        ))
    } else if causal && main.consumers >= 3 {
        Some((
            Sm90aFwdTiles {
                q_regs: true,
                ..short(2, 128)
            },
            "block_m 192 covers a short causal triangle with more wasted rows; measured +15% at seqlen 512; with \
             Q in registers (its buffer free for the next tile at once) +3.9% at d128 512, where a second Q \
             buffer gave +2.5%",
        ))
    } else if spec.mask == Mask::None
        && dmax <= 64
        && !spec.softcap
        && spec.layout == Layout::Dense
        && main.consumers >= 3
    {
        Some((
            Sm90aFwdTiles {
                tma_store_o: true,
                ..main
            },
            "the main plan's tiles with O through shared memory by TMA stores: measured +1.3% at seqlen 512 on \
             the walk, -0.9% at 2k one tile per block",
        ))
    } else if causal && dmax > 192 && main.block_n == 80 {
        Some((
            short(2, 64),
            "measured +1.4% at seqlen 512, +5.6% at 1024 and, on dense tensors, +5.0% at 2048 on the walk",
        ))
    } else if spec.mask == Mask::None
        && dmax > 64
        && dmax <= 128
        && !spec.softcap
        && spec.layout == Layout::Dense
        && main.consumers >= 3
    {
        Some((
            short(2, 128),
            "two consumers at block_n 128 where the main plan has three at block_n 80: 128-row query blocks load \
             each K/V byte for fewer rows but fill 512 keys in 4 whole tiles; measured 498.3 vs 435.1 TFLOP/s at \
             seqlen 512 on the walk (H100, session 40); dense only (ragged lengths end anywhere in a key tile)",
        ))
    } else {
        None
    }
}

/// The tiles of [`Variant::ShortKeys`] for `spec`, if it has that variant
/// ([`short_keys_tiles_why`]).
pub fn short_keys_tiles(spec: &AttnSpec) -> Option<Sm90aFwdTiles> {
    short_keys_tiles_why(spec).map(|(t, _)| t)
}

/// The tiles of [`Variant::MidKeys`] for `spec`, if it has that variant,
/// with why (for the plan's reasons):
/// - d <= 64 causal (dense or ragged) where the short-keys tiles are one
///   consumer at three blocks per SM: two consumers at block_n 128 with three
///   stages for keys of 769..=1024 ([`Variant::keys`]). H100, tune90 on the
///   walk at 1024 keys, 5 rounds (docs/benchmarks/2026-12-07-s39-gpu.md):
///   317.3 TFLOP/s against 305.9 (one consumer, three blocks per SM), 310.6
///   (two stages) and 274.5 (the main plan's three consumers); at 512 the one
///   consumer leads (248.4 against 230.5), at 2k the main plan (375.0).
///
/// (Dense d 80..128 without a mask or softcap had one up to session 41:
///   three consumers at block_n 80 with two stages for 1025..=2048 keys,
///   +2.6% and +6.7% against block_n 176 at 2k; three consumers are now that
///   spec's main plan, with three stages, docs/kernels.md v22.)
pub fn mid_keys_tiles_why(spec: &AttnSpec) -> Option<(Sm90aFwdTiles, &'static str)> {
    if short_keys_tiles(spec).is_some_and(|t| hands_short_keys_on(&t)) {
        return Some((
            Sm90aFwdTiles {
                consumers: 2,
                block_n: 128,
                stages: 3,
                ..default_sm90a_tiles(spec)
            },
            "between the one-consumer short-keys tiles and the main plan's three consumers; measured +3.7% at \
             seqlen 1024 on the walk against the one consumer, +16% against three",
        ));
    }
    None
}

/// The tiles of [`Variant::MidKeys`] for `spec`, if it has that variant
/// ([`mid_keys_tiles_why`]).
pub fn mid_keys_tiles(spec: &AttnSpec) -> Option<Sm90aFwdTiles> {
    mid_keys_tiles_why(spec).map(|(t, _)| t)
}

/// Every variant a call of `spec` may take: [`Variant::Main`], then
/// [`Variant::ShortKeys`] and [`Variant::MidKeys`] where the spec has them
/// (what `attnforge prebuild` and the coverage sweep build).
pub fn variants(spec: &AttnSpec) -> impl Iterator<Item = Variant> {
    std::iter::once(Variant::Main)
        .chain(short_keys_tiles(spec).map(|_| Variant::ShortKeys))
        .chain(mid_keys_tiles(spec).map(|_| Variant::MidKeys))
}

/// The plan of one variant of a spec: [`plan`] for [`Variant::Main`],
/// `None` where the spec has no such variant.
pub fn plan_variant(spec: &AttnSpec, variant: Variant) -> Result<Option<KernelPlan>, PlanError> {
    match variant {
        Variant::Main => plan(spec).map(Some),
        Variant::Sm80Path => {
            let (p, differs) = sm80_path_and_main(spec)?;
            Ok(differs.then_some(p))
        }
        Variant::ShortKeys => Ok(short_keys_tiles_why(spec).map(|(tiles, why)| {
            let range = Variant::ShortKeys.keys(spec).map_or(SHORT_KEYS_MAX, |r| *r.end());
            keyed_variant_plan(spec, tiles, "short keys", &format!("at most {range}"), why)
        })),
        Variant::MidKeys => Ok(mid_keys_tiles_why(spec).map(|(tiles, why)| {
            let range = Variant::MidKeys
                .keys(spec)
                .map_or_else(String::new, |r| format!("{}..={}", r.start(), r.end()));
            keyed_variant_plan(spec, tiles, "mid-length keys", &range, why)
        })),
    }
}

/// The plan of a variant chosen per call by the keys' length (`keys` in
/// `range`), its first reason saying so against the main plan's tiles.
fn keyed_variant_plan(spec: &AttnSpec, tiles: Sm90aFwdTiles, keys: &str, range: &str, why: &str) -> KernelPlan {
    let main = default_sm90a_tiles(spec);
    let mut p = plan_fwd_sm90a_with(spec, tiles);
    p.reasons.insert(
        0,
        format!(
            "variant for {keys} ({range}, chosen per call): {} consumer warpgroup{} at block_n {}{} instead of the \
             main plan's {} at {} ({why})",
            tiles.consumers,
            if tiles.consumers == 1 { "" } else { "s" },
            tiles.block_n,
            if tiles.blocks_per_sm > 1 {
                format!(", {} blocks per SM,", tiles.blocks_per_sm)
            } else {
                String::new()
            },
            main.consumers,
            main.block_n
        ),
    );
    p
}

/// The plan a call of `variant` runs: the variant's, else (a spec without
/// that variant) the main plan.
pub fn plan_or_main(spec: &AttnSpec, variant: Variant) -> Result<KernelPlan, PlanError> {
    match variant {
        // Where the planner takes the sm80 path itself, its plan is the main one.
        Variant::Sm80Path => plan_sm80_path(spec),
        _ => match plan_variant(spec, variant)? {
            Some(p) => Ok(p),
            None => plan(spec),
        },
    }
}

/// Phases of a causal one-tile grid (`common/order.cuh`): a head's `tiles`
/// work tiles (the forward's query blocks, the backward's key blocks) over a
/// device that runs `slots` blocks at once. Head-major order starts the last
/// heads' long tiles at the end of the grid, where they run alone; in P
/// phases every head's longest P-th of tiles goes first. That pays where one
/// head's tiles are well under a round of the device (measured on the H200,
/// `gpu_bench --phases`, 2026-12-05: P = 4 against P = 1, forward d128
/// causal 2k +1.9%, 8k +3.8%, d256 2k +7.4%, 8k +8.2%, d64 8k +3.0%, 16k
/// +1.6%; backward +0.7..+5.0% at 2k and 8k) and costs 1.5..3% where a head
/// is about a round already (d128 and d256 at 16k), which runs longest first
/// by itself. So: one phase where 4 · tiles ≥ 3 · slots, else a quarter of the
/// tiles, between 1 and 4 (re-timed on an H100 in session 21: the best or
/// within 1.8% of the best P in every cell, docs/benchmarks/2026-12-05-s21-phases.md).
pub fn causal_tile_phases(tiles: u32, slots: u32) -> u32 {
    if 4 * u64::from(tiles) >= 3 * u64::from(slots) {
        1
    } else {
        (tiles / 4).clamp(1, 4)
    }
}

/// Most phases a launch takes ([`causal_tile_phases`] or a forced value).
pub const MAX_TILE_PHASES: u32 = 8;

/// The (pair, tile) of block `lin` of a one-tile grid of `pairs` × `tiles`
/// blocks in `phases` phases: the host mirror of `phase_tile` in
/// `templates/common/order.cuh` (phase k holds tiles [k·tiles/P,
/// (k+1)·tiles/P) of every pair, pair-major inside the phase).
pub fn phase_tile(lin: u64, pairs: u64, tiles: u32, phases: u32) -> (u64, u32) {
    let t = u64::from(tiles);
    if phases <= 1 {
        return (lin / t, (lin % t) as u32);
    }
    let (mut lin, mut lo) = (lin, 0u64);
    for k in 1..u64::from(phases) {
        let hi = k * t / u64::from(phases);
        let blocks = pairs * (hi - lo);
        if lin < blocks {
            return (lin / (hi - lo), (lo + lin % (hi - lo)) as u32);
        }
        lin -= blocks;
        lo = hi;
    }
    (lin / (t - lo), (lo + lin % (t - lo)) as u32)
}

/// Most sequences of a ragged batch whose one-tile grid takes the sequences
/// longest keys first ([`ragged_order`]); larger batches keep tile_at's order.
pub const RAGGED_ORDER_MAX_BATCH: usize = 64;

/// The tile (tile_at's number, `(b · heads_q + h) · m + qb`) that block `lin`
/// of a ragged one-tile grid of `lens_q.len()` × `heads_q` × `m` blocks takes
/// with the sequences longest keys first: the host mirror of `ragged_order`
/// in `templates/common/order.cuh`, in its steps (for each sequence the tiles
/// of the sequences ahead of it, then the sequence whose tiles hold `lin`).
/// Sequences go by key length, longest first, ties by batch index; within
/// one, head-major, each head's real query blocks (`min(ceil(sq / block_m),
/// m)` of them) the last first. `None` (the kernel's -1): a block past the
/// last real tile. The kernel takes this order for batches up to
/// [`RAGGED_ORDER_MAX_BATCH`] sequences.
pub fn ragged_order(lens_q: &[u32], lens_k: &[u32], heads_q: u32, m: u32, block_m: u32, lin: u64) -> Option<u64> {
    let nqb: Vec<u64> = lens_q
        .iter()
        .map(|&sq| u64::from(sq.div_ceil(block_m).min(m)))
        .collect();
    let tiles = |b: usize| nqb[b] * u64::from(heads_q);
    for b in 0..lens_q.len() {
        // Sequence j goes ahead of b when its keys are longer, or as long with j < b.
        let ahead: u64 = (0..lens_q.len())
            .filter(|&j| lens_k[j] > lens_k[b] || (lens_k[j] == lens_k[b] && j < b))
            .map(tiles)
            .sum();
        if lin >= ahead && lin < ahead + tiles(b) {
            let r = lin - ahead;
            let (h, ql) = (r / nqb[b], r % nqb[b]);
            return Some((b as u64 * u64::from(heads_q) + h) * u64::from(m) + (u64::from(m) - nqb[b] + ql));
        }
    }
    None
}

/// Longest keys for which the sm90a forward walks its tiles at any head dim
/// (twice as long for some plans: [`sm90a_walk_pays`]).
pub const SM90A_WALK_MAX_KEYS: u32 = 1024;

/// Keys up to which a masked sm90a forward past d128 takes one tile per block
/// ([`sm90a_walk_pays`]).
pub const SM90A_ONE_TILE_MASKED_MAX_KEYS: u32 = 512;

/// The free choices of the Hopper forward: keys per step, K/V ring depth,
/// and the consumers' schedule (see [`KernelPlan::consumer_pipelined`] and
/// [`KernelPlan::pingpong`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sm90aFwdTiles {
    pub block_n: u32,
    pub stages: u32,
    pub pipelined: bool,
    pub pingpong: bool,
    /// Also compile the persistent walk entry ([`GridRule::TilesOrWalk`]),
    /// which the launcher takes for short keys; else one tile per block only.
    pub persistent: bool,
    /// Consumer warpgroups (1 to 3), 64 query rows each: block_m = 64 x
    /// consumers. Three take turns round-robin and get 160 registers each;
    /// one has no ping-pong.
    pub consumers: u32,
    /// Blocks per SM (1 to 3): `__launch_bounds__`' minimum, the registers
    /// and shared memory of one block are the SM's divided by it.
    pub blocks_per_sm: u32,
    /// Head-major tile order (see [`KernelPlan::head_major`]).
    pub head_major: bool,
    /// K/V multicast across a cluster of two blocks (see
    /// [`KernelPlan::cluster_m`]): dense, no mask, at least two 64-column
    /// chunks of K and of V (d > 64); ignored elsewhere. Off by default
    /// (measured slower, docs/kernels.md).
    pub cluster: bool,
    /// Row sums on the tensor cores (see [`KernelPlan::rowsum_mma`]); off
    /// at block_n > [`SM90A_ROWSUM_MMA_MAX_BN`].
    pub rowsum_mma: bool,
    /// Causal query blocks aligned to the sequence's end (see
    /// [`KernelPlan::tail_first`]); ignored without a causal mask.
    pub tail_first: bool,
    /// O written through shared memory by TMA (see
    /// [`KernelPlan::tma_store_o`]); ignored on ragged layouts and where the
    /// staging does not fit.
    pub tma_store_o: bool,
    /// Q in registers, S by register-sourced wgmma (see
    /// [`KernelPlan::q_regs`]); ignored past d 128 and where the registers
    /// do not fit ([`sm90a_q_regs_need`]).
    pub q_regs: bool,
}

/// The widest Q (padded head dim) that [`KernelPlan::q_regs`] takes into
/// registers (4 registers a thread per 16 columns).
pub const SM90A_Q_REGS_MAX_D: u32 = 128;

/// Registers a consumer thread of the sm90a forward needs with Q in
/// registers ([`KernelPlan::q_regs`]): S (block_n / 2 f32), P (block_n / 4),
/// O (dv / 2), Q (dqk / 4) and 32 for the loop's addresses, indices and
/// softmax state. Calibrated on ptxas (NVRTC 13.0, session 45): two consumers
/// (240 registers) compile spill-free at d128 block_n 128 (224) and 144
/// (236) and spill at 160 (248); three (160) spill 480-960 B at d64 block_n
/// 128 (176) and d128 block_n 80 (188); one at three blocks per SM (136)
/// fits d64 block_n 64 (128).
pub const fn sm90a_q_regs_need(block_n: u32, dqk: u32, dv: u32) -> u32 {
    block_n / 2 + block_n / 4 + dv / 2 + dqk / 4 + 32
}

/// The shared memory of the sm90a forward's O staging
/// ([`KernelPlan::tma_store_o`]): per consumer warpgroup 64 rows of the
/// 64-column (128-byte) chunks of `dv` padded columns (the template's
/// `O_STAGE_BYTES`).
pub const fn sm90a_o_stage_bytes(consumers: u32, dv: u32) -> u32 {
    consumers * 64 * 128 * dv.div_ceil(64)
}

/// The widest key tile at which the sm90a forward takes its row sums from
/// the tensor cores ([`KernelPlan::rowsum_mma`]).
pub const SM90A_ROWSUM_MMA_MAX_BN: u32 = 176;
/// Shared memory of the ones block of [`KernelPlan::rowsum_mma`]: one
/// 128-byte-swizzle atom (8 rows of 128 bytes).
pub const SM90A_ONES_BYTES: u32 = 1024;

/// Rounds of the sm90a forward's walk over a ragged (THD) batch whose tiles
/// it takes in [`ragged_order`] (sequences longest keys first): each block
/// keeps its round's tile numbers in shared memory, one `int` a round,
/// computed before the role split (the producer's single thread cannot run
/// the warp-collective mapping itself). A walk with more rounds (more than
/// this many tiles per block) keeps tile_at's order. The template's
/// `WALK_ORDER_ROUNDS`.
pub const SM90A_WALK_ORDER_ROUNDS: u32 = 64;

/// Whether the sm90a forward's walk over a ragged batch of `batch` sequences
/// and `tiles` work tiles (batch x heads x query blocks of the longest) on
/// `grid` blocks takes the sequences longest keys first (the template's
/// `walk_order`): with `ragged_order` on, on a head-major plan, for at most
/// [`RAGGED_ORDER_MAX_BATCH`] sequences, in at most
/// [`SM90A_WALK_ORDER_ROUNDS`] rounds. Otherwise it walks in tile_at's order
/// (batch order, each sequence's empty blocks among the real ones), which
/// measured 7..31% under the ordered walk (session 46), so the launcher's rule
/// takes the one-tile entry there.
pub fn sm90a_ragged_walk_ordered(head_major: bool, ragged_order: bool, batch: u32, tiles: u64, grid: u64) -> bool {
    head_major
        && ragged_order
        && batch as usize <= RAGGED_ORDER_MAX_BATCH
        && grid > 0
        && tiles.div_ceil(grid) <= u64::from(SM90A_WALK_ORDER_ROUNDS)
}

/// Shared memory of the ragged walk's tile table ([`SM90A_WALK_ORDER_ROUNDS`]);
/// dense plans have none.
pub const fn sm90a_walk_order_bytes(layout: Layout) -> u32 {
    match layout {
        Layout::Thd => 4 * SM90A_WALK_ORDER_ROUNDS,
        Layout::Dense => 0,
    }
}

/// The widest key tile at which the sm90a forward's softmax runs under the
/// previous P V ([`KernelPlan::softmax_under_pv`]).
pub const SM90A_SOFTMAX_UNDER_PV_MAX_BN: u32 = 160;

/// The planner's choice of [`Sm90aFwdTiles`] for a spec (before the
/// shared-memory fit of [`plan_fwd_sm90a_with`]).
pub fn default_sm90a_tiles(spec: &AttnSpec) -> Sm90aFwdTiles {
    let dmax = round_up(spec.head_dim_qk.max(spec.head_dim_v) as u32, 16);
    // H200, 2026-12-02 (docs/kernels.md, `gpu_bench --tune90`): pipelined
    // ping-pong consumers with separate K and V slots beat one tile at a time
    // at every head dim (d64 +15%, d128 +8%, d192 +6..14%, d256 +10..17%
    // with block_n 80); the widest block_n whose S, P and O fit the registers.
    //
    // H200, 2026-12-03 (`gpu_bench --tune90`, docs/benchmarks/2026-12-03-s5-tune90.md):
    // head-major tile order won or tied at every head dim and length (d128 2k
    // 486 -> 595, d256 2k 552 -> 642, d128 8k 620 -> 666 TFLOP/s; the blocks in
    // flight share one head's K and V in L2), and three consumer warpgroups at
    // d <= 64 (block_n 128) +16..24% from 2k on (d64 8k 420 -> 521); not with
    // softcap, whose tanh terms do not fit the 160 registers (16..84 B spills).
    //
    // H200, 2026-12-04 (`gpu_bench --tune90`, three runs, and a same-run
    // bench, docs/benchmarks/2026-12-04-s9-tune90.md): once the consumer
    // index is warp-uniform (no R2UR in the main loop in either form), the
    // persistent walk wins where tiles are short (seqlen 512: +5..13%) but
    // loses 3..10% at 8k/16k, and the persistent cubin given one block per
    // tile measured 10..15% under the one-tile cubin (d128 8k without a
    // mask: 614 vs 719 TFLOP/s, the same process, session 10). So every
    // kernel has both entries (one cubin, two functions from one body) and
    // the launcher picks per call ([`sm90a_walk_pays`]). block_n 176 at
    // d128 without a mask: +1..7% from 2k on in three runs (S 88 + P 44 +
    // O 64 registers; until session 41, below); not with softcap, whose walk
    // entry spilled there (ragged d128: 4/20 B).
    let (block_n, stages, consumers) = if dmax <= 64 && spec.softcap {
        (192, 3, SM90A_CONSUMERS)
    } else if dmax <= 64 {
        (128, 3, 3)
    } else if dmax <= 128 && spec.mask == Mask::None && !spec.softcap {
        // H100, 2026-12-07 (session 41, tune90, 5 interleaved rounds,
        // docs/benchmarks/2026-12-07-s41-gpu.md): after v21's one-add
        // descriptors (most gain where a tile has the most HGMMAs per score),
        // three consumers at block_n 80 with three stages lead block_n 176:
        // 8k 660.5 vs 618.1, 16k 667.8 vs 651.0 (one tile per block), 2k
        // 624.0 vs the old mid-keys tiles' 611.7 (two stages, walk). Session
        // 24 had them behind (657-668 vs 684 at 8k). Same-process A/B against
        // block_n 176: 8k +9.5% / +5.6%, 16k +4.5% / +5.1% (two calls), and
        // the bench's ragged batch +8.2% (627.6 vs 580.1), where a 192-row
        // block pads more rows per sequence.
        (80, 3, 3)
    } else if dmax <= 128
        && spec.layout == Layout::Dense
        && matches!(spec.mask, Mask::CausalTopLeft | Mask::CausalBottomRight)
        && !spec.softcap
    {
        // H100, 2026-12-05 (session 24, tune90, 5 interleaved rounds,
        // docs/benchmarks/2026-12-05-s24-gpu.md): three consumers at block_n
        // 80 (S 40 + P 20 + O 64 of 160 registers) against two at 128, d128
        // causal: 8k 648 vs 599 (+8%), 16k 663 vs 638, 2k 491 (walk) vs 472
        // (one tile); 512 loses 13%, which [`Variant::ShortKeys`] takes.
        // Without a mask no gain (8k 657-668 vs 684 at 176). Same-process
        // A/B on an H200 (`--ab`): 2k +4.3%, 8k +5.1%, 16k +3.1%, but the
        // bench's ragged batch -1.4% (more padded rows per sequence at
        // block_m 192), so dense only. Session 41 (H100, after v21): two
        // stages led three in tune90 (8k 657.0 vs 625.7) but not in the
        // same-process A/B (2k -2.6%, 8k -0.4%, 16k -0.1%).
        (80, 3, 3)
    } else if dmax <= 128 {
        (128, 2, SM90A_CONSUMERS)
    } else if dmax <= 192 {
        (96, 2, SM90A_CONSUMERS)
    } else {
        (80, 2, SM90A_CONSUMERS)
    };
    Sm90aFwdTiles {
        block_n,
        stages,
        pipelined: true,
        pingpong: true,
        persistent: true,
        consumers,
        blocks_per_sm: 1,
        head_major: true,
        // Measured on the H200 (session 11, same process, pairs against the
        // same entry with every block alone): -2..-6% at d128/d256 2k and 8k
        // without a mask, so an option only.
        cluster: false,
        // Session 22: the softmax phase is issue-bound (session 17: trading
        // MUFU for FMA lost; dropping the row max won 4-7%); the row sum's
        // FADDs move to the tensor cores (~3% more tensor work at d128).
        // Off: correct on the GPU, but `--ab` measured -3.6..-10.4% at d128
        // without a mask and at d256 (docs/benchmarks/2026-12-05-s22-ab.md).
        rowsum_mma: false,
        // Session 22: where seqlen is not a multiple of block_m (d <= 64's
        // three consumers, block_m 192, at every standard length; ragged
        // batches) the partial query block is the longest under a causal
        // mask and its rows past the end run every key tile for nothing:
        // at seqlen 512 27 warpgroup-tiles for 20 useful, aligned to the end 24.
        // Off: correct on the GPU, but tune90 measured d64 2k causal -3.2%
        // (walk) / -9.3% (one tile) (docs/benchmarks/2026-12-05-s23-gpu.md).
        tail_first: false,
        // Session 24: O through shared memory by TMA stores (the trace puts
        // the epilogue at 16-27% of a walk tile at seqlen 512). Correct on
        // the GPU; timed in session 29 at -2.0..+1.0% at 512 and -6.5..+1.4%
        // at 2k (docs/benchmarks/2026-12-06-s29-gpu.md): off.
        tma_store_o: false,
        // Session 45: Q in registers (S by register-sourced wgmma), an
        // option until timed.
        q_regs: false,
    }
}

/// The Hopper forward plan: wgmma/TMA for every head dim of the family.
/// Keys per step and ring depth follow the head dims: the consumers hold
/// S (block_n/2 f32 registers per thread) and O (d_v/2) at once, within
/// the 240 registers that `setmaxnreg` gives them, and the ring has to fit
/// the 227 KB of shared memory.
pub fn plan_fwd_sm90a(spec: &AttnSpec) -> KernelPlan {
    plan_fwd_sm90a_with(spec, default_sm90a_tiles(spec))
}

/// [`plan_fwd_sm90a`] with explicit tiles (tuning); `block_n` and `stages`
/// shrink until the shared memory fits, ping-pong needs the pipelined loop.
pub fn plan_fwd_sm90a_with(spec: &AttnSpec, tiles: Sm90aFwdTiles) -> KernelPlan {
    let mut reasons = Vec::new();
    let dqk = round_up(spec.head_dim_qk as u32, 16);
    let dv = round_up(spec.head_dim_v as u32, 16);
    let (qk_chunks, v_chunks) = (dqk.div_ceil(64), dv.div_ceil(64));
    let dmax = dqk.max(dv);
    if dqk != spec.head_dim_qk as u32 || dv != spec.head_dim_v as u32 {
        reasons.push(format!(
            "head dims {}/{} padded to {dqk}/{dv} (wgmma k-step 16; TMA zero-fills the columns past the head dim)",
            spec.head_dim_qk, spec.head_dim_v
        ));
    }
    let Sm90aFwdTiles {
        mut block_n,
        mut stages,
        pipelined: consumer_pipelined,
        pingpong,
        persistent,
        consumers,
        blocks_per_sm,
        head_major,
        cluster,
        rowsum_mma,
        tail_first,
        tma_store_o: _,
        q_regs: _,
    } = tiles;
    // Pairs must see the same key tiles (no mask, dense) and split each K/V
    // tile by 64-column chunks (two or more of each).
    let cluster_m =
        if cluster && spec.mask == Mask::None && spec.layout == Layout::Dense && qk_chunks >= 2 && v_chunks >= 2 {
            2
        } else {
            1
        };
    let consumers = consumers.clamp(1, 3);
    let blocks_per_sm = blocks_per_sm.clamp(1, 3);
    let block_m = 64 * consumers;
    let consumer_regs = sm90a_consumer_regs(consumers, blocks_per_sm);
    let pingpong = pingpong && consumer_pipelined && consumers > 1;
    // Several blocks per SM share its shared memory (1 KB of it reserved
    // per block).
    let limit = if blocks_per_sm == 1 {
        spec.arch.max_smem_per_block()
    } else {
        (spec.arch.max_smem_per_block() + 1024) / blocks_per_sm - 1024
    };
    let ones = |block_n: u32| {
        if rowsum_mma && block_n <= SM90A_ROWSUM_MMA_MAX_BN {
            SM90A_ONES_BYTES
        } else {
            0
        }
    };
    let order_bytes = sm90a_walk_order_bytes(spec.layout);
    while fwd_sm90a_smem(block_m, block_n, stages, qk_chunks, v_chunks) + ones(block_n) + order_bytes > limit {
        if stages > 2 {
            stages -= 1;
        } else {
            block_n -= 16;
        }
    }
    let rowsum_mma = ones(block_n) > 0;
    let mut smem_bytes = fwd_sm90a_smem(block_m, block_n, stages, qk_chunks, v_chunks) + ones(block_n) + order_bytes;
    // O's staging for the TMA stores: 64 rows of 128-byte chunks per
    // consumer warpgroup; dense only (in a ragged batch a box would cross
    // into the next sequence's rows), and only beside the ring as planned.
    let o_stage = sm90a_o_stage_bytes(consumers, dv);
    let tma_store_o = tiles.tma_store_o && spec.layout == Layout::Dense && smem_bytes + o_stage <= limit;
    if tma_store_o {
        smem_bytes += o_stage;
    }
    let q_regs_need = sm90a_q_regs_need(block_n, dqk, dv);
    let q_regs = tiles.q_regs && dqk <= SM90A_Q_REGS_MAX_D && q_regs_need <= consumer_regs;
    reasons.push(format!(
        "sm90a: wgmma + TMA, 1 producer warpgroup ({SM90A_PRODUCER_REGS} regs) + {consumers} consumer warpgroup{} \
         ({consumer_regs} regs) of 64 query rows -> block_m={block_m}",
        if consumers == 1 { "" } else { "s" }
    ));
    if blocks_per_sm > 1 {
        reasons.push(format!(
            "{blocks_per_sm} blocks per SM: each launched with {} registers per thread (the SM's 64K divided among \
             them) and at most {limit} B of shared memory",
            sm90a_launch_regs(consumers, blocks_per_sm)
        ));
    }
    reasons.push(format!(
        "d={dmax}: block_n={block_n} (S {} + O {} f32 regs/thread), {stages}-stage K/V ring: {smem_bytes} B shared memory (limit {limit} B)",
        block_n / 2,
        dv / 2
    ));
    reasons.push(match (consumer_pipelined, pingpong) {
        (true, true) => {
            "consumers pipelined by one tile and in ping-pong: each warpgroup issues S(next) and P V(this) \
                         while the other does its softmax"
                .into()
        }
        (true, false) if consumers == 1 => {
            "one consumer warpgroup, pipelined by one tile (next S issued before this \
                                            P V), no ping-pong: the SM's other blocks run their GEMMs under its softmax"
                .into()
        }
        (true, false) => "consumers pipelined by one tile (next S issued before this P V): measured +9% at d64".into(),
        _ => "consumers one tile at a time: pipelining measured -11..-18% at d128/d256".into(),
    });
    // H200, 2026-12-04 (session 13, `gpu_bench --ab`, docs/benchmarks/2026-12-04-s13-ab.md):
    // the softmax under the previous P V gained +0.3..+4.0% at block_n 128,
    // 80 and the d64 consumers' 128, the lazy max +0.2..+3.2% more; at d128's
    // block_n 176 the first lost 1.4%, the second 0.8% on top of it and 4.2%
    // without it.
    let softmax_under_pv = consumer_pipelined && block_n <= SM90A_SOFTMAX_UNDER_PV_MAX_BN;
    if softmax_under_pv {
        reasons.push(
            "the softmax of the next tile runs under this tile's P V (V's wait placed between them, so that ptxas \
             keeps the P V wait after the softmax); lazy reference max, O rescaled only when a row of the warp \
             raised it (a tile max more than 8 above it, log2 domain)"
                .into(),
        );
    } else if consumer_pipelined {
        reasons.push(format!(
            "block_n {block_n} > {SM90A_SOFTMAX_UNDER_PV_MAX_BN}: the P V wait before the softmax (ptxas's order) \
             and O rescaled every tile (the softmax under P V and the lazy max measured -1..-4% at block_n 176)"
        ));
    }
    let tail_first = tail_first && matches!(spec.mask, Mask::CausalTopLeft | Mask::CausalBottomRight);
    if tail_first {
        reasons.push(
            "causal: query blocks aligned to the sequence's end, the partial block first and shortest (its rows \
             before the start are masked like any other and never stored)"
                .into(),
        );
    }
    if rowsum_mma {
        reasons.push(
            "row sums on the tensor cores: one wgmma m64n8k16 per P V k-step, P times a 16 x 8 block of ones \
             (1 KB of shared memory), in place of a FADD per probability"
                .into(),
        );
    } else if tiles.rowsum_mma {
        reasons.push(format!(
            "block_n {block_n} > {SM90A_ROWSUM_MMA_MAX_BN}: row sums by FADD in the softmax (the tensor-core \
             sums' 4 accumulators spilled at block_n 192)"
        ));
    }
    if tma_store_o {
        reasons.push(format!(
            "O through shared memory: each consumer warpgroup stages its 64 rows and one thread stores them by TMA \
             (O's tensor map), the warpgroup going on to the next tile while they run ({o_stage} B of shared memory)"
        ));
    } else if tiles.tma_store_o {
        reasons.push(if spec.layout == Layout::Dense {
            format!("O by 16-byte stores from registers: the TMA stores' staging ({o_stage} B) does not fit beside the ring")
        } else {
            "O by 16-byte stores from registers: a TMA box would cross into the next sequence's rows".to_string()
        });
    }
    if q_regs {
        reasons.push(format!(
            "Q in registers: each consumer warpgroup copies its rows' A fragments ({} registers a thread) and frees \
             the Q buffer at once; S by register-sourced wgmma, only K read from shared memory",
            dqk / 4
        ));
    } else if tiles.q_regs && dqk > SM90A_Q_REGS_MAX_D {
        reasons.push(format!(
            "Q from shared memory: Q in registers is planned up to d {SM90A_Q_REGS_MAX_D} (d {dqk} would take {} \
             registers a thread)",
            dqk / 4
        ));
    } else if tiles.q_regs {
        reasons.push(format!(
            "Q from shared memory: with Q in registers a consumer thread would need about {q_regs_need} registers \
             (S, P, O, Q and the loop's) of its {consumer_regs}"
        ));
    }
    reasons.push(if persistent {
        format!(
            "two entries: one block per work tile, and a persistent walk that the launcher takes {}: the \
             resident blocks walk the tiles in a snake over rounds of the grid, loading the next tile's Q \
             under {}",
            if spec.layout == Layout::Thd && spec.mask == Mask::None && dmax > 128 {
                format!(
                    "for keys of any length (a ragged batch past d128 without a mask, where the walk takes its \
                     sequences longest keys first: at most {RAGGED_ORDER_MAX_BATCH} sequences, at most \
                     {SM90A_WALK_ORDER_ROUNDS} tiles per block; measured +1.8..20.9% over one tile per block)"
                )
            } else if spec.layout == Layout::Thd && dmax > 128 {
                "only where a caller asks for it (`set_persistent_grid`; a ragged batch past d128 under a mask takes \
                 one tile per block at every length: the walk measured 11..21% behind it, on the short-keys tiles \
                 too)"
                    .to_string()
            } else if spec.mask != Mask::None && dmax > 128 {
                format!(
                    "for keys up to {} from {} (under a mask past d128 one tile per block up to \
                     {SM90A_ONE_TILE_MASKED_MAX_KEYS}: measured +15% at d256 causal, seqlen 512)",
                    if sm90a_walks_to_2k(spec, dmax, consumers, block_n) {
                        2 * SM90A_WALK_MAX_KEYS
                    } else {
                        SM90A_WALK_MAX_KEYS
                    },
                    SM90A_ONE_TILE_MASKED_MAX_KEYS + 1
                )
            } else if sm90a_walks_to_2k(spec, dmax, consumers, block_n) {
                format!(
                    "for keys up to {} (three consumers up to d128, under a mask at d <= 64, dense without one \
                     past d128, or at block_n 64)",
                    2 * SM90A_WALK_MAX_KEYS
                )
            } else {
                format!("for keys up to {SM90A_WALK_MAX_KEYS}")
            },
            if q_regs {
                "this tile's key loop (Q in registers)"
            } else {
                "this tile's last P V and epilogue"
            }
        ) + &if spec.layout == Layout::Thd && dmax <= 128 {
            // (the cases past d128 above say it already, or never walk)
            format!(
                "; a ragged batch walks only where the walk takes its sequences longest keys first (at most \
                 {RAGGED_ORDER_MAX_BATCH} sequences, at most {SM90A_WALK_ORDER_ROUNDS} tiles per block)"
            )
        } else {
            String::new()
        }
    } else {
        "one block per work tile".into()
    });
    reasons.push(if head_major {
        "head-major tile order: one (batch, head) at a time, its K and V shared in L2 (measured +0..22% over \
         query-block-major on the H200)"
            .into()
    } else {
        "query-block-major tile order: every head of the last query block first (longest causal tiles first)".into()
    });
    if cluster_m == 2 {
        reasons.push(
            "one tile per block as clusters of 2 where a head's query blocks pair up: each block loads half of every \
             K/V tile and multicasts it to both (TMA multicast), halving the L2 reads per FLOP"
                .into(),
        );
    }
    KernelPlan {
        spec: *spec,
        template: Template::FwdSm90a,
        entry: entry_name(spec),
        block_m,
        block_n,
        num_warps: 4 * (consumers + 1),
        m_tiles_per_warp: 1,
        stages,
        head_dim_qk_padded: dqk,
        head_dim_v_padded: dv,
        // Rows of the swizzled chunks: 64 elements (128 bytes).
        smem_pitch_qk: 64,
        smem_pitch_v: 64,
        smem_bytes,
        min_blocks_per_sm: blocks_per_sm,
        compile_options: Vec::new(),
        grid: if persistent {
            GridRule::TilesOrWalk
        } else {
            GridRule::BatchHeadsByQueryTiles
        },
        reasons,
        consumer_pipelined,
        pingpong,
        softmax_under_pv,
        rowsum_mma,
        tail_first,
        tma_store_o,
        q_regs,
        smem_swizzle: false,
        head_major,
        cluster_m,
        bwd: None,
    }
}

impl fmt::Display for KernelPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "spec        {}", self.spec)?;
        writeln!(f, "template    {}", self.template.file())?;
        writeln!(f, "entry       {}", self.entry)?;
        writeln!(
            f,
            "tile        block_m={} block_n={} warps={} ({} threads) m_tiles/warp={} stages={}",
            self.block_m,
            self.block_n,
            self.num_warps,
            self.threads(),
            self.m_tiles_per_warp,
            self.stages
        )?;
        writeln!(
            f,
            "head dims   qk={} (padded {}) v={} (padded {})",
            self.spec.head_dim_qk, self.head_dim_qk_padded, self.spec.head_dim_v, self.head_dim_v_padded
        )?;
        writeln!(f, "smem        {} B dynamic", self.smem_bytes)?;
        writeln!(f, "grid        {:?}", self.grid)?;
        writeln!(f, "options     {:?}", self.compile_options)?;
        writeln!(f, "why:")?;
        for r in &self.reasons {
            writeln!(f, "  - {r}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fwd_swizzle_where_spill_free() {
        let sw = |s: &str| plan(&s.parse().unwrap()).unwrap().smem_swizzle;
        for s in [
            "fwd.bf16.d64.none.dense.sm80",
            "fwd.f16.d64.causal-br.thd.sm86",
            "fwd.bf16.d256.causal-tl.dense.sm80",
            "fwd.bf16.d256.causal-br.thd.sm80",
            "fwd.bf16.d256.none.thd.sm80",
            "fwd.bf16.d128.none.dense.sm80",
        ] {
            assert!(sw(s), "{s}");
        }
        for s in [
            "fwd.bf16.d128.causal-tl.dense.sm80",
            "fwd.bf16.d128.window.dense.sm90a",
            "fwd.bf16.d96.none.dense.sm80",
            "fwd.bf16.d192.causal-br.dense.sm80",
            "fwd.bf16.d192v128.none.dense.sm80",
        ] {
            assert!(!sw(s), "{s}");
        }
        // The sm80 path of the benchmarked sm90a specs.
        let sm80 = |s: &str| plan_sm80_path(&s.parse().unwrap()).unwrap().smem_swizzle;
        for s in [
            "fwd.bf16.d256.none.dense.sm90a",
            "fwd.bf16.d64.causal-tl.dense.sm90a",
            "fwd.bf16.d128.none.dense.sm90a",
            "fwd.bf16.d128.causal-tl.dense.sm90a",
        ] {
            assert!(sm80(s), "{s}");
        }
        assert!(!sm80("fwd.bf16.d256.causal-br.thd.sm90a"));
        // Which tiles: all three, but K alone at d128 (the template's SW_Q/SW/SW_V).
        assert_eq!(fwd_swizzled_tiles(true, 64, 64), [true; 3]);
        assert_eq!(fwd_swizzled_tiles(true, 256, 256), [true; 3]);
        assert_eq!(fwd_swizzled_tiles(true, 128, 128), [false, true, false]);
        assert_eq!(fwd_swizzled_tiles(false, 64, 64), [false; 3]);
        // The padded figures stay the plan's (the tile choices do not move).
        let p = plan(&"fwd.bf16.d256.none.dense.sm80".parse().unwrap()).unwrap();
        assert_eq!(p.smem_pitch_qk, 264);
    }
    #[test]
    fn the_sm80_forward_runs_head_major_only_without_a_mask_on_dense_tensors() {
        use crate::spec::DType;
        for arch in [Arch::Sm80, Arch::Sm90a] {
            for d in [32u16, 64, 96, 128, 192, 256] {
                for mask in Mask::ALL.iter().copied() {
                    for layout in [Layout::Dense, Layout::Thd] {
                        let spec = AttnSpec::fwd(DType::Bf16, d, mask, layout, arch);
                        let want = layout == Layout::Dense && mask == Mask::None;
                        let p = plan_fwd_sm80(&spec);
                        assert_eq!(p.head_major, want, "{spec}");
                        assert_eq!(
                            p.reasons.iter().any(|r| r.starts_with("head-major block order")),
                            want,
                            "{spec}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_tune_candidates_start_with_the_planners_dense_shape() {
        use crate::spec::DType;
        for d in [32u16, 64, 96, 128, 160, 256] {
            for mask in [Mask::None, Mask::CausalTopLeft] {
                for arch in [Arch::Sm80, Arch::Sm90a] {
                    let spec = AttnSpec::fwd(DType::Bf16, d, mask, Layout::Dense, arch);
                    let c = fwd_tile_candidates(&spec);
                    assert_eq!(c[0], default_fwd_tiles(&spec), "{spec}");
                    let mut shapes: Vec<_> = c
                        .iter()
                        .map(|t| (t.num_warps, t.m_tiles_per_warp, t.block_n, t.stages))
                        .collect();
                    shapes.sort_unstable();
                    shapes.dedup();
                    assert_eq!(shapes.len(), c.len(), "{spec}: no shape twice");
                }
            }
        }
    }

    #[test]
    fn q_regs_up_to_d128_where_the_registers_fit_and_rendered_as_register_sourced_s() {
        use crate::spec::DType;
        // (d, mask, layout, consumers, block_n, blocks per SM, taken)
        for (d, mask, layout, consumers, block_n, bps, taken) in [
            (64, Mask::CausalTopLeft, Layout::Dense, 1, 64, 3, true),
            (96, Mask::None, Layout::Thd, 2, 128, 1, true),
            (128, Mask::None, Layout::Dense, 2, 128, 1, true),
            (128, Mask::None, Layout::Dense, 2, 144, 1, true),
            (128, Mask::SlidingWindow, Layout::Thd, 2, 128, 1, true),
            // The registers: ptxas spilled these (session 45).
            (128, Mask::None, Layout::Dense, 2, 160, 1, false),
            (128, Mask::None, Layout::Dense, 3, 80, 1, false),
            (64, Mask::None, Layout::Dense, 3, 128, 1, false),
            // The head dim.
            (192, Mask::None, Layout::Dense, 2, 96, 1, false),
            (256, Mask::CausalBottomRight, Layout::Dense, 2, 80, 1, false),
        ] {
            let spec = AttnSpec::fwd(DType::Bf16, d, mask, layout, Arch::Sm90a);
            assert!(!default_sm90a_tiles(&spec).q_regs, "{spec}: off by default");
            let base = Sm90aFwdTiles {
                consumers,
                block_n,
                stages: 2,
                blocks_per_sm: bps,
                ..default_sm90a_tiles(&spec)
            };
            let off = plan_fwd_sm90a_with(&spec, base);
            let on = plan_fwd_sm90a_with(&spec, Sm90aFwdTiles { q_regs: true, ..base });
            assert!(!off.q_regs, "{spec}");
            assert_eq!(on.q_regs, taken, "{spec} c{consumers} bn{block_n}");
            // Registers only: the tiles and the shared memory stay.
            assert_eq!(
                (on.block_n, on.stages, on.smem_bytes),
                (off.block_n, off.stages, off.smem_bytes),
                "{spec}"
            );
            let why = if taken {
                "Q in registers: each consumer"
            } else if d > 128 {
                "Q in registers is planned up to d 128"
            } else {
                "with Q in registers a consumer thread would need about"
            };
            assert!(on.reasons.iter().any(|r| r.contains(why)), "{spec}: {:?}", on.reasons);
            let src = crate::render::render(&on).unwrap().source;
            assert!(src.contains(&format!("constexpr bool Q_REGS = {taken};")), "{spec}");
            // The plan's JSON (and so the cache key) carries the option.
            let json = serde_json::to_string(&on).unwrap();
            assert_eq!(json.contains("\"q_regs\":true"), taken, "{spec}");
        }
    }

    #[test]
    fn tma_store_o_only_dense_and_where_its_staging_fits_beside_the_ring() {
        use crate::spec::DType;
        for (d, mask, layout, fits) in [
            (64, Mask::CausalTopLeft, Layout::Dense, true),
            (64, Mask::None, Layout::Thd, false),
            (128, Mask::SlidingWindow, Layout::Dense, true),
            (128, Mask::CausalBottomRight, Layout::Thd, false),
            (128, Mask::CausalTopLeft, Layout::Dense, true),
            (128, Mask::None, Layout::Dense, true),
            (128, Mask::None, Layout::Thd, false),
            (256, Mask::CausalTopLeft, Layout::Dense, false),
        ] {
            let spec = AttnSpec::fwd(DType::Bf16, d, mask, layout, Arch::Sm90a);
            let base = default_sm90a_tiles(&spec);
            assert!(!base.tma_store_o, "{spec}: off by default");
            let off = plan_fwd_sm90a_with(&spec, base);
            let on = plan_fwd_sm90a_with(
                &spec,
                Sm90aFwdTiles {
                    tma_store_o: true,
                    ..base
                },
            );
            assert_eq!(on.tma_store_o, fits, "{spec}");
            // Never at the cost of the ring: the tiles stay the same.
            assert_eq!(
                (on.block_n, on.stages, on.block_m),
                (off.block_n, off.stages, off.block_m),
                "{spec}"
            );
            let stage = if fits {
                sm90a_o_stage_bytes(on.block_m / 64, on.head_dim_v_padded)
            } else {
                0
            };
            assert_eq!(on.smem_bytes, off.smem_bytes + stage, "{spec}");
            assert!(on.smem_bytes <= spec.arch.max_smem_per_block(), "{spec}");
            let src = crate::render::render(&on).unwrap().source;
            assert!(src.contains(&format!("constexpr bool O_TMA = {fits};")), "{spec}");
            // The fourth tensor map only with the option.
            assert_eq!(src.contains("TmaMap to)"), fits, "{spec}");
            assert!(
                on.reasons
                    .iter()
                    .any(|r| r.starts_with("O through shared memory") || r.starts_with("O by 16-byte stores")),
                "{spec}: {:?}",
                on.reasons
            );
        }
    }

    #[test]
    fn short_keys_variant_where_other_tiles_measured_faster_at_short_keys() {
        use crate::spec::DType;
        let fwd = |d, mask, arch| AttnSpec::fwd(DType::Bf16, d, mask, Layout::Dense, arch);
        let causal = [Mask::CausalTopLeft, Mask::CausalBottomRight];
        for mask in causal {
            for d in [64, 128] {
                let spec = fwd(d, mask, Arch::Sm90a);
                assert_eq!(default_sm90a_tiles(&spec).consumers, 3, "{spec}");
                assert_eq!(Variant::for_keys(&spec, 512), Variant::ShortKeys, "{spec}");
                if d == 64 {
                    // One consumer up to 768 keys, then two up to 1024 (the mid-keys variant).
                    assert_eq!(
                        Variant::ShortKeys.keys(&spec),
                        Some(0..=ONE_CONSUMER_KEYS_MAX),
                        "{spec}"
                    );
                    assert_eq!(Variant::for_keys(&spec, ONE_CONSUMER_KEYS_MAX), Variant::ShortKeys);
                    assert_eq!(Variant::for_keys(&spec, ONE_CONSUMER_KEYS_MAX + 1), Variant::MidKeys);
                    assert_eq!(Variant::for_keys(&spec, SHORT_KEYS_MAX), Variant::MidKeys, "{spec}");
                    let mid = plan_variant(&spec, Variant::MidKeys).unwrap().expect("a mid-keys plan");
                    assert_eq!(
                        (mid.block_m, mid.block_n, mid.stages, mid.min_blocks_per_sm),
                        (128, 128, 3, 1)
                    );
                    assert!(
                        mid.reasons[0].contains("(769..=1024, chosen per call)"),
                        "{:?}",
                        mid.reasons
                    );
                    assert_eq!(
                        variants(&spec).collect::<Vec<_>>(),
                        [Variant::Main, Variant::ShortKeys, Variant::MidKeys]
                    );
                } else {
                    assert_eq!(Variant::for_keys(&spec, SHORT_KEYS_MAX), Variant::ShortKeys, "{spec}");
                    assert_eq!(Variant::MidKeys.keys(&spec), None, "{spec}");
                }
                assert_eq!(Variant::for_keys(&spec, SHORT_KEYS_MAX + 1), Variant::Main, "{spec}");
                let short = plan_variant(&spec, Variant::ShortKeys)
                    .unwrap()
                    .expect("a short-keys plan");
                let main = plan_variant(&spec, Variant::Main).unwrap().unwrap();
                // d64: one consumer, three blocks per SM (session 38); d128: two consumers.
                let want = if d == 64 { (64, 64, 3) } else { (128, 128, 1) };
                assert_eq!((short.block_m, short.block_n, short.min_blocks_per_sm), want, "{spec}");
                assert!(!short.pingpong || d != 64, "{spec}: one consumer takes no turns");
                // Q in registers (session 45), which frees the one Q buffer at
                // each tile's start; the main plans (three consumers) keep Q in
                // shared memory, where its registers do not fit.
                assert!(short.q_regs, "{spec}");
                assert!(!main.q_regs, "{spec}");
                if d == 64 {
                    // The tiles gpu_fwd's multi-block job runs on every d64 case.
                    let tiles = Sm90aFwdTiles {
                        consumers: 1,
                        block_n: 64,
                        stages: 2,
                        blocks_per_sm: 3,
                        q_regs: true,
                        ..default_sm90a_tiles(&spec)
                    };
                    assert_eq!(short_keys_tiles(&spec), Some(tiles), "{spec}");
                }
                assert_eq!((main.block_m, main.min_blocks_per_sm), (192, 1), "{spec}");
                assert!(short.reasons[0].contains("short keys"), "{spec}: {:?}", short.reasons);
                // Same spec, same entry symbol and template: only the tiles differ.
                assert_eq!(
                    (short.spec, &short.entry, short.template),
                    (main.spec, &main.entry, main.template)
                );
                assert_ne!(short, main);
            }
        }
        // d256 causal: block_n 64; d128 without a mask: block_n 128 (both two consumers).
        for (d, mask, bn) in [(256, Mask::CausalTopLeft, 64), (128, Mask::None, 128)] {
            let spec = fwd(d, mask, Arch::Sm90a);
            let short = plan_variant(&spec, Variant::ShortKeys)
                .unwrap()
                .expect("a short-keys plan");
            let main = plan(&spec).unwrap();
            assert_eq!((short.block_m, short.block_n), (128, bn), "{spec}");
            assert_ne!(main.block_n, bn, "{spec}");
            assert!(!short.q_regs && !main.q_regs, "{spec}");
            assert_eq!(Variant::for_keys(&spec, 1000), Variant::ShortKeys, "{spec}");
            assert_eq!(Variant::for_keys(&spec, 4096), Variant::Main, "{spec}");
        }
        // Dense d64 without a mask: the main tiles with TMA stores of O (on
        // the walk, where every call up to 1024 keys goes).
        let d64 = fwd(64, Mask::None, Arch::Sm90a);
        let short = plan_variant(&d64, Variant::ShortKeys)
            .unwrap()
            .expect("a short-keys plan");
        let main = plan(&d64).unwrap();
        assert!(short.tma_store_o && !main.tma_store_o);
        assert_eq!(
            (short.block_m, short.block_n, short.stages),
            (main.block_m, main.block_n, main.stages)
        );
        assert!(sm90a_walk_pays(SHORT_KEYS_MAX, &d64, 64, 3, short.block_n));
        assert!(short_keys_tiles(&AttnSpec {
            layout: Layout::Thd,
            ..d64
        })
        .is_none());
        // No variant: d64 with a window (three consumers all the same), d128
        // causal ragged and windowed, d256 without a mask, softcap, the sm80
        // path, the backward.
        let softcap = AttnSpec {
            softcap: true,
            ..fwd(64, Mask::CausalTopLeft, Arch::Sm90a)
        };
        let bwd = AttnSpec {
            direction: Direction::Bwd,
            ..fwd(64, Mask::CausalTopLeft, Arch::Sm90a)
        };
        for spec in [
            fwd(64, Mask::SlidingWindow, Arch::Sm90a),
            fwd(128, Mask::SlidingWindow, Arch::Sm90a),
            fwd(256, Mask::None, Arch::Sm90a),
            fwd(64, Mask::CausalTopLeft, Arch::Sm80),
            softcap,
            bwd,
        ] {
            assert!(short_keys_tiles(&spec).is_none(), "{spec}");
            assert_eq!(Variant::for_keys(&spec, 128), Variant::Main, "{spec}");
            assert!(plan_variant(&spec, Variant::ShortKeys).unwrap().is_none(), "{spec}");
        }
        // Ragged causal specs with three consumers have it too (the keys'
        // maximum picks it); ragged d128 keeps two consumers, and no variant.
        let thd = |d| AttnSpec::fwd(DType::F16, d, Mask::CausalBottomRight, Layout::Thd, Arch::Sm90a);
        assert_eq!(Variant::for_keys(&thd(64), 700), Variant::ShortKeys);
        assert_eq!(Variant::for_keys(&thd(64), 1000), Variant::MidKeys);
        assert_eq!(Variant::for_keys(&thd(64), 1025), Variant::Main);
        assert_eq!(default_sm90a_tiles(&thd(128)).consumers, 2);
        assert_eq!(Variant::for_keys(&thd(128), 700), Variant::Main);
    }

    #[test]
    fn key_ranges_of_every_matrix_spec_are_disjoint_and_match_the_variants() {
        // Over the default coverage matrix: a range exists exactly where the
        // variant does, the short range starts at 0, the mid range starts
        // right after it (or after SHORT_KEYS_MAX where there is no short
        // one), and for_keys takes each variant inside its range only.
        for spec in crate::matrix::default_specs(&[Arch::Sm80, Arch::Sm90a]) {
            let (short, mid) = (Variant::ShortKeys.keys(&spec), Variant::MidKeys.keys(&spec));
            assert_eq!(short.is_some(), short_keys_tiles(&spec).is_some(), "{spec}");
            assert_eq!(mid.is_some(), mid_keys_tiles(&spec).is_some(), "{spec}");
            let short_end = short.as_ref().map(|r| {
                assert_eq!(*r.start(), 0, "{spec}");
                *r.end()
            });
            if let Some(m) = &mid {
                assert_eq!(*m.start(), short_end.unwrap_or(SHORT_KEYS_MAX) + 1, "{spec}");
                assert!(*m.end() <= MID_KEYS_MAX, "{spec}");
            }
            for k in [
                0,
                1,
                512,
                ONE_CONSUMER_KEYS_MAX,
                ONE_CONSUMER_KEYS_MAX + 1,
                SHORT_KEYS_MAX,
                SHORT_KEYS_MAX + 1,
                MID_KEYS_MAX,
                MID_KEYS_MAX + 1,
            ] {
                let want = if short.as_ref().is_some_and(|r| r.contains(&k)) {
                    Variant::ShortKeys
                } else if mid.as_ref().is_some_and(|r| r.contains(&k)) {
                    Variant::MidKeys
                } else {
                    Variant::Main
                };
                assert_eq!(Variant::for_keys(&spec, k), want, "{spec} at {k} keys");
            }
        }
    }

    #[test]
    fn dense_d128_without_a_mask_takes_three_consumers_and_no_mid_keys_variant() {
        use crate::spec::DType;
        for (dt, d_qk, d_v) in [(DType::Bf16, 128, 128), (DType::F16, 96, 96), (DType::Bf16, 80, 80)] {
            let spec = AttnSpec {
                head_dim_v: d_v,
                ..AttnSpec::fwd(dt, d_qk, Mask::None, Layout::Dense, Arch::Sm90a)
            };
            let main = plan(&spec).unwrap();
            assert_eq!((main.block_m, main.block_n, main.stages), (192, 80, 3), "{spec}");
            // Up to 1024 keys the short-keys plan (two consumers at block_n
            // 128), longer ones the main plan, on the walk up to 2k.
            assert_eq!(Variant::for_keys(&spec, SHORT_KEYS_MAX), Variant::ShortKeys, "{spec}");
            assert_eq!(Variant::for_keys(&spec, SHORT_KEYS_MAX + 1), Variant::Main, "{spec}");
            assert_eq!(Variant::ShortKeys.keys(&spec), Some(0..=SHORT_KEYS_MAX));
            assert_eq!(Variant::MidKeys.keys(&spec), None);
            let short = plan_variant(&spec, Variant::ShortKeys)
                .unwrap()
                .expect("a short-keys plan");
            assert_eq!((short.block_m, short.block_n), (128, 128), "{spec}");
            assert_eq!(variants(&spec).collect::<Vec<_>>(), [Variant::Main, Variant::ShortKeys]);
            let d = d_qk.max(d_v) as u32;
            assert!(
                sm90a_walk_pays(MID_KEYS_MAX, &spec, d, 3, 80) && !sm90a_walk_pays(MID_KEYS_MAX + 1, &spec, d, 3, 80)
            );
            // Ragged the same main plan, at every length (no short-keys
            // variant: session 48).
            let thd_spec = AttnSpec {
                layout: Layout::Thd,
                ..spec
            };
            let thd = plan(&thd_spec).unwrap();
            assert_eq!((thd.block_m, thd.block_n, thd.stages), (192, 80, 3), "{spec}");
            assert_eq!(Variant::for_keys(&thd_spec, 512), Variant::Main, "{thd_spec}");
            assert_eq!(variants(&thd_spec).collect::<Vec<_>>(), [Variant::Main], "{thd_spec}");
        }
        // No mid-keys variant elsewhere either (but d <= 64 causal): under a
        // mask, ragged, softcap, d64 and d256, sm80, backward.
        let d128 = AttnSpec::fwd(DType::Bf16, 128, Mask::None, Layout::Dense, Arch::Sm90a);
        for spec in [
            AttnSpec {
                mask: Mask::CausalTopLeft,
                ..d128
            },
            AttnSpec {
                mask: Mask::SlidingWindow,
                ..d128
            },
            AttnSpec {
                layout: Layout::Thd,
                ..d128
            },
            AttnSpec { softcap: true, ..d128 },
            AttnSpec {
                head_dim_qk: 64,
                head_dim_v: 64,
                ..d128
            },
            AttnSpec {
                head_dim_qk: 256,
                head_dim_v: 256,
                ..d128
            },
            AttnSpec {
                arch: Arch::Sm80,
                ..d128
            },
            AttnSpec {
                direction: Direction::Bwd,
                ..d128
            },
        ] {
            assert!(mid_keys_tiles(&spec).is_none(), "{spec}");
            assert!(plan_variant(&spec, Variant::MidKeys).unwrap().is_none(), "{spec}");
            assert_ne!(Variant::for_keys(&spec, 2048), Variant::MidKeys, "{spec}");
            assert!(!variants(&spec).any(|v| v == Variant::MidKeys), "{spec}");
        }
    }

    #[test]
    fn phase_tile_is_a_bijection_that_runs_long_tiles_first() {
        for pairs in [1u64, 2, 3, 7, 32] {
            for tiles in [1u32, 2, 3, 5, 16, 43, 64] {
                for phases in 1..=MAX_TILE_PHASES {
                    let n = pairs * u64::from(tiles);
                    let mut seen = vec![false; n as usize];
                    let mut last_phase = 0;
                    for lin in 0..n {
                        let (bh, tile) = phase_tile(lin, pairs, tiles, phases);
                        assert!(bh < pairs && tile < tiles, "{pairs} {tiles} {phases} {lin}");
                        let idx = (bh * u64::from(tiles) + u64::from(tile)) as usize;
                        assert!(!seen[idx], "tile twice: {pairs} {tiles} {phases} {lin}");
                        seen[idx] = true;
                        // The phase of a tile never decreases along the grid.
                        let phase = (0..phases)
                            .find(|&k| u64::from(tile) < u64::from(k + 1) * u64::from(tiles) / u64::from(phases))
                            .unwrap_or(phases);
                        assert!(phase >= last_phase, "{pairs} {tiles} {phases} {lin}");
                        last_phase = phase;
                    }
                    assert!(seen.iter().all(|&s| s));
                }
            }
        }
        // One phase is the plain head-major order.
        assert_eq!(phase_tile(17, 4, 8, 1), (2, 1));
        // Two phases over 2 pairs x 4 tiles: 0 1 | 0 1 | 2 3 | 2 3.
        let order: Vec<_> = (0..8).map(|l| phase_tile(l, 2, 4, 2)).collect();
        assert_eq!(order, [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (1, 2), (1, 3)]);
    }

    #[test]
    fn ragged_order_takes_every_real_tile_once_longest_keys_first() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(22);
        for trial in 0..400 {
            let batch = match trial % 4 {
                0 => rng.gen_range(1..=4),
                1 => rng.gen_range(1..=RAGGED_ORDER_MAX_BATCH),
                _ => rng.gen_range(30..=RAGGED_ORDER_MAX_BATCH),
            };
            let block_m = [64u32, 128, 192][rng.gen_range(0..3)];
            let heads = rng.gen_range(1..=3u32);
            // Empty sequences, one token, block edges (and one past), any length.
            let len = |rng: &mut rand::rngs::StdRng| match rng.gen_range(0..6) {
                0 => 0,
                1 => 1,
                2 => block_m * rng.gen_range(1..=4),
                3 => block_m * rng.gen_range(1..=4) + 1,
                _ => rng.gen_range(0..=700),
            };
            let lens_q: Vec<u32> = (0..batch).map(|_| len(&mut rng)).collect();
            // Equal key lengths often (ties), and queries without keys.
            let lens_k: Vec<u32> = lens_q
                .iter()
                .map(|&sq| match rng.gen_range(0..4) {
                    0 => sq,
                    1 => 0,
                    _ => len(&mut rng),
                })
                .collect();
            let max_q = *lens_q.iter().max().unwrap();
            // The grid's query blocks from the batch's maximum, now and then
            // one more or one fewer than the longest sequence has (real
            // query blocks are clamped to the grid's).
            let m = match trial % 7 {
                0 => max_q.div_ceil(block_m) + 1,
                1 => max_q.div_ceil(block_m).saturating_sub(1),
                _ => max_q.div_ceil(block_m),
            }
            .max(1);
            let grid = batch as u64 * u64::from(heads) * u64::from(m);
            let real = |t: u64| {
                let b = (t / u64::from(m) / u64::from(heads)) as usize;
                let qb = t % u64::from(m);
                // tile_at's test: the tile's first query row within the sequence.
                (u64::from(m) - 1 - qb) * u64::from(block_m) < u64::from(lens_q[b])
            };
            let n_real = (0..grid).filter(|&t| real(t)).count();
            let mut seen = vec![false; grid as usize];
            let mut last_key = u32::MAX;
            let mut last_b = 0usize;
            for lin in 0..grid {
                let what = format!("trial {trial}: {lens_q:?} {lens_k:?} h{heads} m{m} bm{block_m} lin {lin}");
                let got = ragged_order(&lens_q, &lens_k, heads, m, block_m, lin);
                // The real tiles first, then nothing.
                if lin >= n_real as u64 {
                    assert_eq!(got, None, "{what}");
                    continue;
                }
                let t = got.unwrap_or_else(|| panic!("no tile: {what}"));
                assert!(t < grid && real(t), "{what}: tile {t}");
                assert!(!seen[t as usize], "{what}: tile {t} twice");
                seen[t as usize] = true;
                // Sequences by key length, longest first; ties by batch index.
                let b = (t / u64::from(m) / u64::from(heads)) as usize;
                assert!(lens_k[b] <= last_key, "{what}");
                if lens_k[b] == last_key {
                    assert!(b >= last_b, "{what}");
                }
                (last_key, last_b) = (lens_k[b], b);
            }
            assert_eq!(seen.iter().filter(|&&s| s).count(), n_real);
        }
        // Two sequences (keys 100, 300), two heads, block_m 64, m = 3: the
        // second one's 2 query blocks (the last first) per head, then the first's 3.
        let order: Vec<_> = (0..12)
            .map(|l| ragged_order(&[150, 100], &[100, 300], 2, 3, 64, l))
            .collect();
        let tiles = [7, 8, 10, 11, 0, 1, 2, 3, 4, 5];
        assert_eq!(order[..10], tiles.map(Some));
        assert_eq!(order[10..], [None, None]);
    }

    /// The sm90a forward's walk over a ragged batch in the longest-first
    /// order (`templates/fwd_sm90a.cu`, `walk_order`): block i of a grid of n
    /// takes in round r the walk index r * n + slot, slot = i or n - 1 - i in
    /// odd rounds (the snake) or (i + r) % n (the rotation), and its table
    /// maps the index through ragged_order; over the grid every real tile is
    /// taken once, whatever the grid, where the rounds fit the table.
    #[test]
    fn ragged_walk_takes_every_real_tile_once() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(46);
        let mut checked = 0;
        for trial in 0..300 {
            let batch = rng.gen_range(1..=12usize);
            let block_m = [64u32, 128, 192][rng.gen_range(0..3)];
            let heads = rng.gen_range(1..=4u32);
            let lens_q: Vec<u32> = (0..batch)
                .map(|_| match rng.gen_range(0..4) {
                    0 => 0,
                    1 => block_m * rng.gen_range(1..=3),
                    _ => rng.gen_range(1..=900),
                })
                .collect();
            let lens_k: Vec<u32> = lens_q
                .iter()
                .map(|&q| if rng.gen_bool(0.5) { q } else { rng.gen_range(0..=900) })
                .collect();
            let m = lens_q.iter().max().unwrap().div_ceil(block_m).max(1);
            let total = batch as u64 * u64::from(heads) * u64::from(m);
            let n = [1u64, 3, 7, 32, 132][rng.gen_range(0..5)];
            let rounds = total.div_ceil(n);
            if rounds > u64::from(SM90A_WALK_ORDER_ROUNDS) {
                continue; // the walk keeps tile_at's order (not mapped)
            }
            checked += 1;
            let rotate = trial % 2 == 0;
            let mut taken = vec![0u32; total as usize];
            for i in 0..n {
                for r in 0..rounds {
                    let slot = match (rotate, r % 2) {
                        (true, _) => (i + r) % n,
                        (false, 0) => i,
                        (false, _) => n - 1 - i,
                    };
                    let t = r * n + slot;
                    if t >= total {
                        continue;
                    }
                    if let Some(tile) = ragged_order(&lens_q, &lens_k, heads, m, block_m, t) {
                        taken[tile as usize] += 1;
                    }
                }
            }
            for (t, &k) in taken.iter().enumerate() {
                let b = t / m as usize / heads as usize;
                let qb = t as u64 % u64::from(m);
                let real = (u64::from(m) - 1 - qb) * u64::from(block_m) < u64::from(lens_q[b]);
                assert_eq!(
                    k,
                    u32::from(real),
                    "trial {trial}: tile {t} of {lens_q:?} on {n} blocks"
                );
            }
        }
        assert!(checked > 100, "{checked}");
    }

    #[test]
    fn causal_tile_phases_follow_the_measured_cells() {
        // H200: 132 SMs, one forward block each; tiles = query blocks per head.
        let slots = 132;
        // d128 2k (block_m 128): +1.9..3%; d128 8k: +3.8%.
        assert_eq!(causal_tile_phases(16, slots), 4);
        assert_eq!(causal_tile_phases(64, slots), 4);
        // d128/d256 16k: P = 4 lost 1.5..5%.
        assert_eq!(causal_tile_phases(128, slots), 1);
        // d64 16k (block_m 192): +1.6% (session 20, H200), -0.9% (session 21, H100).
        assert_eq!(causal_tile_phases(86, slots), 4);
        // Backward at two blocks per SM (the sm80 path's d64 shape): 16k gains 3.4-3.7%.
        assert_eq!(causal_tile_phases(128, 264), 4);
        // Few tiles: no more phases than a quarter of them.
        assert_eq!(causal_tile_phases(3, slots), 1);
        assert_eq!(causal_tile_phases(9, slots), 2);
        assert_eq!(causal_tile_phases(0, 0), 1);
    }
    use crate::spec::{DType, Layout, Mask};

    fn all_fwd_specs() -> Vec<AttnSpec> {
        use crate::spec::DType;
        let mut v = Vec::new();
        for &arch in Arch::ALL {
            for &dtype in DType::ALL {
                for d in (8..=256).step_by(8) {
                    for &mask in Mask::ALL {
                        for &layout in Layout::ALL {
                            v.push(AttnSpec::fwd(dtype, d as u16, mask, layout, arch));
                        }
                    }
                }
            }
        }
        v
    }

    #[test]
    fn sm80_forward_takes_one_kv_buffer_where_measured() {
        let tiles = |s: &str| {
            let p = plan_fwd_sm80(&s.parse().unwrap());
            (p.num_warps, p.m_tiles_per_warp, p.block_n, p.stages)
        };
        assert_eq!(tiles("fwd.bf16.d128.none.dense.sm80"), (4, 2, 48, 1));
        assert_eq!(tiles("fwd.f16.d128.causal-tl.dense.sm80"), (4, 2, 48, 1));
        assert_eq!(tiles("fwd.f16.d128.causal-tl.dense.sm90a"), (4, 2, 48, 1));
        assert_eq!(tiles("fwd.f16.d128.none.thd.softcap.sm80"), (4, 2, 48, 1));
        assert_eq!(tiles("fwd.f16.d128.causal-br.thd.softcap.sm80"), (4, 2, 32, 1));
        assert_eq!(tiles("fwd.bf16.d128.window.thd.sm80"), (4, 1, 64, 2));
        assert_eq!(tiles("fwd.bf16.d64.causal-tl.dense.sm80"), (4, 2, 64, 2));
        // Two K/V buffers at bn48 only on Hopper, where two 87 KB blocks fit an SM.
        assert_eq!(tiles("fwd.bf16.d128.none.dense.sm90a"), (4, 2, 48, 2));
        assert_eq!(tiles("fwd.bf16.d128.none.dense.softcap.sm90a"), (4, 2, 48, 1));
        // One buffer and the widest key step that fits: bn80 in sm80's 163 KB, bn96 on Hopper.
        assert_eq!(tiles("fwd.bf16.d256.none.dense.sm80"), (8, 1, 80, 1));
        assert_eq!(tiles("fwd.bf16.d256.none.dense.sm90a"), (8, 1, 96, 1));
        assert_eq!(tiles("fwd.bf16.d256.none.dense.sm86"), (8, 1, 32, 1));
        // Tuning may ask for any depth; the template has two orders.
        let spec: AttnSpec = "fwd.bf16.d128.none.dense.sm80".parse().unwrap();
        let t = |stages| FwdTiles {
            num_warps: 4,
            m_tiles_per_warp: 2,
            block_n: 32,
            stages,
            head_major: true,
        };
        assert_eq!(plan_fwd_sm80_with(&spec, t(0)).stages, 1);
        assert_eq!(plan_fwd_sm80_with(&spec, t(3)).stages, 2);
        assert!(plan_fwd_sm80_with(&spec, t(1)).smem_bytes < plan_fwd_sm80_with(&spec, t(2)).smem_bytes);
    }

    #[test]
    fn plan_is_deterministic_and_fits_the_arch() {
        for spec in all_fwd_specs() {
            let a = plan(&spec).unwrap();
            let b = plan(&spec).unwrap();
            assert_eq!(a, b);
            assert!(
                a.smem_bytes <= spec.arch.max_smem_per_block(),
                "{spec}: {}",
                a.smem_bytes
            );
            match a.template {
                Template::FwdSm80 => assert_eq!(a.block_m, 16 * a.m_tiles_per_warp * a.num_warps),
                Template::FwdSm90a => {
                    assert_eq!(spec.arch, Arch::Sm90a);
                    assert_eq!(a.block_m, 64 * (a.num_warps / 4 - 1), "64 rows per consumer warpgroup");
                    // wgmma N and the register budget of the consumers.
                    assert!(
                        a.block_n <= 256 && a.block_n / 2 + a.head_dim_v_padded / 2 <= 200,
                        "{spec}"
                    );
                }
                Template::BwdSm80 | Template::BwdSm90a => unreachable!(),
            }
            assert!(a.head_dim_qk_padded.is_multiple_of(16) && a.head_dim_qk_padded >= spec.head_dim_qk as u32);
            assert!(a.block_n.is_multiple_of(16) && a.block_n >= 16);
            assert!(!a.reasons.is_empty());
        }
    }

    #[test]
    fn entry_names_are_unique_identifiers() {
        let specs = all_fwd_specs();
        let mut names: Vec<String> = specs.iter().map(entry_name).collect();
        for n in &names {
            assert!(n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "{n}");
        }
        names.sort();
        names.dedup();
        assert_eq!(names.len(), specs.len());
    }

    #[test]
    fn backward_plans_on_the_bwd_template() {
        let spec: AttnSpec = "bwd.bf16.d128.none.dense.sm80".parse().unwrap();
        let p = plan(&spec).unwrap();
        assert_eq!(p.template, Template::BwdSm80);
        assert!(p.bwd.is_some());
    }

    #[test]
    fn the_plan_says_why_it_took_its_sm80_tile_shape() {
        for (s, shape) in [
            (
                "fwd.bf16.d128.none.dense.sm80",
                "tile shape 4x2xbn48: d96/d128: 48-key steps, one K/V buffer",
            ),
            ("fwd.bf16.d128.causal-br.thd.sm80", "tile shape 4x2xbn32: ragged causal"),
            ("fwd.bf16.d256.none.dense.sm80", "tile shape 8x1xbn80: d > 128"),
        ] {
            let p = plan(&s.parse().unwrap()).unwrap();
            assert!(p.reasons.iter().any(|r| r.starts_with(shape)), "{s}: {:?}", p.reasons);
        }
    }

    #[test]
    fn d128_plan_matches_the_documented_choice() {
        let spec = AttnSpec::fwd(DType::Bf16, 128, Mask::None, Layout::Dense, Arch::Sm80);
        let p = plan(&spec).unwrap();
        assert_eq!((p.block_m, p.block_n, p.num_warps), (128, 48, 4));
        assert_eq!(p.smem_pitch_qk, 136);
        let thd = plan(&AttnSpec::fwd(DType::Bf16, 128, Mask::None, Layout::Thd, Arch::Sm80)).unwrap();
        assert_eq!((thd.block_m, thd.block_n, thd.num_warps), (128, 48, 4));
        // Ragged + window keeps one m16 tile per warp (it spills at two).
        let mut w: AttnSpec = "fwd.bf16.d128.window.thd.softcap.sm80".parse().unwrap();
        let p = plan(&w).unwrap();
        assert_eq!((p.block_m, p.block_n, p.num_warps), (64, 64, 4));
        w.softcap = false;
        assert_eq!(plan(&w).unwrap().block_m, 64);
        w.layout = Layout::Dense;
        assert_eq!(plan(&w).unwrap().block_m, 128);
    }

    #[test]
    fn the_sm80_path_can_be_asked_for_on_sm90a() {
        for (s, template) in [
            ("fwd.bf16.d128.none.dense.sm90a", Template::FwdSm80),
            ("bwd.bf16.d128.causal-br.thd.sm90a", Template::BwdSm80),
            ("fwd.f16.d64.window.thd.softcap.sm80", Template::FwdSm80),
        ] {
            let spec: AttnSpec = s.parse().unwrap();
            let p = plan_sm80_path(&spec).unwrap();
            assert_eq!(p.template, template, "{s}");
            assert_eq!(p.spec, spec);
            // Said where it differs from the planner's choice, and only there.
            let differs = plan(&spec).unwrap().template != template;
            assert_eq!(
                p.reasons[0].starts_with("sm80 instruction path requested"),
                differs,
                "{s}: {:?}",
                p.reasons
            );
        }
        // A spec that fails validation fails here too, with the planner's error.
        let bad = AttnSpec::fwd(DType::Bf16, 300, Mask::None, Layout::Dense, Arch::Sm90a);
        assert_eq!(plan_sm80_path(&bad).unwrap_err(), plan(&bad).unwrap_err());
    }

    #[test]
    fn the_sm80_path_variant_exists_only_where_the_planner_takes_another_template() {
        for (s, has) in [
            ("fwd.bf16.d128.none.dense.sm90a", true),
            ("bwd.bf16.d64.none.dense.sm90a", true),
            // The planner's own choice on Hopper (measured faster there).
            ("bwd.bf16.d64.causal-br.dense.sm90a", false),
            ("fwd.bf16.d128.none.dense.sm80", false),
            ("bwd.f16.d256.none.thd.sm80", false),
        ] {
            let spec: AttnSpec = s.parse().unwrap();
            let v = plan_variant(&spec, Variant::Sm80Path).unwrap();
            assert_eq!(v.is_some(), has, "{s}");
            let p = plan_or_main(&spec, Variant::Sm80Path).unwrap();
            assert!(
                matches!(p.template, Template::FwdSm80 | Template::BwdSm80),
                "{s}: {:?}",
                p.template
            );
            assert_eq!(p, plan_sm80_path(&spec).unwrap(), "{s}");
            if !has {
                // The main kernel serves it: the same plan (the jit builds it as Variant::Main).
                assert_eq!(p, plan(&spec).unwrap(), "{s}");
            }
            // Never chosen per call, never prebuilt.
            assert_ne!(Variant::for_keys(&spec, 512), Variant::Sm80Path);
            assert!(!variants(&spec).any(|v| v == Variant::Sm80Path), "{s}");
        }
        let bad = AttnSpec::fwd(DType::Bf16, 300, Mask::None, Layout::Dense, Arch::Sm90a);
        assert_eq!(
            plan_variant(&bad, Variant::Sm80Path).unwrap_err(),
            plan(&bad).unwrap_err()
        );
    }

    #[test]
    fn sm90a_row_sums_on_the_tensor_cores_up_to_block_n_176() {
        use crate::spec::AttnSpec;
        // Asked for, block_n 192 (d <= 64 with softcap) keeps the FADD sums; every
        // other default tile takes the tensor cores' and fits its ones block.
        for s in [
            "fwd.bf16.d64.none.dense.sm90a",
            "fwd.bf16.d64.causal-tl.dense.softcap.sm90a",
            "fwd.bf16.d128.none.dense.sm90a",
            "fwd.f16.d128.window.thd.softcap.sm90a",
            "fwd.bf16.d192v128.causal-br.dense.sm90a",
            "fwd.bf16.d256.none.dense.sm90a",
            "fwd.bf16.d256.causal-br.thd.sm90a",
        ] {
            let spec: AttnSpec = s.parse().unwrap();
            let on = Sm90aFwdTiles {
                rowsum_mma: true,
                ..default_sm90a_tiles(&spec)
            };
            let p = plan_fwd_sm90a_with(&spec, on);
            assert_eq!(
                p.rowsum_mma,
                p.block_n <= SM90A_ROWSUM_MMA_MAX_BN,
                "{s}: block_n {}",
                p.block_n
            );
            assert!(
                p.smem_bytes <= Arch::Sm90a.max_smem_per_block(),
                "{s}: {}",
                p.smem_bytes
            );
            let off = plan_fwd_sm90a_with(
                &spec,
                Sm90aFwdTiles {
                    rowsum_mma: false,
                    ..default_sm90a_tiles(&spec)
                },
            );
            assert!(!off.rowsum_mma);
            // The ones block is the only difference in shared memory (same tiles).
            if p.rowsum_mma && (off.block_n, off.stages) == (p.block_n, p.stages) {
                assert_eq!(p.smem_bytes, off.smem_bytes + SM90A_ONES_BYTES, "{s}");
            }
            let (on_src, off_src) = (
                crate::render::render(&p).unwrap().source,
                crate::render::render(&off).unwrap().source,
            );
            assert!(
                on_src.contains(&format!("constexpr bool ROWSUM_MMA = {};", p.rowsum_mma)),
                "{s}"
            );
            assert!(off_src.contains("constexpr bool ROWSUM_MMA = false;"), "{s}");
        }
        let with = |s: &str| {
            let spec: AttnSpec = s.parse().unwrap();
            plan_fwd_sm90a_with(
                &spec,
                Sm90aFwdTiles {
                    rowsum_mma: true,
                    ..default_sm90a_tiles(&spec)
                },
            )
        };
        assert!(!with("fwd.bf16.d64.causal-tl.dense.softcap.sm90a").rowsum_mma);
        assert!(with("fwd.bf16.d128.none.dense.sm90a").rowsum_mma);
    }

    #[test]
    fn sm90a_causal_blocks_align_to_the_end() {
        for (s, on) in [
            ("fwd.bf16.d64.causal-tl.dense.sm90a", true),
            ("fwd.bf16.d128.causal-br.thd.sm90a", true),
            ("fwd.bf16.d128.none.dense.sm90a", false),
            ("fwd.bf16.d64.window.thd.sm90a", false),
        ] {
            let spec: crate::spec::AttnSpec = s.parse().unwrap();
            let on_tiles = Sm90aFwdTiles {
                tail_first: true,
                ..default_sm90a_tiles(&spec)
            };
            let p = plan_fwd_sm90a_with(&spec, on_tiles);
            assert_eq!(p.tail_first, on, "{s}");
            let src = crate::render::render(&p).unwrap().source;
            assert!(src.contains(&format!("constexpr bool TAIL_FIRST = {on};")), "{s}");
            let off = plan_fwd_sm90a_with(
                &spec,
                Sm90aFwdTiles {
                    tail_first: false,
                    ..default_sm90a_tiles(&spec)
                },
            );
            assert!(!off.tail_first);
        }
    }

    #[test]
    fn sm90a_softmax_under_pv_up_to_block_n_160() {
        // d64 with softcap takes block_n 192: the P V wait stays first.
        for (d, mask, softcap, under) in [
            (64, Mask::None, true, false),
            (128, Mask::None, false, true),
            (128, Mask::CausalTopLeft, false, true),
            (64, Mask::None, false, true),
            (256, Mask::None, false, true),
        ] {
            let spec = AttnSpec {
                softcap,
                ..AttnSpec::fwd(DType::Bf16, d, mask, Layout::Dense, Arch::Sm90a)
            };
            let p = plan_fwd_sm90a(&spec);
            assert_eq!(p.softmax_under_pv, under, "{spec}: block_n {}", p.block_n);
            assert_eq!(p.softmax_under_pv, p.block_n <= SM90A_SOFTMAX_UNDER_PV_MAX_BN);
            let why = if under {
                "the next tile runs under this tile's P V"
            } else {
                "the P V wait before the softmax"
            };
            assert!(p.reasons.iter().any(|r| r.contains(why)), "{spec}: {:?}", p.reasons);
            // The template sees it: V's wait moves between the softmax and the
            // P V wait, and the lazy max is on.
            let src = crate::render::render(&p).unwrap().source;
            assert_eq!(
                src.contains("V(it)'s wait here is also a block boundary"),
                under,
                "{spec}"
            );
            assert!(src.contains(&format!("constexpr bool LAZY_MAX = {under};")), "{spec}");
        }
        // Not without the pipelined loop (nor in sm80 plans).
        let spec = AttnSpec::fwd(DType::Bf16, 256, Mask::None, Layout::Dense, Arch::Sm90a);
        let t = Sm90aFwdTiles {
            pipelined: false,
            ..default_sm90a_tiles(&spec)
        };
        assert!(!plan_fwd_sm90a_with(&spec, t).softmax_under_pv);
    }

    #[test]
    fn sm90a_pingpong_needs_the_pipelined_loop() {
        let spec = AttnSpec::fwd(DType::Bf16, 128, Mask::None, Layout::Dense, Arch::Sm90a);
        let p = plan_fwd_sm90a(&spec);
        assert!(p.consumer_pipelined && p.pingpong, "default: pipelined ping-pong");
        assert!(p.reasons.iter().any(|r| r.contains("ping-pong")));
        let t = Sm90aFwdTiles {
            pipelined: false,
            pingpong: true,
            ..default_sm90a_tiles(&spec)
        };
        let p = plan_fwd_sm90a_with(&spec, t);
        assert!(!p.consumer_pipelined && !p.pingpong);
        // The ring fits: an oversized request shrinks to the arch limit.
        let big = Sm90aFwdTiles {
            block_n: 256,
            stages: 4,
            ..default_sm90a_tiles(&spec)
        };
        let p = plan_fwd_sm90a_with(&spec, big);
        assert!(p.smem_bytes <= Arch::Sm90a.max_smem_per_block(), "{}", p.smem_bytes);
        assert!(p.block_n.is_multiple_of(16));
    }

    #[test]
    fn sm90a_forward_has_both_entries_and_walks_short_keys_only() {
        for d in [64u16, 128, 256] {
            for mask in [Mask::None, Mask::CausalTopLeft] {
                for layout in [Layout::Dense, Layout::Thd] {
                    let spec = AttnSpec::fwd(DType::Bf16, d, mask, layout, Arch::Sm90a);
                    assert_eq!(plan(&spec).unwrap().grid, GridRule::TilesOrWalk, "{spec}");
                    let tiles = Sm90aFwdTiles {
                        persistent: false,
                        ..default_sm90a_tiles(&spec)
                    };
                    assert_eq!(
                        plan_fwd_sm90a_with(&spec, tiles).grid,
                        GridRule::BatchHeadsByQueryTiles,
                        "{spec}"
                    );
                }
            }
        }
        for d in [64u32, 128, 256] {
            for (mask, layout) in [
                (Mask::None, Layout::Dense),
                (Mask::CausalTopLeft, Layout::Dense),
                (Mask::None, Layout::Thd),
                (Mask::CausalBottomRight, Layout::Thd),
            ] {
                let masked = mask != Mask::None;
                let dense = layout == Layout::Dense;
                let spec = AttnSpec::fwd(DType::Bf16, d as u16, mask, layout, Arch::Sm90a);
                for consumers in [2, 3] {
                    let walks = |s| sm90a_walk_pays(s, &spec, d, consumers, 80);
                    // Ragged batches past d128: without a mask the walk at
                    // every length (session 46), under one never (session 47).
                    if !dense && d > 128 {
                        for s in [1, 512, 513, 1024, 2048, 4096, 1 << 20] {
                            assert_eq!(walks(s), !masked, "{spec} {s}");
                        }
                        continue;
                    }
                    // Past d128 a mask keeps one tile per block up to 512 keys.
                    assert_eq!(walks(512), !(masked && d > 128));
                    assert!(walks(513) && walks(SM90A_WALK_MAX_KEYS));
                    assert!(!walks(4096));
                    // 2k: d64 under a mask; d128 with three consumers (a
                    // causal main plan, or the mid-keys variant without a
                    // mask); d256 on dense tensors without a mask.
                    let to_2k = match (d, masked, consumers) {
                        (64, true, _) | (128, _, 3) => true,
                        (256, false, _) => dense,
                        (64, false, _) | (128, _, 2) | (256, true, _) => false,
                        _ => unreachable!(),
                    };
                    assert_eq!(walks(2048), to_2k, "{spec} consumers={consumers}");
                    assert!(!walks(2049));
                }
            }
        }
        // d256 causal at block_n 64 (its short-keys tiles, which dense calls
        // take up to 2k keys): one tile per block up to 512, then the walk up
        // to 2k on dense tensors; ragged batches take the main plan past 1024
        // and one tile per block at every length.
        let d256c = AttnSpec::fwd(DType::Bf16, 256, Mask::CausalTopLeft, Layout::Dense, Arch::Sm90a);
        let walks = |spec: &AttnSpec, s| sm90a_walk_pays(s, spec, 256, 2, 64);
        assert!(!walks(&d256c, 512) && walks(&d256c, 513) && walks(&d256c, 2048) && !walks(&d256c, 2049));
        assert_eq!(Variant::for_keys(&d256c, 2048), Variant::ShortKeys);
        assert_eq!(Variant::for_keys(&d256c, 2049), Variant::Main);
        assert_eq!(
            plan_variant(&d256c, Variant::ShortKeys)
                .unwrap()
                .expect("short")
                .block_n,
            64
        );
        let d256t = AttnSpec::fwd(DType::Bf16, 256, Mask::CausalBottomRight, Layout::Thd, Arch::Sm90a);
        assert!(!walks(&d256t, 512) && !walks(&d256t, 1024) && !walks(&d256t, 2048));
        assert_eq!(Variant::for_keys(&d256t, 1024), Variant::ShortKeys);
        assert_eq!(Variant::for_keys(&d256t, 1025), Variant::Main);
        // Three consumers at block_n 80 at d128 without a mask and under a
        // dense causal mask.
        let tiles = |mask| default_sm90a_tiles(&AttnSpec::fwd(DType::Bf16, 128, mask, Layout::Dense, Arch::Sm90a));
        for mask in [Mask::None, Mask::CausalTopLeft, Mask::CausalBottomRight] {
            assert_eq!(
                (tiles(mask).block_n, tiles(mask).consumers, tiles(mask).stages),
                (80, 3, 3)
            );
        }
        assert_eq!(
            (tiles(Mask::SlidingWindow).block_n, tiles(Mask::SlidingWindow).consumers),
            (128, 2)
        );
        let softcap = AttnSpec {
            softcap: true,
            ..AttnSpec::fwd(DType::Bf16, 128, Mask::None, Layout::Thd, Arch::Sm90a)
        };
        assert_eq!(default_sm90a_tiles(&softcap).block_n, 128);
    }

    #[test]
    fn sm90a_blocks_per_sm_divide_the_shared_memory_and_say_so() {
        let spec = AttnSpec::fwd(DType::Bf16, 128, Mask::CausalTopLeft, Layout::Dense, Arch::Sm90a);
        let base = default_sm90a_tiles(&spec);
        assert_eq!(base.blocks_per_sm, 1);
        let limit = |b: u32| (spec.arch.max_smem_per_block() + 1024) / b - 1024;
        for (consumers, blocks) in [(1, 2), (1, 3), (2, 2)] {
            let tiles = Sm90aFwdTiles {
                consumers,
                blocks_per_sm: blocks,
                block_n: 128,
                stages: 3,
                ..base
            };
            let p = plan_fwd_sm90a_with(&spec, tiles);
            assert_eq!((p.min_blocks_per_sm, p.block_m), (blocks, 64 * consumers));
            assert!(
                p.smem_bytes <= limit(blocks),
                "{consumers} consumers, {blocks} per SM: {}",
                p.smem_bytes
            );
            assert!(p.block_n < 128 || p.stages < 3, "shrunk to fit {} B", limit(blocks));
            assert!(
                blocks * (p.smem_bytes + 1024) <= spec.arch.max_smem_per_block() + 1024,
                "{blocks} blocks fit one SM"
            );
            assert!(p
                .reasons
                .iter()
                .any(|r| r.starts_with(&format!("{blocks} blocks per SM"))));
            assert_eq!(p.pingpong, consumers > 1);
        }
        let one = plan_fwd_sm90a_with(&spec, base);
        assert!(!one.reasons.iter().any(|r| r.contains("blocks per SM")));
    }

    #[test]
    fn sm90a_three_consumer_warpgroups_share_the_register_file() {
        assert_eq!((sm90a_consumer_regs(2, 1), sm90a_consumer_regs(3, 1)), (240, 160));
        assert_eq!(
            (
                sm90a_consumer_regs(1, 2),
                sm90a_consumer_regs(1, 3),
                sm90a_consumer_regs(2, 2)
            ),
            (232, 136, 104)
        );
        for c in 1..=3 {
            for b in 1..=3 {
                let threads = 128 * (c + 1);
                let launch = sm90a_launch_regs(c, b);
                assert!(b * threads * launch <= 65536, "{c} consumers, {b} blocks");
                assert!(128 * SM90A_PRODUCER_REGS + 128 * c * sm90a_consumer_regs(c, b) <= launch * threads);
            }
        }
        let spec = AttnSpec::fwd(DType::Bf16, 64, Mask::CausalTopLeft, Layout::Dense, Arch::Sm90a);
        let t = Sm90aFwdTiles {
            consumers: 3,
            block_n: 128,
            ..default_sm90a_tiles(&spec)
        };
        let p = plan_fwd_sm90a_with(&spec, t);
        assert_eq!((p.block_m, p.threads()), (192, 512));
        assert!(p.reasons.iter().any(|r| r.contains("3 consumer warpgroups (160 regs)")));
        // Out-of-range requests are clamped to what the template takes.
        let p = plan_fwd_sm90a_with(&spec, Sm90aFwdTiles { consumers: 7, ..t });
        assert_eq!(p.block_m, 192);
    }

    #[test]
    fn sm90a_forward_plans_on_the_wgmma_template() {
        for (d, bm, bn, stages, threads) in [
            (64, 192, 128, 3, 512),
            (128, 128, 128, 2, 384),
            (192, 128, 96, 2, 384),
            (256, 128, 80, 2, 384),
        ] {
            let spec = AttnSpec::fwd(DType::Bf16, d, Mask::CausalBottomRight, Layout::Thd, Arch::Sm90a);
            let p = plan(&spec).unwrap();
            assert_eq!(p.template, Template::FwdSm90a);
            assert_eq!(
                (p.block_m, p.block_n, p.stages, p.threads()),
                (bm, bn, stages, threads),
                "d{d}"
            );
            assert!(p.head_major, "d{d}: head-major tile order by default");
        }
        let sm80 = plan(&AttnSpec::fwd(DType::Bf16, 128, Mask::None, Layout::Dense, Arch::Sm80)).unwrap();
        assert_eq!(sm80.template, Template::FwdSm80);
    }
}
