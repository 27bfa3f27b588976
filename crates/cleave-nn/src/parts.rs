//! A causal model whose blocks span devices of several runtimes (a CUDA
//! GPU beside a Vulkan one): each runtime's devices hold a part of it, a
//! run of blocks in layer split, and the parts hand their activations on
//! through the host, as llama.cpp's layer split does between backends.
//!
//! The first part is the model its callers hold (it embeds the ids and
//! runs its blocks); each part after it is a [`LaterPart`], runtime-erased
//! so that a part of one runtime can hand its hidden states to a part of
//! another. The part that holds the tail finishes the pass: it reads the
//! logits back or picks the next tokens on its device.

use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::Tensor;

use crate::causal::{Context, Logits, PickRule};
use crate::error::Result;
use crate::uploads::UploadStats;

/// Hidden states on the host, on their way from one part to the next.
pub struct HostRows {
    pub values: Vec<f32>,
    /// The tensor's shape (`[rows, hidden]`, or `[n, 1, hidden]` in the
    /// decode form), kept so the next part computes every row as the
    /// whole model on one runtime would.
    pub shape: Vec<usize>,
}

impl HostRows {
    /// Reads `x` back from `client`'s device.
    pub fn read<R: Runtime>(client: &ComputeClient<R>, x: &Tensor) -> Result<HostRows> {
        Ok(HostRows {
            values: x.to_vec(client)?,
            shape: x.shape.clone(),
        })
    }

    /// The rows as a tensor on `client`'s device.
    pub fn upload<R: Runtime>(&self, client: &ComputeClient<R>) -> Tensor {
        Tensor::from_f32(client, &self.values, &self.shape)
    }
}

/// What the part holding the tail does at the end of a pass.
#[derive(Clone, Copy, Debug)]
pub enum Finish<'r> {
    /// Nothing: a pass whose logits nobody reads (a long prompt's earlier
    /// pieces), which skips the output head.
    Nothing,
    /// Reads the logits back (each row's or each sequence's last, as the
    /// pass's [`Logits`] says).
    Logits,
    /// Picks each row's next token by its rule (see [`Context::pick`]).
    Pick(&'r [PickRule]),
}

/// What a pass gave, as its [`Finish`] asked.
#[derive(Debug)]
pub enum Finished {
    Nothing,
    Logits(Vec<f32>),
    Picks(Vec<u32>),
}

impl Finished {
    /// The logits read back (none where the pass finished otherwise).
    pub fn logits(self) -> Vec<f32> {
        match self {
            Finished::Logits(logits) => logits,
            _ => Vec::new(),
        }
    }

    /// The ids picked (none where the pass finished otherwise).
    pub fn picks(self) -> Vec<u32> {
        match self {
            Finished::Picks(ids) => ids,
            _ => Vec::new(),
        }
    }
}

/// A part of a model on devices of another runtime than the part that
/// holds it: what it reports of itself.
pub trait Part {
    /// What it (and the parts it holds) uploaded while running.
    fn upload_stats(&self) -> UploadStats;

    /// Bytes cleave's buffers occupy on each of its devices and those of
    /// the parts it holds, in the group's order.
    fn bytes_in_use(&self) -> Result<Vec<u64>>;

    /// [`Part::bytes_in_use`], of the weights and caches only.
    fn model_bytes_in_use(&self) -> Result<Vec<u64>>;
}

/// A part of a causal model after the first, on devices of a runtime of
/// its own: a run of blocks, the tail where the model ends there, and the
/// parts after it.
pub trait LaterPart: Part {
    /// Its share of an empty KV cache (see
    /// [`crate::CausalModel::new_context_slots`]), with those of the parts
    /// after it.
    fn new_context_slots(&self, capacity: usize, slots: usize) -> Result<Context>;

    /// Runs a pass's `hidden` rows (those of `seqs`, `(slot, ids)` each)
    /// with their per-layer inputs where the family has them through its
    /// blocks and the parts after it, caching their keys and values in
    /// `ctx`, and finishes the pass as `finish` says.
    fn pass(
        &self,
        ctx: &mut Context,
        seqs: &[(usize, &[u32])],
        rows: (HostRows, Option<HostRows>),
        which: Logits,
        finish: Finish,
    ) -> Result<Finished>;
}
