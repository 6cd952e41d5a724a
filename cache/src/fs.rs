//! On-disk layout, atomic publication and directory scanning.
//!
//! ```text
//! <root>/v1/blobs/<first 2 hex>/<key>.cubin   the blob
//! <root>/v1/blobs/<first 2 hex>/<key>.json    its metadata (published last)
//! <root>/v1/index.sled/                       sled index (accelerator only)
//! <root>/v1/index.lock                        guards short index operations
//! ```

use std::collections::hash_map::RandomState;
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::CacheError;
use crate::key::CacheKey;
use crate::SCHEMA_VERSION;

/// Prefix of every temporary file; such files are never read as entries.
pub(crate) const TEMP_PREFIX: &str = ".tmp-";
pub(crate) const BLOB_EXT: &str = "cubin";
pub(crate) const META_EXT: &str = "json";

/// Paths of one cache root.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    root: PathBuf,
}

impl Layout {
    pub(crate) fn new(root: &Path) -> Self {
        Layout {
            root: root.to_path_buf(),
        }
    }

    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/v1`
    pub(crate) fn version_dir(&self) -> PathBuf {
        self.root.join(format!("v{SCHEMA_VERSION}"))
    }

    pub(crate) fn blobs_dir(&self) -> PathBuf {
        self.version_dir().join("blobs")
    }

    pub(crate) fn shard_dir(&self, key: &CacheKey) -> PathBuf {
        self.blobs_dir().join(key.shard())
    }

    pub(crate) fn blob_path(&self, key: &CacheKey) -> PathBuf {
        self.shard_dir(key).join(format!("{key}.{BLOB_EXT}"))
    }

    pub(crate) fn meta_path(&self, key: &CacheKey) -> PathBuf {
        self.shard_dir(key).join(format!("{key}.{META_EXT}"))
    }

    pub(crate) fn index_path(&self) -> PathBuf {
        self.version_dir().join("index.sled")
    }

    pub(crate) fn index_lock_path(&self) -> PathBuf {
        self.version_dir().join("index.lock")
    }
}

/// A fresh temp file name: `.tmp-<pid>-<random hex>`.
pub(crate) fn temp_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    format!("{TEMP_PREFIX}{}-{:016x}", std::process::id(), hasher.finish())
}

pub(crate) fn is_temp_name(name: &str) -> bool {
    name.starts_with(TEMP_PREFIX)
}

/// Creates a new, uniquely named temp file in `dir`.
fn create_temp(dir: &Path) -> Result<(PathBuf, File), CacheError> {
    let mut attempts = 0;
    loop {
        let path = dir.join(temp_name());
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(file) => return Ok((path, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempts < 8 => attempts += 1,
            Err(e) => return Err(CacheError::io("create temp file", path, e)),
        }
    }
}

/// Writes `bytes` to a temp file in `dest`'s directory, fsyncs it and renames
/// it over `dest`. Readers see either the old file or the complete new one.
pub(crate) fn publish(dest: &Path, bytes: &[u8]) -> Result<(), CacheError> {
    let dir = dest.parent().unwrap_or_else(|| Path::new("."));
    let (tmp, mut file) = create_temp(dir)?;
    let written = file
        .write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| CacheError::io("write temp file", &tmp, e));
    drop(file);
    let renamed =
        written.and_then(|()| fs::rename(&tmp, dest).map_err(|e| CacheError::io("rename into place", dest, e)));
    if renamed.is_err() {
        // Best effort: do not leave our own temp file behind.
        let _ = fs::remove_file(&tmp);
    }
    renamed
}

/// Writes a probe file in `dir` and removes it: proves `dir` is writable.
pub(crate) fn probe_writable(dir: &Path) -> Result<(), CacheError> {
    let (tmp, mut file) = create_temp(dir)?;
    let res = file
        .write_all(b"probe")
        .map_err(|e| CacheError::io("write probe file", &tmp, e));
    drop(file);
    let removed = fs::remove_file(&tmp).map_err(|e| CacheError::io("remove probe file", &tmp, e));
    res.and(removed)
}

/// fsyncs a directory so that renames in it are durable. Best effort: some
/// filesystems do not support it.
pub(crate) fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

pub(crate) fn create_dir_all(dir: &Path) -> Result<(), CacheError> {
    fs::create_dir_all(dir).map_err(|e| CacheError::io("create directory", dir, e))
}

/// Unix seconds of a time (0 before the epoch).
pub(crate) fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Unix nanoseconds of a time (0 before the epoch, saturating far ahead).
pub(crate) fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// One file found by a scan.
#[derive(Clone, Debug)]
pub(crate) struct FileInfo {
    pub(crate) path: PathBuf,
    pub(crate) len: u64,
    pub(crate) modified: SystemTime,
}

/// The files of one key.
#[derive(Clone, Debug, Default)]
pub(crate) struct EntryFiles {
    pub(crate) blob: Option<FileInfo>,
    pub(crate) meta: Option<FileInfo>,
}

/// Everything found under `<root>/v1`.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    pub(crate) entries: BTreeMap<CacheKey, EntryFiles>,
    pub(crate) temps: Vec<FileInfo>,
    /// Files we do not recognise (never touched).
    pub(crate) strays: Vec<PathBuf>,
    /// Directories or files that could not be read.
    pub(crate) errors: Vec<(PathBuf, String)>,
}

fn file_info(path: PathBuf, md: &fs::Metadata) -> FileInfo {
    FileInfo {
        path,
        len: md.len(),
        modified: md.modified().unwrap_or(UNIX_EPOCH),
    }
}

/// Lists `dir`; a missing directory is empty. Errors are recorded in `scan`.
fn read_dir_entries(dir: &Path, scan: &mut Scan) -> Vec<(String, PathBuf, fs::Metadata)> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            scan.errors.push((dir.to_path_buf(), e.to_string()));
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for item in rd {
        let item = match item {
            Ok(i) => i,
            Err(e) => {
                scan.errors.push((dir.to_path_buf(), e.to_string()));
                continue;
            }
        };
        let path = item.path();
        // symlink_metadata: never follow links out of the cache.
        match fs::symlink_metadata(&path) {
            Ok(md) => out.push((item.file_name().to_string_lossy().into_owned(), path, md)),
            // Vanished between readdir and stat (concurrent rename/gc): skip.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => scan.errors.push((path, e.to_string())),
        }
    }
    out
}

/// Scans `<root>/v1` (top level for temp files) and every shard directory.
/// Never writes.
pub(crate) fn scan_root(layout: &Layout) -> Scan {
    let mut scan = Scan::default();
    for (name, path, md) in read_dir_entries(&layout.version_dir(), &mut scan) {
        if md.is_file() && is_temp_name(&name) {
            scan.temps.push(file_info(path, &md));
        }
    }
    for (shard, shard_path, md) in read_dir_entries(&layout.blobs_dir(), &mut scan) {
        let valid_shard =
            md.is_dir() && shard.len() == 2 && shard.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if !valid_shard {
            scan.strays.push(shard_path);
            continue;
        }
        for (name, path, md) in read_dir_entries(&shard_path, &mut scan) {
            if !md.is_file() {
                scan.strays.push(path);
                continue;
            }
            if is_temp_name(&name) {
                scan.temps.push(file_info(path, &md));
                continue;
            }
            let parsed = name
                .rsplit_once('.')
                .and_then(|(stem, ext)| stem.parse::<CacheKey>().ok().map(|k| (k, ext)));
            match parsed {
                Some((key, ext)) if key.shard() == shard && ext == BLOB_EXT => {
                    scan.entries.entry(key).or_default().blob = Some(file_info(path, &md));
                }
                Some((key, ext)) if key.shard() == shard && ext == META_EXT => {
                    scan.entries.entry(key).or_default().meta = Some(file_info(path, &md));
                }
                _ => scan.strays.push(path),
            }
        }
    }
    scan
}
