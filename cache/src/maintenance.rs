//! `verify` and `gc`.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::error::CacheError;
use crate::fs::{scan_root, unix_nanos, unix_secs, Layout};
use crate::index::{with_index, with_index_opts};
use crate::key::CacheKey;
use crate::meta::KernelMeta;
use crate::report::{GcReport, IndexCheck, Issue, IssueKind, RootKind, VerifyReport};
use crate::store::{read_entry, Cache, EntryState, UserStore};
use crate::{debug_log, MEMORY_ROOT};

/// Temp files and metadata-less blobs younger than this may belong to a
/// writer that is still running; `gc` leaves them alone.
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(10 * 60);

fn age(now: SystemTime, t: SystemTime) -> Duration {
    now.duration_since(t).unwrap_or(Duration::ZERO)
}

/// Removes a file; a file already gone counts as removed.
fn remove(path: &Path) -> Result<(), String> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("cannot remove {}: {e}", path.display())),
    }
}

impl Cache {
    /// Checks every entry of every directory root (read-only roots
    /// included, without writing to them): metadata parses, the blob exists
    /// and re-hashes to `cubin_sha256` with length `cubin_len`. Also reports
    /// temp files, blobs without metadata, and index records of the user
    /// root that point to no entry.
    pub fn verify(&self) -> VerifyReport {
        let now = SystemTime::now();
        let mut report = VerifyReport {
            roots: Vec::new(),
            entries_ok: 0,
            issues: Vec::new(),
            ignored: Vec::new(),
            index: IndexCheck::NotApplicable,
        };
        for (layout, kind) in self.dir_roots() {
            let root = layout.root().to_path_buf();
            let issue = |path: PathBuf, key: Option<CacheKey>, kind: IssueKind| Issue {
                root: root.clone(),
                path,
                key,
                kind,
            };
            report.roots.push(root.clone());
            let scan = scan_root(layout);
            for (path, reason) in scan.errors {
                report.issues.push(issue(path, None, IssueKind::Unreadable { reason }));
            }
            for t in scan.temps {
                let age_secs = age(now, t.modified).as_secs();
                report
                    .issues
                    .push(issue(t.path, None, IssueKind::TempFile { age_secs }));
            }
            report.ignored.extend(scan.strays);
            for (key, files) in &scan.entries {
                if files.meta.is_none() {
                    if let Some(blob) = &files.blob {
                        report
                            .issues
                            .push(issue(blob.path.clone(), Some(*key), IssueKind::OrphanBlob));
                    }
                    continue;
                }
                let found = match read_entry(layout, key, false) {
                    EntryState::Valid { .. } => {
                        report.entries_ok += 1;
                        continue;
                    }
                    EntryState::Absent => continue, // removed meanwhile
                    EntryState::BadMeta { path, reason } => (path, IssueKind::BadMeta { reason }),
                    EntryState::MissingBlob { path } => (path, IssueKind::MissingBlob),
                    EntryState::BlobMismatch { path, reason } => (path, IssueKind::BlobMismatch { reason }),
                };
                report.issues.push(issue(found.0, Some(*key), found.1));
            }
            if kind == RootKind::Writable {
                match with_index(layout, |ix| Ok((ix.keys()?, ix.dangling_spec_rows()?.len()))) {
                    Ok((keys, dangling_rows)) => {
                        report.index = IndexCheck::Checked;
                        for key in keys {
                            // Keys with files left are reported above by
                            // what is wrong with their files.
                            let has_files = scan.entries.contains_key(&key);
                            if !has_files && !layout.meta_path(&key).exists() {
                                report
                                    .issues
                                    .push(issue(layout.index_path(), Some(key), IssueKind::DanglingIndex));
                            }
                        }
                        if dangling_rows > 0 {
                            report
                                .issues
                                .push(issue(layout.index_path(), None, IssueKind::DanglingIndex));
                        }
                    }
                    Err(reason) => {
                        debug_log(format_args!("verify: index skipped: {reason}"));
                        report.index = IndexCheck::Skipped;
                    }
                }
            }
        }
        report
    }

    /// Collects the user root (or the in-memory store) with the default
    /// staleness threshold ([`DEFAULT_STALE_AFTER`]). See [`Cache::gc_with`].
    pub fn gc(&self, max_bytes: u64) -> Result<GcReport, CacheError> {
        self.gc_with(max_bytes, DEFAULT_STALE_AFTER)
    }

