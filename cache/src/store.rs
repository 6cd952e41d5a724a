//! The cache itself: layered roots, `get`, `put`, `list`, `stats`, `roots`.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use crate::config::CacheConfig;
use crate::error::CacheError;
use crate::fs::{self as cfs, unix_nanos, unix_secs, Layout};
use crate::index::with_index;
use crate::key::CacheKey;
use crate::memory::MemoryStore;
use crate::meta::KernelMeta;
use crate::report::{Listed, RootInfo, RootKind, RootStats, Stats};
use crate::{debug_log, MEMORY_ROOT};

/// Result of [`Cache::get`].
// `Hit` is the hot, common variant; boxing its metadata would only add an
// allocation there.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Lookup {
    /// A complete, verified entry.
    Hit {
        /// The blob bytes (their sha256 and length match `meta`).
        cubin: Vec<u8>,
        /// The metadata.
        meta: KernelMeta,
        /// The root it came from, or `<memory>`.
        root: PathBuf,
    },
    /// Not in any root (a blob without metadata also counts as a miss: a
    /// writer is in flight or was killed).
    Miss,
    /// An entry exists but is damaged. Treat it as a miss: recompile and
    /// `put`, which overwrites the damaged files.
    Corrupt {
        /// The damaged file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

/// The state of one key in one directory root.
pub(crate) enum EntryState {
    Valid {
        cubin: Vec<u8>,
        meta: KernelMeta,
    },
    /// No metadata file (a lone blob may exist).
    Absent,
    BadMeta {
        path: PathBuf,
        reason: String,
    },
    MissingBlob {
        path: PathBuf,
    },
    BlobMismatch {
        path: PathBuf,
        reason: String,
    },
}

/// Reads and parses a metadata file.
pub(crate) fn read_meta(path: &Path) -> Result<Option<KernelMeta>, String> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read: {e}")),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| format!("cannot parse: {e}"))
}

/// Reads the entry `key` of `layout`: metadata first, then the blob, which
/// is re-hashed. With `touch`, a valid blob's mtime is set to now (the LRU
/// clock). Never writes anything else.
pub(crate) fn read_entry(layout: &Layout, key: &CacheKey, touch: bool) -> EntryState {
    let meta_path = layout.meta_path(key);
    let meta = match read_meta(&meta_path) {
        Ok(Some(m)) => m,
        Ok(None) => return EntryState::Absent,
        Err(reason) => {
            return EntryState::BadMeta {
                path: meta_path,
                reason,
            }
        }
    };
    let blob_path = layout.blob_path(key);
    let mut file = match File::open(&blob_path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            // gc may have removed the entry between our two reads.
            if !meta_path.exists() {
                return EntryState::Absent;
            }
            return EntryState::MissingBlob { path: blob_path };
        }
        Err(e) => {
            return EntryState::BlobMismatch {
                path: blob_path,
                reason: format!("cannot open: {e}"),
            }
        }
    };
    // Capacity from the metadata, bounded so garbage cannot force a huge
    // allocation.
    let mut cubin = Vec::with_capacity(meta.cubin_len.min(1 << 30) as usize);
    if let Err(e) = file.read_to_end(&mut cubin) {
        return EntryState::BlobMismatch {
            path: blob_path,
            reason: format!("cannot read: {e}"),
        };
    }
    if let Err(reason) = meta.check_blob(&cubin) {
        return EntryState::BlobMismatch {
            path: blob_path,
            reason,
        };
    }
    if touch {
        // Best effort: the LRU clock is advisory.
        let _ = file.set_modified(SystemTime::now());
    }
    EntryState::Valid { cubin, meta }
}

/// Where `put` goes.
pub(crate) enum UserStore {
    Disk(Layout),
    Memory(MemoryStore),
}

/// A persistent, content-addressed store of compiled kernels, layered over
/// read-only prebuilt roots. `Send + Sync`; share it behind an `Arc`.
pub struct Cache {
    pub(crate) read_only: Vec<Layout>,
    pub(crate) user: UserStore,
    warnings: Vec<String>,
}

