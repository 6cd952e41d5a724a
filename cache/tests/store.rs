//! Round trips, layered roots, the in-memory fallback, gc and the index.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use attnforge_cache::{Cache, CacheConfig, CacheError, IndexCheck, Lookup, RootKind, MEMORY_ROOT};
use common::*;

fn expect_hit(cache: &Cache, i: u32) -> PathBuf {
    match cache.get(&key(i)) {
        Lookup::Hit { cubin, meta: m, root } => {
            assert_eq!(cubin, blob(i), "blob of entry {i}");
            assert_eq!(m, meta(i), "meta of entry {i}");
            root
        }
        other => panic!("entry {i}: expected a hit, got {other:?}"),
    }
}

/// Child side of the cross-process tests; a no-op in a normal test run.
#[test]
fn child_main() {
    let Some(mode) = child_mode() else { return };
    match mode.as_str() {
        "put" => {
            let cache = Cache::open(user_cfg(&env_path("CHILD_ROOT")));
            assert!(!cache.is_in_memory());
            cache.put(&key(7), &blob(7), &meta(7)).expect("child put");
        }
        "degrade" => {
            let cfg = user_cfg(&env_path("CHILD_ROOT"));
            let cache = Cache::open(cfg.clone());
            assert!(cache.is_in_memory());
            cache.put(&key(1), &blob(1), &meta(1)).expect("memory put");
            expect_hit(&cache, 1);
            // A second cache in the same process does not repeat the warning.
            let again = Cache::open(cfg);
            assert_eq!(again.warnings().len(), 1);
        }
        "time-get" => {
            // What a fresh process pays for a disk hit: open + get.
            let root = env_path("CHILD_ROOT");
            let started = Instant::now();
            let cache = Cache::open(user_cfg(&root));
            let found = cache.get(&key(0));
            let elapsed = started.elapsed();
            assert!(matches!(found, Lookup::Hit { .. }), "{found:?}");
            // On its own line: libtest prints "test child_main ... " first.
            println!("\nGET_MICROS={}", elapsed.as_micros());
        }
        other => panic!("unknown child mode {other}"),
    }
}

/// The disk-hit path in a new process: a few file reads and one hash, no
/// index. The time is printed, not asserted (speed is measured by
/// `examples/pipeline_bench.rs`, not by timed tests); the child checks the hit.
#[test]
fn disk_hit_in_a_fresh_process() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cubin: Vec<u8> = (0..256 * 1024u32).map(|x| (x * 31 % 251) as u8).collect();
    let mut m = meta(0);
    m.fill_blob_fields(&cubin);
    Cache::open(user_cfg(dir.path())).put(&key(0), &cubin, &m).expect("put");
    let mut best = u128::MAX;
    for _ in 0..3 {
        let out = run_child(
            "child_main",
            "time-get",
            &[("CHILD_ROOT", dir.path().display().to_string())],
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let micros: u128 = stdout
            .lines()
            .find_map(|l| l.split_once("GET_MICROS=").map(|(_, v)| v))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no timing in child output:\n{stdout}"));
        best = best.min(micros);
    }
    println!("open + get of a 256 KiB entry in a fresh process: {best} us");
}

#[test]
fn round_trip_across_fresh_instances() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let cache = Cache::open(user_cfg(dir.path()));
        assert!(!cache.is_in_memory());
        assert!(cache.warnings().is_empty());
        assert_eq!(cache.get(&key(1)), Lookup::Miss);
        cache.put(&key(1), &blob(1), &meta(1)).expect("put");
    }
    let cache = Cache::open(user_cfg(dir.path()));
    assert_eq!(expect_hit(&cache, 1), dir.path());
    assert_eq!(cache.get(&key(2)), Lookup::Miss);
    assert!(blob_path(dir.path(), &key(1)).is_file());
    assert!(meta_path(dir.path(), &key(1)).is_file());
    let v = cache.verify();
    assert!(v.is_clean(), "{:?}", v.issues);
    assert_eq!(v.entries_ok, 1);
}

#[test]
fn round_trip_across_processes() {
    let dir = tempfile::tempdir().expect("tempdir");
    run_child("child_main", "put", &[("CHILD_ROOT", dir.path().display().to_string())]);
    let cache = Cache::open(user_cfg(dir.path()));
    assert_eq!(expect_hit(&cache, 7), dir.path());
}

