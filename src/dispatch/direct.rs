//! "Direct" backends: descriptors of kernels a front end executes itself.
//!
//! For torch these are PyTorch's own FlashAttention-2 and cuDNN SDPA kernels,
//! reached through `torch.ops.aten`. In Rust they are a name, capability data
//! and an LSE layout; `call_fwd` / `call_bwd` return
//! [`DispatchError::ExecutedByFrontEnd`]: the Python layer runs them after the
//! core has chosen them.
//!
//! The capability facts below are **PyTorch SDPA behaviour**, read from
//! `aten/src/ATen/native/transformers/cuda/sdp_utils.cpp` (`can_use_flash_attention`,
//! `can_use_cudnn_attention` and their `check_*` filters) and the aten ops'
//! signatures; each row cites the filter it encodes. They are deliberately
//! conservative where torch versions differ: a decline costs a slower
//! backend, a wrong accept costs a crash.
//!
//! Checked on an H200 with torch 2.11.0+cu130 / cuDNN 9.19 (2026-12-02,
//! `torch.nn.attention.sdpa_kernel` per backend and the aten ops): flash
//! declines non-square `is_causal`, attn_mask and q/k ≠ v head dims; takes
//! GQA, dropout (with backward), d = 256 backward, deterministic backward, and
//! `window_size_left/right`; its varlen LSE is packed `[H, total_q]`. cuDNN
//! takes an attn_mask bias, GQA, d = 256 forward and backward; its `is_causal`
//! is top-left; its LSE is `[B, H, Sq, 1]`, natural log; it declines
//! deterministic mode. That torch also accepted cuDNN dropout (p = 0.125) and
//! d = 192/192 backward, which the rows below still decline (older and newer
//! torch/cuDNN pairs do not).

use crate::spec::{Direction, Layout, Mask};

use super::backend::{Backend, BackendKind, Caps, HeadDimLimit, HeadDims, MaskRule, MaskWhen, Quirk, Support};
use super::context::LseKind;
use super::problem::{ComputeCapability as Cc, ElemType, ProblemKey};
use super::{BwdCall, DispatchError, FwdCall, FwdContext};

/// A front-end-executed backend: name, capabilities, LSE layout for THD.
#[derive(Debug, Clone, Copy)]
pub struct DirectBackend {
    pub name: &'static str,
    pub caps: Caps,
    /// The LSE layout its ragged (varlen) ops write and read.
    pub thd_lse: LseKind,
}

impl DirectBackend {
    pub const fn new(name: &'static str, caps: Caps, thd_lse: LseKind) -> Self {
        DirectBackend { name, caps, thd_lse }
    }

    /// PyTorch's FlashAttention-2 (`aten::_flash_attention_forward/backward`).
    pub const fn torch_flash() -> Self {
        Self::new(TORCH_FLASH, TORCH_FLASH_CAPS, LseKind::Packed)
    }

    /// PyTorch's cuDNN SDPA (`aten::_scaled_dot_product_cudnn_attention`).
    pub const fn torch_cudnn() -> Self {
        Self::new(TORCH_CUDNN, TORCH_CUDNN_CAPS, LseKind::Dense)
    }

    /// The same backend with another THD LSE layout (a front end on a torch
    /// whose varlen flash ops use the padded `[B, H, max_seqlen_q]` LSE).
    pub const fn with_thd_lse(mut self, kind: LseKind) -> Self {
        self.thd_lse = kind;
        self
    }
}

impl Backend for DirectBackend {
    fn name(&self) -> &'static str {
        self.name
    }

    fn kind(&self) -> BackendKind {
        BackendKind::FrontEnd
    }

    fn supports(&self, direction: Direction, key: &ProblemKey) -> Result<Support, String> {
        self.caps.check(key, direction).map(|()| Support::default())
    }

    fn lse_kind(&self, layout: Layout) -> LseKind {
        match layout {
            Layout::Dense => LseKind::Dense,
            Layout::Thd => self.thd_lse,
        }
    }

    fn call_fwd(&self, _call: &FwdCall, _support: &Support) -> Result<FwdContext, DispatchError> {
        Err(DispatchError::ExecutedByFrontEnd {
            backend: self.name,
            direction: Direction::Fwd,
        })
    }

    fn call_bwd(&self, _call: &BwdCall, _ctx: &FwdContext, _support: &Support) -> Result<(), DispatchError> {
        Err(DispatchError::ExecutedByFrontEnd {
            backend: self.name,
            direction: Direction::Bwd,
        })
    }
}

pub const TORCH_FLASH: &str = "torch-flash";
pub const TORCH_CUDNN: &str = "torch-cudnn";

const F16_BF16: &[ElemType] = &[ElemType::F16, ElemType::Bf16];

