//! What a decoder layer keeps of each sequence between passes, beside the
//! layer on the devices that run it: keys and values for attention (the
//! [`KvCache`]), and for other kinds of layer a state of their own (a
//! linear-attention layer's [`crate::RecurrentState`]). The
//! [`crate::Context`] holds one per layer and counts each slot's
//! positions; a cache answers for what it holds when a slot is cleared or
//! cut short.

use std::any::Any;

use cleave_shaders::Weight;

/// One layer's cache of every slot of a context.
pub trait LayerCache: Any + Send {
    /// Forgets what the cache holds of `slot` (a new sequence starts
    /// there). A cache indexed by position has nothing to do: the
    /// context's count of the slot's positions says what is valid.
    fn clear(&mut self, _slot: usize) {}

    /// Forgets what the cache holds of `slot` past its first `len`
    /// positions (drafted tokens a speculative step did not keep, or what
    /// a new sequence does not share with the slot's last one).
    fn truncate(&mut self, _slot: usize, _len: usize) {}

    /// Whether a pass may go on from `slot` cut back to `len` positions
    /// ([`LayerCache::truncate`]). A cache indexed by position always can.
    fn can_truncate(&self, _slot: usize, _len: usize) -> bool {
        true
    }

    /// Keeps what it needs to cut a sequence back by up to `positions`
    /// positions from where its last pass left it (a speculative step's
    /// drafts). A cache indexed by position keeps that already.
    fn keep_history(&mut self, _positions: usize) {}
}

/// An attention layer's keys and values: one K and one V cache
/// (`[slots · capacity, kv width]`) per shard of its heads, each on the
/// device of those heads. Position `p` of slot `s` is row `s · capacity +
/// p`, so what lies past a slot's length is overwritten by its next pass.
pub struct KvCache {
    pub shards: Vec<(Weight, Weight)>,
}

impl LayerCache for KvCache {}
