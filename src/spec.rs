//! Stage 1 of the pipeline: the kernel **spec**.
//!
//! An [`AttnSpec`] names one specialized kernel: everything that changes the
//! generated code, and nothing that is only a run-time value. Batch, heads, the
//! GQA ratio, sequence lengths, the softmax scale, window sizes and the softcap
//! value are launch arguments (see `launch`), not spec fields.
//!
//! Every spec has one canonical string form, fixed order, dot-separated:
//!
//! ```text
//! {dir}.{dtype}.d{qk}[v{v}].{mask}.{layout}[.softcap][.det].{arch}
//! fwd.bf16.d128.causal-br.thd.sm90a
//! bwd.f16.d192v128.none.dense.softcap.det.sm80
//! ```
//!
//! `Display` prints it and `FromStr` parses it back (round trip is tested);
//! the CLI and the cache listings use it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::SpecError;

/// Largest supported head dimension (qk or v).
pub const MAX_HEAD_DIM: u16 = 256;

macro_rules! token_enum {
    ($(#[$m:meta])* $name:ident, $field:literal { $($(#[$vm:meta])* $var:ident => $tok:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum $name { $($(#[$vm])* $var),+ }

        impl $name {
            /// Every value, in canonical order.
            pub const ALL: &'static [$name] = &[$($name::$var),+];
            /// The token used in the canonical spec string.
            pub const fn token(self) -> &'static str {
                match self { $($name::$var => $tok),+ }
            }
            fn allowed() -> String {
                [$($tok),+].join(", ")
            }
            fn parse_token(s: &str) -> Result<Self, SpecError> {
                match s {
                    $($tok => Ok($name::$var),)+
                    _ => Err(SpecError::InvalidValue {
                        field: $field,
                        value: s.to_string(),
                        allowed: Self::allowed(),
                    }),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.token())
            }
        }

        impl FromStr for $name {
            type Err = SpecError;
            fn from_str(s: &str) -> Result<Self, SpecError> {
                Self::parse_token(s)
            }
        }
    };
}

token_enum!(
    /// Forward (O, LSE) or backward (dQ, dK, dV).
    Direction, "direction" { Fwd => "fwd", Bwd => "bwd" }
);

token_enum!(
    /// Element type of Q, K, V, O and their gradients; accumulation is always f32.
    DType, "dtype" { F16 => "f16", Bf16 => "bf16" }
);

token_enum!(
    /// How Q/K/V/O are laid out in memory.
    Layout, "layout" {
        /// 4-D `[batch, seq, heads, d]` with arbitrary strides, head-dim stride 1.
        Dense => "dense",
        /// Ragged: packed `[total_tokens, heads, d]` with `cu_seqlens` prefix sums.
        Thd => "thd",
    }
);

token_enum!(
    /// Which (query, key) pairs are visible.
    Mask, "mask" {
        /// Every key is visible.
        None => "none",
        /// Causal, aligned at the top-left corner: query i sees keys j <= i.
        CausalTopLeft => "causal-tl",
        /// Causal, aligned at the bottom-right corner (FlashAttention >= 2.1,
        /// cuDNN): query i sees keys j <= i + seqlen_k - seqlen_q.
        CausalBottomRight => "causal-br",
        /// Sliding window (left, right) around the bottom-right diagonal; the
        /// sizes are launch arguments (-1 = unbounded on that side).
        SlidingWindow => "window",
    }
);

token_enum!(
    /// Target architecture of the generated CUBIN.
    Arch, "arch" {
        Sm80 => "sm80",
        Sm86 => "sm86",
        Sm89 => "sm89",
        Sm90a => "sm90a",
    }
);

