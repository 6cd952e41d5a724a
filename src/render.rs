//! Stage 3 of the pipeline: **render** a plan into CUDA source with tera.
//!
//! Templates live in `templates/` and are embedded in the binary at build
//! time. Tera only decides what is compiled in and fills constants; the kernel
//! logic stays in plain device functions. The fingerprint of all templates is
//! part of every cache key (the rendered source is too, so a template change
//! always changes the key).

use std::sync::OnceLock;

use serde::Serialize;
use sha2::{Digest, Sha256};
use tera::{Context, Tera};

use crate::error::RenderError;
use crate::plan::{KernelPlan, Template};
use crate::spec::{DType, Layout, Mask};

/// Every template file, by the name templates include it with.
pub const TEMPLATES: &[(&str, &str)] = &[
    ("fwd_sm80.cu", include_str!("../templates/fwd_sm80.cu")),
    ("bwd_sm80.cu", include_str!("../templates/bwd_sm80.cu")),
    ("fwd_sm90a.cu", include_str!("../templates/fwd_sm90a.cu")),
    ("bwd_sm90a.cu", include_str!("../templates/bwd_sm90a.cu")),
    (
        "common/fwd_params.cuh",
        include_str!("../templates/common/fwd_params.cuh"),
    ),
    ("common/softmax.cuh", include_str!("../templates/common/softmax.cuh")),
    ("common/hopper.cuh", include_str!("../templates/common/hopper.cuh")),
    ("common/ptx.cuh", include_str!("../templates/common/ptx.cuh")),
    (
        "common/wgmma_operands.tera",
        include_str!("../templates/common/wgmma_operands.tera"),
    ),
    ("common/mask.cuh", include_str!("../templates/common/mask.cuh")),
    ("common/order.cuh", include_str!("../templates/common/order.cuh")),
    ("common/tile.cuh", include_str!("../templates/common/tile.cuh")),
    ("common/trace.cuh", include_str!("../templates/common/trace.cuh")),
    (
        "common/bwd_common.cuh",
        include_str!("../templates/common/bwd_common.cuh"),
    ),
];

/// Rendered CUDA source for one plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    /// Source text, header-free.
    pub source: String,
    /// File name used for NVRTC and error reports, e.g. `attnforge_fwd_bf16_....cu`.
    pub program_name: String,
    pub entry: String,
}

fn tera() -> Result<&'static Tera, RenderError> {
    static TERA: OnceLock<Result<Tera, String>> = OnceLock::new();
    TERA.get_or_init(|| {
        let mut t = Tera::default();
        t.autoescape_on(vec![]);
        t.add_raw_templates(TEMPLATES.iter().copied())
            .map_err(|e| format!("{e:?}"))?;
        Ok(t)
    })
    .as_ref()
    .map_err(|m| RenderError {
        template: "<all>".into(),
        message: m.clone(),
    })
}

/// sha256 over every template's name and text, hex.
pub fn templates_fingerprint() -> &'static str {
    static FP: OnceLock<String> = OnceLock::new();
    FP.get_or_init(|| {
        let mut h = Sha256::new();
        for (name, text) in TEMPLATES {
            h.update((name.len() as u64).to_le_bytes());
            h.update(name.as_bytes());
            h.update((text.len() as u64).to_le_bytes());
            h.update(text.as_bytes());
        }
        hex::encode(h.finalize())
    })
}

/// The values a template sees.
#[derive(Debug, Serialize)]
struct FwdContext {
    spec: String,
    entry: String,
    ptx_type: &'static str,
    block_m: u32,
    block_n: u32,
    num_warps: u32,
    m_tiles: u32,
    stages: u32,
    d_qk: u16,
    d_v: u16,
    d_qk_pad: u32,
    d_v_pad: u32,
    pitch_qk: u32,
    pitch_v: u32,
    mask_kind: u32,
    is_thd: bool,
    softcap: bool,
    min_blocks: u32,
    head_major: bool,
    /// Q, K and V tiles swizzled instead of padded (rows of whole 128-byte
    /// lines; `plan::fwd_swizzled_tiles`).
    swizzle: [bool; 3],
}

