//! The in-memory fallback store, used when no writable directory exists.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::SystemTime;

use crate::fs::unix_secs;
use crate::key::CacheKey;
use crate::meta::KernelMeta;

pub(crate) struct MemEntry {
    pub(crate) cubin: Vec<u8>,
    pub(crate) meta: KernelMeta,
    /// Wall-clock last use (reported).
    pub(crate) last_used: SystemTime,
    /// Logical clock of last use (orders LRU exactly).
    pub(crate) tick: u64,
}

impl MemEntry {
    pub(crate) fn size(&self) -> u64 {
        self.cubin.len() as u64
    }

    pub(crate) fn last_used_unix(&self) -> u64 {
        unix_secs(self.last_used)
    }
}

#[derive(Default)]
struct Inner {
    map: HashMap<CacheKey, MemEntry>,
    clock: u64,
}

/// A process-local map of entries.
#[derive(Default)]
pub(crate) struct MemoryStore {
    inner: Mutex<Inner>,
}

impl MemoryStore {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic elsewhere cannot leave the map half-updated: every
        // mutation below is a single insert/remove.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn get(&self, key: &CacheKey) -> Option<(Vec<u8>, KernelMeta)> {
        let mut inner = self.lock();
        inner.clock += 1;
        let tick = inner.clock;
        inner.map.get_mut(key).map(|e| {
            e.tick = tick;
            e.last_used = SystemTime::now();
            (e.cubin.clone(), e.meta.clone())
        })
    }

    pub(crate) fn put(&self, key: &CacheKey, cubin: &[u8], meta: &KernelMeta) {
        let mut inner = self.lock();
        inner.clock += 1;
        let tick = inner.clock;
        inner.map.insert(
            *key,
            MemEntry {
                cubin: cubin.to_vec(),
                meta: meta.clone(),
                last_used: SystemTime::now(),
                tick,
            },
        );
    }

    /// Calls `f` with every entry.
    pub(crate) fn for_each(&self, mut f: impl FnMut(&CacheKey, &MemEntry)) {
        let inner = self.lock();
        for (k, e) in &inner.map {
            f(k, e);
        }
    }

    /// Evicts least recently used entries until the total is at most
    /// `max_bytes`. Returns (bytes before, evicted keys, evicted bytes,
    /// entries left).
    pub(crate) fn evict_to(&self, max_bytes: u64) -> (u64, Vec<CacheKey>, u64, u64) {
        let mut inner = self.lock();
        let mut order: Vec<(u64, CacheKey, u64)> = inner.map.iter().map(|(k, e)| (e.tick, *k, e.size())).collect();
        order.sort();
        let before: u64 = order.iter().map(|(_, _, s)| s).sum();
        let mut total = before;
        let mut evicted = Vec::new();
        let mut evicted_bytes = 0;
        for (_, key, size) in order {
            if total <= max_bytes {
                break;
            }
            inner.map.remove(&key);
            total -= size;
            evicted_bytes += size;
            evicted.push(key);
        }
        (before, evicted, evicted_bytes, inner.map.len() as u64)
    }
}