#[test]
fn put_fills_or_checks_blob_fields() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = Cache::open(user_cfg(dir.path()));
    let mut m = meta(3);
    m.cubin_sha256.clear();
    m.cubin_len = 0;
    cache.put(&key(3), &blob(3), &m).expect("put with empty blob fields");
    expect_hit(&cache, 3);

    let mut wrong = meta(4);
    wrong.cubin_len += 1;
    let err = cache.put(&key(4), &blob(4), &wrong).expect_err("mismatch");
    assert!(matches!(err, CacheError::MetaMismatch { .. }), "{err}");
    assert!(err.to_string().contains(&key(4).to_string()), "{err}");
    assert_eq!(cache.get(&key(4)), Lookup::Miss);
}

#[test]
fn io_errors_name_the_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = Cache::open(user_cfg(dir.path()));
    // Make the shard directory of key(5) a regular file.
    let shard = shard_dir(dir.path(), &key(5));
    fs::write(&shard, b"not a directory").expect("write");
    let err = cache.put(&key(5), &blob(5), &meta(5)).expect_err("put must fail");
    assert!(matches!(err, CacheError::Io { .. }), "{err}");
    assert!(err.to_string().contains(&shard.display().to_string()), "{err}");
}

#[test]
fn list_stats_roots_and_index() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = Cache::open(user_cfg(dir.path()));
    for i in 0..3 {
        cache.put(&key(i), &blob(i), &meta(i)).expect("put");
    }
    let listed = cache.list();
    assert_eq!(listed.len(), 3);
    let mut keys: Vec<_> = (0..3).map(key).collect();
    keys.sort();
    assert_eq!(listed.iter().map(|l| l.key).collect::<Vec<_>>(), keys);
    for l in &listed {
        let i = (0..3).find(|i| key(*i) == l.key).expect("known key");
        assert_eq!(l.meta, meta(i));
        assert_eq!(l.root, dir.path());
        let on_disk = fs::metadata(blob_path(dir.path(), &l.key)).expect("md").len()
            + fs::metadata(meta_path(dir.path(), &l.key)).expect("md").len();
        assert_eq!(l.size, on_disk);
        assert!(l.last_used > 0);
    }
    let stats = cache.stats();
    assert_eq!(stats.total_entries, 3);
    assert_eq!(stats.total_bytes, listed.iter().map(|l| l.size).sum::<u64>());
    assert_eq!(stats.roots.len(), 1);
    assert_eq!(stats.roots[0].kind, RootKind::Writable);

    let roots = cache.roots();
    assert_eq!(roots.len(), 1);
    assert_eq!(roots[0].path, dir.path());
    assert_eq!(roots[0].kind, RootKind::Writable);
    assert!(roots[0].exists);

    // The index maps spec -> key.
    assert!(dir.path().join("v1").join("index.sled").is_dir());
    assert_eq!(cache.indexed_keys_for_spec(&spec(1)), Some(vec![key(1)]));
    assert_eq!(cache.indexed_keys_for_spec("no.such.spec"), Some(vec![]));
    assert_eq!(cache.find_spec(&spec(2)).len(), 1);
    assert_eq!(cache.verify().index, IndexCheck::Checked);

    // The files are the truth: list never shows an index copy of metadata
    // that was replaced on disk.
    let mut edited = meta(1);
    edited.log = "edited on disk".into();
    fs::write(
        meta_path(dir.path(), &key(1)),
        serde_json::to_vec(&edited).expect("json"),
    )
    .expect("write");
    let listed = cache.list();
    let l1 = listed.iter().find(|l| l.key == key(1)).expect("listed");
    assert_eq!(l1.meta.log, "edited on disk");
}

#[test]
fn degrades_to_memory_when_user_root_is_unusable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("a-file");
    fs::write(&file, b"x").expect("write");
    let root = file.join("cache");
    let cache = Cache::open(user_cfg(&root));
    assert!(cache.is_in_memory());
    assert_eq!(cache.warnings().len(), 1, "{:?}", cache.warnings());
    let w = &cache.warnings()[0];
    assert!(w.starts_with("attnforge: warning: cache dir "), "{w}");
    assert!(w.contains(&root.display().to_string()), "{w}");
    assert!(w.contains("is not writable ("), "{w}");
    assert!(w.ends_with("); using an in-memory cache for this process"), "{w}");

    assert_eq!(cache.get(&key(1)), Lookup::Miss);
    cache.put(&key(1), &blob(1), &meta(1)).expect("memory put");
    assert_eq!(expect_hit(&cache, 1), Path::new(MEMORY_ROOT));
    assert_eq!(cache.list().len(), 1);
    assert_eq!(cache.list()[0].root, Path::new(MEMORY_ROOT));
    assert_eq!(cache.stats().total_entries, 1);
    let roots = cache.roots();
    assert_eq!(roots.len(), 1);
    assert_eq!(roots[0].kind, RootKind::InMemory);
    assert!(cache.verify().is_clean());
    assert_eq!(cache.verify().index, IndexCheck::NotApplicable);
    assert!(cache.user_root().is_none());
    assert!(!root.exists());
    assert_eq!(fs::read(&file).expect("read"), b"x");
}

