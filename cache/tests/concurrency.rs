//! Many processes and threads on one root, and a sled index held by someone
//! else.

mod common;

use std::fs;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use attnforge_cache::{Cache, IndexCheck, Lookup};
use common::*;

const KEYS: u32 = 50;
const PROCESSES: u32 = 6;
const THREADS: u32 = 6;

fn wait_for(path: &Path, limit: Duration) {
    let start = Instant::now();
    while !path.exists() {
        assert!(start.elapsed() < limit, "timed out waiting for {}", path.display());
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// One worker: puts and gets all keys, in an order that depends on `worker`
/// so that workers collide on different keys at different times.
fn hammer(cache: &Cache, worker: u32) {
    for n in 0..KEYS {
        let i = (n * 7 + worker * 11) % KEYS;
        match cache.get(&key(i)) {
            Lookup::Hit { cubin, meta: m, .. } => {
                assert_eq!(cubin, blob(i), "worker {worker} key {i}");
                assert_eq!(m, meta(i));
            }
            Lookup::Miss => {}
            Lookup::Corrupt { path, reason } => {
                panic!("worker {worker} key {i}: corrupt {}: {reason}", path.display())
            }
        }
        // Every worker writes every key: same-key writers collide.
        cache.put(&key(i), &blob(i), &meta(i)).expect("put");
        match cache.get(&key(i)) {
            Lookup::Hit { cubin, .. } => assert_eq!(cubin, blob(i)),
            other => panic!("worker {worker} key {i}: after put: {other:?}"),
        }
    }
    for i in 0..KEYS {
        assert!(matches!(cache.get(&key(i)), Lookup::Hit { .. }), "final get {i}");
    }
}

/// Child side of the cross-process tests; a no-op in a normal test run.
#[test]
fn child_main() {
    let Some(mode) = child_mode() else { return };
    let root = env_path("CHILD_ROOT");
    match mode.as_str() {
        "hammer" => {
            let worker: u32 = std::env::var("CHILD_WORKER")
                .expect("CHILD_WORKER")
                .parse()
                .expect("worker number");
            let cache = Cache::open(user_cfg(&root));
            assert!(!cache.is_in_memory());
            wait_for(&root.join("go"), Duration::from_secs(60));
            hammer(&cache, worker);
        }
        "hold-sled" => {
            let db = sled::open(root.join("v1").join("index.sled")).expect("child opens sled");
            fs::write(root.join("held"), b"").expect("marker");
            wait_for(&root.join("release"), Duration::from_secs(60));
            drop(db);
        }
        "hold-index-lock" => {
            // A cooperating process stuck in the middle of an index update.
            use fs2::FileExt;
            let f = fs::File::create(root.join("v1").join("index.lock")).expect("lock file");
            f.lock_exclusive().expect("lock");
            fs::write(root.join("held"), b"").expect("marker");
            wait_for(&root.join("release"), Duration::from_secs(60));
            drop(f);
        }
        other => panic!("unknown child mode {other}"),
    }
}

#[test]
fn many_processes_put_and_get_the_same_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().to_path_buf();
    let mut children: Vec<_> = (0..PROCESSES)
        .map(|w| {
            child_command(
                "child_main",
                "hammer",
                &[
                    ("CHILD_ROOT", root.display().to_string()),
                    ("CHILD_WORKER", w.to_string()),
                ],
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn")
        })
        .collect();
    // Let them all start, then release them at once.
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    fs::write(root.join("go"), b"").expect("go");
    for (w, child) in children.drain(..).enumerate() {
        let out = child.wait_with_output().expect("wait");
        assert!(
            out.status.success(),
            "worker {w} failed: {}\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    eprintln!("{PROCESSES} processes x {KEYS} keys: {:?}", started.elapsed());

    let cache = Cache::open(user_cfg(&root));
    let v = cache.verify();
    assert!(v.is_clean(), "{:#?}", v.issues);
    assert_eq!(v.entries_ok, KEYS as u64);
    assert_eq!(cache.list().len(), KEYS as usize);
    for i in 0..KEYS {
        assert!(matches!(cache.get(&key(i)), Lookup::Hit { .. }));
    }
    // Nothing but entries is left behind (no temp files).
    assert_eq!(cache.stats().roots[0].temp_files, 0);
}

#[test]
fn many_threads_put_and_get_the_same_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let barrier = Arc::new(Barrier::new(THREADS as usize));
    let handles: Vec<_> = (0..THREADS)
        .map(|w| {
            let root = dir.path().to_path_buf();
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                // Half the threads share nothing but the directory.
                let cache = Cache::open(user_cfg(&root));
                barrier.wait();
                hammer(&cache, w);
            })
        })
        .collect();
    for h in handles {
        h.join().expect("worker thread");
    }
    let cache = Cache::open(user_cfg(dir.path()));
    let v = cache.verify();
    assert!(v.is_clean(), "{:#?}", v.issues);
    assert_eq!(v.entries_ok, KEYS as u64);
}

/// Readers racing a writer never see a half-published entry: the blob is
/// published before the metadata, so they see a miss, then a hit.
#[test]
fn readers_racing_a_writer_see_miss_or_hit_only() {
    const N: u32 = 150;
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = Arc::new(Cache::open(user_cfg(dir.path())));
    let current = Arc::new(AtomicU32::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (cache, current, done) = (Arc::clone(&cache), Arc::clone(&current), Arc::clone(&done));
            std::thread::spawn(move || {
                let (mut misses, mut hits) = (0u64, 0u64);
                while !done.load(Ordering::Acquire) {
                    let i = current.load(Ordering::Acquire);
                    match cache.get(&key(i)) {
                        Lookup::Miss => misses += 1,
                        Lookup::Hit { cubin, .. } => {
                            assert_eq!(cubin, blob(i));
                            hits += 1
                        }
                        Lookup::Corrupt { path, reason } => {
                            panic!("key {i}: reader saw {}: {reason}", path.display())
                        }
                    }
                }
                (misses, hits)
            })
        })
        .collect();
    for i in 0..N {
        current.store(i, Ordering::Release);
        cache.put(&key(i), &blob(i), &meta(i)).expect("put");
    }
    done.store(true, Ordering::Release);
    for r in readers {
        let (misses, hits) = r.join().expect("reader");
        assert!(misses + hits > 0);
    }
}

