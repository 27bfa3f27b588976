//! What a model uploads while it runs: streamed blocks, and experts fetched
//! into a device's expert cache, with that cache's hits and misses.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counts since the model was loaded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UploadStats {
    /// Routed experts found in their device's cache.
    pub expert_hits: u64,
    /// Routed experts uploaded before they ran.
    pub expert_misses: u64,
    /// Checkpoint bytes uploaded while running (streamed blocks and experts).
    pub uploaded_bytes: u64,
}

impl UploadStats {
    /// The share of routed experts found cached; `None` when no expert
    /// went through a cache.
    pub fn expert_hit_rate(&self) -> Option<f64> {
        let routed = self.expert_hits + self.expert_misses;
        (routed > 0).then(|| self.expert_hits as f64 / routed as f64)
    }

    /// These counts and `other`'s together (two parts of one model).
    pub fn plus(&self, other: &UploadStats) -> UploadStats {
        UploadStats {
            expert_hits: self.expert_hits + other.expert_hits,
            expert_misses: self.expert_misses + other.expert_misses,
            uploaded_bytes: self.uploaded_bytes + other.uploaded_bytes,
        }
    }

    /// What happened between `earlier` and these counts.
    pub fn since(&self, earlier: &UploadStats) -> UploadStats {
        UploadStats {
            expert_hits: self.expert_hits - earlier.expert_hits,
            expert_misses: self.expert_misses - earlier.expert_misses,
            uploaded_bytes: self.uploaded_bytes - earlier.uploaded_bytes,
        }
    }
}

/// The counters a model keeps, shared by the threads that may run it.
#[derive(Debug, Default)]
pub struct UploadCounters {
    expert_hits: AtomicU64,
    expert_misses: AtomicU64,
    uploaded_bytes: AtomicU64,
}

impl UploadCounters {
    pub fn expert_hit(&self) {
        self.expert_hits.fetch_add(1, Ordering::Relaxed);
    }

    pub fn expert_miss(&self) {
        self.expert_misses.fetch_add(1, Ordering::Relaxed);
    }

    pub fn uploaded(&self, bytes: u64) {
        self.uploaded_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn stats(&self) -> UploadStats {
        UploadStats {
            expert_hits: self.expert_hits.load(Ordering::Relaxed),
            expert_misses: self.expert_misses.load(Ordering::Relaxed),
            uploaded_bytes: self.uploaded_bytes.load(Ordering::Relaxed),
        }
    }
}