impl Arch {
    /// The `--gpu-architecture` value NVRTC takes for this arch.
    pub const fn nvrtc_arch(self) -> &'static str {
        match self {
            Arch::Sm80 => "sm_80",
            Arch::Sm86 => "sm_86",
            Arch::Sm89 => "sm_89",
            Arch::Sm90a => "sm_90a",
        }
    }

    /// Largest dynamic shared memory one block may opt into, in bytes.
    pub const fn max_smem_per_block(self) -> u32 {
        match self {
            Arch::Sm80 => 163 * 1024,
            Arch::Sm86 | Arch::Sm89 => 99 * 1024,
            Arch::Sm90a => 227 * 1024,
        }
    }

    /// Whether SASS built for this arch runs on a device of compute capability
    /// `major.minor` (same major, device minor at least ours; `a` targets
    /// exactly one device).
    pub const fn runs_on(self, major: i32, minor: i32) -> bool {
        match self {
            Arch::Sm80 => major == 8 && minor >= 0,
            Arch::Sm86 => major == 8 && minor >= 6,
            Arch::Sm89 => major == 8 && minor >= 9,
            Arch::Sm90a => major == 9 && minor == 0,
        }
    }

    /// The arch of a device with this compute capability, if we target it.
    pub const fn from_compute_capability(major: i32, minor: i32) -> Option<Arch> {
        match (major, minor) {
            (8, 0) => Some(Arch::Sm80),
            (8, 6) | (8, 7) => Some(Arch::Sm86),
            (8, 9) => Some(Arch::Sm89),
            (9, 0) => Some(Arch::Sm90a),
            _ => None,
        }
    }
}

/// One specialized attention kernel. See the module docs for the string form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AttnSpec {
    pub direction: Direction,
    pub dtype: DType,
    pub head_dim_qk: u16,
    pub head_dim_v: u16,
    pub layout: Layout,
    pub mask: Mask,
    pub softcap: bool,
    /// Bitwise-repeatable backward (no atomics in the dQ reduction). Backward only.
    pub deterministic: bool,
    pub arch: Arch,
}

impl AttnSpec {
    /// A forward spec with equal qk/v head dims and defaults elsewhere.
    pub fn fwd(dtype: DType, head_dim: u16, mask: Mask, layout: Layout, arch: Arch) -> Self {
        AttnSpec {
            direction: Direction::Fwd,
            dtype,
            head_dim_qk: head_dim,
            head_dim_v: head_dim,
            layout,
            mask,
            softcap: false,
            deterministic: false,
            arch,
        }
    }

    /// Check the field constraints; every constructor path (parse, TOML,
    /// Python) goes through this.
    pub fn validate(&self) -> Result<(), SpecError> {
        for (field, d) in [("head_dim_qk", self.head_dim_qk), ("head_dim_v", self.head_dim_v)] {
            if d == 0 || d % 8 != 0 || d > MAX_HEAD_DIM {
                return Err(SpecError::InvalidValue {
                    field,
                    value: d.to_string(),
                    allowed: format!("multiples of 8 from 8 to {MAX_HEAD_DIM}"),
                });
            }
        }
        if self.deterministic && self.direction == Direction::Fwd {
            return Err(SpecError::Inconsistent {
                reason: "`det` (deterministic) applies to bwd specs only; the forward is always deterministic".into(),
            });
        }
        Ok(())
    }

    /// Same spec for another arch.
    pub fn with_arch(mut self, arch: Arch) -> Self {
        self.arch = arch;
        self
    }
}

impl fmt::Display for AttnSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.d{}", self.direction, self.dtype, self.head_dim_qk)?;
        if self.head_dim_v != self.head_dim_qk {
            write!(f, "v{}", self.head_dim_v)?;
        }
        write!(f, ".{}.{}", self.mask, self.layout)?;
        if self.softcap {
            f.write_str(".softcap")?;
        }
        if self.deterministic {
            f.write_str(".det")?;
        }
        write!(f, ".{}", self.arch)
    }
}

fn parse_dims(tok: &str) -> Result<(u16, u16), SpecError> {
    let bad = || SpecError::InvalidValue {
        field: "head_dim",
        value: tok.to_string(),
        allowed: "d<qk> or d<qk>v<v>, e.g. d128 or d192v128".into(),
    };
    let rest = tok.strip_prefix('d').ok_or_else(bad)?;
    let (qk, v) = match rest.split_once('v') {
        Some((qk, v)) => (qk, Some(v)),
        None => (rest, None),
    };
    let num = |s: &str| -> Result<u16, SpecError> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        s.parse::<u16>().map_err(|_| bad())
    };
    let qk = num(qk)?;
    let v = match v {
        Some(v) => num(v)?,
        None => qk,
    };
    Ok((qk, v))
}

