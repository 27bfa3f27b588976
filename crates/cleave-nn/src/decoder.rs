//! The forward pass of a decoder of any family, written once: checking a
//! pass's ids, cutting a prompt into passes, embedding, running the blocks
//! (handing the rows to a part on another runtime where the model spans
//! runtimes), and finishing a pass with logits, picks or nothing. A family
//! gives the driver its layers through [`DecoderLayers`]: the embedding,
//! block `i` over the pass's rows with its layer's cache, and the head
//! (llama.cpp keeps this split: `llama-context.cpp` drives, a model file
//! builds its graph).

use std::ops::Range;

use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::{copy_rows, Picked, RopeTable, Tensor};

use crate::causal::{read_logits, CausalModel, Context, Logits, PickRule, MAX_DRAFTS};
use crate::error::{ModelError, Result};
use crate::layer_cache::LayerCache;
use crate::parts::{Finish, Finished, HostRows, LaterPart, Part};
use crate::placement::{PlacedModel, Placement};
use crate::rows::PassRows;
use crate::uploads::UploadStats;

/// Most prompt tokens one forward pass takes; longer prompts go in pieces.
pub const MAX_BATCH_ROWS: usize = 512;

/// Most rows of one sequence that a pass computes in the decode form (each
/// row as decoding it alone would: the decode products share each weight
/// read among a few rows): a speculative step's token and its drafts. A
/// longer pass is a prompt's, for the prefill products.
pub(crate) const DECODE_FORM_ROWS: usize = 1 + MAX_DRAFTS;

/// The sizes of a decoder that the driver needs.
#[derive(Clone, Copy, Debug)]
pub struct DecoderShape {
    pub layers: usize,
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// Positions the model was trained for.
    pub max_positions: usize,
    /// Keys a sliding-window layer attends to (0: the model has none).
    pub sliding_window: usize,
    /// `cap · tanh(l / cap)` on the logits (Gemma 2).
    pub final_softcap: Option<f32>,
}

/// What block `i` of a pass reads beside its weights: the context (its
/// layer's cache, the rotary tables) and the pass's rows.
pub struct BlockPass<'a> {
    pub ctx: &'a Context,
    pub rows: &'a PassRows,
    /// Where the pass's positions end (LongRoPE picks its factors by it).
    pub end: usize,
    /// Each row's inputs of every layer, `[rows, layers · width]`, where
    /// the family has them (Gemma 4), on the block's home device.
    pub per_layer: Option<&'a Tensor>,
}

/// A decoder family's layers, as one part of the model holds them (the
/// whole model, or on a group spanning runtimes one runtime's share).
pub trait DecoderLayers<R: Runtime> {
    fn shape(&self) -> DecoderShape;

    /// The embeddings of `ids` on `client`'s device (the head's), read from
    /// `picked` where the last pass picked exactly these ids there. Only
    /// the part holding the head is asked.
    fn embed(&self, client: &ComputeClient<R>, ids: &[u32], picked: Option<&Picked>) -> Result<Tensor>;

    /// The per-layer inputs of the rows `ids`, whose embeddings are
    /// `hidden` (on `client`'s device, the head's, shaped as the pass
    /// runs them), where the family has them (Gemma 4): every block of
    /// the pass reads its share. Only the part holding the head is asked.
    fn per_layer_inputs(&self, _client: &ComputeClient<R>, _ids: &[u32], _hidden: &Tensor) -> Result<Option<Tensor>> {
        Ok(None)
    }

    /// Runs block `i` over `hidden` (on the block's home device), its
    /// layer's cache updated with the pass's rows.
    fn block(&self, placement: &Placement<R>, i: usize, hidden: Tensor, pass: BlockPass) -> Result<Tensor>;

    /// The logits of the rows `x` (on `client`'s device, the tail's): the
    /// last norm and the output head. Only the part holding the tail is
    /// asked.
    fn head(&self, client: &ComputeClient<R>, x: &Tensor) -> Result<Tensor>;

    /// Block `i`'s empty cache for `slots` sequences of `capacity`
    /// positions, beside its layer; only blocks this part runs are asked.
    fn layer_cache(
        &self,
        placement: &Placement<R>,
        i: usize,
        capacity: usize,
        slots: usize,
    ) -> Result<Box<dyn LayerCache>>;

