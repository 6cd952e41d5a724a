//! Cache keys and the builder that derives them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

use crate::error::CacheError;
use crate::SCHEMA_VERSION;

/// Domain-separation tag hashed before anything else.
const KEY_DOMAIN: &[u8] = b"attnforge-cache-key";

/// A content address: the SHA-256 of everything that determines a compiled
/// kernel. Displayed and parsed as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct CacheKey(pub [u8; 32]);

impl CacheKey {
    /// The 64-digit lowercase hex form (same as `Display`).
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The first two hex digits: the shard directory of the entry.
    pub fn shard(&self) -> String {
        hex::encode(&self.0[..1])
    }
}

impl fmt::Display for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl FromStr for CacheKey {
    type Err = CacheError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = |reason: &str| CacheError::InvalidKey {
            input: s.to_string(),
            reason: reason.to_string(),
        };
        if s.len() != 64 {
            return Err(invalid(&format!("expected 64 hex digits, got {} characters", s.len())));
        }
        if !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(invalid("expected only lowercase hex digits [0-9a-f]"));
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).map_err(|e| invalid(&e.to_string()))?;
        Ok(CacheKey(out))
    }
}

impl Serialize for CacheKey {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for CacheKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Builds a [`CacheKey`] from named fields.
///
/// The hash input is a domain tag, the little-endian [`SCHEMA_VERSION`], then
/// for every field: `len(name) as u64 LE`, `name`, `len(value) as u64 LE`,
/// `value`. Because both parts are length-prefixed, no two different field
/// sequences produce the same hash input (`("ab","c")` vs `("a","bc")`).
/// Field order matters: callers must add fields in a fixed order.
#[derive(Clone)]
pub struct KeyBuilder {
    hasher: Sha256,
}

impl KeyBuilder {
    /// Starts a key with the domain tag and [`SCHEMA_VERSION`].
    pub fn new() -> Self {
        let mut hasher = Sha256::new();
        hasher.update(KEY_DOMAIN);
        hasher.update(SCHEMA_VERSION.to_le_bytes());
        KeyBuilder { hasher }
    }

    /// Appends one named field.
    pub fn field(mut self, name: &str, value: impl AsRef<[u8]>) -> Self {
        let value = value.as_ref();
        self.hasher.update((name.len() as u64).to_le_bytes());
        self.hasher.update(name.as_bytes());
        self.hasher.update((value.len() as u64).to_le_bytes());
        self.hasher.update(value);
        self
    }

    /// Finishes the hash.
    pub fn finish(self) -> CacheKey {
        CacheKey(self.hasher.finalize().into())
    }
}

impl Default for KeyBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for KeyBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyBuilder").finish_non_exhaustive()
    }
}
