//! The backend-neutral forward context, and LSE layout conversion.
//!
//! A forward returns a [`FwdContext`]: who produced it, the problem, the LSE
//! buffer and its [`LseLayout`], the resolved softmax scale, the mask
//! parameters, the dropout RNG state and the `cu_seqlens`. Any backward that
//! supports the problem consumes it; where the producer and the consumer
//! disagree on the LSE layout, [`LseConversion`] describes the conversion.
//!
//! LSE is always f32, natural log (`ln Σ exp(s·scale)`), one value per query
//! row and query head. Layouts:
//!
//! | kind     | shape (contiguous)            | element of (b, h, i)               | who                           |
//! |----------|-------------------------------|------------------------------------|-------------------------------|
//! | `Dense`  | `[batch, heads_q, seqlen_q]`  | `(b·H + h)·Sq + i`                 | every backend, dense problems |
//! | `Packed` | `[heads_q, total_q]`          | `h·total_q + cu_q[b] + i`          | generated THD, torch's FA2 varlen (2.11) |
//! | `Padded` | `[batch, heads_q, max_seqlen_q]` | `(b·H + h)·max_sq + i`, `i < len_b` | older FA2 varlen, cuDNN ragged |
//!
//! Conversions between `Packed` and `Padded` are gathers; the index mapping
//! is pure and tested on the host ([`LseConversion::gather_map`],
//! [`LseConversion::apply_host`]). On the device, a front end executes it with
//! its own tensor ops; a Rust-executed backward would need a small gather
//! kernel, which is not written yet (see docs/dispatch.md).

use std::fmt;

use thiserror::Error;

use crate::spec::{Layout, Mask};

use super::backend::{Backend, FwdCall};
use super::problem::Problem;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ContextError {
    #[error("LSE layout {from} cannot become {to}: {reason}")]
    Incompatible { from: String, to: String, reason: String },
    #[error("invalid cu_seqlens_q: {0}")]
    CuSeqlens(String),
    #[error("LSE buffer has {got} elements, the layout {layout} needs {want}")]
    BufferLength { layout: String, got: usize, want: usize },
    #[error("dropout mask was drawn by `{producer}`'s RNG; only `{producer}` can replay it, not `{consumer}`")]
    RngMismatch {
        producer: &'static str,
        consumer: &'static str,
    },
    #[error("`{backend}` writes a {kind} LSE, which does not fit a {layout} problem")]
    KindForLayout {
        backend: &'static str,
        kind: LseKind,
        layout: Layout,
    },
}

/// Which LSE layout a backend uses (see the module table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LseKind {
    Dense,
    Packed,
    Padded,
}

impl LseKind {
    /// attnforge's documented layout (`launch` docs): dense for dense
    /// problems, packed for THD.
    pub const fn natural(layout: Layout) -> LseKind {
        match layout {
            Layout::Dense => LseKind::Dense,
            Layout::Thd => LseKind::Packed,
        }
    }
}

impl fmt::Display for LseKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LseKind::Dense => "dense [B, H, Sq]",
            LseKind::Packed => "packed [H, total_q]",
            LseKind::Padded => "padded [B, H, max_seqlen_q]",
        })
    }
}

/// An LSE layout with its sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LseLayout {
    Dense { batch: u32, heads: u32, seqlen_q: u32 },
    Packed { heads: u32, total_q: u32 },
    Padded { batch: u32, heads: u32, max_seqlen_q: u32 },
}

impl LseLayout {
    /// The layout a backend of `kind` uses for `p`. Dense problems only have
    /// a dense LSE; THD problems a packed or padded one.
    pub fn for_problem(kind: LseKind, p: &Problem) -> Option<LseLayout> {
        match (p.layout, kind) {
            (Layout::Dense, LseKind::Dense) => Some(LseLayout::Dense {
                batch: p.batch,
                heads: p.heads_q,
                seqlen_q: p.seqlen_q,
            }),
            (Layout::Thd, LseKind::Packed) => Some(LseLayout::Packed {
                heads: p.heads_q,
                total_q: p.total_q,
            }),
            (Layout::Thd, LseKind::Padded) => Some(LseLayout::Padded {
                batch: p.batch,
                heads: p.heads_q,
                max_seqlen_q: p.seqlen_q,
            }),
            _ => None,
        }
    }

