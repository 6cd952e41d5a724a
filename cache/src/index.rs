//! The sled index at `<root>/v1/index.sled`: spec -> keys, and key ->
//! metadata copy + last_used.
//!
//! The index is an accelerator, never the source of truth (the blob and
//! metadata files are). sled locks its database to one process, so every
//! operation here opens the database, does its work, flushes and drops it.
//! If anything goes wrong (another process holds it, an I/O error, a
//! corrupt database, even a panic inside sled) the operation is skipped
//! and the caller carries on from the files.

use std::fs::OpenOptions;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

use fs2::FileExt;
use serde::{Deserialize, Serialize};

use crate::fs::Layout;
use crate::key::CacheKey;
use crate::meta::KernelMeta;

const SPEC_TREE: &str = "spec";
const ENTRY_TREE: &str = "entries";

/// Serialises index operations of the threads of this process, so that they
/// queue briefly instead of skipping each other's updates. Other processes
/// are excluded by the `index.lock` file (non-blocking: they skip).
static PROCESS_LOCK: Mutex<()> = Mutex::new(());

/// What the index stores per key.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub(crate) struct IndexRecord {
    pub(crate) meta: KernelMeta,
    /// Unix seconds of the last use known to the index (put or gc time).
    pub(crate) last_used: u64,
    /// Mtime (unix nanoseconds) of the metadata file this copy was taken
    /// from; a different mtime on disk means the copy is stale.
    #[serde(default)]
    pub(crate) meta_mtime_ns: u64,
}

/// An open index; only lives inside [`with_index`].
pub(crate) struct Index {
    spec: sled::Tree,
    entries: sled::Tree,
}

fn spec_key(spec: &str, key: &CacheKey) -> Vec<u8> {
    let mut k = Vec::with_capacity(spec.len() + 1 + 32);
    k.extend_from_slice(spec.as_bytes());
    k.push(0);
    k.extend_from_slice(&key.0);
    k
}

fn key_from_bytes(bytes: &[u8]) -> Option<CacheKey> {
    <[u8; 32]>::try_from(bytes).ok().map(CacheKey)
}

fn corrupt(what: &str) -> sled::Error {
    sled::Error::Unsupported(format!("attnforge index: {what}"))
}

impl Index {
    /// Adds or replaces the record of `key`.
    pub(crate) fn record(
        &self,
        key: &CacheKey,
        meta: &KernelMeta,
        last_used: u64,
        meta_mtime_ns: u64,
    ) -> sled::Result<()> {
        if let Some(old) = self.get(key)? {
            if old.meta.spec != meta.spec {
                self.spec.remove(spec_key(&old.meta.spec, key))?;
            }
        }
        let rec = IndexRecord {
            meta: meta.clone(),
            last_used,
            meta_mtime_ns,
        };
        let bytes = serde_json::to_vec(&rec).map_err(|e| corrupt(&e.to_string()))?;
        self.entries.insert(key.0, bytes)?;
        self.spec.insert(spec_key(&meta.spec, key), &[] as &[u8])?;
        Ok(())
    }

    /// The record of `key`, if any (an unparsable record reads as `None`).
    pub(crate) fn get(&self, key: &CacheKey) -> sled::Result<Option<IndexRecord>> {
        Ok(self.entries.get(key.0)?.and_then(|v| serde_json::from_slice(&v).ok()))
    }

    /// Removes `key` and its spec mapping.
    pub(crate) fn remove(&self, key: &CacheKey) -> sled::Result<()> {
        if let Some(old) = self.get(key)? {
            self.spec.remove(spec_key(&old.meta.spec, key))?;
        }
        self.entries.remove(key.0)?;
        Ok(())
    }

    /// All keys with a record.
    pub(crate) fn keys(&self) -> sled::Result<Vec<CacheKey>> {
        let mut out = Vec::new();
        for item in self.entries.iter() {
            let (k, _) = item?;
            if let Some(key) = key_from_bytes(&k) {
                out.push(key);
            }
        }
        Ok(out)
    }

    /// Keys recorded for `spec`.
    pub(crate) fn keys_for_spec(&self, spec: &str) -> sled::Result<Vec<CacheKey>> {
        let mut prefix = spec.as_bytes().to_vec();
        prefix.push(0);
        let mut out = Vec::new();
        for item in self.spec.scan_prefix(&prefix) {
            let (k, _) = item?;
            if let Some(key) = key_from_bytes(&k[prefix.len()..]) {
                out.push(key);
            }
        }
        Ok(out)
    }

