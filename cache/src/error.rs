//! Typed errors of the cache crate.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong in the cache. Every variant that concerns a
/// file names it, so that a message is actionable on its own.
#[derive(thiserror::Error, Debug)]
pub enum CacheError {
    /// A filesystem operation failed.
    #[error("cannot {op} {}: {source}", path.display())]
    Io {
        /// What we were doing ("create directory", "rename into place", ...).
        op: &'static str,
        /// The file or directory concerned.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// A metadata file exists but is not valid JSON for [`crate::KernelMeta`].
    #[error("invalid kernel metadata in {}: {source}", path.display())]
    MetaParse {
        /// The `.json` file.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },

    /// The metadata given to [`crate::Cache::put`] could not be serialized.
    #[error("cannot serialize kernel metadata for key {key}: {source}")]
    MetaSerialize {
        /// The key being stored.
        key: String,
        /// The serialization error.
        #[source]
        source: serde_json::Error,
    },

    /// The metadata given to [`crate::Cache::put`] disagrees with the blob.
    #[error("kernel metadata does not match the cubin for key {key}: {reason}")]
    MetaMismatch {
        /// The key being stored.
        key: String,
        /// What disagrees.
        reason: String,
    },

    /// A string is not a valid cache key.
    #[error("invalid cache key {input:?}: {reason}")]
    InvalidKey {
        /// The offending input.
        input: String,
        /// Why it is invalid.
        reason: String,
    },

    /// A string is not a valid size.
    #[error("invalid size {input:?}: {reason} (examples: 1024, 10k, 500M, 2G, 1.5GiB)")]
    InvalidSize {
        /// The offending input.
        input: String,
        /// Why it is invalid.
        reason: String,
    },
}

impl CacheError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        CacheError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}
