//! Damaged entries and killed writers: `get` never returns damage as a hit,
//! `put` repairs, `verify` reports, `gc` cleans up.

mod common;

use std::fs;
use std::io::Write;
use std::path::Path;

use attnforge_cache::{Cache, CacheKey, IssueKind, Lookup};
use common::*;

fn hit(cache: &Cache, i: u32) {
    match cache.get(&key(i)) {
        Lookup::Hit { cubin, meta: m, .. } => {
            assert_eq!(cubin, blob(i));
            assert_eq!(m, meta(i));
        }
        other => panic!("entry {i}: expected a hit, got {other:?}"),
    }
}

fn expect_corrupt(cache: &Cache, i: u32, want_path: &Path, reason_part: &str) {
    match cache.get(&key(i)) {
        Lookup::Corrupt { path, reason } => {
            assert_eq!(path, want_path, "entry {i}");
            assert!(reason.contains(reason_part), "entry {i}: {reason}");
        }
        other => panic!("entry {i}: expected corrupt, got {other:?}"),
    }
}

fn setup(ids: &[u32]) -> (tempfile::TempDir, Cache) {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = Cache::open(user_cfg(dir.path()));
    for &i in ids {
        cache.put(&key(i), &blob(i), &meta(i)).expect("put");
        hit(&cache, i);
    }
    (dir, cache)
}

/// The issue kinds `verify` reports for `k`.
fn issues_for(cache: &Cache, k: &CacheKey) -> Vec<IssueKind> {
    cache
        .verify()
        .issues
        .into_iter()
        .filter(|i| i.key.as_ref() == Some(k))
        .map(|i| i.kind)
        .collect()
}

fn assert_clean(cache: &Cache) {
    let v = cache.verify();
    assert!(v.is_clean(), "{:#?}", v.issues);
}

#[test]
fn truncated_blob_is_corrupt_and_put_repairs_it() {
    let (dir, cache) = setup(&[1]);
    let b = blob_path(dir.path(), &key(1));
    let f = fs::OpenOptions::new().write(true).open(&b).expect("open");
    f.set_len(100).expect("truncate");
    drop(f);
    expect_corrupt(&cache, 1, &b, "100 bytes");
    assert!(matches!(
        issues_for(&cache, &key(1)).as_slice(),
        [IssueKind::BlobMismatch { .. }]
    ));
    cache.put(&key(1), &blob(1), &meta(1)).expect("repair");
    hit(&cache, 1);
    assert_clean(&cache);
}

#[test]
fn flipped_byte_is_corrupt_and_put_repairs_it() {
    let (dir, cache) = setup(&[2]);
    let b = blob_path(dir.path(), &key(2));
    let mut bytes = fs::read(&b).expect("read");
    bytes[1000] ^= 0x01;
    fs::write(&b, &bytes).expect("write");
    expect_corrupt(&cache, 2, &b, "sha256");
    assert!(matches!(
        issues_for(&cache, &key(2)).as_slice(),
        [IssueKind::BlobMismatch { .. }]
    ));
    cache.put(&key(2), &blob(2), &meta(2)).expect("repair");
    hit(&cache, 2);
    assert_clean(&cache);
}

#[test]
fn missing_meta_is_a_miss_and_put_repairs_it() {
    let (dir, cache) = setup(&[3]);
    fs::remove_file(meta_path(dir.path(), &key(3))).expect("rm meta");
    assert_eq!(cache.get(&key(3)), Lookup::Miss);
    assert_eq!(issues_for(&cache, &key(3)), vec![IssueKind::OrphanBlob]);
    assert!(cache.list().is_empty());
    cache.put(&key(3), &blob(3), &meta(3)).expect("repair");
    hit(&cache, 3);
    assert_clean(&cache);
}

#[test]
fn garbage_meta_is_corrupt_and_put_repairs_it() {
    let (dir, cache) = setup(&[4]);
    let m = meta_path(dir.path(), &key(4));
    fs::write(&m, b"{\"spec\": not json").expect("write");
    expect_corrupt(&cache, 4, &m, "bad metadata");
    assert!(matches!(
        issues_for(&cache, &key(4)).as_slice(),
        [IssueKind::BadMeta { .. }]
    ));
    cache.put(&key(4), &blob(4), &meta(4)).expect("repair");
    hit(&cache, 4);
    assert_clean(&cache);

    // Valid JSON that is not kernel metadata is just as bad.
    fs::write(&m, b"{}").expect("write");
    expect_corrupt(&cache, 4, &m, "bad metadata");
}

