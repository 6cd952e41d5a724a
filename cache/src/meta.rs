//! Kernel metadata stored next to every blob.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Metadata of one compiled kernel, stored as `<key>.json` next to the blob.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct KernelMeta {
    /// Canonical spec string, e.g. `fwd.bf16.d128.causal-br.dense.sm80`.
    pub spec: String,
    /// Kernel entry symbol.
    pub entry: String,
    /// Architecture string, e.g. `sm_80`.
    pub arch: String,
    /// NVRTC version, e.g. `13.0`.
    pub nvrtc_version: String,
    /// Registers per thread.
    pub registers: u32,
    /// Stack frame bytes.
    pub stack_frame: u32,
    /// Spill store bytes.
    pub spill_stores: u32,
    /// Spill load bytes.
    pub spill_loads: u32,
    /// Static shared memory bytes.
    pub smem_static: u32,
    /// Dynamic shared memory bytes.
    pub smem_dynamic: u32,
    /// Wall time of the compilation.
    pub compile_ms: f64,
    /// When the entry was compiled (unix seconds).
    pub created_unix: u64,
    /// Compiler log.
    pub log: String,
    /// Lowercase hex SHA-256 of the blob bytes.
    pub cubin_sha256: String,
    /// Length of the blob in bytes.
    pub cubin_len: u64,
    /// Launch information the caller wants to keep (plan etc.).
    #[serde(default)]
    pub extra: serde_json::Value,
}

impl KernelMeta {
    /// Sets `cubin_sha256` and `cubin_len` from the blob bytes.
    pub fn fill_blob_fields(&mut self, cubin: &[u8]) {
        self.cubin_sha256 = sha256_hex(cubin);
        self.cubin_len = cubin.len() as u64;
    }

    /// Checks that `cubin_len` and `cubin_sha256` describe `cubin`.
    /// The error is a human-readable reason.
    pub fn check_blob(&self, cubin: &[u8]) -> Result<(), String> {
        if cubin.len() as u64 != self.cubin_len {
            return Err(format!(
                "blob is {} bytes, metadata says {} bytes",
                cubin.len(),
                self.cubin_len
            ));
        }
        let actual = sha256_hex(cubin);
        if !actual.eq_ignore_ascii_case(&self.cubin_sha256) {
            return Err(format!("blob sha256 is {actual}, metadata says {}", self.cubin_sha256));
        }
        Ok(())
    }
}

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}
