//! The problem descriptor: one attention call as the dispatcher sees it.
//!
//! [`Problem`] is the whole call (shapes, run-time values, flags, the device's
//! compute capability). [`ProblemKey`] is the part of it that decisions may
//! depend on; the memo is keyed by it, so a decision *cannot* depend on a
//! sequence length or a scale value by construction. Varying `seqlen` or
//! batch (ragged training) reuses one decision.

use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher};
use std::str::FromStr;

use thiserror::Error;

use crate::spec::{Arch, AttnSpec, DType, Direction, Layout, Mask};

/// A problem that no backend should see: the reason names the field.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("invalid problem: `{field}` {reason}")]
pub struct ProblemError {
    pub field: &'static str,
    pub reason: String,
}

fn bad(field: &'static str, reason: impl Into<String>) -> ProblemError {
    ProblemError {
        field,
        reason: reason.into(),
    }
}

/// Element type of Q/K/V/O as the caller has them. `F32` exists so that a
/// front end can ask, and be told why nothing here takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ElemType {
    F16,
    Bf16,
    F32,
}

impl ElemType {
    pub const ALL: &'static [ElemType] = &[ElemType::F16, ElemType::Bf16, ElemType::F32];

    pub const fn token(self) -> &'static str {
        match self {
            ElemType::F16 => "f16",
            ElemType::Bf16 => "bf16",
            ElemType::F32 => "f32",
        }
    }

    /// The spec dtype, for the types the generated kernels take.
    pub const fn spec_dtype(self) -> Option<DType> {
        match self {
            ElemType::F16 => Some(DType::F16),
            ElemType::Bf16 => Some(DType::Bf16),
            ElemType::F32 => None,
        }
    }
}

impl From<DType> for ElemType {
    fn from(d: DType) -> Self {
        match d {
            DType::F16 => ElemType::F16,
            DType::Bf16 => ElemType::Bf16,
        }
    }
}

impl fmt::Display for ElemType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.token())
    }
}

impl FromStr for ElemType {
    type Err = ProblemError;
    fn from_str(s: &str) -> Result<Self, ProblemError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f16" | "fp16" | "float16" | "half" => Ok(ElemType::F16),
            "bf16" | "bfloat16" => Ok(ElemType::Bf16),
            "f32" | "fp32" | "float32" | "float" => Ok(ElemType::F32),
            other => Err(bad("dtype", format!("`{other}`: allowed values are f16, bf16, f32"))),
        }
    }
}

/// A device's compute capability (`major.minor`), e.g. 9.0 for H100/H200.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ComputeCapability {
    pub major: u8,
    pub minor: u8,
}

impl ComputeCapability {
    pub const fn new(major: u8, minor: u8) -> Self {
        ComputeCapability { major, minor }
    }

    /// The capability a spec arch targets (sm90a → 9.0).
    pub const fn of_arch(arch: Arch) -> Self {
        match arch {
            Arch::Sm80 => Self::new(8, 0),
            Arch::Sm86 => Self::new(8, 6),
            Arch::Sm89 => Self::new(8, 9),
            Arch::Sm90a => Self::new(9, 0),
        }
    }

    /// The generated kernels' arch for this device, if we target it.
    pub const fn arch(self) -> Option<Arch> {
        Arch::from_compute_capability(self.major as i32, self.minor as i32)
    }

    /// `lo <= self <= hi`.
    pub fn within(self, lo: ComputeCapability, hi: ComputeCapability) -> bool {
        lo <= self && self <= hi
    }
}

impl fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sm{}{}", self.major, self.minor)
    }
}