/// Messages already printed by this process (one warning per cause).
static PRINTED_WARNINGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn emit_warning(msg: &str) {
    let mut printed = PRINTED_WARNINGS.lock().unwrap_or_else(|p| p.into_inner());
    if !printed.iter().any(|m| m == msg) {
        eprintln!("{msg}");
        printed.push(msg.to_string());
    }
}

/// Creates `<root>/v1/blobs` and proves the root is writable.
fn prepare_user_root(layout: &Layout) -> Result<(), CacheError> {
    cfs::create_dir_all(&layout.blobs_dir())?;
    // The probe is a temp file in `v1/`, where gc looks for leftovers.
    cfs::probe_writable(&layout.version_dir())
}

impl Cache {
    /// Opens the cache. Never fails: if the user root cannot be created or
    /// written, the cache keeps its entries in memory for this process and
    /// prints one warning (also available from [`Cache::warnings`]).
    pub fn open(cfg: CacheConfig) -> Cache {
        let mut warnings = Vec::new();
        let user = match &cfg.user_root {
            Some(root) => {
                let layout = Layout::new(root);
                match prepare_user_root(&layout) {
                    Ok(()) => UserStore::Disk(layout),
                    Err(e) => {
                        warnings.push(format!(
                            "attnforge: warning: cache dir {} is not writable ({e}); \
                             using an in-memory cache for this process",
                            root.display()
                        ));
                        UserStore::Memory(MemoryStore::default())
                    }
                }
            }
            None => {
                warnings.push(
                    "attnforge: warning: no cache dir could be determined (set \
                     ATTNFORGE_CACHE_DIR, XDG_CACHE_HOME or HOME); using an in-memory \
                     cache for this process"
                        .to_string(),
                );
                UserStore::Memory(MemoryStore::default())
            }
        };
        for w in &warnings {
            emit_warning(w);
        }

        let mut seen: HashSet<PathBuf> = cfg.user_root.iter().cloned().collect();
        let read_only = cfg
            .read_only_roots
            .iter()
            .filter(|p| seen.insert((*p).clone()))
            .map(|p| Layout::new(p))
            .collect();
        Cache {
            read_only,
            user,
            warnings,
        }
    }

    /// `Cache::open(CacheConfig::from_env())`.
    pub fn from_env() -> Cache {
        Cache::open(CacheConfig::from_env())
    }

    /// Warnings raised by `open` (at most one).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// True when puts go to memory rather than to a directory.
    pub fn is_in_memory(&self) -> bool {
        matches!(self.user, UserStore::Memory(_))
    }

    /// The writable root directory, if any.
    pub fn user_root(&self) -> Option<&Path> {
        match &self.user {
            UserStore::Disk(l) => Some(l.root()),
            UserStore::Memory(_) => None,
        }
    }

    /// Directory roots in search order, with their kinds.
    pub(crate) fn dir_roots(&self) -> impl Iterator<Item = (&Layout, RootKind)> {
        let user = match &self.user {
            UserStore::Disk(l) => Some((l, RootKind::Writable)),
            UserStore::Memory(_) => None,
        };
        self.read_only.iter().map(|l| (l, RootKind::ReadOnly)).chain(user)
    }

    /// Looks `key` up: read-only roots in order, then the user root, then
    /// memory. The blob is re-hashed; damage is reported as `Corrupt`, never
    /// as a hit. A damaged entry in one root does not hide a good one in a
    /// later root (so a repaired copy in the user root is found). Does not
    /// open the index; on a user-root hit it sets the blob's mtime (LRU).
    pub fn get(&self, key: &CacheKey) -> Lookup {
        let mut first_corrupt: Option<(PathBuf, String)> = None;
        for (layout, kind) in self.dir_roots() {
            let touch = kind == RootKind::Writable;
            match read_entry(layout, key, touch) {
                EntryState::Valid { cubin, meta } => {
                    return Lookup::Hit {
                        cubin,
                        meta,
                        root: layout.root().to_path_buf(),
                    }
                }
                EntryState::Absent => {}
                EntryState::BadMeta { path, reason } => {
                    first_corrupt.get_or_insert((path, format!("bad metadata: {reason}")));
                }
                EntryState::MissingBlob { path } => {
                    first_corrupt.get_or_insert((path, "blob missing".to_string()));
                }
                EntryState::BlobMismatch { path, reason } => {
                    first_corrupt.get_or_insert((path, reason));
                }
            }
        }
        if let UserStore::Memory(mem) = &self.user {
            if let Some((cubin, meta)) = mem.get(key) {
                return Lookup::Hit {
                    cubin,
                    meta,
                    root: PathBuf::from(MEMORY_ROOT),
                };
            }
        }
        match first_corrupt {
            Some((path, reason)) => Lookup::Corrupt { path, reason },
            None => Lookup::Miss,
        }
    }