#[test]
fn degrade_prints_exactly_one_warning() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("a-file");
    fs::write(&file, b"x").expect("write");
    let out = run_child(
        "child_main",
        "degrade",
        &[("CHILD_ROOT", file.join("cache").display().to_string())],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("attnforge: warning:")).collect();
    assert_eq!(warnings.len(), 1, "stderr:\n{stderr}");
    assert!(warnings[0].contains("using an in-memory cache for this process"));
}

#[test]
fn memory_store_gc_is_lru() {
    let cache = Cache::open(CacheConfig::default());
    assert!(cache.is_in_memory());
    assert_eq!(cache.warnings().len(), 1);
    for i in 0..4 {
        cache.put(&key(i), &blob(i), &meta(i)).expect("put");
    }
    expect_hit(&cache, 0); // 0 becomes most recently used
    let keep = (blob(0).len() + blob(3).len()) as u64;
    let report = cache.gc(keep).expect("gc");
    assert_eq!(report.evicted, vec![key(1), key(2)]);
    assert_eq!(report.bytes_after, keep);
    assert_eq!(report.entries_after, 2);
    expect_hit(&cache, 0);
    expect_hit(&cache, 3);
    assert_eq!(cache.get(&key(1)), Lookup::Miss);
}

#[test]
fn gc_evicts_least_recently_used_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = Cache::open(user_cfg(dir.path()));
    for i in 0..5 {
        cache.put(&key(i), &blob(i), &meta(i)).expect("put");
        // Entry 0 oldest, entry 4 newest.
        set_mtime(&blob_path(dir.path(), &key(i)), ago(3600 * (10 - i as u64)));
    }
    // A hit refreshes last_used: entry 0 becomes the newest.
    expect_hit(&cache, 0);
    let sizes: Vec<u64> = cache.list().iter().map(|l| l.size).collect();
    let total: u64 = sizes.iter().sum();
    let size_of = |i: u32| {
        cache
            .list()
            .into_iter()
            .find(|l| l.key == key(i))
            .map(|l| l.size)
            .expect("listed")
    };
    let keep = size_of(0) + size_of(3) + size_of(4);
    // Room for three entries (plus a little): 1 and 2 must go.
    let report = cache.gc(keep + 10).expect("gc");
    assert_eq!(report.bytes_before, total);
    assert_eq!(report.evicted, vec![key(1), key(2)]);
    assert_eq!(report.bytes_after, keep);
    assert_eq!(report.entries_after, 3);
    assert!(report.index_updated);
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    for i in [1, 2] {
        assert_eq!(cache.get(&key(i)), Lookup::Miss);
        assert!(!blob_path(dir.path(), &key(i)).exists());
    }
    for i in [0, 3, 4] {
        expect_hit(&cache, i);
    }
    assert_eq!(cache.indexed_keys_for_spec(&spec(1)), Some(vec![]));
    let v = cache.verify();
    assert!(v.is_clean(), "{:?}", v.issues);

    // A limit above the total evicts nothing; zero evicts everything.
    assert!(cache.gc(u64::MAX).expect("gc").evicted.is_empty());
    let report = cache.gc(0).expect("gc");
    assert_eq!(report.evicted.len(), 3);
    assert_eq!(report.bytes_after, 0);
    assert!(cache.list().is_empty());
    assert!(cache.verify().is_clean());
}

/// Builds a prebuilt root containing entries `ids` and returns its path.
fn prebuilt_root(parent: &Path, ids: &[u32]) -> PathBuf {
    let root = parent.join("prebuilt");
    let cache = Cache::open(user_cfg(&root));
    for &i in ids {
        cache.put(&key(i), &blob(i), &meta(i)).expect("prebuild put");
    }
    root
}

