//! A linear-attention layer's cache: per sequence, a recurrent state that
//! does not grow with the context (a Gated DeltaNet's convolution window
//! and its `[heads, key, value]` state), on the layer's device.
//!
//! A state cannot be cut back to an earlier position as a KV cache is, by
//! forgetting rows: it holds the sum of every row. So a context that
//! speculates keeps, per slot, the states of its last few positions in a
//! ring ([`LayerCache::keep_history`]); cutting the sequence back to one of
//! them makes its next pass start from that state (llama.cpp and vLLM keep
//! such checkpoints too). The ring is taken at the first pass after it is
//! asked for, so a context that never speculates holds only its slots'
//! states. Clearing a slot makes its next pass start from zeros. Both are
//! bookkeeping on the host: the kernels read a pass's [`StateRoute`]s.

use std::sync::Mutex;

use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::{copy_rows, StateRing, StateRoute, Tensor};

use crate::error::{ModelError, Result};
use crate::layer_cache::LayerCache;
use crate::rows::PassRows;

/// Where a slot's next pass starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Start {
    /// Zeros: a new sequence.
    Zeros,
    /// Its own state, the result of its last pass.
    Own,
    /// The state its ring keeps of this position.
    Ring(usize),
    /// Nothing: the sequence was cut back before what its ring keeps.
    Lost(usize),
}

struct Book {
    starts: Vec<Start>,
    /// Each slot's positions after its last pass.
    lens: Vec<usize>,
    /// The first position whose state each slot's ring keeps.
    kept_from: Vec<usize>,
    /// States in each slot's ring (0: none), and how many were asked for.
    ring: usize,
    wanted: usize,
    /// The convolution's windows, `[states, taps - 1, channels]`, and the
    /// delta rule's states, `[states, heads, key, value]`: slot `s`'s at
    /// `s`, then each slot's ring.
    windows: Tensor,
    states: Tensor,
}

/// A recurrent layer's state of every slot of a context.
pub struct RecurrentState {
    slots: usize,
    book: Mutex<Book>,
}

/// What a pass's kernels read: its routes and the buffers they number.
pub struct StatePass {
    pub routes: Vec<StateRoute>,
    pub windows: Tensor,
    pub states: Tensor,
}

impl RecurrentState {
    /// A cache of `slots` slots over `windows` and `states`, one state of
    /// each per slot; every slot starts from zeros.
    pub fn new(windows: Tensor, states: Tensor, slots: usize) -> Self {
        RecurrentState {
            slots,
            book: Mutex::new(Book {
                starts: vec![Start::Zeros; slots],
                lens: vec![0; slots],
                kept_from: vec![0; slots],
                ring: 0,
                wanted: 0,
                windows,
                states,
            }),
        }
    }

    /// Where each sequence of the pass over `rows` reads and writes its
    /// state, its rows in the pass's order; each slot then holds its own
    /// result, and its ring the states of the pass's last positions. The
    /// rings are made on `client` at the first pass after they are asked
    /// for.
    pub fn pass<R: Runtime>(&self, client: &ComputeClient<R>, rows: &PassRows) -> Result<StatePass> {
        let mut book = self
            .book
            .lock()
            .map_err(|_| ModelError::Device("a recurrent state's lock".into()))?;
        if book.wanted > book.ring {
            let states = self.slots * (1 + book.wanted);
            book.windows = grown(client, &book.windows, self.slots, states)?;
            book.states = grown(client, &book.states, self.slots, states)?;
            book.ring = book.wanted;
            // Only the slots' own states are there yet.
            book.kept_from = book.lens.clone();
        }
        let ring = book.ring;
        let mut first_row = 0;
        let mut routes = Vec::new();
        for (slot, start, count) in rows.sequences() {
            if slot >= self.slots {
                return Err(ModelError::Device(format!(
                    "a pass names slot {slot} of {}",
                    self.slots
                )));
            }
            let base = self.slots + slot * ring;
            let source = match book.starts[slot] {
                Start::Zeros => None,
                Start::Own => Some(slot),
                Start::Ring(position) => Some(base + position % ring),
                Start::Lost(len) => {
                    return Err(ModelError::Device(format!(
                        "the recurrent state of slot {slot} cannot go back to position {len}: it keeps only \
                         the states of its last positions, and only in a context that speculates"
                    )))
                }
            };
            routes.push(StateRoute {
                first_row,
                rows: count,
                source,
                dest: slot,
                ring: (ring > 0).then_some(StateRing {
                    base,
                    len: ring,
                    at: start,
                }),
            });
            let end = start + count;
            book.starts[slot] = Start::Own;
            book.lens[slot] = end;
            book.kept_from[slot] = book.kept_from[slot].max((end + 1).saturating_sub(ring));
            first_row += count;
        }
        Ok(StatePass {
            routes,
            windows: book.windows.clone(),
            states: book.states.clone(),
        })
    }

    fn book(&mut self) -> &mut Book {
        self.book.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// `buffer`'s first `slots` states in a new buffer of `states` states.
fn grown<R: Runtime>(client: &ComputeClient<R>, buffer: &Tensor, slots: usize, states: usize) -> Result<Tensor> {
    let mut shape = buffer.shape.clone();
    shape[0] = states;
    let grown = Tensor::allocate(client, &shape);
    let len = buffer.len() / slots.max(1);
    copy_rows(
        client,
        &buffer.reshape(&[slots, len]),
        0,
        &grown.reshape(&[states, len]),
        0,
        slots,
    )?;
    Ok(grown)
}

impl LayerCache for RecurrentState {
    fn clear(&mut self, slot: usize) {
        if slot >= self.slots {
            return;
        }
        let book = self.book();
        book.starts[slot] = Start::Zeros;
        book.lens[slot] = 0;
        book.kept_from[slot] = 0;
    }

    fn truncate(&mut self, slot: usize, len: usize) {
        if slot >= self.slots {
            return;
        }
        let book = self.book();
        if len >= book.lens[slot] {
            return;
        }
        book.starts[slot] = match book.ring > 0 && len >= book.kept_from[slot] {
            true => Start::Ring(len),
            false => Start::Lost(len),
        };
        book.lens[slot] = len;
    }

    fn can_truncate(&self, slot: usize, len: usize) -> bool {
        let book = self.book.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        slot < self.slots && (len >= book.lens[slot] || (book.ring > 0 && len >= book.kept_from[slot]))
    }

    fn keep_history(&mut self, positions: usize) {
        let book = self.book();
        // A position's own state and those of the `positions` before it.
        book.wanted = book.wanted.max(positions + 1);
    }
}