impl FromStr for ComputeCapability {
    type Err = ProblemError;
    /// Accepts `sm90a`, `sm90`, `sm_90`, `sm100`, `9.0`.
    fn from_str(s: &str) -> Result<Self, ProblemError> {
        let err = || {
            bad(
                "arch",
                format!("`{s}`: expected smXY[a] (sm80, sm86, sm89, sm90a, sm100, ...) or X.Y (9.0)"),
            )
        };
        let t = s.trim().to_ascii_lowercase();
        if let Some((ma, mi)) = t.split_once('.') {
            let major: u8 = ma.parse().map_err(|_| err())?;
            let minor: u8 = mi.parse().map_err(|_| err())?;
            if major == 0 || minor > 9 {
                return Err(err());
            }
            return Ok(Self::new(major, minor));
        }
        let digits = t
            .strip_prefix("sm_")
            .or_else(|| t.strip_prefix("sm"))
            .ok_or_else(err)?
            .trim_end_matches(['a', 'f']);
        if !(2..=3).contains(&digits.len()) || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err());
        }
        let n: u16 = digits.parse().map_err(|_| err())?;
        let (major, minor) = ((n / 10) as u8, (n % 10) as u8);
        if major == 0 {
            return Err(err());
        }
        Ok(Self::new(major, minor))
    }
}

/// One attention call: shapes, run-time values and what the caller needs.
///
/// Tensor conventions follow [`crate::launch`] (dense `[b, s, h, d]` with any
/// strides, or ragged THD with `cu_seqlens`); pointers travel separately in
/// [`crate::dispatch::FwdCall`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Problem {
    pub dtype: ElemType,
    pub head_dim_qk: u32,
    pub head_dim_v: u32,
    pub layout: Layout,
    pub batch: u32,
    pub heads_q: u32,
    pub heads_kv: u32,
    /// Dense: the sequence lengths. THD: the maximum lengths over the batch.
    pub seqlen_q: u32,
    pub seqlen_k: u32,
    /// THD only: total tokens (`cu_seqlens[batch]`).
    pub total_q: u32,
    pub total_k: u32,
    pub mask: Mask,
    /// Sliding window (left, right), -1 = unbounded; `Mask::SlidingWindow` only.
    pub window: (i32, i32),
    /// Softcap value; 0 = off.
    pub softcap: f32,
    /// Softmax scale; `None` = 1/sqrt(head_dim_qk).
    pub scale: Option<f32>,
    /// Dropout probability; 0 = off.
    pub dropout_p: f32,
    /// An arbitrary `attn_mask` (additive bias or boolean mask tensor) is given.
    pub attn_mask: bool,
    /// THD only: every sequence has seqlen_q == seqlen_k (self-attention over
    /// one `cu_seqlens`). Dense problems derive this from the lengths.
    pub thd_equal_seqlens: bool,
    /// A backward will follow (the forward must leave a context for it).
    pub requires_grad: bool,
    /// The backward must be bitwise repeatable.
    pub deterministic: bool,
    /// The device the call runs on.
    pub cc: ComputeCapability,
}

impl Problem {
    /// A dense problem with equal head dims and no mask; chain the setters.
    #[allow(clippy::too_many_arguments)]
    pub fn dense(
        dtype: ElemType,
        head_dim: u32,
        batch: u32,
        heads_q: u32,
        heads_kv: u32,
        seqlen_q: u32,
        seqlen_k: u32,
        cc: ComputeCapability,
    ) -> Self {
        Problem {
            dtype,
            head_dim_qk: head_dim,
            head_dim_v: head_dim,
            layout: Layout::Dense,
            batch,
            heads_q,
            heads_kv,
            seqlen_q,
            seqlen_k,
            total_q: 0,
            total_k: 0,
            mask: Mask::None,
            window: (-1, -1),
            softcap: 0.0,
            scale: None,
            dropout_p: 0.0,
            attn_mask: false,
            thd_equal_seqlens: false,
            requires_grad: false,
            deterministic: false,
            cc,
        }
    }

    /// A ragged (THD) problem: `max_seqlen_*` and `total_*` tokens.
    #[allow(clippy::too_many_arguments)]
    pub fn thd(
        dtype: ElemType,
        head_dim: u32,
        batch: u32,
        heads_q: u32,
        heads_kv: u32,
        (max_seqlen_q, total_q): (u32, u32),
        (max_seqlen_k, total_k): (u32, u32),
        cc: ComputeCapability,
    ) -> Self {
        let mut p = Self::dense(
            dtype,
            head_dim,
            batch,
            heads_q,
            heads_kv,
            max_seqlen_q,
            max_seqlen_k,
            cc,
        );
        p.layout = Layout::Thd;
        p.total_q = total_q;
        p.total_k = total_k;
        p
    }