    /// The rotary tables the blocks of `blocks` read, `[set][device]`, on
    /// each device that attends (none for a family without rotary
    /// positions).
    fn rope_tables(
        &self,
        placement: &Placement<R>,
        blocks: Range<usize>,
        capacity: usize,
    ) -> Result<Vec<Vec<Option<RopeTable>>>>;

    /// What the layers uploaded while running (streamed blocks, fetched
    /// experts), with the parts on other runtimes they hold.
    fn upload_stats(&self) -> UploadStats;

    /// Parts on devices of other runtimes that the layers hold and report
    /// for (expert split's experts), beside the driver's next part.
    fn parts(&self) -> Vec<&dyn Part> {
        Vec::new()
    }
}

/// A decoder on a device group: the layers of one family placed as the
/// plan says, driven pass by pass. On a group spanning runtimes, this is
/// the part on the first runtime, with the parts after it.
pub struct Decoder<R: Runtime, L> {
    placement: Placement<R>,
    layers: L,
    /// The blocks this part runs: every one, but for a model spanning
    /// runtimes in layer split.
    blocks: Range<usize>,
    /// The part on the next runtime, in layer split across runtimes.
    next: Option<Box<dyn LaterPart>>,
}

impl<R: Runtime, L: DecoderLayers<R>> Decoder<R, L> {
    /// `layers` on `placement`, with the parts after this one on other
    /// runtimes. A part that runs blocks hands them on to the tail's
    /// part; parts after that one hold nothing (their members got no
    /// block).
    pub fn new(placement: Placement<R>, layers: L, next: Option<Box<dyn LaterPart>>) -> Result<Self> {
        let plan = placement.plan();
        let blocks = plan.blocks();
        if !plan.has_tail() && !blocks.is_empty() && next.is_none() {
            return Err(ModelError::Device(format!(
                "a part of {} running blocks {blocks:?} has neither the tail nor a part after it",
                plan.module
            )));
        }
        Ok(Decoder {
            placement,
            layers,
            blocks,
            next,
        })
    }

    /// The next part, where this one hands its rows on instead of
    /// finishing the pass.
    fn hands_on(&self) -> Option<&dyn LaterPart> {
        self.next.as_deref().filter(|_| !self.placement.plan().has_tail())
    }

