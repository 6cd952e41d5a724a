//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, SystemTime};

use attnforge_cache::{CacheConfig, CacheKey, KernelMeta, KeyBuilder};
use sha2::{Digest, Sha256};

/// Env var that turns a test binary into a child worker.
pub const CHILD_ENV: &str = "ATTNFORGE_CACHE_TEST_CHILD";

/// The key of test entry `i`.
pub fn key(i: u32) -> CacheKey {
    KeyBuilder::new()
        .field("spec", spec(i))
        .field("nvrtc", "13.0")
        .field("arch", "sm_80")
        .finish()
}

pub fn spec(i: u32) -> String {
    format!("fwd.bf16.d{i}.causal-br.dense.sm80")
}

/// Deterministic blob bytes of entry `i` (a few KiB, different per entry).
pub fn blob(i: u32) -> Vec<u8> {
    let len = 2048 + (i as usize * 97) % 4096;
    let mut x: u32 = 0x9e37_79b9 ^ i;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect()
}

/// Metadata of entry `i` (blob fields filled in).
pub fn meta(i: u32) -> KernelMeta {
    let mut m = KernelMeta {
        spec: spec(i),
        entry: format!("attnforge_fwd_{i}"),
        arch: "sm_80".into(),
        nvrtc_version: "13.0".into(),
        registers: 128,
        stack_frame: 0,
        spill_stores: 0,
        spill_loads: 0,
        smem_static: 0,
        smem_dynamic: 49152,
        compile_ms: 812.5,
        created_unix: 1_700_000_000,
        log: "ptxas info: ok".into(),
        cubin_sha256: String::new(),
        cubin_len: 0,
        extra: serde_json::json!({ "plan": { "block_m": 128, "block_n": 64, "i": i } }),
    };
    m.fill_blob_fields(&blob(i));
    m
}

pub fn user_cfg(root: &Path) -> CacheConfig {
    CacheConfig::with_user_root(root)
}

/// `<root>/v1/blobs/<xx>/<key>.cubin`
pub fn blob_path(root: &Path, k: &CacheKey) -> PathBuf {
    shard_dir(root, k).join(format!("{k}.cubin"))
}

pub fn meta_path(root: &Path, k: &CacheKey) -> PathBuf {
    shard_dir(root, k).join(format!("{k}.json"))
}

pub fn shard_dir(root: &Path, k: &CacheKey) -> PathBuf {
    root.join("v1").join("blobs").join(&k.to_string()[..2])
}

/// Sets a file's mtime.
pub fn set_mtime(path: &Path, t: SystemTime) {
    let f = fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    f.set_modified(t)
        .unwrap_or_else(|e| panic!("set mtime {}: {e}", path.display()));
}

pub fn ago(secs: u64) -> SystemTime {
    SystemTime::now() - Duration::from_secs(secs)
}

/// A hash of a directory tree: relative paths, file contents, mtimes and
/// permission bits of every file and directory.
pub fn tree_hash(root: &Path) -> String {
    fn walk(base: &Path, dir: &Path, h: &mut Sha256) {
        let mut items: Vec<_> = fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
            .map(|e| e.expect("dir entry").path())
            .collect();
        items.sort();
        for p in items {
            let md = fs::symlink_metadata(&p).expect("metadata");
            let rel = p.strip_prefix(base).expect("prefix");
            h.update(rel.to_string_lossy().as_bytes());
            h.update(format!("{:?}", md.modified().ok()).as_bytes());
            h.update(format!("{:?}", md.permissions()).as_bytes());
            if md.is_dir() {
                h.update(b"/");
                walk(base, &p, h);
            } else {
                h.update(md.len().to_le_bytes());
                h.update(fs::read(&p).expect("read"));
            }
        }
    }
    let mut h = Sha256::new();
    walk(root, root, &mut h);
    hex::encode(h.finalize())
}

/// Runs this test binary's test `test_name` as a child process in mode
/// `mode`, with extra env vars. The child test must return immediately when
/// `CHILD_ENV` is unset.
pub fn child_command(test_name: &str, mode: &str, envs: &[(&str, String)]) -> Command {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.args([test_name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, mode)
        .env_remove("ATTNFORGE_CACHE_PATH")
        .env_remove("ATTNFORGE_CACHE_DIR");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd
}

pub fn run_child(test_name: &str, mode: &str, envs: &[(&str, String)]) -> Output {
    let out = child_command(test_name, mode, envs).output().expect("spawn child");
    assert!(
        out.status.success(),
        "child {mode} failed: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The child mode requested of this process, if any.
pub fn child_mode() -> Option<String> {
    std::env::var(CHILD_ENV).ok()
}

pub fn env_path(name: &str) -> PathBuf {
    PathBuf::from(std::env::var_os(name).unwrap_or_else(|| panic!("{name} not set")))
}