    pub fn kind(&self) -> LseKind {
        match self {
            LseLayout::Dense { .. } => LseKind::Dense,
            LseLayout::Packed { .. } => LseKind::Packed,
            LseLayout::Padded { .. } => LseKind::Padded,
        }
    }

    pub fn heads(&self) -> u32 {
        match *self {
            LseLayout::Dense { heads, .. } | LseLayout::Packed { heads, .. } | LseLayout::Padded { heads, .. } => heads,
        }
    }

    /// Elements in the buffer.
    pub fn len(&self) -> usize {
        match *self {
            LseLayout::Dense { batch, heads, seqlen_q } => batch as usize * heads as usize * seqlen_q as usize,
            LseLayout::Packed { heads, total_q } => heads as usize * total_q as usize,
            LseLayout::Padded {
                batch,
                heads,
                max_seqlen_q,
            } => batch as usize * heads as usize * max_seqlen_q as usize,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element offset of query row `i` of sequence `b`, head `h`; `None` when
    /// out of range. `cu` (host copy of cu_seqlens_q) is read by `Packed` and
    /// (for the row bound) `Padded`.
    pub fn offset(&self, b: u32, h: u32, i: u32, cu: &[i32]) -> Option<usize> {
        let (b, h, i) = (b as usize, h as usize, i as usize);
        match *self {
            LseLayout::Dense { batch, heads, seqlen_q } => {
                (b < batch as usize && h < heads as usize && i < seqlen_q as usize)
                    .then(|| (b * heads as usize + h) * seqlen_q as usize + i)
            }
            LseLayout::Packed { heads, total_q } => {
                let (start, len) = seq_range(cu, b)?;
                (h < heads as usize && i < len && start + len <= total_q as usize)
                    .then(|| h * total_q as usize + start + i)
            }
            LseLayout::Padded {
                batch,
                heads,
                max_seqlen_q,
            } => {
                let (_, len) = seq_range(cu, b)?;
                (b < batch as usize && h < heads as usize && i < len && i < max_seqlen_q as usize)
                    .then(|| (b * heads as usize + h) * max_seqlen_q as usize + i)
            }
        }
    }
}

impl fmt::Display for LseLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            LseLayout::Dense { batch, heads, seqlen_q } => write!(f, "dense [{batch}, {heads}, {seqlen_q}]"),
            LseLayout::Packed { heads, total_q } => write!(f, "packed [{heads}, {total_q}]"),
            LseLayout::Padded {
                batch,
                heads,
                max_seqlen_q,
            } => write!(f, "padded [{batch}, {heads}, {max_seqlen_q}]"),
        }
    }
}

fn seq_range(cu: &[i32], b: usize) -> Option<(usize, usize)> {
    let start = *cu.get(b)?;
    let end = *cu.get(b + 1)?;
    (start >= 0 && end >= start).then(|| (start as usize, (end - start) as usize))
}

/// Check a host copy of cu_seqlens_q against a layout's sizes.
fn check_cu(cu: &[i32], batch: u32, total_q: Option<u32>, max_seqlen_q: Option<u32>) -> Result<(), ContextError> {
    let err = |m: String| Err(ContextError::CuSeqlens(m));
    if cu.len() != batch as usize + 1 {
        return err(format!(
            "{} entries, expected batch + 1 = {}",
            cu.len(),
            batch as usize + 1
        ));
    }
    if cu[0] != 0 {
        return err(format!("must start at 0, starts at {}", cu[0]));
    }
    for (b, w) in cu.windows(2).enumerate() {
        if w[1] < w[0] {
            return err(format!("decreases at sequence {b} ({} -> {})", w[0], w[1]));
        }
        if let Some(m) = max_seqlen_q {
            if (w[1] - w[0]) as i64 > m as i64 {
                return err(format!(
                    "sequence {b} has {} queries, more than max_seqlen_q {m}",
                    w[1] - w[0]
                ));
            }
        }
    }
    if let Some(t) = total_q {
        if cu[batch as usize] as i64 != t as i64 {
            return err(format!("ends at {}, total_q is {t}", cu[batch as usize]));
        }
    }
    Ok(())
}

/// How to turn one LSE layout into another for the same problem.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LseConversion {
    pub from: LseLayout,
    pub to: LseLayout,
    /// Value written to padding rows (`+inf`: exp(s − lse) = 0 there).
    pub fill: f32,
}

