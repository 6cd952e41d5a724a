//! Snapshot tests of rendered kernel sources (naga-style in/out files).
//!
//! Each spec below renders to `codegen_tests/snapshots/<spec>.cu`, committed,
//! so every template change shows up in review as a diff of generated CUDA.
//! After an intended change: `ATTNFORGE_BLESS=1 cargo test -p attnforge-codegen-tests --test snapshots`.

use std::path::PathBuf;

use attnforge::{plan, render, AttnSpec};

/// A representative set: each dtype, mask, layout, softcap, an odd head dim, qk != v, each arch family;
/// the backward in fast and deterministic mode.
const SPECS: &[&str] = &[
    "fwd.bf16.d128.none.dense.sm80",
    "fwd.f16.d64.causal-tl.dense.sm80",
    "fwd.bf16.d128.causal-br.thd.sm90a",
    "fwd.f16.d128.window.dense.softcap.sm80",
    "fwd.bf16.d256.none.dense.sm90a",
    "fwd.bf16.d192v128.causal-br.dense.sm80",
    "fwd.f16.d40.none.thd.sm86",
    "bwd.bf16.d128.causal-br.dense.sm80",
    "bwd.f16.d64.window.thd.softcap.det.sm90a",
    "bwd.bf16.d128.causal-br.dense.sm90a",
    "bwd.f16.d64.window.thd.softcap.sm90a",
    "bwd.bf16.d64.causal-br.thd.sm80",
];

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("snapshots")
}

#[test]
fn rendered_sources_match_snapshots() {
    let bless = std::env::var_os("ATTNFORGE_BLESS").is_some_and(|v| v != "0");
    let mut mismatched = Vec::new();
    for s in SPECS {
        let spec: AttnSpec = s.parse().unwrap();
        let rendered = render::render(&plan(&spec).unwrap()).unwrap();
        let path = dir().join(format!("{s}.cu"));
        if bless {
            std::fs::create_dir_all(dir()).unwrap();
            std::fs::write(&path, &rendered.source).unwrap();
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(expected) if expected == rendered.source => {}
            Ok(expected) => {
                let line = expected
                    .lines()
                    .zip(rendered.source.lines())
                    .position(|(a, b)| a != b)
                    .map(|i| i + 1)
                    .unwrap_or(expected.lines().count().min(rendered.source.lines().count()) + 1);
                mismatched.push(format!("{s}: differs from {} at line {line}", path.display()));
            }
            Err(e) => mismatched.push(format!("{s}: cannot read {}: {e}", path.display())),
        }
    }
    assert!(
        mismatched.is_empty(),
        "rendered sources changed (review, then re-bless with ATTNFORGE_BLESS=1):\n{}",
        mismatched.join("\n")
    );
}

#[test]
fn no_stale_snapshots() {
    let Ok(entries) = std::fs::read_dir(dir()) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let spec = name.trim_end_matches(".cu");
        assert!(SPECS.contains(&spec), "snapshot {name} has no spec in SPECS; delete it");
    }
}
