//! Where the cache lives: configuration from the environment.

use std::ffi::OsString;
use std::path::PathBuf;

/// Colon-separated list of read-only (prebuilt) cache roots.
pub const ENV_CACHE_PATH: &str = "ATTNFORGE_CACHE_PATH";
/// The writable user cache root.
pub const ENV_CACHE_DIR: &str = "ATTNFORGE_CACHE_DIR";

/// Roots of a [`crate::Cache`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheConfig {
    /// Prebuilt roots, searched first and in order; never written.
    pub read_only_roots: Vec<PathBuf>,
    /// The writable root that receives every `put`. `None` means an
    /// in-memory cache.
    pub user_root: Option<PathBuf>,
}

impl CacheConfig {
    /// A configuration with only a writable root.
    pub fn with_user_root(root: impl Into<PathBuf>) -> Self {
        CacheConfig {
            read_only_roots: Vec::new(),
            user_root: Some(root.into()),
        }
    }

    /// Reads the process environment:
    /// * `read_only_roots` from `ATTNFORGE_CACHE_PATH` (colon-separated,
    ///   empty entries ignored);
    /// * `user_root` from `ATTNFORGE_CACHE_DIR`, else
    ///   `$XDG_CACHE_HOME/attnforge` (if absolute), else
    ///   `$HOME/.cache/attnforge`, else `None`.
    pub fn from_env() -> Self {
        Self::from_vars(|name| std::env::var_os(name))
    }

    /// Like [`CacheConfig::from_env`] but reads variables through `get`
    /// (for tests and embedding).
    pub fn from_vars(get: impl Fn(&str) -> Option<OsString>) -> Self {
        let non_empty = |name: &str| get(name).filter(|v| !v.is_empty());

        let read_only_roots = non_empty(ENV_CACHE_PATH)
            .map(|v| {
                std::env::split_paths(&v)
                    .filter(|p| !p.as_os_str().is_empty())
                    .collect()
            })
            .unwrap_or_default();

        let user_root = non_empty(ENV_CACHE_DIR)
            .map(PathBuf::from)
            .or_else(|| {
                non_empty("XDG_CACHE_HOME")
                    .map(PathBuf::from)
                    // The XDG spec says relative paths must be ignored.
                    .filter(|p| p.is_absolute())
                    .map(|p| p.join("attnforge"))
            })
            .or_else(|| non_empty("HOME").map(|h| PathBuf::from(h).join(".cache").join("attnforge")));

        CacheConfig {
            read_only_roots,
            user_root,
        }
    }
}