    /// Stores an entry in the user root (or memory). The blob is published
    /// first and the metadata last, each by temp file + fsync + rename, so
    /// damaged files are replaced and concurrent writers of the same key
    /// both succeed.
    ///
    /// If `meta.cubin_sha256` is empty, it and `cubin_len` are filled in;
    /// otherwise they must match `cubin` (`CacheError::MetaMismatch`).
    pub fn put(&self, key: &CacheKey, cubin: &[u8], meta: &KernelMeta) -> Result<(), CacheError> {
        let meta = checked_meta(key, cubin, meta)?;
        match &self.user {
            UserStore::Memory(mem) => {
                mem.put(key, cubin, &meta);
                Ok(())
            }
            UserStore::Disk(layout) => put_files(layout, key, cubin, &meta),
        }
    }

    /// Every complete entry of every root, in search order (entries of one
    /// root sorted by key). The set of entries comes from the files; the
    /// user root's index only saves re-reading metadata files.
    pub fn list(&self) -> Vec<Listed> {
        let mut out = Vec::new();
        for (layout, kind) in self.dir_roots() {
            let scan = cfs::scan_root(layout);
            // Metadata copies from the index (writable root only; a
            // read-only root's index is never opened).
            let indexed = if kind == RootKind::Writable && !scan.entries.is_empty() {
                let keys: Vec<CacheKey> = scan.entries.keys().copied().collect();
                with_index(layout, |ix| {
                    let mut found = std::collections::HashMap::new();
                    for k in keys {
                        if let Some(rec) = ix.get(&k)? {
                            found.insert(k, rec);
                        }
                    }
                    Ok(found)
                })
                .unwrap_or_else(|reason| {
                    debug_log(format_args!("list: index skipped: {reason}"));
                    Default::default()
                })
            } else {
                Default::default()
            };
            for (key, files) in scan.entries {
                let (Some(blob), Some(meta_file)) = (files.blob, files.meta) else {
                    continue;
                };
                // The index copy is used only if it was taken from the
                // metadata file that is on disk now.
                let meta = match indexed.get(&key) {
                    Some(rec)
                        if rec.meta_mtime_ns == unix_nanos(meta_file.modified) && rec.meta.cubin_len == blob.len =>
                    {
                        rec.meta.clone()
                    }
                    _ => match read_meta(&meta_file.path) {
                        Ok(Some(m)) => m,
                        _ => continue,
                    },
                };
                out.push(Listed {
                    key,
                    meta,
                    root: layout.root().to_path_buf(),
                    size: blob.len + meta_file.len,
                    last_used: unix_secs(blob.modified),
                });
            }
        }
        if let UserStore::Memory(mem) = &self.user {
            let mut mem_entries = Vec::new();
            mem.for_each(|key, e| {
                mem_entries.push(Listed {
                    key: *key,
                    meta: e.meta.clone(),
                    root: PathBuf::from(MEMORY_ROOT),
                    size: e.size(),
                    last_used: e.last_used_unix(),
                })
            });
            mem_entries.sort_by_key(|l| l.key);
            out.extend(mem_entries);
        }
        out
    }

    /// Complete entries (blob and metadata present) whose spec is `spec`.
    pub fn find_spec(&self, spec: &str) -> Vec<Listed> {
        self.list().into_iter().filter(|l| l.meta.spec == spec).collect()
    }

