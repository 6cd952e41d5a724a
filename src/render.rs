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
use crate::plan::KernelPlan;
use crate::spec::{DType, Layout, Mask};

/// Every template file, by the name templates include it with.
pub const TEMPLATES: &[(&str, &str)] = &[
    ("fwd_sm80.cu", include_str!("../templates/fwd_sm80.cu")),
    ("common/ptx.cuh", include_str!("../templates/common/ptx.cuh")),
    ("common/mask.cuh", include_str!("../templates/common/mask.cuh")),
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
    let cx = FwdContext {
        spec: spec.to_string(),
        entry: plan.entry.clone(),
        ptx_type: match spec.dtype {
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
        },
        block_m: plan.block_m,
        block_n: plan.block_n,
        num_warps: plan.num_warps,
        m_tiles: plan.m_tiles_per_warp,
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
    };
    let name = plan.template.file();
    let context = Context::from_serialize(&cx).map_err(|e| RenderError {
        template: name.into(),
        message: e.to_string(),
    })?;
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
    fn fingerprint_is_stable_hex() {
        let f = templates_fingerprint();
        assert_eq!(f.len(), 64);
        assert_eq!(f, templates_fingerprint());
    }
}