/// The values the sm90a forward template sees.
#[derive(Debug, Serialize)]
struct FwdSm90aContext {
    spec: String,
    entry: String,
    ptx_type: &'static str,
    consumers: u32,
    block_m: u32,
    block_n: u32,
    stages: u32,
    d_qk: u16,
    d_v: u16,
    d_v_pad: u32,
    qk_chunks: u32,
    v_chunks: u32,
    qk_ksteps: u32,
    /// f32 accumulator registers per thread of S (block_n/2) and O (d_v_pad/2),
    /// and their 8-column tiles: the operand lists of the wgmma wrappers.
    s_regs: u32,
    s_tiles: u32,
    o_regs: u32,
    o_tiles: u32,
    mask_kind: u32,
    is_thd: bool,
    softcap: bool,
    producer_regs: u32,
    consumer_regs: u32,
    pipelined: bool,
    pingpong: bool,
    softmax_under_pv: bool,
    rowsum_mma: bool,
    tail_first: bool,
    tma_store_o: bool,
    q_regs: bool,
    persistent: bool,
    head_major: bool,
    cluster_m: u32,
    min_blocks: u32,
    /// Rounds of the ragged walk's tile table (`plan::SM90A_WALK_ORDER_ROUNDS`; 0 on dense plans).
    walk_order_rounds: u32,
}

/// The values the backward template sees (see `plan::plan_bwd` for the tiles).
#[derive(Debug, Serialize)]
struct BwdContext {
    spec: String,
    entry: String,
    ptx_type: &'static str,
    block_m: u32,
    block_n: u32,
    num_warps: u32,
    q_stages: u32,
    d_qk: u16,
    d_v: u16,
    d_qk_pad: u32,
    d_v_pad: u32,
    pitch_qk: u32,
    pitch_v: u32,
    pitch_m: u32,
    s_wn: u32,
    s_wm: u32,
    dk_wn: u32,
    dk_wd: u32,
    dv_wn: u32,
    dv_wd: u32,
    dq_wm: u32,
    dq_wd: u32,
    mask_kind: u32,
    is_thd: bool,
    softcap: bool,
    deterministic: bool,
    row_warps: u32,
    dqb_m: u32,
    dqb_n: u32,
    dqb_warps: u32,
    dqb_stages: u32,
    acc_chunk: u32,
    dq_chunk: u32,
    dk_after_dq: bool,
    dk_in_dq: bool,
    dq_frags_once: bool,
    kv_in_regs: bool,
    qdo_swizzle: bool,
    /// Tokens per tile of the f32 dQ accumulator (`BwdPlan::dq_tile_rows`).
    dq_tile_rows: u32,
    head_major: bool,
}

/// The values the Hopper backward template sees.
#[derive(Debug, Serialize)]
struct BwdSm90aContext {
    spec: String,
    entry: String,
    ptx_type: &'static str,
    block_m: u32,
    block_n: u32,
    d_qk: u16,
    d_v: u16,
    d_qk_pad: u32,
    d_v_pad: u32,
    /// dQ columns per warpgroup, and how the warpgroups share dQ: 0 = each
    /// over its own kv rows, 1 = dQ's columns, 2 = dQ's rows.
    dq_n: u32,
    dq_split: u32,
    /// The N of the register-A wgmma products (dK, dV), once each.
    rs_ns: Vec<u32>,
    mask_kind: u32,
    is_thd: bool,
    softcap: bool,
    row_warps: u32,
    walk_rotation: bool,
    /// Tokens per tile of the f32 dQ accumulator (`BwdPlan::dq_tile_rows`).
    dq_tile_rows: u32,
    head_major: bool,
}

/// Mask kind as the templates number it (see `templates/common/mask.cuh`).
pub const fn mask_kind(mask: Mask) -> u32 {
    match mask {
        Mask::None => 0,
        Mask::CausalTopLeft => 1,
        Mask::CausalBottomRight => 2,
        Mask::SlidingWindow => 3,
    }
}