    pub fn with_mask(mut self, mask: Mask) -> Self {
        self.mask = mask;
        self
    }
    pub fn with_window(mut self, left: i32, right: i32) -> Self {
        self.mask = Mask::SlidingWindow;
        self.window = (left, right);
        self
    }
    pub fn with_head_dim_v(mut self, d: u32) -> Self {
        self.head_dim_v = d;
        self
    }
    pub fn with_softcap(mut self, c: f32) -> Self {
        self.softcap = c;
        self
    }
    pub fn with_scale(mut self, s: f32) -> Self {
        self.scale = Some(s);
        self
    }
    pub fn with_dropout(mut self, p: f32) -> Self {
        self.dropout_p = p;
        self
    }
    pub fn with_attn_mask(mut self) -> Self {
        self.attn_mask = true;
        self
    }
    pub fn with_grad(mut self) -> Self {
        self.requires_grad = true;
        self
    }
    pub fn with_deterministic(mut self) -> Self {
        self.deterministic = true;
        self
    }
    pub fn with_thd_equal_seqlens(mut self, yes: bool) -> Self {
        self.thd_equal_seqlens = yes;
        self
    }

    /// The softmax scale in effect.
    pub fn scale_value(&self) -> f32 {
        self.scale
            .unwrap_or_else(|| 1.0 / (self.head_dim_qk.max(1) as f32).sqrt())
    }

    /// Whether every sequence has as many queries as keys (causal top-left and
    /// bottom-right then coincide).
    pub fn square(&self) -> bool {
        match self.layout {
            Layout::Dense => self.seqlen_q == self.seqlen_k,
            Layout::Thd => self.thd_equal_seqlens,
        }
    }

    /// Checks that hold for every backend (a problem failing them is a caller
    /// bug, not a routing question).
    pub fn validate(&self) -> Result<(), ProblemError> {
        if self.head_dim_qk == 0 || self.head_dim_v == 0 {
            return Err(bad("head_dim", "must be >= 1"));
        }
        if self.heads_q == 0 || self.heads_kv == 0 {
            return Err(bad("heads", "heads_q and heads_kv must be >= 1"));
        }
        if !self.heads_q.is_multiple_of(self.heads_kv) {
            return Err(bad(
                "heads_kv",
                format!(
                    "heads_q ({}) must be a multiple of heads_kv ({}) for GQA/MQA",
                    self.heads_q, self.heads_kv
                ),
            ));
        }
        if !(self.dropout_p.is_finite() && (0.0..1.0).contains(&self.dropout_p)) {
            return Err(bad("dropout_p", format!("must be in [0, 1), got {}", self.dropout_p)));
        }
        if !(self.softcap.is_finite() && self.softcap >= 0.0) {
            return Err(bad(
                "softcap",
                format!("must be finite and >= 0 (0 = off), got {}", self.softcap),
            ));
        }
        if let Some(s) = self.scale {
            if !(s.is_finite() && s > 0.0) {
                return Err(bad("scale", format!("must be finite and > 0, got {s}")));
            }
        }
        match self.mask {
            Mask::SlidingWindow if self.window.0 < -1 || self.window.1 < -1 => {
                return Err(bad(
                    "window",
                    format!("sizes must be >= -1 (-1 = unbounded), got {:?}", self.window),
                ));
            }
            Mask::SlidingWindow => {}
            _ if self.window != (-1, -1) => {
                return Err(bad(
                    "window",
                    format!("{:?} given with mask `{}`; use the window mask", self.window, self.mask),
                ));
            }
            _ => {}
        }
        if self.layout == Layout::Dense && (self.total_q != 0 || self.total_k != 0) {
            return Err(bad("total_q", "totals are for THD problems; leave them 0 for dense"));
        }
        for (name, v) in [
            ("seqlen_q", self.seqlen_q),
            ("seqlen_k", self.seqlen_k),
            ("total_q", self.total_q),
            ("total_k", self.total_k),
        ] {
            if v > i32::MAX as u32 {
                return Err(bad(name, "must fit in int32"));
            }
        }
        Ok(())
    }

