//! `attnforge-cache`: a persistent, content-addressed store for compiled GPU
//! kernels (CUBIN blobs plus JSON metadata), safe for many processes at once.
//!
//! * The caller computes a [`CacheKey`] with [`KeyBuilder`].
//! * [`Cache::get`] searches read-only prebuilt roots, then the user root,
//!   re-hashing the blob; damage is [`Lookup::Corrupt`], never a hit.
//! * [`Cache::put`] publishes blob then metadata by temp file + fsync +
//!   atomic rename into the user root.
//! * A sled index (spec -> keys, metadata copies) is kept as an accelerator;
//!   it is opened only for short operations and skipped when busy.
//!
//! See `docs/cache.md` for the on-disk layout and the protocols.

mod config;
mod error;
mod fs;
mod index;
mod key;
mod maintenance;
mod memory;
mod meta;
mod report;
mod size;
mod store;

pub use config::{CacheConfig, ENV_CACHE_DIR, ENV_CACHE_PATH};
pub use error::CacheError;
pub use key::{CacheKey, KeyBuilder};
pub use maintenance::DEFAULT_STALE_AFTER;
pub use meta::{sha256_hex, KernelMeta};
pub use report::{GcReport, IndexCheck, Issue, IssueKind, Listed, RootInfo, RootKind, RootStats, Stats, VerifyReport};
pub use size::{format_size, parse_size};
pub use store::{Cache, Lookup};

/// Version of the key derivation and of the on-disk layout (`<root>/v1`).
pub const SCHEMA_VERSION: u32 = 1;

/// The `root` reported for entries of the in-memory store.
pub const MEMORY_ROOT: &str = "<memory>";

/// Set to a non-empty value other than `0` to print debug messages (index
/// skips and the like) to stderr.
pub const ENV_CACHE_DEBUG: &str = "ATTNFORGE_CACHE_DEBUG";

fn debug_enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var_os(ENV_CACHE_DEBUG).is_some_and(|v| !v.is_empty() && v != "0"))
}

pub(crate) fn debug_log(msg: std::fmt::Arguments<'_>) {
    if debug_enabled() {
        eprintln!("attnforge: debug: cache: {msg}");
    }
}

#[allow(dead_code)]
fn assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<Cache>();
}