    /// Spec-tree rows whose key has no record (left by an interrupted update).
    pub(crate) fn dangling_spec_rows(&self) -> sled::Result<Vec<Vec<u8>>> {
        let mut out = Vec::new();
        for item in self.spec.iter() {
            let (k, _) = item?;
            let dangling = match k.len().checked_sub(32).and_then(|at| key_from_bytes(&k[at..])) {
                Some(key) => !self.entries.contains_key(key.0)?,
                None => true,
            };
            if dangling {
                out.push(k.to_vec());
            }
        }
        Ok(out)
    }

    pub(crate) fn remove_spec_row(&self, row: &[u8]) -> sled::Result<()> {
        self.spec.remove(row).map(|_| ())
    }
}

/// True if some process (a non-cooperating one: ours take `index.lock`
/// first) holds sled's own lock on the database file.
fn held_by_sled(index_dir: &std::path::Path) -> bool {
    let Ok(file) = OpenOptions::new().read(true).write(true).open(index_dir.join("db")) else {
        return false;
    };
    match file.try_lock_exclusive() {
        Ok(()) => {
            let _ = FileExt::unlock(&file);
            false
        }
        Err(_) => true,
    }
}

/// Retries of a sled open that finds sled's lock held (see `with_index_opts`).
const OPEN_RETRIES: u32 = 5;

/// Opens the index of `layout`, runs `f`, flushes and closes it. Returns
/// `Err(reason)` if the index was skipped; never waits on other processes
/// beyond a short retry (150 ms at most) while sled lets go of its lock.
/// Must only be called for writable roots (it creates files).
pub(crate) fn with_index<R>(layout: &Layout, f: impl FnOnce(&Index) -> sled::Result<R>) -> Result<R, String> {
    with_index_opts(layout, false, f)
}

/// Like [`with_index`]; with `reset_if_corrupt`, a database that sled cannot
/// open (corrupt, wrong version, ...) is deleted and recreated empty, unless
/// some process holds sled's lock on it. Safe because we hold `index.lock`
/// and the caller (gc) rebuilds the index from the files.
pub(crate) fn with_index_opts<R>(
    layout: &Layout,
    reset_if_corrupt: bool,
    f: impl FnOnce(&Index) -> sled::Result<R>,
) -> Result<R, String> {
    let _guard = PROCESS_LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());

    let lock_path = layout.index_lock_path();
    let lock_file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .map_err(|e| format!("cannot open {}: {e}", lock_path.display()))?;
    lock_file
        .try_lock_exclusive()
        .map_err(|e| format!("index busy ({}: {e})", lock_path.display()))?;

    let path = layout.index_path();
    // A panic inside sled must not take the caller down: the index is
    // optional.
    let outcome = catch_unwind(AssertUnwindSafe(|| -> sled::Result<R> {
        let open = || {
            sled::Config::new()
                .path(&path)
                .cache_capacity(8 << 20)
                .flush_every_ms(None)
                .open()
        };
        // sled lets go of its file lock from a background thread after the
        // last handle drops, so an open right after a close (this process's
        // previous index operation) can find it still held: retry briefly,
        // OPEN_RETRIES times with a growing pause (150 ms at most in all).
        let mut attempt = 0;
        let db = loop {
            match open() {
                Ok(db) => break db,
                Err(e) if reset_if_corrupt && !held_by_sled(&path) => {
                    crate::debug_log(format_args!(
                        "index {} cannot be opened ({e}); recreating it",
                        path.display()
                    ));
                    std::fs::remove_dir_all(&path).map_err(sled::Error::Io)?;
                    break open()?;
                }
                Err(_) if attempt < OPEN_RETRIES && held_by_sled(&path) => {
                    attempt += 1;
                    std::thread::sleep(std::time::Duration::from_millis(10 * attempt as u64));
                }
                Err(e) => return Err(e),
            }
        };
        let index = Index {
            spec: db.open_tree(SPEC_TREE)?,
            entries: db.open_tree(ENTRY_TREE)?,
        };
        let result = f(&index)?;
        db.flush()?;
        Ok(result)
    }));
    // Unlocks (also happens on drop; explicit for clarity).
    let _ = FileExt::unlock(&lock_file);
    match outcome {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(format!("sled index {}: {e}", path.display())),
        Err(_) => Err(format!("sled index {}: panicked", path.display())),
    }
}