impl FromStr for AttnSpec {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Self, SpecError> {
        let parts: Vec<&str> = s.trim().split('.').collect();
        if parts.len() < 6 {
            return Err(SpecError::Syntax {
                input: s.to_string(),
                reason: "expected {dir}.{dtype}.d{qk}[v{v}].{mask}.{layout}[.softcap][.det].{arch}, e.g. fwd.bf16.d128.causal-br.thd.sm90a".into(),
            });
        }
        let direction = parts[0].parse()?;
        let dtype = parts[1].parse()?;
        let (head_dim_qk, head_dim_v) = parse_dims(parts[2])?;
        let mask = parts[3].parse()?;
        let layout = parts[4].parse()?;
        let arch = parts[parts.len() - 1].parse()?;
        let mut softcap = false;
        let mut deterministic = false;
        let flags = &parts[5..parts.len() - 1];
        // Flags appear at most once each, in canonical order.
        let mut last = 0;
        for flag in flags {
            let (slot, seen) = match *flag {
                "softcap" => (1, &mut softcap),
                "det" => (2, &mut deterministic),
                other => {
                    return Err(SpecError::InvalidValue {
                        field: "flag",
                        value: other.to_string(),
                        allowed: "softcap, det (in that order), then the arch".into(),
                    })
                }
            };
            if *seen || slot <= last {
                return Err(SpecError::Syntax {
                    input: s.to_string(),
                    reason: "flags must appear at most once, in the order softcap, det".into(),
                });
            }
            *seen = true;
            last = slot;
        }
        let spec = AttnSpec {
            direction,
            dtype,
            head_dim_qk,
            head_dim_v,
            layout,
            mask,
            softcap,
            deterministic,
            arch,
        };
        spec.validate()?;
        Ok(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_examples_round_trip() {
        for s in [
            "fwd.bf16.d128.causal-br.thd.sm90a",
            "fwd.f16.d64.none.dense.sm80",
            "bwd.f16.d192v128.window.dense.softcap.det.sm80",
            "bwd.bf16.d256.causal-tl.thd.det.sm89",
            "fwd.bf16.d8.none.dense.softcap.sm86",
        ] {
            let spec: AttnSpec = s.parse().unwrap();
            assert_eq!(spec.to_string(), s);
        }
    }

    #[test]
    fn every_combination_round_trips() {
        let mut n = 0;
        for &direction in Direction::ALL {
            for &dtype in DType::ALL {
                for (qk, v) in [(64, 64), (192, 128), (8, 256)] {
                    for &mask in Mask::ALL {
                        for &layout in Layout::ALL {
                            for softcap in [false, true] {
                                for det in [false, true] {
                                    for &arch in Arch::ALL {
                                        let spec = AttnSpec {
                                            direction,
                                            dtype,
                                            head_dim_qk: qk,
                                            head_dim_v: v,
                                            layout,
                                            mask,
                                            softcap,
                                            deterministic: det,
                                            arch,
                                        };
                                        if spec.validate().is_err() {
                                            continue;
                                        }
                                        let back: AttnSpec = spec.to_string().parse().unwrap();
                                        assert_eq!(back, spec);
                                        n += 1;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(n > 1000);
    }

    #[test]
    fn errors_name_the_field_and_allowed_values() {
        let e = "fwd.f32.d128.none.dense.sm80".parse::<AttnSpec>().unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("dtype") && msg.contains("f16") && msg.contains("bf16"),
            "{msg}"
        );

        let e = "fwd.f16.d100.none.dense.sm80".parse::<AttnSpec>().unwrap_err();
        assert!(e.to_string().contains("head_dim_qk"), "{e}");
        let e = "fwd.f16.d264.none.dense.sm80".parse::<AttnSpec>().unwrap_err();
        assert!(e.to_string().contains("multiples of 8"), "{e}");
        let e = "fwd.f16.d128.none.dense.sm75".parse::<AttnSpec>().unwrap_err();
        assert!(e.to_string().contains("sm90a"), "{e}");
        let e = "fwd.f16.d128.none.dense.det.sm80".parse::<AttnSpec>().unwrap_err();
        assert!(e.to_string().contains("bwd"), "{e}");
        let e = "bwd.f16.d128.none.dense.det.softcap.sm80"
            .parse::<AttnSpec>()
            .unwrap_err();
        assert!(e.to_string().contains("order"), "{e}");
        for bad in [
            "",
            "fwd",
            "fwd.f16.dx.none.dense.sm80",
            "fwd.f16.d.none.dense.sm80",
            "fwd.f16.d128v.none.dense.sm80",
            "fwd.f16.d99999999.none.dense.sm80",
            "fwd.f16.d128.none.dense.bogus.sm80",
            "fwd.f16.d128.diag.dense.sm80",
        ] {
            assert!(bad.parse::<AttnSpec>().is_err(), "{bad:?} parsed");
        }
    }
}