    /// Fails unless `ids` fit after what `slot` of `ctx` holds and are all
    /// in the vocabulary.
    fn check(&self, ctx: &Context, slot: usize, ids: &[u32]) -> Result<()> {
        let shape = self.layers.shape();
        if ctx.len(slot) + ids.len() > ctx.capacity() {
            return Err(ModelError::PromptTooLong {
                tokens: ctx.len(slot) + ids.len(),
                context: ctx.capacity(),
                max: shape.max_positions,
            });
        }
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= shape.vocab_size) {
            return Err(ModelError::TokenId {
                id,
                vocab: shape.vocab_size,
            });
        }
        Ok(())
    }

    /// How many of `remaining` tokens the next pass takes: at most
    /// [`MAX_BATCH_ROWS`], and when every row's logits are wanted, few
    /// enough that they (`rows × vocab`) fit one buffer. (Attention writes
    /// no scores, so it sets no bound of its own.)
    fn batch_rows(&self, remaining: usize, which: Logits) -> usize {
        let mut rows = remaining.min(MAX_BATCH_ROWS);
        if which == Logits::All {
            let row_bytes = self.layers.shape().vocab_size * size_of::<f32>();
            while rows > 1 && rows * row_bytes > self.placement.max_buffer() {
                rows /= 2;
            }
        }
        rows
    }

    /// One pass over the rows of one or more sequences, `(slot, ids)`
    /// each, finished as `finish` says: each row's logits (`All`) or each
    /// sequence's last, read back or picked from.
    fn forward_pass(
        &self,
        ctx: &mut Context,
        seqs: &[(usize, &[u32])],
        which: Logits,
        finish: Finish,
    ) -> Result<Finished> {
        let plan = self.placement.plan();
        if !plan.has_head() {
            return Err(ModelError::Device(format!(
                "a part of {} without its head was given ids",
                plan.module
            )));
        }
        let (head, tail) = (plan.head_device(), plan.tail_device());
        let client = self.placement.client(head);
        let ids: Vec<u32> = seqs.iter().flat_map(|(_, ids)| ids.iter().copied()).collect();
        // A decode step's ids where the last step picked them on this very
        // device are read there; the others are written to the device.
        let picked = ctx.picked(&ids).filter(|_| plan.has_tail() && head == tail);
        let mut hidden = self.layers.embed(client, &ids, picked)?;
        if ids.len() > 1 && (ids.len() == seqs.len() || ids.len() <= DECODE_FORM_ROWS) {
            // One row of each of several sequences, or a few of one:
            // shaped so that every matmul computes each row exactly as it
            // would alone.
            hidden = hidden.reshape(&[ids.len(), 1, self.layers.shape().hidden_size]);
        }
        let per_layer = self.layers.per_layer_inputs(client, &ids, &hidden)?;
        self.run_part(ctx, seqs, ((hidden, per_layer), head), which, finish)
    }

    /// Runs a pass's `hidden` rows and their per-layer inputs (on device
    /// `here`) through this part's blocks, then hands them to the next
    /// part through the host, or finishes the pass here.
    fn run_part(
        &self,
        ctx: &mut Context,
        seqs: &[(usize, &[u32])],
        (hidden, here): ((Tensor, Option<Tensor>), usize),
        which: Logits,
        finish: Finish,
    ) -> Result<Finished> {
        let placement = &self.placement;
        let rows = PassRows::for_pass(placement, ctx, seqs, self.layers.shape().sliding_window);
        let end = seqs
            .iter()
            .map(|&(slot, ids)| ctx.len(slot) + ids.len())
            .max()
            .unwrap_or(0);
        let run = |i, _, (hidden, per_layer): (Tensor, Option<Tensor>)| {
            let pass = BlockPass {
                ctx,
                rows: &rows,
                end,
                per_layer: per_layer.as_ref(),
            };
            Ok((self.layers.block(placement, i, hidden, pass)?, per_layer))
        };
        let ((hidden, per_layer), here) = placement.run_blocks_from(hidden, here, self.blocks.clone(), run)?;
        for (slot, ids) in seqs {
            ctx.advance(*slot, ids.len());
        }
        ctx.keep_rows(rows);
        match self.hands_on() {
            Some(next) => {
                let client = placement.client(here);
                let hidden = HostRows::read(client, &hidden)?;
                let per_layer = per_layer.map(|p| HostRows::read(client, &p)).transpose()?;
                next.pass(ctx.next_mut()?, seqs, (hidden, per_layer), which, finish)
            }
            None => self.finish_pass(ctx, seqs, (hidden, here), which, finish),
        }
    }

    /// Finishes a pass whose last block left `hidden` on device `here`:
    /// the head over each row (`All`) or each sequence's last, the logits
    /// read back or picked from as `finish` says.
    fn finish_pass(
        &self,
        ctx: &mut Context,
        seqs: &[(usize, &[u32])],
        (hidden, mut here): (Tensor, usize),
        which: Logits,
        finish: Finish,
    ) -> Result<Finished> {
        let placement = &self.placement;
        let plan = placement.plan();
        if !plan.has_tail() {
            return Err(ModelError::Device(format!(
                "a part of {} ends without its tail",
                plan.module
            )));
        }
        let rules = match finish {
            Finish::Nothing => return Ok(Finished::Nothing),
            Finish::Logits => None,
            Finish::Pick(rules) => Some(rules),
        };
        let shape = self.layers.shape();
        let hidden = placement.hand_over(hidden, &mut here, plan.tail_device());
        let client = placement.client(here);
        // Each row is normed on its own, so the last rows are taken first.
        let mut x = hidden;
        let rows: usize = seqs.iter().map(|(_, ids)| ids.len()).sum();
        if which == Logits::Last && rows > seqs.len() {
            let last = Tensor::empty(client, &[seqs.len(), shape.hidden_size]);
            let mut end = 0;
            for (i, (_, seq)) in seqs.iter().enumerate() {
                end += seq.len();
                copy_rows(client, &x, end - 1, &last, i, 1)?;
            }
            x = last;
        }
        let logits = self.layers.head(client, &x)?;
        Ok(match rules {
            None => Finished::Logits(read_logits(client, &logits, shape.final_softcap)?),
            Some(rules) => Finished::Picks(ctx.pick(client, &logits, shape.final_softcap, rules)?),
        })
    }

    /// Runs `ids` through the model after what `slot` holds, in passes of
    /// at most [`Decoder::batch_rows`] rows; `finish(rows, last)` says how
    /// to finish each pass of `rows` rows (and whether it is the last).
    /// Returns what each pass gave.
    fn prefill<'r>(
        &self,
        ctx: &mut Context,
        slot: usize,
        ids: &[u32],
        which: Logits,
        mut finish: impl FnMut(usize, bool) -> Finish<'r>,
    ) -> Result<Vec<Finished>> {
        if ids.is_empty() {
            return Err(ModelError::EmptyPrompt);
        }
        self.check(ctx, slot, ids)?;
        let mut rest = ids;
        let mut passes = Vec::new();
        while !rest.is_empty() {
            let rows = self.batch_rows(rest.len(), which);
            let (batch, tail) = rest.split_at(rows);
            passes.push(self.forward_pass(ctx, &[(slot, batch)], which, finish(rows, tail.is_empty()))?);
            rest = tail;
        }
        Ok(passes)
    }

    /// Checks a decode step's `(slot, id)`s: each slot once and in range,
    /// each id fitting its sequence; returns them as a pass's sequences.
    fn decode_rows<'s>(&self, ctx: &Context, steps: &'s [(usize, u32)]) -> Result<Vec<(usize, &'s [u32])>> {
        for (i, &(slot, id)) in steps.iter().enumerate() {
            if slot >= ctx.slots() || steps[..i].iter().any(|&(other, _)| other == slot) {
                return Err(ModelError::Device(format!(
                    "decode step {i} names slot {slot}, which is out of range or taken twice"
                )));
            }
            self.check(ctx, slot, &[id])?;
        }
        Ok(steps
            .iter()
            .map(|(slot, id)| (*slot, std::slice::from_ref(id)))
            .collect())
    }

    /// The parts this one holds and reports for.
    fn parts(&self) -> impl Iterator<Item = &dyn Part> {
        let next = self.next.iter().map(|p| p.as_ref() as &dyn Part);
        next.chain(self.layers.parts())
    }

    /// `here` (one figure per device of this part), then each part's
    /// figures as `of` gives them: one per device of the group, in its
    /// order.
    fn after(&self, mut here: Vec<u64>, of: impl Fn(&dyn Part) -> Result<Vec<u64>>) -> Result<Vec<u64>> {
        for part in self.parts() {
            here.extend(of(part)?);
        }
        Ok(here)
    }
}