impl LseConversion {
    /// The conversion between two layouts of one problem; errors when the
    /// layouts describe different problems or mix dense and ragged.
    pub fn new(from: LseLayout, to: LseLayout) -> Result<LseConversion, ContextError> {
        let incompatible = |reason: &str| ContextError::Incompatible {
            from: from.to_string(),
            to: to.to_string(),
            reason: reason.into(),
        };
        if from.heads() != to.heads() {
            return Err(incompatible("head counts differ"));
        }
        match (from, to) {
            (a, b) if a == b => {}
            (LseLayout::Packed { .. }, LseLayout::Padded { .. })
            | (LseLayout::Padded { .. }, LseLayout::Packed { .. }) => {}
            (LseLayout::Dense { .. }, _) | (_, LseLayout::Dense { .. }) => {
                return Err(incompatible("dense and ragged problems do not share a context"))
            }
            _ => return Err(incompatible("sizes differ")),
        }
        Ok(LseConversion {
            from,
            to,
            fill: f32::INFINITY,
        })
    }

    pub fn is_identity(&self) -> bool {
        self.from == self.to
    }

    /// Whether the device work is more than passing the pointer on.
    pub fn needs_device_work(&self) -> bool {
        !self.is_identity()
    }

    /// One line for `explain` and logs.
    pub fn describe(&self) -> String {
        if self.is_identity() {
            return format!("LSE {} consumed as is", self.from);
        }
        match (self.from, self.to) {
            (LseLayout::Packed { .. }, LseLayout::Padded { .. }) => format!(
                "LSE {} -> {}: scatter each sequence's rows to [b, h, 0..len_b), fill the rest with +inf",
                self.from, self.to
            ),
            _ => format!(
                "LSE {} -> {}: gather rows [b, h, 0..len_b) of each sequence to [h, cu_q[b]..cu_q[b+1])",
                self.from, self.to
            ),
        }
    }

    fn check_cu(&self, cu: &[i32]) -> Result<(), ContextError> {
        match (self.from, self.to) {
            (
                LseLayout::Packed { total_q, .. },
                LseLayout::Padded {
                    batch, max_seqlen_q, ..
                },
            )
            | (
                LseLayout::Padded {
                    batch, max_seqlen_q, ..
                },
                LseLayout::Packed { total_q, .. },
            ) => check_cu(cu, batch, Some(total_q), Some(max_seqlen_q)),
            _ => Ok(()),
        }
    }

    /// For every destination element, the source element it takes, or
    /// `None` for padding (`fill`). This is the whole conversion: a device
    /// kernel computes `dst[i] = map[i].map_or(fill, |j| src[j])`.
    pub fn gather_map(&self, cu: &[i32]) -> Result<Vec<Option<usize>>, ContextError> {
        self.check_cu(cu)?;
        let n = self.to.len();
        if self.is_identity() {
            return Ok((0..n).map(Some).collect());
        }
        let mut map = vec![None; n];
        match self.to {
            LseLayout::Padded {
                batch,
                heads,
                max_seqlen_q,
            } => {
                for b in 0..batch {
                    for h in 0..heads {
                        let len = (cu[b as usize + 1] - cu[b as usize]) as u32;
                        for i in 0..len {
                            let (Some(d), Some(s)) = (self.to.offset(b, h, i, cu), self.from.offset(b, h, i, cu))
                            else {
                                continue;
                            };
                            map[d] = Some(s);
                        }
                        debug_assert!(len <= max_seqlen_q);
                    }
                }
            }
            LseLayout::Packed { heads, total_q } => {
                let batch = cu.len() - 1;
                for h in 0..heads {
                    for t in 0..total_q {
                        // The sequence holding token t: the last b with cu[b] <= t.
                        let b = cu[1..].partition_point(|&end| end as u32 <= t).min(batch - 1);
                        let i = t - cu[b] as u32;
                        let d = (h * total_q + t) as usize;
                        map[d] = self.from.offset(b as u32, h, i, cu);
                    }
                }
            }
            LseLayout::Dense { .. } => {}
        }
        Ok(map)
    }

    /// The conversion on a host copy (reference for a device kernel, and for
    /// tests).
    pub fn apply_host(&self, src: &[f32], cu: &[i32]) -> Result<Vec<f32>, ContextError> {
        if src.len() != self.from.len() {
            return Err(ContextError::BufferLength {
                layout: self.from.to_string(),
                got: src.len(),
                want: self.from.len(),
            });
        }
        Ok(self
            .gather_map(cu)?
            .into_iter()
            .map(|j| j.map_or(self.fill, |j| src[j]))
            .collect())
    }
}