    /// The decision-relevant part of the problem.
    pub fn key(&self) -> ProblemKey {
        let causal = matches!(self.mask, Mask::CausalTopLeft | Mask::CausalBottomRight);
        ProblemKey {
            dtype: self.dtype,
            head_dim_qk: self.head_dim_qk,
            head_dim_v: self.head_dim_v,
            layout: self.layout,
            mask: self.mask,
            // Only causal masks care; normalizing keeps one memo entry per problem class.
            square: causal && self.square(),
            softcap: self.softcap > 0.0,
            dropout: self.dropout_p > 0.0,
            attn_mask: self.attn_mask,
            gqa: self.heads_q != self.heads_kv,
            requires_grad: self.requires_grad,
            deterministic: self.deterministic,
            long_keys: self.seqlen_k >= LONG_KEYS,
            cc: self.cc,
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} d{}", self.dtype, self.head_dim_qk)?;
        if self.head_dim_v != self.head_dim_qk {
            write!(f, "v{}", self.head_dim_v)?;
        }
        write!(
            f,
            " {} b={} hq={} hkv={} sq={} sk={}",
            self.layout, self.batch, self.heads_q, self.heads_kv, self.seqlen_q, self.seqlen_k
        )?;
        if self.layout == Layout::Thd {
            write!(f, " total_q={} total_k={}", self.total_q, self.total_k)?;
        }
        write!(f, " {}", self.mask)?;
        if self.mask == Mask::SlidingWindow {
            write!(f, "({},{})", self.window.0, self.window.1)?;
        }
        if self.softcap > 0.0 {
            write!(f, " softcap={}", self.softcap)?;
        }
        if self.dropout_p > 0.0 {
            write!(f, " dropout={}", self.dropout_p)?;
        }
        if self.attn_mask {
            f.write_str(" attn_mask")?;
        }
        if self.requires_grad {
            f.write_str(" grad")?;
        }
        if self.deterministic {
            f.write_str(" det")?;
        }
        write!(f, " {}", self.cc)
    }
}

/// What a decision may depend on: no values, no sizes but one class (long
/// keys), only flags and the fields that select kernels. `Copy`, 24 bytes,
/// hashed as one `u128`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProblemKey {
    pub dtype: ElemType,
    pub head_dim_qk: u32,
    pub head_dim_v: u32,
    pub layout: Layout,
    pub mask: Mask,
    /// Causal masks only: seqlen_q == seqlen_k for every sequence.
    pub square: bool,
    pub softcap: bool,
    pub dropout: bool,
    pub attn_mask: bool,
    /// heads_q != heads_kv.
    pub gqa: bool,
    pub requires_grad: bool,
    pub deterministic: bool,
    /// Keys (dense `seqlen_k`, ragged maximum) >= [`LONG_KEYS`]: the one
    /// size class the ranking tells apart.
    pub long_keys: bool,
    pub cc: ComputeCapability,
}

/// Keys from which a problem is "long" for the ranking ([`ProblemKey::long_keys`]):
/// where the Hopper forward leads cuDNN's in every measured cell (see
/// [`super::heuristics::DEFAULT_RANKING`]; 8192 until session 49).
pub const LONG_KEYS: u32 = 2048;

impl ProblemKey {
    /// Every field, packed losslessly (head dims take 32 bits each).
    pub fn packed(&self) -> u128 {
        let flags = (self.square as u32)
            | (self.softcap as u32) << 1
            | (self.dropout as u32) << 2
            | (self.attn_mask as u32) << 3
            | (self.gqa as u32) << 4
            | (self.requires_grad as u32) << 5
            | (self.deterministic as u32) << 6
            | (self.long_keys as u32) << 7;
        let small = (self.dtype as u32)
            | (self.layout as u32) << 2
            | (self.mask as u32) << 3
            | flags << 6
            | (self.cc.minor as u32) << 14
            | (self.cc.major as u32) << 18;
        (self.head_dim_qk as u128) | (self.head_dim_v as u128) << 32 | (small as u128) << 64
    }