/// PyTorch SDPA behaviour, flash backend (FA2):
/// - dtypes f16/bf16 (`check_dtypes_flash_attention`);
/// - sm80..sm121 (`check_flash_attention_hardware_support`);
/// - q/k/v head dims equal and ≤ 256 (`check_head_dim_size_flash`); we also
///   require multiples of 8 (torch pads other sizes, which we do not model);
/// - no attn_mask (`check_for_attn_mask`); GQA yes (`check_batch_size_and_num_heads_dense<supports_gqa=true>`);
/// - `is_causal` is top-left in SDPA, while FA2's own causal is bottom-right, so
///   SDPA declines non-square causal (`check_flash_causal_non_square_seqlens`);
///   bottom-right goes through `aten::_flash_attention_forward(is_causal=True)`
///   (and the varlen form with `cum_seq_q/k`), which is where ragged THD goes too;
/// - sliding windows through that op's `window_size_left/right`;
/// - softcap: none (torch passes `softcap = 0`);
/// - dropout yes; deterministic backward yes (`_flash_attention_backward`
///   takes `deterministic` from `torch.use_deterministic_algorithms`);
/// - training on sm86/sm89/sm12x: no backward for d ∈ (192, 224], nor for
///   d ∈ (224, 256] with dropout
///   (`check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120`).
pub const TORCH_FLASH_CAPS: Caps = Caps {
    fwd: true,
    bwd: true,
    dtypes: F16_BF16,
    cc: (Cc::new(8, 0), Cc::new(12, 1)),
    head_dims: Some(HeadDims {
        multiple_of: 8,
        equal_qk_v: true,
        limits: &[HeadDimLimit {
            cc: (Cc::new(8, 0), Cc::new(12, 1)),
            fwd_max: 256,
            bwd_max: 256,
        }],
    }),
    layouts: &[Layout::Dense, Layout::Thd],
    masks: &[
        MaskRule {
            mask: Mask::None,
            when: MaskWhen::Always,
            why: "",
        },
        MaskRule {
            mask: Mask::CausalTopLeft,
            when: MaskWhen::SquareOnly,
            why: "causal top-left with seqlen_q != seqlen_k unsupported (FA2's causal is bottom-right; \
                  torch declines is_causal for non-square)",
        },
        MaskRule {
            mask: Mask::CausalBottomRight,
            when: MaskWhen::Always,
            why: "",
        },
        MaskRule {
            mask: Mask::SlidingWindow,
            when: MaskWhen::Always,
            why: "",
        },
    ],
    softcap: false,
    dropout: true,
    attn_mask: false,
    gqa: true,
    deterministic_bwd: true,
    quirks: &[Quirk {
        source: "sdp_utils.cpp check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120",
        check: |k, dir| {
            let consumer_gpu = k.cc.within(Cc::new(8, 6), Cc::new(8, 9)) || k.cc.within(Cc::new(12, 0), Cc::new(12, 1));
            let d = k.head_dim_qk;
            let gap = (d > 192 && d <= 224) || (d > 224 && k.dropout);
            (dir == Direction::Bwd && consumer_gpu && gap).then(|| {
                format!(
                    "backward with head dim {d}{} unsupported on {} (FA2 on sm86/89/12x)",
                    if k.dropout { " and dropout" } else { "" },
                    k.cc
                )
            })
        },
    }],
};