#[test]
fn put_succeeds_while_this_process_holds_the_index() {
    let dir = tempfile::tempdir().expect("tempdir");
    let index = dir.path().join("v1").join("index.sled");
    let db = sled::open(&index).expect("open sled");
    let cache = Cache::open(user_cfg(dir.path()));
    let started = Instant::now();
    cache.put(&key(1), &blob(1), &meta(1)).expect("put with index held");
    // No waiting on the held index: well under sled's own lock timeouts even
    // on a loaded 2-core machine.
    assert!(started.elapsed() < Duration::from_secs(5), "put waited");
    assert!(matches!(cache.get(&key(1)), Lookup::Hit { .. }));
    assert_eq!(cache.list().len(), 1);
    assert_eq!(cache.find_spec(&spec(1)).len(), 1);
    assert_eq!(cache.indexed_keys_for_spec(&spec(1)), None);
    let v = cache.verify();
    assert!(v.is_clean(), "{:#?}", v.issues);
    assert_eq!(v.index, IndexCheck::Skipped);
    let report = cache.gc(u64::MAX).expect("gc with index held");
    assert!(!report.index_updated);
    assert_eq!(report.entries_after, 1);
    drop(db);

    // Once released, the index is used again (and gc catches it up). sled
    // lets go of its file lock from a background flusher, not in `drop`, so
    // allow it a moment on a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        cache.put(&key(2), &blob(2), &meta(2)).expect("put");
        if cache.indexed_keys_for_spec(&spec(2)).is_some() || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(cache.indexed_keys_for_spec(&spec(2)), Some(vec![key(2)]));
    assert!(cache.gc(u64::MAX).expect("gc").index_updated);
    assert_eq!(cache.indexed_keys_for_spec(&spec(1)), Some(vec![key(1)]));
    assert_eq!(cache.verify().index, IndexCheck::Checked);
}

#[test]
fn put_succeeds_while_another_process_holds_the_sled_db() {
    index_held_by_another_process("hold-sled");
}

#[test]
fn put_succeeds_while_another_process_holds_the_index_lock() {
    index_held_by_another_process("hold-index-lock");
}

fn index_held_by_another_process(mode: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    fs::create_dir_all(root.join("v1")).expect("mkdir");
    let child = child_command("child_main", mode, &[("CHILD_ROOT", root.display().to_string())])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    wait_for(&root.join("held"), Duration::from_secs(60));

    let cache = Cache::open(user_cfg(root));
    let started = Instant::now();
    for i in 0..5 {
        cache
            .put(&key(i), &blob(i), &meta(i))
            .expect("put with index held elsewhere");
    }
    assert!(started.elapsed() < Duration::from_secs(5), "puts waited");
    // A fresh instance (as another process would) reads the entries.
    let reader = Cache::open(user_cfg(root));
    for i in 0..5 {
        assert!(matches!(reader.get(&key(i)), Lookup::Hit { .. }));
    }
    assert_eq!(reader.list().len(), 5);
    assert!(reader.verify().is_clean());
    assert_eq!(reader.indexed_keys_for_spec(&spec(0)), None);

    fs::write(root.join("release"), b"").expect("release");
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(cache.gc(u64::MAX).expect("gc").index_updated);
    assert_eq!(cache.indexed_keys_for_spec(&spec(3)), Some(vec![key(3)]));
}
