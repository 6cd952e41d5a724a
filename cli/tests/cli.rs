//! End-to-end tests of the `attnforge` binary: bad input gives a typed one-line
//! error and a non-zero exit (never a panic); prebuild fills a cache that a
//! second run hits; concurrent prebuilds share a cache; read-only prebuilt
//! roots layer under the user root; an unwritable cache dir degrades to memory;
//! a damaged cache is reported and repaired.
//!
//! Tests that compile need NVRTC: they skip without it, unless
//! `ATTNFORGE_REQUIRE_NVRTC=1` (set by `make test`), where they fail.

use std::path::Path;
use std::process::{Command, Output};

const SMALL_MATRIX: &str = r#"
specs = ["fwd.bf16.d64.window.thd.softcap"]

[[group]]
dtype = ["f16"]
head_dim = [64]
mask = ["none", "causal-br"]
layout = ["dense"]
"#;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_attnforge"))
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("run attnforge")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

/// A failed command: non-zero, one `attnforge: error:` line, no panic.
fn assert_clean_failure(out: &Output, needle: &str) {
    let err = text(&out.stderr);
    assert!(!out.status.success(), "expected failure, got success: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    assert!(err.contains(needle), "stderr lacks {needle:?}: {err}");
}

fn nvrtc_available() -> bool {
    let ok = attnforge::compile::Nvrtc::get().is_ok();
    if !ok && std::env::var_os("ATTNFORGE_REQUIRE_NVRTC").is_some_and(|v| v != "0") {
        panic!("ATTNFORGE_REQUIRE_NVRTC is set but NVRTC is missing");
    }
    if !ok {
        println!("skipped: NVRTC not found");
    }
    ok
}

fn prebuild(cache_dir: &Path, matrix: &Path, extra_env: &[(&str, &Path)]) -> Output {
    let mut c = bin();
    c.args(["prebuild", "--arch", "sm80", "--matrix"])
        .arg(matrix)
        .arg("--quiet");
    c.env("ATTNFORGE_CACHE_DIR", cache_dir)
        .env_remove("ATTNFORGE_CACHE_PATH");
    for (k, v) in extra_env {
        c.env(k, v);
    }
    run(&mut c)
}

fn summary_counts(out: &Output) -> (usize, usize, usize) {
    let s = text(&out.stdout);
    let grab = |word: &str| -> usize {
        let i = s
            .find(&format!(" {word}"))
            .unwrap_or_else(|| panic!("no {word} in {s}"));
        s[..i]
            .rsplit(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    (grab("compiled"), grab("cached"), grab("failed"))
}

fn tree_digest(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((p.display().to_string(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn bad_specs_and_arguments_are_one_line_errors() {
    let cases: &[(&[&str], &str)] = &[
        (&["plan", "fwd.f32.d128.none.dense.sm80"], "invalid dtype `f32`"),
        (&["plan", "fwd.bf16.d100.none.dense.sm80"], "head_dim_qk"),
        (&["plan", "fwd.bf16.d128.none.dense.sm75"], "allowed values are sm80"),
        (&["plan", "fwd.bf16.d128.none.dense.det.sm80"], "bwd"),
        (&["plan", "garbage"], "cannot parse spec"),
        (
            &["compile", "fwd.bf16.d128.none.dense.sm80", "--emit", "cubin"],
            "-o FILE",
        ),
        (&["prebuild", "--arch", "sm75"], "invalid arch"),
        (
            &["prebuild", "--matrix", "/nonexistent/matrix.toml"],
            "cannot read matrix file",
        ),
        (&["cache", "gc", "--max-size", "lots"], "size"),
    ];
    for (args, needle) in cases {
        let out = run(bin().args(*args));
        assert_clean_failure(&out, needle);
        let err = text(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{args:?}: more than one line: {err}");
    }
    // clap's own errors: usage on stderr, exit 2, no panic.
    for args in [&["frobnicate"][..], &["plan"], &["compile", "x", "--emit", "elf"]] {
        let out = run(bin().args(args));
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!text(&out.stderr).contains("panicked"));
    }
}

#[test]
fn a_bad_matrix_file_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("m.toml");
    std::fs::write(
        &m,
        "[[group]]\ndtype = [\"f16\"]\nhead_dim = [100]\nmask = [\"none\"]\nlayout = [\"dense\"]\n",
    )
    .unwrap();
    let out = run(bin().args(["prebuild", "--arch", "sm80", "--matrix"]).arg(&m));
    assert_clean_failure(&out, "head_dim_qk");
}

#[test]
fn plan_and_help_describe_the_spec() {
    let out = run(bin().args(["plan", "fwd.bf16.d128.causal-br.thd.sm90a"]));
    assert!(out.status.success());
    let s = text(&out.stdout);
    assert!(
        s.contains("entry       attnforge_fwd_bf16_d128_causal_br_thd_sm90a") && s.contains("why:"),
        "{s}"
    );
    // --json: the plan as the cache's metadata keeps it.
    let out = run(bin().args(["plan", "fwd.bf16.d128.none.dense.sm90a", "--json"]));
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_str(&text(&out.stdout)).expect("plan JSON");
    assert_eq!(
        (v["block_m"].as_u64(), v["block_n"].as_u64()),
        (Some(192), Some(80)),
        "{v}"
    );
    assert_eq!(v["entry"], "attnforge_fwd_bf16_d128_none_dense_sm90a");
    let out = run(bin().arg("--help"));
    assert!(text(&out.stdout).contains("causal-br"));
    let out = run(bin().args(["compile", "fwd.f16.d64.none.dense.sm80", "--emit", "cu"]));
    assert!(out.status.success());
    assert!(text(&out.stdout).contains("mma.sync.aligned.m16n8k16"));
}

#[test]
fn the_sm80_path_on_sm90a_by_request() {
    // The plan: the sm80 template, and the reason says what the planner takes.
    let out = run(bin().args(["plan", "bwd.bf16.d128.none.dense.sm90a", "--path", "sm80"]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(s.contains("template    bwd_sm80.cu"), "{s}");
    assert!(
        s.contains("sm80 instruction path requested: bwd_sm80.cu instead of the planner's bwd_sm90a.cu"),
        "{s}"
    );
    let out = run(bin().args(["plan", "bwd.bf16.d128.none.dense.sm90a"]));
    assert!(text(&out.stdout).contains("template    bwd_sm90a.cu"));
    // Its source, and a bad value is a clean error.
    let out = run(bin().args([
        "compile",
        "fwd.bf16.d128.none.dense.sm90a",
        "--emit",
        "cu",
        "--path",
        "sm80",
    ]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("mma.sync.aligned.m16n8k16"));
    assert!(!text(&out.stdout).contains("wgmma.mma_async"));
    assert_clean_failure(
        &run(bin().args(["plan", "fwd.bf16.d64.none.dense.sm90a", "--path", "sm70"])),
        "sm70",
    );
    if !nvrtc_available() {
        return;
    }
    // A cubin, compiled fresh for sm_90a.
    let dir = tempfile::tempdir().unwrap();
    let cubin = dir.path().join("k.cubin");
    let out = run(bin()
        .args(["compile", "fwd.bf16.d64.causal-br.thd.sm90a", "--path", "sm80", "-o"])
        .arg(&cubin)
        .env("ATTNFORGE_CACHE_DIR", dir.path().join("cache")));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("(Compiled, key"), "{}", text(&out.stderr));
    let bytes = std::fs::read(&cubin).unwrap();
    assert_eq!(&bytes[..4], b"\x7fELF");
}

#[test]
fn the_mid_keys_variant_by_request() {
    // d64 causal has one: the plan names both key ranges; --path mid-keys
    // prints two consumers at block_n 128, and a spec without one fails
    // cleanly.
    let s = text(&run(bin().args(["plan", "fwd.bf16.d64.causal-tl.dense.sm90a", "--path", "mid-keys"])).stdout);
    assert!(
        s.contains("block_m=128 block_n=128") && s.contains("variant for mid-length keys (769..=1024"),
        "{s}"
    );
    // d128 without a mask (three consumers since session 41): the short-keys
    // plan up to 1024 keys, then the main plan.
    let s = text(&run(bin().args(["plan", "fwd.bf16.d128.none.dense.sm90a"])).stdout);
    assert!(
        s.contains("block_m=192 block_n=80") && s.contains("calls with keys up to 1024 take the short-keys plan"),
        "{s}"
    );
    // d256 causal on dense tensors: the short-keys plan up to 2048 keys.
    let s = text(&run(bin().args(["plan", "fwd.bf16.d256.causal-tl.dense.sm90a"])).stdout);
    assert!(s.contains("calls with keys up to 2048 take the short-keys plan"), "{s}");
    // d64 causal: one consumer up to 768 keys, two up to 1024.
    let s = text(&run(bin().args(["plan", "fwd.bf16.d64.causal-tl.dense.sm90a"])).stdout);
    assert!(
        s.contains("calls with keys up to 768 take the short-keys plan")
            && s.contains("calls with keys of 769..=1024 take the mid-keys plan"),
        "{s}"
    );
    for other in [
        "fwd.bf16.d128.causal-tl.dense.sm90a",
        "fwd.bf16.d128.none.thd.sm90a",
        "fwd.bf16.d128.none.dense.sm90a",
    ] {
        assert_clean_failure(
            &run(bin().args(["plan", other, "--path", "mid-keys"])),
            "has no mid-keys variant",
        );
        assert!(!text(&run(bin().args(["plan", other])).stdout).contains("mid-keys plan"));
    }
}

#[test]
fn the_short_keys_variant_by_request() {
    // The planner's plan names the variant; --path short-keys prints it.
    let spec = "fwd.bf16.d128.causal-tl.dense.sm90a";
    let out = run(bin().args(["plan", spec]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(
        s.contains("block_m=192") && s.contains("calls with keys up to 1024 take the short-keys plan"),
        "{s}"
    );
    let out = run(bin().args(["plan", spec, "--path", "short-keys"]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(
        s.contains("block_m=128 block_n=128") && s.contains("variant for short keys"),
        "{s}"
    );
    // Specs without one (ragged d128 without a mask: session 48), and a
    // backward: clean errors that say so.
    for other in [
        "fwd.bf16.d256.none.dense.sm90a",
        "fwd.bf16.d128.none.thd.sm90a",
        "bwd.bf16.d128.causal-tl.dense.sm90a",
    ] {
        assert_clean_failure(
            &run(bin().args(["plan", other, "--path", "short-keys"])),
            "has no short-keys variant",
        );
    }
    let out = run(bin().args(["plan", "fwd.bf16.d256.none.dense.sm90a"]));
    assert!(!text(&out.stdout).contains("short-keys plan"));
    if !nvrtc_available() {
        return;
    }
    // Its cubin goes through the cache: compiled once, then a disk hit in a new process.
    let dir = tempfile::tempdir().unwrap();
    let cubin = dir.path().join("k.cubin");
    let compile = || {
        run(bin()
            .args([
                "compile",
                "fwd.bf16.d64.causal-br.dense.sm90a",
                "--path",
                "short-keys",
                "-o",
            ])
            .arg(&cubin)
            .env("ATTNFORGE_CACHE_DIR", dir.path().join("cache"))
            .env_remove("ATTNFORGE_CACHE_PATH"))
    };
    let first = compile();
    assert!(first.status.success(), "{}", text(&first.stderr));
    assert!(
        text(&first.stderr).contains("(Compiled, key"),
        "{}",
        text(&first.stderr)
    );
    let second = compile();
    assert!(text(&second.stderr).contains("(Disk, key"), "{}", text(&second.stderr));
    assert!(text(&second.stderr).contains("0/0 B spill"), "{}", text(&second.stderr));
}

#[test]
fn prebuild_then_hits_then_repairs_a_damaged_entry() {
    if !nvrtc_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("m.toml");
    std::fs::write(&m, SMALL_MATRIX).unwrap();
    let cache = tmp.path().join("cache");
    let out = prebuild(&cache, &m, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(summary_counts(&out), (3, 0, 0));
    let out = prebuild(&cache, &m, &[]);
    assert_eq!(summary_counts(&out), (0, 3, 0), "second run must be all hits");

    let verify = |cache: &Path| run(bin().args(["cache", "verify"]).env("ATTNFORGE_CACHE_DIR", cache));
    assert!(verify(&cache).status.success());
    // Flip one byte of one blob: verify fails, prebuild recompiles it, verify is clean again.
    let blob = tree_digest(&cache)
        .into_iter()
        .map(|(p, _)| p)
        .find(|p| p.ends_with(".cubin"))
        .unwrap();
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes[100] ^= 0x40;
    std::fs::write(&blob, bytes).unwrap();
    let out = verify(&cache);
    assert_clean_failure(&out, "bad cache entries");
    assert!(text(&out.stdout).contains("BAD"));
    let out = prebuild(&cache, &m, &[]);
    assert!(out.status.success());
    assert_eq!(summary_counts(&out), (1, 2, 0));
    assert!(verify(&cache).status.success());

    let ls = run(bin().args(["cache", "ls"]).env("ATTNFORGE_CACHE_DIR", &cache));
    let s = text(&ls.stdout);
    assert!(
        s.contains("fwd.bf16.d64.window.thd.softcap.sm80") && s.contains("3 entries"),
        "{s}"
    );
}

#[test]
fn two_concurrent_prebuilds_share_one_cache() {
    if !nvrtc_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("m.toml");
    std::fs::write(&m, SMALL_MATRIX).unwrap();
    let cache = tmp.path().join("cache");
    let spawn = || {
        bin()
            .args(["prebuild", "--arch", "sm80,sm90a", "--quiet", "--jobs", "2", "--matrix"])
            .arg(&m)
            .env("ATTNFORGE_CACHE_DIR", &cache)
            .env_remove("ATTNFORGE_CACHE_PATH")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    for o in [&a, &b] {
        assert!(o.status.success(), "{}", text(&o.stderr));
        assert_eq!(summary_counts(o).2, 0);
    }
    let out = run(bin().args(["cache", "verify"]).env("ATTNFORGE_CACHE_DIR", &cache));
    assert!(out.status.success(), "{}", text(&out.stdout));
    let out = prebuild(&cache, &m, &[]);
    assert_eq!(summary_counts(&out), (0, 3, 0));
}

#[test]
fn read_only_prebuilt_root_layers_under_the_user_root() {
    if !nvrtc_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("m.toml");
    std::fs::write(&m, SMALL_MATRIX).unwrap();
    let shipped = tmp.path().join("shipped");
    assert!(prebuild(&shipped, &m, &[]).status.success());
    let before = tree_digest(&shipped);
    let user = tmp.path().join("user");
    let out = prebuild(&user, &m, &[("ATTNFORGE_CACHE_PATH", &shipped)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(summary_counts(&out), (0, 3, 0), "served from the read-only root");
    assert_eq!(tree_digest(&shipped), before, "read-only root was modified");
    let stats = run(bin()
        .args(["cache", "stats"])
        .env("ATTNFORGE_CACHE_DIR", &user)
        .env("ATTNFORGE_CACHE_PATH", &shipped));
    let s = text(&stats.stdout);
    assert!(s.contains("total: 3 entries"), "{s}");
}

#[test]
fn unwritable_cache_dir_degrades_to_memory_with_one_warning() {
    if !nvrtc_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("m.toml");
    std::fs::write(&m, SMALL_MATRIX).unwrap();
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let out = prebuild(&file.join("cache"), &m, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(summary_counts(&out), (3, 0, 0));
    let warnings = text(&out.stderr).lines().filter(|l| l.contains("warning")).count();
    assert_eq!(warnings, 1, "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("<memory>"));
}

#[test]
fn a_prebuilt_root_serves_kernels_where_nvrtc_is_missing() {
    if !nvrtc_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("m.toml");
    std::fs::write(&m, SMALL_MATRIX).unwrap();
    let shipped = tmp.path().join("shipped");
    assert!(prebuild(&shipped, &m, &[]).status.success());
    // A machine without NVRTC: ATTNFORGE_NVRTC is authoritative and points nowhere.
    let compile = |spec: &str| {
        run(bin()
            .args(["compile", spec, "--emit", "cubin", "-o"])
            .arg(tmp.path().join("k.cubin"))
            .env("ATTNFORGE_NVRTC", tmp.path().join("no-such-libnvrtc.so.13"))
            .env("ATTNFORGE_CACHE_PATH", &shipped)
            .env("ATTNFORGE_CACHE_DIR", tmp.path().join("user")))
    };
    let out = compile("fwd.f16.d64.causal-br.dense.sm80");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("Disk"), "{}", text(&out.stderr));
    let cubin = std::fs::read(tmp.path().join("k.cubin")).unwrap();
    assert_eq!(&cubin[..4], b"\x7fELF");
    // A spec that was not prebuilt still needs NVRTC, and says so.
    let out = compile("fwd.f16.d128.causal-br.dense.sm80");
    assert_clean_failure(&out, "NVRTC");
}

#[test]
fn multi_line_errors_say_how_to_see_their_details() {
    let tmp = tempfile::tempdir().unwrap();
    let run_with = |verbose: bool| {
        let mut c = bin();
        c.args(["compile", "fwd.f16.d64.none.dense.sm80", "--emit", "cubin", "-o"])
            .arg(tmp.path().join("k.cubin"))
            .env("ATTNFORGE_NVRTC", tmp.path().join("no-such-libnvrtc.so.13"))
            .env("ATTNFORGE_CACHE_DIR", tmp.path().join("user"))
            .env_remove("ATTNFORGE_CACHE_PATH")
            .env_remove("ATTNFORGE_VERBOSE");
        if verbose {
            c.env("ATTNFORGE_VERBOSE", "1");
        }
        run(&mut c)
    };
    // The missing-NVRTC error has several lines (what was searched).
    let out = run_with(false);
    assert_clean_failure(&out, "NVRTC");
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("(details: set ATTNFORGE_VERBOSE=1)"), "{err}");
    let out = run_with(true);
    let err = text(&out.stderr);
    assert!(err.lines().count() > 2 && err.contains("Searched"), "{err}");
}

#[test]
fn prebuild_on_the_sm80_path_builds_what_that_policy_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("m.toml");
    std::fs::write(&m, SMALL_MATRIX).unwrap();
    let cache = tmp.path().join("cache");
    let go = |flag: Option<&str>, env: Option<&str>| {
        let mut c = bin();
        c.args(["prebuild", "--arch", "sm90a", "--quiet", "--matrix"]).arg(&m);
        if let Some(f) = flag {
            c.args(["--generated-path", f]);
        }
        c.env("ATTNFORGE_CACHE_DIR", &cache).env_remove("ATTNFORGE_CACHE_PATH");
        match env {
            Some(v) => c.env("ATTNFORGE_GENERATED_PATH", v),
            None => c.env_remove("ATTNFORGE_GENERATED_PATH"),
        };
        run(&mut c)
    };
    // A value that names no path: a clean error before anything compiles.
    assert_clean_failure(&go(None, Some("sm75")), "is not `planner` or `sm80`");
    if !nvrtc_available() {
        return;
    }
    let out = go(Some("sm80"), None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("on the sm80 instruction path"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(summary_counts(&out), (3, 0, 0));
    // The environment's path is the default: the same kernels, all hits.
    let out = go(None, Some("sm80"));
    assert_eq!(summary_counts(&out), (0, 3, 0), "{}", text(&out.stdout));
    // They are the sm80 template's: each entry's shared memory is its
    // sm80-path plan's, not the wgmma plan's.
    let ls = text(&run(bin().args(["cache", "ls"]).env("ATTNFORGE_CACHE_DIR", &cache)).stdout);
    assert!(ls.contains("3 entries"), "{ls}");
    let smem = |spec: &str, path: &str| -> String {
        let p = text(&run(bin().args(["plan", spec, "--path", path, "--json"])).stdout);
        let v: serde_json::Value = serde_json::from_str(&p).unwrap();
        v["smem_bytes"].to_string()
    };
    for spec in ["fwd.f16.d64.none.dense.sm90a", "fwd.f16.d64.causal-br.dense.sm90a"] {
        let (sm80, wgmma) = (smem(spec, "sm80"), smem(spec, "planner"));
        assert_ne!(sm80, wgmma, "{spec}");
        let line = ls
            .lines()
            .find(|l| l.starts_with(spec))
            .unwrap_or_else(|| panic!("{spec} not in {ls}"));
        assert!(
            line.split_whitespace().any(|w| w == sm80),
            "{spec}: {line} (sm80-path smem {sm80})"
        );
    }
}

#[test]
fn doctor_shows_the_policy_from_the_environment() {
    let out = run(bin()
        .arg("doctor")
        .env("ATTNFORGE_GENERATED_PATH", "sm80")
        .env("ATTNFORGE_BACKEND_FWD", "generated")
        .env_remove("ATTNFORGE_BACKEND_BWD"));
    let s = text(&out.stdout);
    assert!(
        s.contains("policy     fwd=generated (ATTNFORGE_BACKEND_FWD) bwd=auto generated-path=sm80"),
        "{s}"
    );
    let out = run(bin().arg("doctor").env("ATTNFORGE_GENERATED_PATH", "sm75"));
    assert!(
        text(&out.stdout).contains("is not `planner` or `sm80`"),
        "{}",
        text(&out.stdout)
    );
}

#[cfg(unix)]
#[test]
fn a_reader_that_stops_early_ends_the_output_quietly() {
    // `attnforge plan SPEC | head -1`: the reader is gone before the plan is
    // printed. The process ends by SIGPIPE (or, had it written everything
    // first, succeeds), never with a panic from `println!`.
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let mut child = bin()
        .args(["plan", "fwd.bf16.d128.none.dense.sm90a"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run attnforge");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait");
    let err = text(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        out.status.success() || out.status.signal() == Some(13),
        "{:?}: {err}",
        out.status
    );
}