#[test]
fn meta_without_blob_is_corrupt_and_put_repairs_it() {
    let (dir, cache) = setup(&[5]);
    let b = blob_path(dir.path(), &key(5));
    fs::remove_file(&b).expect("rm blob");
    expect_corrupt(&cache, 5, &b, "blob missing");
    assert_eq!(issues_for(&cache, &key(5)), vec![IssueKind::MissingBlob]);
    cache.put(&key(5), &blob(5), &meta(5)).expect("repair");
    hit(&cache, 5);
    assert_clean(&cache);
}

/// Leaves what a writer killed mid-put leaves: temp files (one holding a
/// complete copy of the blob, one half-written metadata) and, for another
/// key, a published blob without metadata.
fn simulate_killed_writer(root: &Path) -> Vec<std::path::PathBuf> {
    let shard = shard_dir(root, &key(6));
    fs::create_dir_all(&shard).expect("mkdir");
    let t1 = shard.join(".tmp-999999-00000000deadbeef");
    fs::write(&t1, blob(6)).expect("write");
    let t2 = shard.join(".tmp-999999-00000000cafef00d");
    let mut f = fs::File::create(&t2).expect("create");
    f.write_all(b"{\"spec\": \"fwd.").expect("write");
    drop(f);
    let lone = blob_path(root, &key(7));
    fs::create_dir_all(lone.parent().expect("parent")).expect("mkdir");
    fs::write(&lone, blob(7)).expect("write");
    vec![t1, t2, lone]
}

#[test]
fn killed_writer_leftovers_are_never_entries() {
    let (dir, cache) = setup(&[]);
    let leftovers = simulate_killed_writer(dir.path());
    assert_eq!(cache.get(&key(6)), Lookup::Miss);
    assert_eq!(cache.get(&key(7)), Lookup::Miss);
    assert!(cache.list().is_empty());
    assert_eq!(cache.stats().total_entries, 0);
    assert_eq!(cache.stats().roots[0].temp_files, 2);

    let v = cache.verify();
    let temps = v
        .issues
        .iter()
        .filter(|i| matches!(i.kind, IssueKind::TempFile { .. }))
        .count();
    assert_eq!(temps, 2, "{:#?}", v.issues);
    assert_eq!(issues_for(&cache, &key(7)), vec![IssueKind::OrphanBlob]);
    assert_eq!(v.issues.len(), 3, "{:#?}", v.issues);

    // Fresh leftovers may belong to a live writer: gc leaves them alone.
    let report = cache.gc(u64::MAX).expect("gc");
    assert!(report.removed_temp.is_empty() && report.removed_bad.is_empty());
    assert!(leftovers.iter().all(|p| p.exists()));

    // Old ones are from a dead writer: gc removes them.
    for p in &leftovers {
        set_mtime(p, ago(3600));
    }
    let report = cache.gc(u64::MAX).expect("gc");
    assert_eq!(report.removed_temp.len(), 2);
    assert_eq!(report.removed_bad, vec![leftovers[2].clone()]);
    assert!(leftovers.iter().all(|p| !p.exists()));
    assert_clean(&cache);

    // And the keys work normally afterwards.
    for i in [6, 7] {
        cache.put(&key(i), &blob(i), &meta(i)).expect("put");
        hit(&cache, i);
    }
    assert_clean(&cache);
}

#[test]
fn put_repairs_after_killed_writer() {
    let (dir, cache) = setup(&[]);
    simulate_killed_writer(dir.path());
    cache.put(&key(7), &blob(7), &meta(7)).expect("put");
    hit(&cache, 7);
    let v = cache.verify();
    assert!(v.issues.iter().all(|i| matches!(i.kind, IssueKind::TempFile { .. })));
}