    /// Keys that the user root's index records for `spec`, without scanning
    /// any file. This is an accelerator: it may miss entries whose index
    /// update was skipped (another process held the index) and is `None`
    /// when the index cannot be opened or there is no writable root. Use
    /// [`Cache::find_spec`] for an authoritative answer.
    pub fn indexed_keys_for_spec(&self, spec: &str) -> Option<Vec<CacheKey>> {
        let UserStore::Disk(layout) = &self.user else {
            return None;
        };
        with_index(layout, |ix| ix.keys_for_spec(spec))
            .map_err(|reason| debug_log(format_args!("index lookup skipped: {reason}")))
            .ok()
    }

    /// Entry counts and bytes per root (from a directory scan; no hashing).
    pub fn stats(&self) -> Stats {
        let mut roots = Vec::new();
        for (layout, kind) in self.dir_roots() {
            let scan = cfs::scan_root(layout);
            let mut row = RootStats {
                path: layout.root().to_path_buf(),
                kind,
                entries: 0,
                bytes: 0,
                temp_files: scan.temps.len() as u64,
            };
            for files in scan.entries.values() {
                if let (Some(b), Some(m)) = (&files.blob, &files.meta) {
                    row.entries += 1;
                    row.bytes += b.len + m.len;
                }
            }
            roots.push(row);
        }
        if let UserStore::Memory(mem) = &self.user {
            let mut row = RootStats {
                path: PathBuf::from(MEMORY_ROOT),
                kind: RootKind::InMemory,
                entries: 0,
                bytes: 0,
                temp_files: 0,
            };
            mem.for_each(|_, e| {
                row.entries += 1;
                row.bytes += e.size();
            });
            roots.push(row);
        }
        Stats {
            total_entries: roots.iter().map(|r| r.entries).sum(),
            total_bytes: roots.iter().map(|r| r.bytes).sum(),
            roots,
        }
    }

    /// The roots in search order.
    pub fn roots(&self) -> Vec<RootInfo> {
        let mut out: Vec<RootInfo> = self
            .dir_roots()
            .map(|(layout, kind)| RootInfo {
                path: layout.root().to_path_buf(),
                kind,
                exists: layout.root().is_dir(),
            })
            .collect();
        if self.is_in_memory() {
            out.push(RootInfo {
                path: PathBuf::from(MEMORY_ROOT),
                kind: RootKind::InMemory,
                exists: true,
            });
        }
        out
    }
}

/// The metadata to store: blob fields filled in or checked.
fn checked_meta(key: &CacheKey, cubin: &[u8], meta: &KernelMeta) -> Result<KernelMeta, CacheError> {
    let mut meta = meta.clone();
    if meta.cubin_sha256.is_empty() {
        meta.fill_blob_fields(cubin);
    } else {
        meta.check_blob(cubin).map_err(|reason| CacheError::MetaMismatch {
            key: key.to_hex(),
            reason,
        })?;
        meta.cubin_sha256.make_ascii_lowercase();
    }
    Ok(meta)
}

/// Publishes blob then metadata, then updates the index (best effort).
fn put_files(layout: &Layout, key: &CacheKey, cubin: &[u8], meta: &KernelMeta) -> Result<(), CacheError> {
    let json = serde_json::to_vec_pretty(meta).map_err(|source| CacheError::MetaSerialize {
        key: key.to_hex(),
        source,
    })?;
    let shard = layout.shard_dir(key);
    cfs::create_dir_all(&shard)?;
    cfs::publish(&layout.blob_path(key), cubin)?;
    // Make the blob's rename durable before the metadata can be.
    cfs::sync_dir(&shard);
    cfs::publish(&layout.meta_path(key), &json)?;
    cfs::sync_dir(&shard);

    let now = unix_secs(SystemTime::now());
    let meta_mtime_ns = fs::metadata(layout.meta_path(key))
        .and_then(|m| m.modified())
        .map(unix_nanos)
        .unwrap_or(0);
    if let Err(reason) = with_index(layout, |ix| ix.record(key, meta, now, meta_mtime_ns)) {
        debug_log(format_args!("put {key}: index update skipped: {reason}"));
    }
    Ok(())
}