impl<R: Runtime, L> PlacedModel<R> for Decoder<R, L> {
    fn placement(&self) -> &Placement<R> {
        &self.placement
    }
}

impl<R: Runtime, L: DecoderLayers<R>> CausalModel<R> for Decoder<R, L> {
    fn vocab_size(&self) -> usize {
        self.layers.shape().vocab_size
    }

    fn max_positions(&self) -> usize {
        self.layers.shape().max_positions
    }

    fn new_context_slots(&self, capacity: usize, slots: usize) -> Result<Context> {
        let placement = &self.placement;
        let layers = (0..self.layers.shape().layers)
            .map(|i| {
                // Another part caches the blocks it runs.
                self.blocks
                    .contains(&i)
                    .then(|| self.layers.layer_cache(placement, i, capacity, slots))
                    .transpose()
            })
            .collect::<Result<Vec<_>>>()?;
        let rope = self.layers.rope_tables(placement, self.blocks.clone(), capacity)?;
        let context = Context::new(layers, rope, capacity, slots);
        match &self.next {
            Some(next) => Ok(context.with_next(next.new_context_slots(capacity, slots)?)),
            None => Ok(context),
        }
    }

    fn forward_slot(&self, ctx: &mut Context, slot: usize, ids: &[u32], which: Logits) -> Result<Vec<f32>> {
        // Only the very last row counts where only the last is asked for.
        let passes = self.prefill(ctx, slot, ids, which, |_, last| match which {
            Logits::All => Finish::Logits,
            Logits::Last if last => Finish::Logits,
            _ => Finish::Nothing,
        })?;
        Ok(passes.into_iter().flat_map(Finished::logits).collect())
    }