    /// Collects the user root; read-only roots are never touched.
    /// 1. removes temp files and metadata-less blobs older than `stale_after`
    ///    (younger ones may belong to a running writer);
    /// 2. removes bad entries (unparsable metadata, missing or mismatching
    ///    blob);
    /// 3. evicts least-recently-used entries (blob mtime) until the entries
    ///    total at most `max_bytes` (blob + metadata bytes);
    /// 4. brings the index in line with the files (best effort).
    ///
    /// Fails only if the blob directory cannot be read; individual files
    /// that cannot be removed are listed in `failures`.
    pub fn gc_with(&self, max_bytes: u64, stale_after: Duration) -> Result<GcReport, CacheError> {
        match &self.user {
            UserStore::Memory(mem) => {
                let (before, evicted, evicted_bytes, left) = mem.evict_to(max_bytes);
                Ok(GcReport {
                    root: PathBuf::from(MEMORY_ROOT),
                    bytes_before: before,
                    bytes_after: before - evicted_bytes,
                    entries_after: left,
                    evicted,
                    evicted_bytes,
                    ..GcReport::default()
                })
            }
            UserStore::Disk(layout) => gc_dir(layout, max_bytes, stale_after),
        }
    }
}

struct Survivor {
    key: CacheKey,
    last_used: SystemTime,
    meta_mtime_ns: u64,
    size: u64,
    meta: KernelMeta,
}

fn gc_dir(layout: &Layout, max_bytes: u64, stale_after: Duration) -> Result<GcReport, CacheError> {
    let blobs = layout.blobs_dir();
    if let Err(e) = fs::read_dir(&blobs) {
        if e.kind() != io::ErrorKind::NotFound {
            return Err(CacheError::io("read directory", blobs, e));
        }
    }
    let now = SystemTime::now();
    let mut report = GcReport {
        root: layout.root().to_path_buf(),
        ..GcReport::default()
    };
    let scan = scan_root(layout);
    for (path, reason) in &scan.errors {
        report
            .failures
            .push(format!("cannot read {}: {reason}", path.display()));
    }

    for t in &scan.temps {
        if age(now, t.modified) > stale_after {
            match remove(&t.path) {
                Ok(()) => report.removed_temp.push(t.path.clone()),
                Err(e) => report.failures.push(e),
            }
        }
    }

    let mut survivors = Vec::new();
    for (key, files) in &scan.entries {
        let Some(meta_file) = &files.meta else {
            if let Some(blob) = &files.blob {
                if age(now, blob.modified) > stale_after {
                    match remove(&blob.path) {
                        Ok(()) => report.removed_bad.push(blob.path.clone()),
                        Err(e) => report.failures.push(e),
                    }
                }
            }
            continue;
        };
        match read_entry(layout, key, false) {
            EntryState::Valid { meta, .. } => {
                let (last_used, blob_len) = files
                    .blob
                    .as_ref()
                    .map(|b| (b.modified, b.len))
                    .unwrap_or((now, meta.cubin_len));
                survivors.push(Survivor {
                    key: *key,
                    last_used,
                    meta_mtime_ns: unix_nanos(meta_file.modified),
                    size: blob_len + meta_file.len,
                    meta,
                });
            }
            EntryState::Absent => {}
            EntryState::BadMeta { .. } | EntryState::MissingBlob { .. } | EntryState::BlobMismatch { .. } => {
                // Metadata first, so that readers see a miss, not damage.
                for path in [layout.meta_path(key), layout.blob_path(key)] {
                    let existed = path.exists();
                    match remove(&path) {
                        Ok(()) if existed => report.removed_bad.push(path),
                        Ok(()) => {}
                        Err(e) => report.failures.push(e),
                    }
                }
            }
        }
    }

    survivors.sort_by(|a, b| a.last_used.cmp(&b.last_used).then(a.key.cmp(&b.key)));
    report.bytes_before = survivors.iter().map(|s| s.size).sum();
    let mut total = report.bytes_before;
    let mut kept = Vec::new();
    for s in survivors {
        if total <= max_bytes {
            kept.push(s);
            continue;
        }
        let removed = remove(&layout.meta_path(&s.key)).and_then(|()| remove(&layout.blob_path(&s.key)));
        match removed {
            Ok(()) => {
                total -= s.size;
                report.evicted_bytes += s.size;
                report.evicted.push(s.key);
            }
            Err(e) => {
                report.failures.push(e);
                kept.push(s);
            }
        }
    }
    report.bytes_after = total;
    report.entries_after = kept.len() as u64;

    let index_result = with_index_opts(layout, true, |ix| {
        let live: HashMap<CacheKey, &Survivor> = kept.iter().map(|s| (s.key, s)).collect();
        let indexed: HashSet<CacheKey> = ix.keys()?.into_iter().collect();
        for key in &indexed {
            if !live.contains_key(key) {
                ix.remove(key)?;
            }
        }
        for s in &kept {
            let last_used = unix_secs(s.last_used);
            let current = ix.get(&s.key)?;
            let up_to_date = current
                .is_some_and(|r| r.last_used == last_used && r.meta_mtime_ns == s.meta_mtime_ns && r.meta == s.meta);
            if !up_to_date {
                ix.record(&s.key, &s.meta, last_used, s.meta_mtime_ns)?;
            }
        }
        for row in ix.dangling_spec_rows()? {
            ix.remove_spec_row(&row)?;
        }
        Ok(())
    });
    match index_result {
        Ok(()) => report.index_updated = true,
        Err(reason) => debug_log(format_args!("gc: index skipped: {reason}")),
    }
    Ok(report)
}