#[test]
fn verify_reports_every_bad_entry_and_gc_cleans_them() {
    let (dir, cache) = setup(&[10, 11, 12, 13, 14, 15]);
    let root = dir.path();
    // 10: truncated, 11: flipped byte, 12: garbage meta, 13: blob gone,
    // 14: meta gone (orphan blob, old), 15: intact.
    fs::write(blob_path(root, &key(10)), &blob(10)[..10]).expect("w");
    let mut b = blob(11);
    b[0] ^= 0x80;
    fs::write(blob_path(root, &key(11)), &b).expect("w");
    fs::write(meta_path(root, &key(12)), b"garbage").expect("w");
    fs::remove_file(blob_path(root, &key(13))).expect("rm");
    fs::remove_file(meta_path(root, &key(14))).expect("rm");
    set_mtime(&blob_path(root, &key(14)), ago(3600));

    let v = cache.verify();
    assert_eq!(v.entries_ok, 1);
    assert_eq!(v.issues.len(), 5, "{:#?}", v.issues);
    assert!(matches!(
        issues_for(&cache, &key(10)).as_slice(),
        [IssueKind::BlobMismatch { .. }]
    ));
    assert!(matches!(
        issues_for(&cache, &key(11)).as_slice(),
        [IssueKind::BlobMismatch { .. }]
    ));
    assert!(matches!(
        issues_for(&cache, &key(12)).as_slice(),
        [IssueKind::BadMeta { .. }]
    ));
    assert_eq!(issues_for(&cache, &key(13)), vec![IssueKind::MissingBlob]);
    assert_eq!(issues_for(&cache, &key(14)), vec![IssueKind::OrphanBlob]);
    for issue in &v.issues {
        // Every issue prints with its path.
        assert!(issue.to_string().contains(&root.display().to_string()), "{issue}");
    }

    let report = cache.gc(u64::MAX).expect("gc");
    assert!(report.evicted.is_empty());
    assert_eq!(report.entries_after, 1);
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    // 10, 11, 12: both files; 13: meta; 14: blob.
    assert_eq!(report.removed_bad.len(), 8, "{:#?}", report.removed_bad);
    assert_clean(&cache);
    hit(&cache, 15);
    for i in 10..15 {
        assert_eq!(cache.get(&key(i)), Lookup::Miss);
    }
    // The index forgot the removed entries.
    assert_eq!(cache.indexed_keys_for_spec(&spec(10)), Some(vec![]));
    assert_eq!(cache.indexed_keys_for_spec(&spec(15)), Some(vec![key(15)]));
}

#[test]
fn verify_reports_index_entries_pointing_nowhere() {
    let (dir, cache) = setup(&[20, 21]);
    fs::remove_file(meta_path(dir.path(), &key(20))).expect("rm");
    fs::remove_file(blob_path(dir.path(), &key(20))).expect("rm");
    assert_eq!(cache.get(&key(20)), Lookup::Miss);
    assert_eq!(issues_for(&cache, &key(20)), vec![IssueKind::DanglingIndex]);
    let report = cache.gc(u64::MAX).expect("gc");
    assert!(report.index_updated);
    assert_clean(&cache);
    assert_eq!(cache.indexed_keys_for_spec(&spec(20)), Some(vec![]));
}

#[test]
fn gc_rebuilds_a_corrupt_index() {
    let (dir, cache) = setup(&[30]);
    let index = dir.path().join("v1").join("index.sled");
    // Damage every file of the sled database.
    for e in fs::read_dir(&index).expect("read_dir") {
        let p = e.expect("entry").path();
        if p.is_file() {
            fs::write(&p, b"\xffgarbage that is not a sled database").expect("w");
        }
    }
    // The files still work.
    hit(&cache, 30);
    cache.put(&key(31), &blob(31), &meta(31)).expect("put");
    hit(&cache, 31);
    assert_eq!(cache.list().len(), 2);
    let report = cache.gc(u64::MAX).expect("gc");
    assert_eq!(report.entries_after, 2);
    assert!(report.index_updated);
    assert_eq!(cache.indexed_keys_for_spec(&spec(30)), Some(vec![key(30)]));
    assert_eq!(cache.indexed_keys_for_spec(&spec(31)), Some(vec![key(31)]));
    assert_clean(&cache);
}