/// Render a plan. Pure: same plan, same bytes.
pub fn render(plan: &KernelPlan) -> Result<Rendered, RenderError> {
    let spec = &plan.spec;
    let name = plan.template.file();
    let ptx_type = match spec.dtype {
        DType::F16 => "f16",
        DType::Bf16 => "bf16",
    };
    let ctx_err = |e: tera::Error| RenderError {
        template: name.into(),
        message: e.to_string(),
    };
    let context = match (plan.template, &plan.bwd) {
        (Template::BwdSm80, Some(b)) => Context::from_serialize(BwdContext {
            spec: spec.to_string(),
            entry: plan.entry.clone(),
            ptx_type,
            block_m: b.block_m,
            block_n: b.block_n,
            num_warps: b.num_warps,
            q_stages: b.q_stages,
            d_qk: spec.head_dim_qk,
            d_v: spec.head_dim_v,
            d_qk_pad: plan.head_dim_qk_padded,
            d_v_pad: plan.head_dim_v_padded,
            pitch_qk: plan.smem_pitch_qk,
            pitch_v: plan.smem_pitch_v,
            pitch_m: b.pitch_m,
            s_wn: b.warps_s.0,
            s_wm: b.warps_s.1,
            dk_wn: b.warps_dk.0,
            dk_wd: b.warps_dk.1,
            dv_wn: b.warps_dv.0,
            dv_wd: b.warps_dv.1,
            dq_wm: b.warps_dq.0,
            dq_wd: b.warps_dq.1,
            mask_kind: mask_kind(spec.mask),
            is_thd: spec.layout == Layout::Thd,
            softcap: spec.softcap,
            deterministic: spec.deterministic,
            row_warps: b.row_warps,
            dqb_m: b.dq_block_m,
            dqb_n: b.dq_block_n,
            dqb_warps: b.dq_warps,
            dqb_stages: b.dq_kv_stages,
            acc_chunk: b.acc_chunk,
            dq_chunk: b.dq_chunk(),
            dk_after_dq: b.dk_after_dq,
            dk_in_dq: b.dk_in_dq,
            dq_frags_once: b.dq_frags_once,
            kv_in_regs: b.kv_in_regs,
            qdo_swizzle: b.qdo_swizzle,
            dq_tile_rows: b.dq_tile_rows,
            head_major: plan.head_major,
        })
        .map_err(ctx_err)?,
        (Template::BwdSm90a, Some(b)) => {
            let (dqk, dv) = (plan.head_dim_qk_padded, plan.head_dim_v_padded);
            let mut rs_ns = vec![dqk, dv];
            rs_ns.dedup();
            Context::from_serialize(BwdSm90aContext {
                spec: spec.to_string(),
                entry: plan.entry.clone(),
                ptx_type,
                block_m: b.block_m,
                block_n: b.block_n,
                d_qk: spec.head_dim_qk,
                d_v: spec.head_dim_v,
                d_qk_pad: dqk,
                d_v_pad: dv,
                dq_n: 64,
                dq_split: crate::plan::plan_bwd::sm90a_dq_split(dqk, b.block_m),
                rs_ns,
                mask_kind: mask_kind(spec.mask),
                is_thd: spec.layout == Layout::Thd,
                softcap: spec.softcap,
                row_warps: b.row_warps,
                walk_rotation: b.walk_rotation,
                dq_tile_rows: b.dq_tile_rows,
                head_major: plan.head_major,
            })
            .map_err(ctx_err)?
        }
        (Template::BwdSm80 | Template::BwdSm90a, None) => {
            return Err(RenderError {
                template: name.into(),
                message: format!("a {name} plan needs its `bwd` tiles"),
            })
        }
        (Template::FwdSm90a, _) => Context::from_serialize(FwdSm90aContext {
            spec: spec.to_string(),
            entry: plan.entry.clone(),
            ptx_type,
            consumers: plan.block_m / 64,
            block_m: plan.block_m,
            block_n: plan.block_n,
            stages: plan.stages,
            d_qk: spec.head_dim_qk,
            d_v: spec.head_dim_v,
            d_v_pad: plan.head_dim_v_padded,
            qk_chunks: plan.head_dim_qk_padded.div_ceil(64),
            v_chunks: plan.head_dim_v_padded.div_ceil(64),
            qk_ksteps: plan.head_dim_qk_padded / 16,
            s_regs: plan.block_n / 2,
            s_tiles: plan.block_n / 8,
            o_regs: plan.head_dim_v_padded / 2,
            o_tiles: plan.head_dim_v_padded / 8,
            mask_kind: mask_kind(spec.mask),
            is_thd: spec.layout == Layout::Thd,
            softcap: spec.softcap,
            producer_regs: crate::plan::SM90A_PRODUCER_REGS,
            consumer_regs: crate::plan::sm90a_consumer_regs(plan.block_m / 64, plan.min_blocks_per_sm),
            min_blocks: plan.min_blocks_per_sm,
            pipelined: plan.consumer_pipelined,
            pingpong: plan.pingpong,
            softmax_under_pv: plan.softmax_under_pv,
            rowsum_mma: plan.rowsum_mma,
            tail_first: plan.tail_first,
            tma_store_o: plan.tma_store_o,
            q_regs: plan.q_regs,
            persistent: plan.grid == crate::plan::GridRule::TilesOrWalk,
            head_major: plan.head_major,
            cluster_m: plan.cluster_m,
            walk_order_rounds: crate::plan::sm90a_walk_order_bytes(spec.layout) / 4,
        })
        .map_err(ctx_err)?,
        (Template::FwdSm80, _) => Context::from_serialize(FwdContext {
            swizzle: crate::plan::fwd_swizzled_tiles(
                plan.smem_swizzle,
                plan.head_dim_qk_padded,
                plan.head_dim_v_padded,
            ),
            spec: spec.to_string(),
            entry: plan.entry.clone(),
            ptx_type,
            block_m: plan.block_m,
            block_n: plan.block_n,
            num_warps: plan.num_warps,
            m_tiles: plan.m_tiles_per_warp,
            stages: plan.stages,
            d_qk: spec.head_dim_qk,
            d_v: spec.head_dim_v,
            d_qk_pad: plan.head_dim_qk_padded,
            d_v_pad: plan.head_dim_v_padded,
            pitch_qk: plan.smem_pitch_qk,
            pitch_v: plan.smem_pitch_v,
            mask_kind: mask_kind(spec.mask),
            is_thd: spec.layout == Layout::Thd,
            softcap: spec.softcap,
            min_blocks: plan.min_blocks_per_sm,
            head_major: plan.head_major,
        })
        .map_err(ctx_err)?,
    };
    let source = tera()?.render(name, &context).map_err(|e| {
        let mut msg = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            msg.push_str(": ");
            msg.push_str(&s.to_string());
            src = s.source();
        }
        RenderError {
            template: name.into(),
            message: msg,
        }
    })?;
    Ok(Rendered {
        source,
        program_name: format!("{}.cu", plan.entry),
        entry: plan.entry.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::plan;
    use crate::spec::{Arch, AttnSpec};

    #[test]
    fn rendered_source_is_header_free_and_complete() {
        let spec = AttnSpec::fwd(DType::Bf16, 128, Mask::CausalBottomRight, Layout::Dense, Arch::Sm80);
        let r = render(&plan(&spec).unwrap()).unwrap();
        assert!(!r.source.contains("#include"), "kernels must not include headers");
        assert!(
            !r.source.contains("{{") && !r.source.contains("{%"),
            "unrendered tera syntax left"
        );
        assert!(r.source.contains(&format!("{}(const FwdParams p)", r.entry)));
        assert!(r.source.contains("f32.bf16.bf16.f32"));
        assert!(r.source.contains("constexpr int MASK_KIND = 2;"));
    }

    #[test]
    fn rendering_is_deterministic_and_spec_sensitive() {
        let a = AttnSpec::fwd(DType::F16, 64, Mask::None, Layout::Thd, Arch::Sm90a);
        let pa = plan(&a).unwrap();
        assert_eq!(render(&pa).unwrap(), render(&pa).unwrap());
        let mut b = a;
        b.softcap = true;
        assert_ne!(render(&pa).unwrap().source, render(&plan(&b).unwrap()).unwrap().source);
    }

    #[test]
    fn sm80_forward_block_order_reaches_the_source() {
        for s in ["fwd.bf16.d128.causal-tl.dense.sm80", "fwd.f16.d64.none.thd.sm86"] {
            let mut p = plan(&s.parse().unwrap()).unwrap();
            assert!(
                !p.head_major,
                "{s}: query-block-major by default (head-major is an option)"
            );
            let old = render(&p).unwrap().source;
            p.head_major = true;
            let hm = render(&p).unwrap().source;
            assert!(hm.contains("bh = (int)(lin / gridDim.y);"), "{s}");
            // Dense causal grids in the launcher's phases (common/order.cuh).
            assert!(hm.contains("phase_tile(lin, (int)gridDim.y, p.tile_phases)"), "{s}");
            assert!(!old.contains("phase_tile(lin"), "{s}");
            // The coordinates come from %ctaid twice: before the key loop and
            // for the epilogue (nothing only the epilogue needs stays live).
            for src in [&old, &hm] {
                assert_eq!(src.matches("fwd_block(p)").count(), 2, "{s}");
            }
            assert!(
                !old.contains("lin / gridDim.y") && old.contains("int bh = (int)bx;"),
                "{s}"
            );
        }
    }

    #[test]
    fn sm80_forward_takes_ragged_batches_longest_keys_first() {
        // Ragged: both block orders map their blocks through common/order.cuh's
        // ragged_order where the launcher asks (p.ragged_order).
        for head_major in [false, true] {
            let mut p = plan(&"fwd.f16.d64.none.thd.sm80".parse().unwrap()).unwrap();
            p.head_major = head_major;
            let src = render(&p).unwrap().source;
            assert!(src.contains("if (MASK_KIND == 0 && p.ragged_order != 0 && p.batch <= RAGGED_ORDER_MAX_BATCH) {"));
            assert!(src.contains("constexpr int RAGGED_ORDER_MAX_BATCH = 64;"));
        }
        // Dense grids have no such order (and no order.cuh without head_major,
        // which dense grids take only without a mask).
        let src = render(&plan(&"fwd.f16.d64.causal-tl.dense.sm80".parse().unwrap()).unwrap())
            .unwrap()
            .source;
        assert!(!src.contains("ragged_order("));
    }

    #[test]
    fn backward_block_order_reaches_the_source() {
        for s in ["bwd.bf16.d128.causal-tl.dense.det.sm80", "bwd.bf16.d64.none.thd.sm90a"] {
            let mut p = plan(&s.parse().unwrap()).unwrap();
            assert!(p.head_major, "{s}: head-major by default");
            let hm = render(&p).unwrap().source;
            p.head_major = false;
            let old = render(&p).unwrap().source;
            assert!(
                hm.contains("lin / gridDim.y") && !old.contains("lin / gridDim.y"),
                "{s}"
            );
            assert!(old.contains("BlockTile{(int)blockIdx.x, (int)blockIdx.y}"), "{s}");
        }
    }

    #[test]
    fn sm90a_schedule_options_reach_the_source() {
        use crate::plan::{default_sm90a_tiles, plan_fwd_sm90a_with, Sm90aFwdTiles};
        let spec = AttnSpec::fwd(DType::Bf16, 128, Mask::CausalTopLeft, Layout::Dense, Arch::Sm90a);
        let base = default_sm90a_tiles(&spec);
        let src = |t: Sm90aFwdTiles| render(&plan_fwd_sm90a_with(&spec, t)).unwrap().source;
        // Both entries (one body), head-major: the walk's sections and snake
        // are compiled in under WALK.
        assert!(base.persistent && base.head_major);
        let default = src(base);
        let entry = crate::plan::plan_fwd_sm90a_with(&spec, base).entry;
        assert!(default.contains(&format!("{entry}(")) && default.contains(&format!("{entry}_walk(")));
        assert!(default.contains("fwd_tiles<false>") && default.contains("fwd_tiles<true>"));
        assert!(default.contains("Head-major in sections") && default.contains("round_base + walk_slot(rnd)"));
        assert!(default.contains("return r & 1 ? n - 1 - i : i;") && default.contains("return (i + r) % n;"));
        assert!(default.contains("bh = t / m;"));
        let qbm = src(Sm90aFwdTiles {
            head_major: false,
            ..base
        });
        assert!(!qbm.contains("Head-major") && qbm.contains("t / bh_count"));
        // The ragged longest-first order maps to head-major tile numbers only.
        assert!(default.contains("constexpr bool HEAD_MAJOR = true;"));
        // The kernel's batch limit of the order (two sequences a lane) is the host mirror's.
        assert!(default.contains(&format!(
            "constexpr int RAGGED_ORDER_MAX_BATCH = {};",
            crate::plan::RAGGED_ORDER_MAX_BATCH
        )));
        assert!(
            qbm.contains("constexpr bool HEAD_MAJOR = false;") && qbm.contains("if (HEAD_MAJOR && p.ragged_order != 0")
        );
        // One tile per block only: no walk entry.
        let one = src(Sm90aFwdTiles {
            persistent: false,
            ..base
        });
        assert!(!one.contains("_walk(") && one.contains("fwd_tiles<false>") && !one.contains("fwd_tiles<true>"));
        let three = src(Sm90aFwdTiles {
            consumers: 3,
            block_n: 80,
            ..base
        });
        assert!(three.contains("constexpr int CONSUMERS = 3;") && three.contains("regs_claim<160>"));
    }

    #[test]
    fn backward_renders_every_entry_point() {
        for (s, det) in [
            ("bwd.bf16.d128.causal-br.dense.sm80", false),
            ("bwd.f16.d64.window.thd.softcap.det.sm90a", true),
        ] {
            let spec: AttnSpec = s.parse().unwrap();
            let r = render(&plan(&spec).unwrap()).unwrap();
            assert!(!r.source.contains("#include"));
            assert!(!r.source.contains("{{") && !r.source.contains("{%") && !r.source.contains("{#"));
            for (suffix, present) in [("_pre", true), ("", true), ("_dq_convert", !det), ("_dq", det)] {
                let sig = format!("{}{suffix}(const BwdParams p)", r.entry);
                assert_eq!(r.source.contains(&sig), present, "{s}: {sig}");
            }
            assert!(r.source.contains(&format!("constexpr bool DETERMINISTIC = {det};")));
        }
    }

    #[test]
    fn fingerprint_is_stable_hex() {
        let f = templates_fingerprint();
        assert_eq!(f.len(), 64);
        assert_eq!(f, templates_fingerprint());
    }
}