/// Mask parameters a backward needs to reproduce the forward's mask.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MaskParams {
    pub mask: Mask,
    /// (left, right), -1 = unbounded; window masks only.
    pub window: (i32, i32),
    /// 0 = off.
    pub softcap: f32,
}

impl MaskParams {
    /// The mask as a FlashAttention-style (left, right) window around the
    /// bottom-right diagonal, for backends that take windows (FA2's
    /// `window_size_left/right`); `None` for causal top-left on a non-square
    /// problem, which no bottom-right window expresses.
    pub fn bottom_right_window(&self, square: bool) -> Option<(i32, i32)> {
        match self.mask {
            Mask::None => Some((-1, -1)),
            Mask::CausalBottomRight => Some((-1, 0)),
            Mask::CausalTopLeft => square.then_some((-1, 0)),
            Mask::SlidingWindow => Some(self.window),
        }
    }
}

/// Dropout RNG state (Philox seed/offset as PyTorch's flash kernels take it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RngState {
    /// Values known on the host.
    Host { seed: u64, offset: u64 },
    /// Device pointers to u64 seed and offset (CUDA-graph capture).
    Device { seed_ptr: u64, offset_ptr: u64 },
}

/// What a forward leaves for a backward. See the module docs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FwdContext {
    /// The backend that ran the forward.
    pub producer: &'static str,
    pub problem: Problem,
    /// f32 LSE, natural log, in `lse_layout`.
    pub lse: u64,
    pub lse_layout: LseLayout,
    /// The softmax scale in effect (resolved default).
    pub scale: f32,
    pub mask: MaskParams,
    pub dropout_p: f32,
    pub rng: Option<RngState>,
    pub cu_seqlens_q: Option<u64>,
    pub cu_seqlens_k: Option<u64>,
}

impl FwdContext {
    /// The context of `call` run by `producer` (any backend: the front end
    /// builds one for the direct backends it executes).
    pub fn new(producer: &dyn Backend, call: &FwdCall) -> Result<FwdContext, ContextError> {
        let p = &call.problem;
        let kind = producer.lse_kind(p.layout);
        let lse_layout = LseLayout::for_problem(kind, p).ok_or(ContextError::KindForLayout {
            backend: producer.name(),
            kind,
            layout: p.layout,
        })?;
        Ok(FwdContext {
            producer: producer.name(),
            problem: *p,
            lse: call.lse,
            lse_layout,
            scale: p.scale_value(),
            mask: MaskParams {
                mask: p.mask,
                window: p.window,
                softcap: p.softcap,
            },
            dropout_p: p.dropout_p,
            rng: call.rng,
            cu_seqlens_q: call.cu_seqlens_q,
            cu_seqlens_k: call.cu_seqlens_k,
        })
    }

    /// What `consumer` needs done to this context before its backward: the
    /// LSE conversion (identity when the layouts agree). Errors when the
    /// consumer cannot replay the forward's dropout.
    pub fn for_consumer(&self, consumer: &dyn Backend) -> Result<LseConversion, ContextError> {
        if rng_rule(self.dropout_p > 0.0, self.producer, consumer.name()).is_some() {
            return Err(ContextError::RngMismatch {
                producer: self.producer,
                consumer: consumer.name(),
            });
        }
        let kind = consumer.lse_kind(self.problem.layout);
        let to = LseLayout::for_problem(kind, &self.problem).ok_or(ContextError::KindForLayout {
            backend: consumer.name(),
            kind,
            layout: self.problem.layout,
        })?;
        LseConversion::new(self.lse_layout, to)
    }
}

