//! The [`Backend`] interface, the call structs, and the table-driven
//! capability rules that backends describe themselves with.
//!
//! A backend answers one question purely — [`Backend::supports`] for a
//! direction and a [`ProblemKey`] — and offers two entry points,
//! [`Backend::call_fwd`] and [`Backend::call_bwd`]; either may be left at its
//! default, which declines with [`DispatchError::DirectionUnsupported`].
//!
//! Capabilities are data ([`Caps`]); [`RULES`] is the one list of checks that
//! reads them, in order, and the first failing rule gives the decline reason.
//! Backend-specific exceptions are [`Quirk`] rows, not branches.

use std::fmt;

use crate::launch::TensorArg;
use crate::spec::{AttnSpec, Direction, Layout, Mask};

use super::context::{FwdContext, LseKind, RngState};
use super::error::DispatchError;
use super::policy::Policy;
use super::problem::{ComputeCapability, ElemType, Problem, ProblemKey};

/// Who executes a backend's kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// attnforge's own generated kernels, launched from Rust.
    Generated,
    /// A descriptor registered by a front end, which executes the kernel
    /// itself (e.g. PyTorch's flash / cuDNN SDPA through `torch.ops.aten`).
    FrontEnd,
    /// A library called from Rust (the cuDNN graph backend, later).
    Native,
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Generated => "generated",
            BackendKind::FrontEnd => "executed by the front end",
            BackendKind::Native => "native library",
        })
    }
}

/// What a backend says when it accepts a problem.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Support {
    /// The generated kernel's spec, when there is one.
    pub spec: Option<AttnSpec>,
    /// One line for `explain` (e.g. which template).
    pub note: Option<String>,
}

/// A device buffer for scratch space (`bytes` from [`Backend::workspace_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Workspace {
    pub ptr: u64,
    pub bytes: usize,
}

/// An additive attention bias / mask tensor `[b, h, sq, sk]` (strides in
/// elements; broadcast dims have stride 0). Only backends with
/// `Caps::attn_mask` take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BiasArg {
    pub ptr: u64,
    pub strides: [i64; 4],
}

/// Everything a forward needs: the problem, device pointers, the stream.
#[derive(Debug, Clone, PartialEq)]
pub struct FwdCall {
    pub problem: Problem,
    pub q: TensorArg,
    pub k: TensorArg,
    pub v: TensorArg,
    pub o: TensorArg,
    /// f32 LSE output in the producing backend's layout (see `context`);
    /// 0 = not wanted (inference): the generated forward then writes O only,
    /// and a backward refuses the call's context (its LSE pointer is null).
    pub lse: u64,
    /// THD: int32 `[batch + 1]` prefix sums on the device.
    pub cu_seqlens_q: Option<u64>,
    pub cu_seqlens_k: Option<u64>,
    pub attn_bias: Option<BiasArg>,
    /// Dropout RNG state, when `dropout_p > 0`.
    pub rng: Option<RngState>,
    pub workspace: Workspace,
    /// `CUstream` as an integer; 0 = the legacy default stream.
    pub stream: usize,
}

impl FwdCall {
    /// A call with no cu_seqlens, bias, RNG or workspace, on the default stream.
    pub fn new(problem: Problem, q: TensorArg, k: TensorArg, v: TensorArg, o: TensorArg, lse: u64) -> Self {
        FwdCall {
            problem,
            q,
            k,
            v,
            o,
            lse,
            cu_seqlens_q: None,
            cu_seqlens_k: None,
            attn_bias: None,
            rng: None,
            workspace: Workspace::default(),
            stream: 0,
        }
    }
}

/// A backward's own buffers; the rest (problem, LSE, cu_seqlens, RNG, scale,
/// mask) comes from the [`FwdContext`].
#[derive(Debug, Clone, PartialEq)]
pub struct BwdCall {
    pub d_o: TensorArg,
    pub q: TensorArg,
    pub k: TensorArg,
    pub v: TensorArg,
    pub o: TensorArg,
    pub dq: TensorArg,
    pub dk: TensorArg,
    pub dv: TensorArg,
    pub attn_bias: Option<BiasArg>,
    pub workspace: Workspace,
    pub stream: usize,
}