    fn forward_pick(&self, ctx: &mut Context, slot: usize, ids: &[u32], rules: &[PickRule]) -> Result<Vec<u32>> {
        let each = match rules.len() {
            1 => false,
            n if n == ids.len() => true,
            n => {
                return Err(ModelError::Device(format!(
                    "a pass over {} ids given {n} pick rules (one, or one per id)",
                    ids.len()
                )))
            }
        };
        let which = if each { Logits::All } else { Logits::Last };
        let mut rest = rules;
        let passes = self.prefill(ctx, slot, ids, which, |rows, last| {
            if each {
                let (now, later) = rest.split_at(rows);
                rest = later;
                Finish::Pick(now)
            } else if last {
                Finish::Pick(rules)
            } else {
                Finish::Nothing
            }
        })?;
        Ok(passes.into_iter().flat_map(Finished::picks).collect())
    }

    fn decode(&self, ctx: &mut Context, steps: &[(usize, u32)]) -> Result<Vec<Vec<f32>>> {
        let rows = self.decode_rows(ctx, steps)?;
        let logits = self.forward_pass(ctx, &rows, Logits::Last, Finish::Logits)?.logits();
        Ok(logits
            .chunks(self.layers.shape().vocab_size)
            .map(<[f32]>::to_vec)
            .collect())
    }

    fn decode_pick(&self, ctx: &mut Context, steps: &[(usize, u32)], rules: &[PickRule]) -> Result<Vec<u32>> {
        if rules.len() != steps.len() {
            return Err(ModelError::Device(format!(
                "a decode step of {} sequences given pick rules for {}",
                steps.len(),
                rules.len()
            )));
        }
        let rows = self.decode_rows(ctx, steps)?;
        Ok(self
            .forward_pass(ctx, &rows, Logits::Last, Finish::Pick(rules))?
            .picks())
    }

    fn bytes_in_use(&self) -> Result<Vec<u64>> {
        Part::bytes_in_use(self)
    }

    fn model_bytes_in_use(&self) -> Result<Vec<u64>> {
        Part::model_bytes_in_use(self)
    }

    fn upload_stats(&self) -> UploadStats {
        Part::upload_stats(self)
    }
}

impl<R: Runtime, L: DecoderLayers<R>> LaterPart for Decoder<R, L> {
    fn new_context_slots(&self, capacity: usize, slots: usize) -> Result<Context> {
        CausalModel::new_context_slots(self, capacity, slots)
    }

    fn pass(
        &self,
        ctx: &mut Context,
        seqs: &[(usize, &[u32])],
        (hidden, per_layer): (HostRows, Option<HostRows>),
        which: Logits,
        finish: Finish,
    ) -> Result<Finished> {
        let plan = self.placement.plan();
        let here = match (self.blocks.is_empty(), self.hands_on()) {
            (false, _) => plan.device_of_block(self.blocks.start),
            // A part its plan gives no block passes the rows on as they are.
            (true, Some(next)) => {
                for (slot, ids) in seqs {
                    ctx.advance(*slot, ids.len());
                }
                return next.pass(ctx.next_mut()?, seqs, (hidden, per_layer), which, finish);
            }
            (true, None) => plan.tail_device(),
        };
        let client = self.placement.client(here);
        let per_layer = per_layer.map(|p| p.upload(client));
        self.run_part(ctx, seqs, ((hidden.upload(client), per_layer), here), which, finish)
    }
}

impl<R: Runtime, L: DecoderLayers<R>> Part for Decoder<R, L> {
    fn upload_stats(&self) -> UploadStats {
        let next = self.next.iter().map(|p| p.upload_stats());
        next.fold(self.layers.upload_stats(), |sum, part| sum.plus(&part))
    }

    fn bytes_in_use(&self) -> Result<Vec<u64>> {
        self.after(self.placement.bytes_in_use()?, |part| part.bytes_in_use())
    }

    fn model_bytes_in_use(&self) -> Result<Vec<u64>> {
        self.after(self.placement.model_bytes_in_use()?, |part| part.model_bytes_in_use())
    }
}