/// The context rule between a forward producer and a backward consumer:
/// dropout masks are regenerated from the producer's RNG stream, which only
/// the producer knows how to replay.
pub fn rng_rule(dropout: bool, producer: &str, consumer: &str) -> Option<String> {
    (dropout && producer != consumer)
        .then(|| format!("dropout mask was drawn by `{producer}`'s RNG; only `{producer}` can replay it"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_match_the_documented_formulas() {
        let cu = [0, 3, 3, 8];
        let d = LseLayout::Dense {
            batch: 2,
            heads: 4,
            seqlen_q: 10,
        };
        assert_eq!(d.offset(1, 2, 7, &[]), Some((4 + 2) * 10 + 7));
        assert_eq!(d.offset(2, 0, 0, &[]), None);
        let p = LseLayout::Packed { heads: 4, total_q: 8 };
        assert_eq!(p.offset(2, 3, 4, &cu), Some(3 * 8 + 3 + 4));
        assert_eq!(p.offset(1, 0, 0, &cu), None, "empty sequence has no rows");
        assert_eq!(p.offset(0, 0, 3, &cu), None);
        let q = LseLayout::Padded {
            batch: 3,
            heads: 4,
            max_seqlen_q: 5,
        };
        assert_eq!(q.offset(2, 1, 4, &cu), Some((2 * 4 + 1) * 5 + 4));
        assert_eq!(q.offset(2, 1, 5, &cu), None);
        assert_eq!((d.len(), p.len(), q.len()), (80, 32, 60));
    }

    fn ragged() -> (Vec<i32>, LseLayout, LseLayout) {
        // batch 4 with an empty sequence and a full-length one.
        let cu = vec![0, 2, 2, 7, 8];
        let packed = LseLayout::Packed { heads: 3, total_q: 8 };
        let padded = LseLayout::Padded {
            batch: 4,
            heads: 3,
            max_seqlen_q: 5,
        };
        (cu, packed, padded)
    }

    #[test]
    fn packed_to_padded_and_back_round_trips() {
        let (cu, packed, padded) = ragged();
        let src: Vec<f32> = (0..packed.len()).map(|i| i as f32 * 0.5).collect();
        let fwd = LseConversion::new(packed, padded).unwrap();
        let mid = fwd.apply_host(&src, &cu).unwrap();
        assert_eq!(mid.len(), padded.len());
        // (b=2, h=1, i=4) = packed h=1, token cu[2]+4 = 6.
        assert_eq!(mid[padded.offset(2, 1, 4, &cu).unwrap()], src[8 + 6]);
        // Padding rows are +inf: sequence 0 has 2 rows, row 2.. is padding.
        assert_eq!(mid[padded.offset(0, 0, 1, &cu).unwrap() + 1], f32::INFINITY);
        assert_eq!(
            mid.iter().filter(|x| x.is_infinite()).count(),
            padded.len() - packed.len()
        );
        let back = LseConversion::new(padded, packed)
            .unwrap()
            .apply_host(&mid, &cu)
            .unwrap();
        assert_eq!(back, src);
    }

    #[test]
    fn conversions_refuse_what_does_not_fit() {
        let (cu, packed, padded) = ragged();
        let dense = LseLayout::Dense {
            batch: 4,
            heads: 3,
            seqlen_q: 5,
        };
        assert!(LseConversion::new(packed, dense).is_err());
        assert!(LseConversion::new(packed, LseLayout::Packed { heads: 2, total_q: 8 }).is_err());
        assert!(LseConversion::new(packed, LseLayout::Packed { heads: 3, total_q: 9 }).is_err());
        let c = LseConversion::new(packed, padded).unwrap();
        for bad in [
            &[0, 2, 2, 7][..],
            &[1, 2, 2, 7, 8],
            &[0, 2, 1, 7, 8],
            &[0, 2, 2, 7, 9],
            &[0, 6, 6, 7, 8],
        ] {
            assert!(matches!(c.gather_map(bad), Err(ContextError::CuSeqlens(_))), "{bad:?}");
        }
        assert!(matches!(
            c.apply_host(&[0.0; 3], &cu),
            Err(ContextError::BufferLength { .. })
        ));
        let id = LseConversion::new(dense, dense).unwrap();
        assert!(id.is_identity() && !id.needs_device_work());
        assert!(id.describe().contains("as is"));
        assert!(c.describe().contains("+inf"));
    }

    #[test]
    fn windows_follow_the_bottom_right_convention() {
        let m = |mask, window| MaskParams {
            mask,
            window,
            softcap: 0.0,
        };
        assert_eq!(m(Mask::None, (-1, -1)).bottom_right_window(false), Some((-1, -1)));
        assert_eq!(
            m(Mask::CausalBottomRight, (-1, -1)).bottom_right_window(false),
            Some((-1, 0))
        );
        assert_eq!(
            m(Mask::CausalTopLeft, (-1, -1)).bottom_right_window(true),
            Some((-1, 0))
        );
        assert_eq!(m(Mask::CausalTopLeft, (-1, -1)).bottom_right_window(false), None);
        assert_eq!(
            m(Mask::SlidingWindow, (128, 0)).bottom_right_window(false),
            Some((128, 0))
        );
    }
}