/// One way of computing attention. See the module docs.
pub trait Backend: Send + Sync + fmt::Debug {
    /// Stable name, used in policies and logs (`generated`, `torch-flash`).
    fn name(&self) -> &'static str;

    fn kind(&self) -> BackendKind;

    /// Told the dispatcher's policy when registered and on every policy
    /// change, before any decision under it (the generated backend keeps its
    /// instruction path from it).
    fn apply_policy(&self, _policy: &Policy) {}

    /// Pure: whether this backend takes the problem in this direction, or the
    /// one-line reason it declines.
    fn supports(&self, direction: Direction, key: &ProblemKey) -> Result<Support, String>;

    /// The LSE layout this backend writes (forward) and reads (backward).
    fn lse_kind(&self, layout: Layout) -> LseKind {
        LseKind::natural(layout)
    }

    /// Scratch bytes a call needs (the front end allocates them).
    fn workspace_bytes(&self, _direction: Direction, _problem: &Problem) -> usize {
        0
    }

    /// Run the forward; returns the context a backward consumes.
    fn call_fwd(&self, _call: &FwdCall, _support: &Support) -> Result<FwdContext, DispatchError> {
        Err(DispatchError::DirectionUnsupported {
            backend: self.name(),
            direction: Direction::Fwd,
        })
    }

    /// Run the backward on a context from any backend's forward.
    fn call_bwd(&self, _call: &BwdCall, _ctx: &FwdContext, _support: &Support) -> Result<(), DispatchError> {
        Err(DispatchError::DirectionUnsupported {
            backend: self.name(),
            direction: Direction::Bwd,
        })
    }
}

/// When a mask is accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaskWhen {
    Always,
    /// Only when seqlen_q == seqlen_k for every sequence (top-left and
    /// bottom-right causal coincide there).
    SquareOnly,
}

/// One accepted mask; `why` is the decline reason when `when` fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaskRule {
    pub mask: Mask,
    pub when: MaskWhen,
    pub why: &'static str,
}

/// Head-dim limit for a compute-capability range (inclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadDimLimit {
    pub cc: (ComputeCapability, ComputeCapability),
    pub fwd_max: u32,
    pub bwd_max: u32,
}

/// Head-dim constraints. `limits`: the first row whose range holds the
/// device applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadDims {
    pub multiple_of: u32,
    pub equal_qk_v: bool,
    pub limits: &'static [HeadDimLimit],
}

/// A backend-specific exception: returns the decline reason when it applies.
#[derive(Clone, Copy)]
pub struct Quirk {
    /// Where the fact comes from (shown in docs and `Debug`).
    pub source: &'static str,
    pub check: fn(&ProblemKey, Direction) -> Option<String>,
}

impl fmt::Debug for Quirk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.source)
    }
}

/// What a backend supports, as data.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    pub fwd: bool,
    pub bwd: bool,
    pub dtypes: &'static [ElemType],
    /// Inclusive range of compute capabilities.
    pub cc: (ComputeCapability, ComputeCapability),
    /// `None`: the backend checks head dims itself (the planner does for the
    /// generated backend).
    pub head_dims: Option<HeadDims>,
    pub layouts: &'static [Layout],
    pub masks: &'static [MaskRule],
    pub softcap: bool,
    pub dropout: bool,
    /// An arbitrary attn_mask / additive bias tensor.
    pub attn_mask: bool,
    /// heads_q != heads_kv without expanding K/V.
    pub gqa: bool,
    /// A bitwise-repeatable backward.
    pub deterministic_bwd: bool,
    pub quirks: &'static [Quirk],
}