/// PyTorch SDPA behaviour, cuDNN backend:
/// - dtypes f16/bf16 (`check_dtypes_low_precision`); sm80..sm121
///   (`check_cudnn_hardware_support`);
/// - head dims multiples of 8, q/k and v may differ; ≤ 128, ≤ 256 forward on
///   sm90/sm10x with a recent cuDNN; backward ≤ 128 (sm90/10x also take
///   exactly (192, 128) and (256, 256)) (`check_cudnn_tensor_shapes`,
///   `check_cudnn_d256_bprop_head_dim`);
/// - arbitrary attn_mask yes (`check_attn_mask_shape`); GQA yes
///   (`check_batch_size_and_num_heads_dense<supports_gqa=true>`);
/// - causal is top-left (cuDNN's causal mask); bottom-right only where it
///   coincides (square); no sliding window, no softcap;
/// - dense only (ragged nested tensors are experimental behind
///   `TORCH_CUDNN_SDPA_NESTED_TENSOR_ENABLED`);
/// - dropout: declined — kept simple: cuDNN < 8.9.6 and 9.11–9.13 have none in
///   torch, and p must be a multiple of 1/16 (`check_cudnn_dropout`);
/// - not deterministic (`check_cudnn_deterministic`).
pub const TORCH_CUDNN_CAPS: Caps = Caps {
    fwd: true,
    bwd: true,
    dtypes: F16_BF16,
    cc: (Cc::new(8, 0), Cc::new(12, 1)),
    head_dims: Some(HeadDims {
        multiple_of: 8,
        equal_qk_v: false,
        limits: &[
            HeadDimLimit {
                cc: (Cc::new(9, 0), Cc::new(9, 0)),
                fwd_max: 256,
                bwd_max: 256,
            },
            HeadDimLimit {
                cc: (Cc::new(10, 0), Cc::new(10, 9)),
                fwd_max: 256,
                bwd_max: 256,
            },
            HeadDimLimit {
                cc: (Cc::new(8, 0), Cc::new(12, 1)),
                fwd_max: 128,
                bwd_max: 128,
            },
        ],
    }),
    layouts: &[Layout::Dense],
    masks: &[
        MaskRule {
            mask: Mask::None,
            when: MaskWhen::Always,
            why: "",
        },
        MaskRule {
            mask: Mask::CausalTopLeft,
            when: MaskWhen::Always,
            why: "",
        },
        MaskRule {
            mask: Mask::CausalBottomRight,
            when: MaskWhen::SquareOnly,
            why: "causal bottom-right with seqlen_q != seqlen_k unsupported (torch's cuDNN causal is top-left)",
        },
    ],
    softcap: false,
    dropout: false,
    attn_mask: true,
    gqa: true,
    deterministic_bwd: false,
    quirks: &[Quirk {
        source: "sdp_utils.cpp check_cudnn_d256_bprop_head_dim",
        check: |k, dir| {
            let (q, v) = (k.head_dim_qk, k.head_dim_v);
            let ok = (q <= 128 && v <= 128) || (q, v) == (192, 128) || (q, v) == (256, 256);
            (dir == Direction::Bwd && !ok)
                .then(|| format!("backward with head dims {q}/{v} unsupported (<= 128, 192/128 or 256/256 only)"))
        },
    }],
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::problem::Problem;

    fn p(d: u32, cc: Cc) -> Problem {
        Problem::dense(ElemType::Bf16, d, 2, 8, 8, 512, 512, cc)
    }

    const SM80: Cc = Cc::new(8, 0);
    const SM86: Cc = Cc::new(8, 6);
    const SM90: Cc = Cc::new(9, 0);

    fn fwd(b: &DirectBackend, p: Problem) -> Result<Support, String> {
        b.supports(Direction::Fwd, &p.key())
    }
    fn bwd(b: &DirectBackend, p: Problem) -> Result<Support, String> {
        b.supports(Direction::Bwd, &p.key())
    }

    #[test]
    fn torch_flash_facts() {
        let f = DirectBackend::torch_flash();
        assert!(fwd(&f, p(256, SM80)).is_ok());
        assert!(fwd(&f, p(128, SM80).with_dropout(0.1)).is_ok());
        assert!(fwd(&f, p(128, SM80).with_attn_mask())
            .unwrap_err()
            .contains("attn_mask"));
        assert!(fwd(&f, p(192, SM80).with_head_dim_v(128))
            .unwrap_err()
            .contains("must match"));
        assert!(fwd(&f, p(128, SM80).with_softcap(30.0))
            .unwrap_err()
            .contains("softcap"));
        let mut nonsq = p(128, SM90).with_mask(Mask::CausalTopLeft);
        nonsq.seqlen_k = 1024;
        assert!(fwd(&f, nonsq).unwrap_err().contains("top-left"));
        assert!(fwd(&f, nonsq.with_mask(Mask::CausalBottomRight)).is_ok());
        assert!(
            fwd(&f, p(128, SM90).with_mask(Mask::CausalTopLeft)).is_ok(),
            "square top-left is fine"
        );
        assert!(bwd(&f, p(128, SM90).with_deterministic()).is_ok());
        // sm86 training gap.
        assert!(bwd(&f, p(208, SM86)).unwrap_err().contains("sm86"));
        assert!(bwd(&f, p(256, SM86)).is_ok());
        assert!(bwd(&f, p(256, SM86).with_dropout(0.1)).unwrap_err().contains("dropout"));
        assert!(bwd(&f, p(208, SM90)).is_ok());
        assert!(fwd(&f, p(208, SM86)).is_ok(), "the gap is a backward limit");
    }

    #[test]
    fn torch_cudnn_facts() {
        let c = DirectBackend::torch_cudnn();
        assert!(fwd(&c, p(128, SM80).with_attn_mask()).is_ok());
        assert!(fwd(&c, p(256, SM80)).unwrap_err().contains("256 > 128"));
        assert!(fwd(&c, p(256, SM90)).is_ok());
        assert!(bwd(&c, p(256, SM90)).is_ok());
        assert!(bwd(&c, p(192, SM90)).unwrap_err().contains("192/192"));
        assert!(bwd(&c, p(192, SM90).with_head_dim_v(128)).is_ok());
        assert!(fwd(&c, p(128, SM90).with_dropout(0.1)).unwrap_err().contains("dropout"));
        assert!(bwd(&c, p(128, SM90).with_deterministic())
            .unwrap_err()
            .contains("deterministic"));
        let thd = Problem::thd(ElemType::Bf16, 128, 2, 8, 8, (512, 600), (512, 600), SM90);
        assert!(fwd(&c, thd).unwrap_err().contains("THD"));
        let mut br = p(128, SM90).with_mask(Mask::CausalBottomRight);
        assert!(fwd(&c, br).is_ok());
        br.seqlen_q = 100;
        assert!(fwd(&c, br).unwrap_err().contains("bottom-right"));
        assert!(fwd(&c, p(128, SM90).with_window(64, 0)).unwrap_err().contains("window"));
    }
}
