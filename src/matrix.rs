//! The coverage matrix as data: the specs we promise, in TOML.
//!
//! ```toml
//! [[group]]
//! direction = ["fwd"]
//! dtype = ["f16", "bf16"]
//! head_dim = [64, 128, "192v128"]   # an int, or "qkv" for qk != v
//! mask = ["none", "causal-br"]
//! layout = ["dense"]
//! softcap = [false]
//! ```
//!
//! A group expands to the Cartesian product of its lists (omitted lists take
//! their defaults: fwd, no softcap, not deterministic). `specs = ["..."]` adds
//! single specs written in the canonical form without the arch. The arch is
//! not part of the matrix: the sweep and `attnforge prebuild --arch` apply
//! their own list.

use serde::Deserialize;

use crate::error::SpecError;
use crate::spec::{Arch, AttnSpec, DType, Direction, Layout, Mask};

/// The default matrix, embedded so that the CLI works anywhere.
pub const DEFAULT_MATRIX: &str = include_str!("../codegen_tests/matrix/default.toml");

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MatrixFile {
    #[serde(default)]
    group: Vec<Group>,
    #[serde(default)]
    specs: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum HeadDim {
    Same(u16),
    Pair(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Group {
    #[serde(default = "default_dir")]
    direction: Vec<String>,
    dtype: Vec<String>,
    head_dim: Vec<HeadDim>,
    mask: Vec<String>,
    layout: Vec<String>,
    #[serde(default = "default_false")]
    softcap: Vec<bool>,
    #[serde(default = "default_false")]
    deterministic: Vec<bool>,
}

fn default_dir() -> Vec<String> {
    vec!["fwd".into()]
}
fn default_false() -> Vec<bool> {
    vec![false]
}

/// Error in a matrix file.
#[derive(Debug, thiserror::Error)]
pub enum MatrixError {
    #[error("matrix file is not valid TOML for a coverage matrix: {0}")]
    Toml(String),
    #[error("matrix entry: {0}")]
    Spec(#[from] SpecError),
}

fn dims(h: &HeadDim) -> Result<(u16, u16), SpecError> {
    match h {
        HeadDim::Same(d) => Ok((*d, *d)),
        HeadDim::Pair(s) => {
            let spec: AttnSpec = format!("fwd.f16.d{s}.none.dense.sm80").parse()?;
            Ok((spec.head_dim_qk, spec.head_dim_v))
        }
    }
}

/// Parse a matrix and expand it for the given archs, in a stable order with
/// duplicates removed.
pub fn expand(toml_text: &str, archs: &[Arch]) -> Result<Vec<AttnSpec>, MatrixError> {
    let file: MatrixFile = toml::from_str(toml_text).map_err(|e| {
        let line = e
            .span()
            .map(|s| toml_text[..s.start.min(toml_text.len())].lines().count().max(1));
        MatrixError::Toml(match line {
            Some(l) => format!("line {l}: {}", e.message()),
            None => e.message().to_string(),
        })
    })?;
    let mut out: Vec<AttnSpec> = Vec::new();
    let mut push = |s: AttnSpec| -> Result<(), SpecError> {
        s.validate()?;
        if !out.contains(&s) {
            out.push(s);
        }
        Ok(())
    };
    for &arch in archs {
        for g in &file.group {
            for dir in &g.direction {
                let direction: Direction = dir.parse()?;
                for dt in &g.dtype {
                    let dtype: DType = dt.parse()?;
                    for hd in &g.head_dim {
                        let (head_dim_qk, head_dim_v) = dims(hd)?;
                        for m in &g.mask {
                            let mask: Mask = m.parse()?;
                            for l in &g.layout {
                                let layout: Layout = l.parse()?;
                                for &softcap in &g.softcap {
                                    for &deterministic in &g.deterministic {
                                        push(AttnSpec {
                                            direction,
                                            dtype,
                                            head_dim_qk,
                                            head_dim_v,
                                            layout,
                                            mask,
                                            softcap,
                                            deterministic,
                                            arch,
                                        })?;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        for s in &file.specs {
            let spec: AttnSpec = format!("{s}.{arch}").parse()?;
            push(spec)?;
        }
    }
    Ok(out)
}

/// The default matrix for the given archs.
pub fn default_specs(archs: &[Arch]) -> Vec<AttnSpec> {
    // The embedded matrix is checked by a unit test; an error here is a bug.
    expand(DEFAULT_MATRIX, archs).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_matrix_parses_and_plans() {
        let specs = expand(DEFAULT_MATRIX, &[Arch::Sm80, Arch::Sm90a]).unwrap();
        assert!(!specs.is_empty());
        for s in &specs {
            crate::plan::plan(s).unwrap();
        }
    }

    #[test]
    fn groups_expand_as_products() {
        let m = r#"
            specs = ["fwd.f16.d64.none.dense"]
            [[group]]
            dtype = ["f16", "bf16"]
            head_dim = [64, "192v128"]
            mask = ["none", "causal-br"]
            layout = ["dense"]
        "#;
        let specs = expand(m, &[Arch::Sm80]).unwrap();
        assert_eq!(specs.len(), 8);
        assert!(specs.iter().any(|s| s.head_dim_qk == 192 && s.head_dim_v == 128));
        assert_eq!(expand(m, &[Arch::Sm80, Arch::Sm90a]).unwrap().len(), 16);
    }

    #[test]
    fn bad_matrices_are_errors() {
        assert!(expand("group = 3", &[Arch::Sm80]).is_err());
        let m = "[[group]]\ndtype=[\"f8\"]\nhead_dim=[64]\nmask=[\"none\"]\nlayout=[\"dense\"]";
        let e = expand(m, &[Arch::Sm80]).unwrap_err();
        assert!(e.to_string().contains("dtype"), "{e}");
        assert!(expand("specs = [\"fwd.f16.d100.none.dense\"]", &[Arch::Sm80]).is_err());
        assert!(expand("[[group]]\nbogus = 1", &[Arch::Sm80]).is_err());
    }
}