/// Every mask, always.
pub const ALL_MASKS: &[MaskRule] = &[
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
        when: MaskWhen::Always,
        why: "",
    },
    MaskRule {
        mask: Mask::SlidingWindow,
        when: MaskWhen::Always,
        why: "",
    },
];

type RuleFn = fn(&Caps, &ProblemKey, Direction) -> Option<String>;

fn join<T: fmt::Display>(items: &[T]) -> String {
    items.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
}

/// The rule set, in evaluation order: (name, check). Each check reads one
/// field of [`Caps`] and returns the decline reason, or `None`.
pub const RULES: &[(&str, RuleFn)] = &[
    ("direction", |c, _, dir| {
        let ok = match dir {
            Direction::Fwd => c.fwd,
            Direction::Bwd => c.bwd,
        };
        (!ok).then(|| format!("{dir} not implemented by this backend"))
    }),
    ("dtype", |c, k, _| {
        (!c.dtypes.contains(&k.dtype)).then(|| format!("dtype {} unsupported ({} only)", k.dtype, join(c.dtypes)))
    }),
    ("arch", |c, k, _| {
        (!k.cc.within(c.cc.0, c.cc.1)).then(|| format!("{} outside the supported range {}..{}", k.cc, c.cc.0, c.cc.1))
    }),
    ("head_dim", |c, k, dir| {
        let h = c.head_dims?;
        if h.equal_qk_v && k.head_dim_qk != k.head_dim_v {
            return Some(format!(
                "head_dim_qk {} != head_dim_v {} unsupported (q, k and v head dims must match)",
                k.head_dim_qk, k.head_dim_v
            ));
        }
        for d in [k.head_dim_qk, k.head_dim_v] {
            if !d.is_multiple_of(h.multiple_of) {
                return Some(format!("head dim {d} is not a multiple of {}", h.multiple_of));
            }
        }
        let Some(lim) = h.limits.iter().find(|l| k.cc.within(l.cc.0, l.cc.1)) else {
            return Some(format!("no head-dim limit known for {}", k.cc));
        };
        let max = if dir == Direction::Fwd {
            lim.fwd_max
        } else {
            lim.bwd_max
        };
        let d = k.head_dim_qk.max(k.head_dim_v);
        (d > max).then(|| format!("head dim {d} > {max} ({dir} limit on {})", k.cc))
    }),
    ("layout", |c, k, _| {
        (!c.layouts.contains(&k.layout)).then(|| match k.layout {
            Layout::Thd => "ragged THD layout unsupported".to_string(),
            Layout::Dense => "dense layout unsupported".to_string(),
        })
    }),
    ("mask", |c, k, _| match c.masks.iter().find(|m| m.mask == k.mask) {
        None => Some(format!("{} mask unsupported", k.mask)),
        Some(m) if m.when == MaskWhen::SquareOnly && !k.square => Some(m.why.to_string()),
        Some(_) => None,
    }),
    ("softcap", |c, k, _| {
        (k.softcap && !c.softcap).then(|| "softcap unsupported".into())
    }),
    ("dropout", |c, k, _| {
        (k.dropout && !c.dropout).then(|| "dropout unsupported".into())
    }),
    ("attn_mask", |c, k, _| {
        (k.attn_mask && !c.attn_mask).then(|| "arbitrary attn_mask unsupported".into())
    }),
    ("gqa", |c, k, _| {
        (k.gqa && !c.gqa).then(|| "GQA/MQA (heads_q != heads_kv) unsupported".into())
    }),
    ("deterministic", |c, k, dir| {
        (dir == Direction::Bwd && k.deterministic && !c.deterministic_bwd)
            .then(|| "deterministic backward unsupported".into())
    }),
    ("quirks", |c, k, dir| c.quirks.iter().find_map(|q| (q.check)(k, dir))),
];