    /// The generated kernel's spec for this problem and direction, or why
    /// there is none (the planner judges the rest).
    pub fn spec(&self, direction: Direction) -> Result<AttnSpec, String> {
        let dtype = self
            .dtype
            .spec_dtype()
            .ok_or_else(|| format!("dtype {} unsupported (f16, bf16 only)", self.dtype))?;
        let arch = self
            .cc
            .arch()
            .ok_or_else(|| format!("no generated target for {} (targets: sm80, sm86, sm89, sm90a)", self.cc))?;
        let dim = |d: u32| u16::try_from(d).map_err(|_| format!("head dim {d} exceeds {}", crate::spec::MAX_HEAD_DIM));
        Ok(AttnSpec {
            direction,
            dtype,
            head_dim_qk: dim(self.head_dim_qk)?,
            head_dim_v: dim(self.head_dim_v)?,
            layout: self.layout,
            mask: self.mask,
            softcap: self.softcap,
            deterministic: self.deterministic && direction == Direction::Bwd,
            arch,
        })
    }
}

impl Hash for ProblemKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u128(self.packed());
    }
}

impl fmt::Display for ProblemKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} d{}", self.dtype, self.head_dim_qk)?;
        if self.head_dim_v != self.head_dim_qk {
            write!(f, "v{}", self.head_dim_v)?;
        }
        write!(f, " {} {}", self.layout, self.mask)?;
        for (on, name) in [
            (self.square, "square"),
            (self.softcap, "softcap"),
            (self.dropout, "dropout"),
            (self.attn_mask, "attn_mask"),
            (self.gqa, "gqa"),
            (self.requires_grad, "grad"),
            (self.deterministic, "det"),
            (self.long_keys, "long"),
        ] {
            if on {
                write!(f, " {name}")?;
            }
        }
        write!(f, " {}", self.cc)
    }
}

/// Multiply-mix hasher for [`ProblemKey`] (one `u128` write per key); the
/// keys come from our own code, so no DoS-resistant hash is needed.
#[derive(Default, Clone, Copy)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_u128(&mut self, x: u128) {
        self.write_u64(x as u64);
        self.write_u64((x >> 64) as u64);
    }
}

/// `BuildHasher` for maps keyed by [`ProblemKey`].
#[derive(Default, Clone, Copy)]
pub struct BuildKeyHasher;

