//! The ids a grammar allows at one pick, worked out when the pick needs
//! them: after the pass's kernels are queued, so that the host computes
//! the mask while the device runs the step.

use std::fmt;
use std::sync::Arc;

use crate::error::Result;

/// What works out the ids a pick may take: a grammar at its place in a
/// sequence's text.
pub trait AllowedIds: Send + Sync {
    /// The ids the next pick may take, as bits (id `i` is bit `i % 32` of
    /// word `i / 32`; ids past the words are not allowed). Asked again
    /// before the text moves on, it gives the same words.
    fn words(&self) -> Result<Arc<[u32]>>;
}

/// A pick's [`AllowedIds`]. Two are equal where they are the same one: a
/// sequence's rule keeps its grammar from step to step while the words
/// change, so that the buffers a pick keeps for its rules stay.
#[derive(Clone)]
pub struct Allowed(Arc<dyn AllowedIds>);

impl Allowed {
    pub fn new(ids: Arc<dyn AllowedIds>) -> Allowed {
        Allowed(ids)
    }

    /// The ids the pick may take now ([`AllowedIds::words`]).
    pub fn words(&self) -> Result<Arc<[u32]>> {
        self.0.words()
    }

    /// Whether `id` is among `words` ([`AllowedIds::words`]).
    pub fn holds(words: &[u32], id: usize) -> bool {
        words.get(id / 32).is_some_and(|word| word >> (id % 32) & 1 == 1)
    }
}

impl PartialEq for Allowed {
    fn eq(&self, other: &Allowed) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.0), Arc::as_ptr(&other.0))
    }
}

impl fmt::Debug for Allowed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Allowed(..)")
    }
}