impl Caps {
    /// The first rule this problem breaks, as a one-line reason.
    pub fn check(&self, key: &ProblemKey, direction: Direction) -> Result<(), String> {
        match RULES.iter().find_map(|(_, rule)| rule(self, key, direction)) {
            Some(reason) => Err(reason),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CC80: ComputeCapability = ComputeCapability::new(8, 0);
    const CC90: ComputeCapability = ComputeCapability::new(9, 0);

    const CAPS: Caps = Caps {
        fwd: true,
        bwd: false,
        dtypes: &[ElemType::Bf16],
        cc: (CC80, CC90),
        head_dims: Some(HeadDims {
            multiple_of: 8,
            equal_qk_v: true,
            limits: &[
                HeadDimLimit {
                    cc: (CC80, CC80),
                    fwd_max: 128,
                    bwd_max: 64,
                },
                HeadDimLimit {
                    cc: (CC90, CC90),
                    fwd_max: 256,
                    bwd_max: 256,
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
                when: MaskWhen::SquareOnly,
                why: "needs square",
            },
        ],
        softcap: false,
        dropout: false,
        attn_mask: false,
        gqa: false,
        deterministic_bwd: false,
        quirks: &[Quirk {
            source: "test",
            check: |k, _| (k.head_dim_qk == 72).then(|| "72 is cursed".into()),
        }],
    };

    fn key() -> ProblemKey {
        Problem::dense(ElemType::Bf16, 128, 1, 4, 4, 64, 64, CC90).key()
    }

    #[test]
    fn each_rule_declines_with_its_reason() {
        let k = key();
        assert_eq!(CAPS.check(&k, Direction::Fwd), Ok(()));
        let m = |f: fn(&mut ProblemKey)| {
            let mut x = k;
            f(&mut x);
            x
        };
        let fwd = Direction::Fwd;
        let cases: Vec<(ProblemKey, Direction, &str)> = vec![
            (k, Direction::Bwd, "bwd not implemented"),
            (m(|k| k.dtype = ElemType::F16), fwd, "dtype f16 unsupported (bf16 only)"),
            (m(|k| k.cc = ComputeCapability::new(7, 5)), fwd, "sm75 outside"),
            (m(|k| k.head_dim_v = 64), fwd, "must match"),
            (m(|k| (k.head_dim_qk, k.head_dim_v) = (100, 100)), fwd, "multiple of 8"),
            (m(|k| k.cc = CC80), fwd, ""), // 128 is fine on sm80
            (
                m(|k| (k.head_dim_qk, k.head_dim_v, k.cc) = (256, 256, CC80)),
                fwd,
                "256 > 128",
            ),
            (m(|k| k.cc = ComputeCapability::new(8, 6)), fwd, "no head-dim limit"),
            (m(|k| k.layout = Layout::Thd), fwd, "ragged THD"),
            (m(|k| k.mask = Mask::SlidingWindow), fwd, "window mask unsupported"),
            (m(|k| k.mask = Mask::CausalTopLeft), fwd, "needs square"),
            (m(|k| (k.mask, k.square) = (Mask::CausalTopLeft, true)), fwd, ""),
            (m(|k| k.softcap = true), fwd, "softcap unsupported"),
            (m(|k| k.dropout = true), fwd, "dropout unsupported"),
            (m(|k| k.attn_mask = true), fwd, "arbitrary attn_mask unsupported"),
            (m(|k| k.gqa = true), fwd, "GQA"),
            (m(|k| (k.head_dim_qk, k.head_dim_v) = (72, 72)), fwd, "cursed"),
        ];
        for (key, dir, want) in cases {
            let got = CAPS.check(&key, dir);
            if want.is_empty() {
                assert_eq!(got, Ok(()), "{key}");
            } else {
                let reason = got.unwrap_err();
                assert!(reason.contains(want), "{key}: {reason:?} lacks {want:?}");
            }
        }
    }

    #[test]
    fn rules_have_unique_names() {
        let mut names: Vec<_> = RULES.iter().map(|(n, _)| *n).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), RULES.len());
    }
}
