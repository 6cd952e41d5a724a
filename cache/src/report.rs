//! Result types of `list`, `stats`, `verify`, `gc` and `roots`.

use std::fmt;
use std::path::PathBuf;

use serde::Serialize;

use crate::key::CacheKey;
use crate::meta::KernelMeta;

/// What kind of root a path is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RootKind {
    /// A prebuilt root from `ATTNFORGE_CACHE_PATH`; never written.
    ReadOnly,
    /// The user root; receives every `put`.
    Writable,
    /// The in-memory fallback (path `<memory>`).
    InMemory,
}

impl fmt::Display for RootKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RootKind::ReadOnly => "read-only",
            RootKind::Writable => "writable",
            RootKind::InMemory => "in-memory",
        })
    }
}

/// One root of a cache, in search order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RootInfo {
    /// The root directory, or `<memory>`.
    pub path: PathBuf,
    /// Its kind.
    pub kind: RootKind,
    /// Whether the directory exists (always true for memory).
    pub exists: bool,
}

/// One entry found by `list`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Listed {
    /// The content address.
    pub key: CacheKey,
    /// Its metadata.
    pub meta: KernelMeta,
    /// The root it lives in (or `<memory>`).
    pub root: PathBuf,
    /// Bytes on disk: blob plus metadata file.
    pub size: u64,
    /// Last use, unix seconds (the blob file's mtime, touched on each hit).
    pub last_used: u64,
}

/// Per-root totals.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RootStats {
    /// The root directory, or `<memory>`.
    pub path: PathBuf,
    /// Its kind.
    pub kind: RootKind,
    /// Complete entries (blob and metadata both present).
    pub entries: u64,
    /// Bytes of those entries (blob plus metadata file).
    pub bytes: u64,
    /// Temporary files (in-flight or abandoned writes).
    pub temp_files: u64,
}

/// Totals across roots.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// One row per root, in search order.
    pub roots: Vec<RootStats>,
    /// Sum of `entries`.
    pub total_entries: u64,
    /// Sum of `bytes`.
    pub total_bytes: u64,
}

/// What is wrong with one file or entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum IssueKind {
    /// The metadata file cannot be read or parsed.
    BadMeta {
        /// Why.
        reason: String,
    },
    /// Metadata exists but the blob does not.
    MissingBlob,
    /// The blob does not match the metadata (length or sha256).
    BlobMismatch {
        /// Why.
        reason: String,
    },
    /// A blob without metadata: an in-flight or killed writer.
    OrphanBlob,
    /// A temporary file: an in-flight or killed writer.
    TempFile {
        /// Seconds since it was last modified.
        age_secs: u64,
    },
    /// The index has a record for a key whose files are gone.
    DanglingIndex,
    /// A directory or file could not be read.
    Unreadable {
        /// Why.
        reason: String,
    },
}

/// One problem found by `verify`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Issue {
    /// The root concerned.
    pub root: PathBuf,
    /// The file concerned (the index directory for `DanglingIndex`).
    pub path: PathBuf,
    /// The entry concerned, if known.
    pub key: Option<CacheKey>,
    /// What is wrong.
    pub kind: IssueKind,
}

impl fmt::Display for Issue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = self.path.display();
        match &self.kind {
            IssueKind::BadMeta { reason } => write!(f, "{path}: bad metadata: {reason}"),
            IssueKind::MissingBlob => write!(f, "{path}: metadata without blob"),
            IssueKind::BlobMismatch { reason } => write!(f, "{path}: corrupt blob: {reason}"),
            IssueKind::OrphanBlob => write!(f, "{path}: blob without metadata (unfinished write)"),
            IssueKind::TempFile { age_secs } => {
                write!(f, "{path}: temporary file, {age_secs}s old (unfinished write)")
            }
            IssueKind::DanglingIndex => match &self.key {
                Some(k) => write!(f, "{path}: index entry {k} points to no file"),
                None => write!(f, "{path}: index row points to no entry"),
            },
            IssueKind::Unreadable { reason } => write!(f, "{path}: unreadable: {reason}"),
        }
    }
}

/// Whether the index was checked by `verify`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum IndexCheck {
    /// The user root's index was opened and compared with the files.
    Checked,
    /// It could not be opened (busy or broken); nothing to conclude.
    Skipped,
    /// There is no writable root (read-only roots' indexes are never opened).
    NotApplicable,
}

/// Result of `verify`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    /// The directory roots that were scanned.
    pub roots: Vec<PathBuf>,
    /// Entries whose blob re-hashed correctly.
    pub entries_ok: u64,
    /// Everything that is wrong.
    pub issues: Vec<Issue>,
    /// Files in the blob tree that are not ours (never touched by gc).
    pub ignored: Vec<PathBuf>,
    /// Whether the user root's index was compared with the files.
    pub index: IndexCheck,
}

impl VerifyReport {
    /// True when no issue was found.
    pub fn is_clean(&self) -> bool {
        self.issues.is_empty()
    }
}

/// Result of `gc`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GcReport {
    /// The collected root (the user root, or `<memory>`).
    pub root: PathBuf,
    /// Bytes of complete entries before collection.
    pub bytes_before: u64,
    /// Bytes of complete entries after collection.
    pub bytes_after: u64,
    /// Entries left.
    pub entries_after: u64,
    /// Entries evicted to fit the size limit, least recently used first.
    pub evicted: Vec<CacheKey>,
    /// Bytes freed by eviction.
    pub evicted_bytes: u64,
    /// Files of bad entries removed (corrupt, half-written or orphaned).
    pub removed_bad: Vec<PathBuf>,
    /// Stale temporary files removed.
    pub removed_temp: Vec<PathBuf>,
    /// Files that could not be removed, with the reason.
    pub failures: Vec<String>,
    /// Whether the index was brought in line with the files.
    pub index_updated: bool,
}