impl BuildHasher for BuildKeyHasher {
    type Hasher = KeyHasher;
    fn build_hasher(&self) -> KeyHasher {
        KeyHasher::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H100: ComputeCapability = ComputeCapability::new(9, 0);

    #[test]
    fn compute_capability_parses_the_usual_spellings() {
        for (s, want) in [
            ("sm90a", (9, 0)),
            ("sm90", (9, 0)),
            ("sm_80", (8, 0)),
            ("SM86", (8, 6)),
            ("9.0", (9, 0)),
            ("sm100", (10, 0)),
            ("sm121", (12, 1)),
            ("10.3", (10, 3)),
        ] {
            let cc: ComputeCapability = s.parse().unwrap();
            assert_eq!((cc.major, cc.minor), want, "{s}");
        }
        for s in ["", "sm", "sm9", "x86", "9", "sm1000", "0.5", "9.x", "sm0a"] {
            assert!(s.parse::<ComputeCapability>().is_err(), "{s:?} parsed");
        }
        assert_eq!(ComputeCapability::new(9, 0).arch(), Some(Arch::Sm90a));
        assert_eq!(ComputeCapability::new(10, 0).arch(), None);
    }

    #[test]
    fn key_ignores_sizes_and_values_but_not_flags() {
        let a = Problem::dense(ElemType::Bf16, 128, 2, 16, 16, 1024, 1024, H100);
        let mut b = a;
        b.batch = 7;
        b.seqlen_q = 333;
        b.seqlen_k = 333;
        b.scale = Some(0.1);
        assert_eq!(a.key(), b.key());
        // Sizes matter through one class only: keys >= LONG_KEYS.
        let mut long = a;
        long.seqlen_q = LONG_KEYS;
        long.seqlen_k = LONG_KEYS;
        assert!(!a.key().long_keys && long.key().long_keys);
        assert_ne!(a.key(), long.key());
        long.seqlen_k = 4 * LONG_KEYS;
        long.batch = 1;
        assert!(long.key().long_keys);
        assert_ne!(a.key(), a.with_grad().key());
        assert_ne!(a.key(), a.with_dropout(0.1).key());
        // Squareness matters for causal masks only.
        let mut c = a;
        c.seqlen_k = 1000;
        assert_eq!(a.key(), c.key());
        assert_ne!(
            a.with_mask(Mask::CausalTopLeft).key(),
            c.with_mask(Mask::CausalTopLeft).key()
        );
    }

    #[test]
    fn packed_key_is_injective_on_a_grid() {
        let mut seen = std::collections::HashSet::new();
        let mut n = 0;
        for &dtype in ElemType::ALL {
            for d in [8, 64, 128, 256, 512] {
                for &mask in Mask::ALL {
                    for &layout in Layout::ALL {
                        for bits in 0..256u32 {
                            for cc in [ComputeCapability::new(8, 0), ComputeCapability::new(9, 0)] {
                                let k = ProblemKey {
                                    dtype,
                                    head_dim_qk: d,
                                    head_dim_v: d / 2 + 8,
                                    layout,
                                    mask,
                                    square: bits & 1 != 0,
                                    softcap: bits & 2 != 0,
                                    dropout: bits & 4 != 0,
                                    attn_mask: bits & 8 != 0,
                                    gqa: bits & 16 != 0,
                                    requires_grad: bits & 32 != 0,
                                    deterministic: bits & 64 != 0,
                                    long_keys: bits & 128 != 0,
                                    cc,
                                };
                                assert!(seen.insert(k.packed()), "{k}");
                                n += 1;
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(seen.len(), n);
    }

    #[test]
    fn validation_names_the_field() {
        let p = Problem::dense(ElemType::F16, 64, 1, 6, 4, 8, 8, H100);
        assert_eq!(p.validate().unwrap_err().field, "heads_kv");
        let p = Problem::dense(ElemType::F16, 64, 1, 4, 4, 8, 8, H100);
        assert!(p.validate().is_ok());
        assert_eq!(p.with_dropout(1.0).validate().unwrap_err().field, "dropout_p");
        assert_eq!(p.with_dropout(f32::NAN).validate().unwrap_err().field, "dropout_p");
        assert_eq!(p.with_softcap(-1.0).validate().unwrap_err().field, "softcap");
        assert_eq!(p.with_scale(0.0).validate().unwrap_err().field, "scale");
        assert_eq!(p.with_window(-2, 0).validate().unwrap_err().field, "window");
        let mut w = p;
        w.window = (4, 0);
        assert_eq!(w.validate().unwrap_err().field, "window");
        let mut d = p;
        d.head_dim_v = 0;
        assert_eq!(d.validate().unwrap_err().field, "head_dim");
    }

    #[test]
    fn spec_of_key_follows_the_device() {
        let p = Problem::dense(ElemType::Bf16, 128, 1, 8, 8, 64, 64, H100).with_mask(Mask::CausalBottomRight);
        let s = p.key().spec(Direction::Fwd).unwrap();
        assert_eq!(s.to_string(), "fwd.bf16.d128.causal-br.dense.sm90a");
        let s = p.with_deterministic().key().spec(Direction::Bwd).unwrap();
        assert_eq!(s.to_string(), "bwd.bf16.d128.causal-br.dense.det.sm90a");
        let mut q = p;
        q.dtype = ElemType::F32;
        assert!(q.key().spec(Direction::Fwd).unwrap_err().contains("f32"));
        q = p;
        q.cc = ComputeCapability::new(7, 5);
        assert!(q.key().spec(Direction::Fwd).unwrap_err().contains("sm75"));
    }
}