#[cfg(unix)]
fn chmod_tree(root: &Path, file_mode: u32, dir_mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    fn walk(p: &Path, f: u32, d: u32) {
        let md = fs::symlink_metadata(p).expect("md");
        if md.is_dir() {
            for e in fs::read_dir(p).expect("read_dir") {
                walk(&e.expect("entry").path(), f, d);
            }
            fs::set_permissions(p, fs::Permissions::from_mode(d)).expect("chmod");
        } else {
            fs::set_permissions(p, fs::Permissions::from_mode(f)).expect("chmod");
        }
    }
    walk(root, file_mode, dir_mode);
}

#[test]
fn read_only_root_is_searched_first_and_never_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ro = prebuilt_root(dir.path(), &[1, 2]);
    #[cfg(unix)]
    chmod_tree(&ro, 0o444, 0o555);
    let before = tree_hash(&ro);

    let user = dir.path().join("user");
    let cache = Cache::open(CacheConfig {
        read_only_roots: vec![ro.clone(), dir.path().join("missing-root")],
        user_root: Some(user.clone()),
    });
    assert!(!cache.is_in_memory());
    let roots = cache.roots();
    assert_eq!(
        roots.iter().map(|r| (r.kind, r.exists)).collect::<Vec<_>>(),
        vec![
            (RootKind::ReadOnly, true),
            (RootKind::ReadOnly, false),
            (RootKind::Writable, true)
        ]
    );

    // Present only in the read-only root: hits from there.
    assert_eq!(expect_hit(&cache, 1), ro);
    assert_eq!(expect_hit(&cache, 2), ro);
    // A put goes to the user root, even for a key the prebuilt root has.
    cache.put(&key(3), &blob(3), &meta(3)).expect("put");
    cache.put(&key(1), &blob(1), &meta(1)).expect("put");
    assert!(blob_path(&user, &key(3)).is_file());
    assert!(blob_path(&user, &key(1)).is_file());
    assert_eq!(expect_hit(&cache, 3), user);
    assert_eq!(expect_hit(&cache, 1), ro, "read-only roots come first");

    // Read-side maintenance never writes the read-only root, nor does gc.
    let listed = cache.list();
    assert_eq!(listed.len(), 4);
    assert_eq!(listed.iter().filter(|l| l.root == ro).count(), 2);
    assert_eq!(cache.stats().roots.len(), 3);
    let v = cache.verify();
    assert!(v.is_clean(), "{:?}", v.issues);
    assert_eq!(v.entries_ok, 4);
    assert_eq!(cache.find_spec(&spec(1)).len(), 2);
    let report = cache.gc(0).expect("gc");
    assert_eq!(report.root, user);
    assert_eq!(report.evicted.len(), 2);
    assert_eq!(expect_hit(&cache, 1), ro);

    assert_eq!(tree_hash(&ro), before, "the read-only root was modified");
    #[cfg(unix)]
    chmod_tree(&ro, 0o644, 0o755);
}

#[test]
fn corrupt_read_only_entry_does_not_hide_user_copy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ro = prebuilt_root(dir.path(), &[1]);
    fs::write(blob_path(&ro, &key(1)), b"damaged").expect("damage");
    let before = tree_hash(&ro);
    let user = dir.path().join("user");
    let cache = Cache::open(CacheConfig {
        read_only_roots: vec![ro.clone()],
        user_root: Some(user.clone()),
    });
    match cache.get(&key(1)) {
        Lookup::Corrupt { path, .. } => assert_eq!(path, blob_path(&ro, &key(1))),
        other => panic!("expected corrupt, got {other:?}"),
    }
    cache.put(&key(1), &blob(1), &meta(1)).expect("put");
    assert_eq!(expect_hit(&cache, 1), user);
    assert_eq!(tree_hash(&ro), before);
}

#[test]
fn shared_between_threads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = Arc::new(Cache::open(user_cfg(dir.path())));
    let started = Instant::now();
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let cache = Arc::clone(&cache);
            std::thread::spawn(move || {
                for n in 0..20u32 {
                    let i = (n + t * 5) % 20;
                    cache.put(&key(i), &blob(i), &meta(i)).expect("put");
                    expect_hit(&cache, i);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("thread");
    }
    eprintln!("4 threads x 20 puts: {:?}", started.elapsed());
    assert_eq!(cache.list().len(), 20);
    let v = cache.verify();
    assert!(v.is_clean(), "{:?}", v.issues);
}
