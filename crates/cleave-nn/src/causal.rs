//! What a causal language model of any family offers the generation loop
//! and the server, and the context it keeps its sequences in.

use std::any::Any;

use cleave_shaders::cubecl::prelude::*;
use cleave_shaders::{
    logprob_reports, pick_tokens, sample_on_host, samples_on_device, Banned, History, LogprobReports, Penalties,
    Picked, RopeTable, SampleRules, SamplerConfig, Tensor, WeightType, NON_FINITE,
};

use crate::allowed::Allowed;
use crate::error::{ModelError, Result};
use crate::layer_cache::LayerCache;
use crate::logprobs::{TokenLogprobs, MAX_TOP_LOGPROBS};
use crate::placement::PlacedModel;
use crate::rows::PassRows;
use crate::uploads::UploadStats;

/// Which rows of logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    Last,
    All,
    /// None: the pass only fills the cache (a prompt's chunk before its
    /// last), so the output head does not run and nothing is read back.
    None,
}

/// The type a KV cache holds its keys and values in: f32, or f16 (half the
/// memory; llama.cpp's default) with the values rounded to f16 as they are
/// cached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CacheType {
    #[default]
    F32,
    F16,
}

impl CacheType {
    /// Bytes of one cached value.
    pub fn bytes(self) -> usize {
        match self {
            CacheType::F32 => 4,
            CacheType::F16 => 2,
        }
    }

    pub fn weight_type(self) -> WeightType {
        match self {
            CacheType::F32 => WeightType::F32,
            CacheType::F16 => WeightType::F16,
        }
    }
}

/// What a model keeps of one or more sequences, each in its own part
/// ("slot") of `capacity` positions: each layer's cache (see
/// [`LayerCache`]), beside the layer, and the rotary tables of every
/// device that runs attention.
pub struct Context {
    /// `None` for a layer another part of the model runs.
    layers: Vec<Option<Box<dyn LayerCache>>>,
    rope: Vec<Vec<Option<RopeTable>>>,
    capacity: usize,
    /// Positions each slot's sequence holds.
    lens: Vec<usize>,
    /// Where the device's picks of the last pass went, and the rules they
    /// were made by (banned ids, sampling, penalty windows): kept from
    /// step to step, so that a decode step allocates nothing for them.
    picks: Option<PickBuffers>,
    /// The last pass's rows, which the next decode step moves on.
    rows: Option<PassRows>,
    /// What the last pick's rules asked to report of their tokens.
    logprobs: Vec<Option<TokenLogprobs>>,
    /// The cache of the model's parts on other runtimes (see
    /// [`crate::LaterPart`]).
    next: Option<Box<Context>>,
}

/// Most drafted tokens a speculative step checks after its token: a pass
/// of at most `1 + MAX_DRAFTS` rows of one sequence runs in the decode
/// form, each row as decoding it alone would, so that its picks are
/// plain decoding's.
pub const MAX_DRAFTS: usize = 16;

/// How the device picks one sequence's next token: the most likely one,
/// or one sampled, never one of `banned`.
#[derive(Clone, Debug, PartialEq)]
pub struct PickRule {
    /// Ids never picked (the end-of-sequence ids of a generation that
    /// ignores them).
    pub banned: Vec<u32>,
    /// Greedy where its temperature is 0.
    pub sampler: SamplerConfig,
    /// Uniforms the sequence's sampler has drawn: the next pick draws the
    /// one after.
    pub drawn: u32,
    /// The sequence's last ids that its penalties look at, oldest first
    /// (none where they are off).
    pub window: Vec<u32>,
    /// Added to the logits before the pick (OpenAI's `logit_bias`), after
    /// the soft cap.
    pub bias: Vec<(u32, f32)>,
    /// How many of the most likely tokens' log-probabilities the pick
    /// reports beside its own ([`Context::logprobs`]); `None` reports
    /// nothing.
    pub logprobs: Option<usize>,
    /// The only ids the pick may take: a grammar's mask for this step,
    /// worked out once the pass's kernels are queued. `None` allows every
    /// id.
    pub allowed: Option<Allowed>,
}

impl PickRule {
    /// The most likely token, never one of `banned`.
    pub fn greedy(banned: Vec<u32>) -> PickRule {
        PickRule {
            banned,
            sampler: SamplerConfig::greedy(),
            drawn: 0,
            window: Vec::new(),
            bias: Vec::new(),
            logprobs: None,
            allowed: None,
        }
    }

    /// The pick this rule makes from a row of `logits` on the host: the
    /// device's, from the same logits. Fails where they hold a NaN.
    pub fn pick_on_host(&self, logits: &[f32]) -> Result<u32> {
        let allowed = self.allowed.as_ref().map(Allowed::words).transpose()?;
        let mut logits = logits.to_vec();
        for &(id, bias) in &self.bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }
        for &id in &self.banned {
            if let Some(l) = logits.get_mut(id as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
        if let Some(allowed) = &allowed {
            for (id, l) in logits.iter_mut().enumerate() {
                if !Allowed::holds(allowed, id) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        sample_on_host(&logits, &self.sampler, self.drawn, &self.window).ok_or(ModelError::NoToken)
    }

    /// The rule for the pick after this one, where this one took `id`:
    /// how a speculative step picks after each drafted token.
    pub fn after(&self, id: u32) -> PickRule {
        let mut next = self.clone();
        next.sampler.advance(&mut next.drawn, &mut next.window, id);
        next
    }

    /// Whether a pick by this rule needs no state of the sequence's: the
    /// most likely token, unpenalized.
    fn is_plain_greedy(&self) -> bool {
        self.sampler.is_greedy() && self.sampler.penalties.is_off()
    }

    /// Whether the device can make this rule's pick on `client`: it adds
    /// no bias, and it samples, penalizes or reports log-probabilities
    /// only where the device does (a CPU adapter reads its logits as
    /// cheaply as the reports, see `samples_on_device`).
    fn picks_on_device<R: Runtime>(&self, client: &ComputeClient<R>) -> bool {
        self.bias.is_empty()
            && (self.logprobs.is_none() || samples_on_device(client))
            && (self.is_plain_greedy() || (self.sampler.fits_device() && samples_on_device(client)))
    }
}

/// Whether the device can make every pick of `rules` on `client`: each
/// rule's ([`PickRule::picks_on_device`]), and none penalizes where one
/// reports log-probabilities, for penalties rewrite the logits the
/// reports are read from.
fn all_pick_on_device<R: Runtime>(client: &ComputeClient<R>, rules: &[PickRule]) -> bool {
    let reports = rules.iter().any(|r| r.logprobs.is_some());
    let penalizes = rules.iter().any(|r| !r.sampler.penalties.is_off());
    rules.iter().all(|r| r.picks_on_device(client)) && !(reports && penalizes)
}

struct PickBuffers {
    /// The rules as the device holds them: each sampling row's count of
    /// uniforms moved on by every pick it made.
    rules: Vec<PickRule>,
    banned: Banned,
    /// Where any row samples.
    sampling: Option<SampleRules>,
    /// Where any row penalizes.
    history: Option<History>,
    picked: Picked,
    /// What was last read from `picked`, which it still holds.
    read: Vec<u32>,
    /// Where any row reports log-probabilities.
    reports: Option<LogprobReports>,
}

impl PickBuffers {
    /// The buffers of `rules`' picks over a vocabulary of `vocab`.
    fn new<R: Runtime>(client: &ComputeClient<R>, rules: &[PickRule], vocab: usize) -> Result<PickBuffers> {
        let banned: Vec<&[u32]> = rules.iter().map(|r| r.banned.as_slice()).collect();
        let sampling = match rules.iter().any(|r| !r.sampler.is_greedy()) {
            true => {
                let table: Vec<(SamplerConfig, u32)> = rules.iter().map(|r| (r.sampler, r.drawn)).collect();
                Some(SampleRules::new(client, &table)?)
            }
            false => None,
        };
        let history = match rules.iter().any(|r| !r.sampler.penalties.is_off()) {
            true => {
                let windows: Vec<(Penalties, &[u32])> = rules
                    .iter()
                    .map(|r| (r.sampler.penalties, r.window.as_slice()))
                    .collect();
                Some(History::new(client, &windows)?)
            }
            false => None,
        };
        Ok(PickBuffers {
            rules: rules.to_vec(),
            banned: Banned::new(client, &banned),
            sampling,
            history,
            picked: Picked::new(client, rules.len()),
            read: Vec::new(),
            reports: match rules.iter().filter_map(|r| r.logprobs).max() {
                Some(top) => Some(LogprobReports::new(
                    client,
                    rules.len(),
                    top.min(MAX_TOP_LOGPROBS).min(vocab),
                )?),
                None => None,
            },
        })
    }
}

impl Context {
    /// An empty context of `slots` sequences: `layers[i]` is layer `i`'s
    /// cache, `rope[set][device]` the rotary table of each set of
    /// frequencies (one, or a model's full and sliding layers' own) on
    /// each device that attends.
    pub fn new(
        layers: Vec<Option<Box<dyn LayerCache>>>,
        rope: Vec<Vec<Option<RopeTable>>>,
        capacity: usize,
        slots: usize,
    ) -> Self {
        Context {
            layers,
            rope,
            capacity,
            lens: vec![0; slots],
            picks: None,
            rows: None,
            logprobs: Vec::new(),
            next: None,
        }
    }

    /// This cache, with `next` the cache of the model's parts after this
    /// one's (on other runtimes).
    pub fn with_next(self, next: Context) -> Self {
        Context {
            next: Some(Box::new(next)),
            ..self
        }
    }

    /// The cache of the model's parts after this one's.
    pub fn next_mut(&mut self) -> Result<&mut Context> {
        self.next
            .as_deref_mut()
            .ok_or_else(|| ModelError::Device("a model part's cache has no cache for the parts after it".into()))
    }

    /// The last pass's rows, taken for the next pass to move on.
    pub(crate) fn take_rows(&mut self) -> Option<PassRows> {
        self.rows.take()
    }

    /// Keeps a pass's rows for the next one.
    pub fn keep_rows(&mut self, rows: PassRows) {
        self.rows = Some(rows);
    }

    /// Picks each row's next token from `logits: [rows, vocab]` (soft-capped
    /// where `softcap`) on `client`'s device, by the row's rule, and reads
    /// the ids back. The buffers the picks need (banned ids, sampling rules,
    /// penalty windows) are those of the last pass where they still hold
    /// these rules, as the device moved them on: a decode step then writes
    /// nothing to the device for its picks.
    ///
    /// The logits come back for the host to pick from where a rule asks
    /// what the device cannot do (a bias, `SamplerConfig::fits_device`,
    /// log-probabilities beside penalties), and on a device that does not
    /// sample (see `samples_on_device`) wherever a rule samples, penalizes
    /// or reports log-probabilities. On the device, the reports come back
    /// beside the ids: a few words a row.
    ///
    /// Where a grammar holds a rule to a mask, the host works the mask out
    /// here, while the device runs the pass queued before, and uploads it
    /// with the banned ids: one write a step.
    pub fn pick<R: Runtime>(
        &mut self,
        client: &ComputeClient<R>,
        logits: &Tensor,
        softcap: Option<f32>,
        rules: &[PickRule],
    ) -> Result<Vec<u32>> {
        self.logprobs.clear();
        let masked = rules.iter().any(|rule| rule.allowed.is_some());
        if masked {
            // Queued is not yet running on every runtime: submit the pass.
            client
                .flush()
                .map_err(|e| ModelError::Device(format!("submitting a pass before its pick: {e:?}")))?;
        }
        let masks = rules
            .iter()
            .map(|rule| rule.allowed.as_ref().map(Allowed::words).transpose())
            .collect::<Result<Vec<_>>>()?;
        if !all_pick_on_device(client, rules) {
            let vocab = logits.cols();
            let logits = read_logits(client, logits, softcap)?;
            let mut picks = Vec::with_capacity(rules.len());
            for (row, rule) in logits.chunks(vocab).zip(rules) {
                let id = rule.pick_on_host(row)?;
                self.logprobs
                    .push(rule.logprobs.map(|top| TokenLogprobs::of(row, id, top)));
                picks.push(id);
            }
            return Ok(picks);
        }
        let picks = match &mut self.picks {
            Some(picks) if picks.rules == rules => picks,
            stale => stale.insert(PickBuffers::new(client, rules, logits.cols())?),
        };
        if masked {
            let banned: Vec<&[u32]> = rules.iter().map(|r| r.banned.as_slice()).collect();
            let masks: Vec<Option<&[u32]>> = masks.iter().map(Option::as_deref).collect();
            picks.banned = Banned::masked(client, &banned, &masks, logits.cols());
        }
        let inputs = (picks.sampling.as_ref(), picks.history.as_ref());
        pick_tokens(client, logits, &picks.banned, softcap, inputs, &picks.picked)?;
        if let Some(reports) = &picks.reports {
            logprob_reports(client, logits, softcap, &picks.picked, reports)?;
        }
        picks.read = picks.picked.read(client)?;
        // The device moved each rule's state on by its pick (a NaN's flag
        // ends the sequence).
        for (rule, &id) in picks.rules.iter_mut().zip(&picks.read) {
            if id & NON_FINITE == 0 {
                rule.sampler.advance(&mut rule.drawn, &mut rule.window, id);
            }
        }
        let ids = picks
            .read
            .iter()
            .map(|&id| match id & NON_FINITE {
                0 => Ok(id),
                _ => Err(ModelError::NonFinite {
                    what: "the logits".into(),
                    index: (id & !NON_FINITE) as usize,
                    hint: LOGITS_HINT,
                }),
            })
            .collect::<Result<Vec<u32>>>()?;
        if let Some(reports) = &picks.reports {
            for ((rule, report), &id) in rules.iter().zip(reports.read(client)?).zip(&ids) {
                self.logprobs.push(rule.logprobs.map(|top| TokenLogprobs {
                    id,
                    logprob: report.logprob,
                    top: report.top.into_iter().take(top).collect(),
                }));
            }
        }
        Ok(ids)
    }

    /// The log-probabilities of each token the last pick took, for the
    /// rules that asked for them (see [`PickRule::logprobs`]), in the
    /// rules' order; read where the model's tail picked.
    pub fn logprobs(&self) -> &[Option<TokenLogprobs>] {
        match &self.next {
            Some(next) => next.logprobs(),
            None => &self.logprobs,
        }
    }

    /// The device buffer holding `ids` where the last pass picked exactly
    /// them, so that the next pass reads them there instead of writing them
    /// to the device again.
    pub fn picked(&self, ids: &[u32]) -> Option<&Picked> {
        self.picks.as_ref().filter(|p| p.read == ids).map(|p| &p.picked)
    }

    /// Positions each sequence may hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn slots(&self) -> usize {
        self.lens.len()
    }

    /// Positions the sequence in `slot` holds.
    pub fn len(&self, slot: usize) -> usize {
        self.lens[slot]
    }

    /// Forgets the sequence in `slot`, so that a new one starts there.
    pub fn clear(&mut self, slot: usize) {
        self.lens[slot] = 0;
        for cache in self.layers.iter_mut().flatten() {
            cache.clear(slot);
        }
        if let Some(next) = &mut self.next {
            next.clear(slot);
        }
    }

    /// Forgets every position of `slot` after its first `len`: the drafted
    /// tokens a speculative step cached and did not keep. What the cache
    /// holds beyond is overwritten by the next pass.
    pub fn truncate(&mut self, slot: usize, len: usize) {
        self.lens[slot] = self.lens[slot].min(len);
        for cache in self.layers.iter_mut().flatten() {
            cache.truncate(slot, len);
        }
        if let Some(next) = &mut self.next {
            next.truncate(slot, len);
        }
    }

    /// Whether `slot` may be cut back to its first `len` positions and a
    /// pass go on from there ([`Context::truncate`]): always where every
    /// layer caches by position; a recurrent state keeps only its last
    /// positions' states, and those only where the context speculates.
    pub fn can_truncate(&self, slot: usize, len: usize) -> bool {
        slot < self.slots()
            && self.layers.iter().flatten().all(|cache| cache.can_truncate(slot, len))
            && self.next.as_ref().is_none_or(|next| next.can_truncate(slot, len))
    }

    /// Makes every layer's cache keep what it needs to cut a sequence back
    /// by up to `positions` positions (see [`LayerCache::keep_history`]):
    /// for a context that speculates.
    pub fn keep_history(&mut self, positions: usize) {
        for cache in self.layers.iter_mut().flatten() {
            cache.keep_history(positions);
        }
        if let Some(next) = &mut self.next {
            next.keep_history(positions);
        }
    }

    /// Counts `positions` more in `slot`, once a pass has cached them.
    pub fn advance(&mut self, slot: usize, positions: usize) {
        self.lens[slot] += positions;
    }

    /// The cache of `layer`, of the kind `C` its layer keeps.
    pub fn layer<C: LayerCache>(&self, layer: usize) -> Result<&C> {
        let cache = self.layers.get(layer).and_then(Option::as_deref);
        let any: Option<&dyn Any> = cache.map(|cache| cache as &dyn Any);
        any.and_then(<dyn Any>::downcast_ref).ok_or_else(|| {
            let kind = std::any::type_name::<C>().rsplit("::").next().unwrap_or("cache");
            ModelError::Device(format!("this context holds no {kind} for layer {layer}"))
        })
    }

    /// Set `set`'s rotary table on each device (`None` where nothing
    /// attends).
    pub fn rope_tables(&self, set: usize) -> &[Option<RopeTable>] {
        &self.rope[set]
    }
}

/// A causal language model on a device group, of any family: what the CLI,
/// the server, the tests and the benches drive. Made by the family registry.
pub trait CausalModel<R: Runtime>: PlacedModel<R> {
    fn vocab_size(&self) -> usize;

    /// Positions the model was trained for.
    fn max_positions(&self) -> usize;

    /// An empty KV cache for `slots` sequences of `capacity` positions
    /// each, each shard's part on the device of its heads.
    fn new_context_slots(&self, capacity: usize, slots: usize) -> Result<Context>;

    /// An empty KV cache for one sequence of `capacity` positions.
    fn new_context(&self, capacity: usize) -> Result<Context> {
        self.new_context_slots(capacity, 1)
    }

    /// Runs `ids` through the model after what `slot` of `ctx` holds,
    /// appends them to its cache, and returns the logits of the last or of
    /// every position (`[rows][vocab]`, flattened), or none.
    fn forward_slot(&self, ctx: &mut Context, slot: usize, ids: &[u32], which: Logits) -> Result<Vec<f32>>;

    /// [`CausalModel::forward_slot`] for a context of one sequence.
    fn forward(&self, ctx: &mut Context, ids: &[u32], which: Logits) -> Result<Vec<f32>> {
        self.forward_slot(ctx, 0, ids, which)
    }

    /// One decode step for several sequences at once: `(slot, id)` appends
    /// `id` to the sequence in `slot`. Returns each sequence's next-token
    /// logits, in order, the same as decoding each on its own would give.
    fn decode(&self, ctx: &mut Context, steps: &[(usize, u32)]) -> Result<Vec<Vec<f32>>>;

    /// [`CausalModel::forward_slot`], the next token then picked on the
    /// device as a rule says: the most likely one (the first of equal
    /// ones, as the host's greedy pick takes) or one sampled as the host's
    /// sampler would, never a banned one (see [`Context::pick`]). One rule
    /// picks after the last of `ids`; one rule per id picks after each
    /// (a speculative step checking its drafts). Only the ids come back.
    fn forward_pick(&self, ctx: &mut Context, slot: usize, ids: &[u32], rules: &[PickRule]) -> Result<Vec<u32>>;

    /// [`CausalModel::decode`], each sequence's next token picked on the
    /// device as [`CausalModel::forward_pick`] picks it, by its own rule.
    /// Only the ids come back.
    fn decode_pick(&self, ctx: &mut Context, steps: &[(usize, u32)], rules: &[PickRule]) -> Result<Vec<u32>>;

    /// What the model has uploaded while running since it was loaded
    /// (nothing, for a model whose weights all stay on its devices).
    fn upload_stats(&self) -> UploadStats {
        UploadStats::default()
    }

    /// Bytes cleave's buffers occupy on each device of the model's group
    /// now, in the group's order (those of its parts on other runtimes
    /// included).
    fn bytes_in_use(&self) -> Result<Vec<u64>> {
        self.placement().bytes_in_use()
    }

    /// [`CausalModel::bytes_in_use`], of the weights and caches only (see
    /// [`crate::Placement::model_bytes_in_use`]).
    fn model_bytes_in_use(&self) -> Result<Vec<u64>> {
        self.placement().model_bytes_in_use()
    }
}

/// What the generation loop needs of a model with one sequence's state.
pub trait CausalLm {
    fn vocab_size(&self) -> usize;
    /// Positions this sequence's context holds.
    fn capacity(&self) -> usize;
    /// Positions the model was trained for.
    fn max_positions(&self) -> usize;
    /// Appends `ids` and returns the logits of the last or every new
    /// position, or none.
    fn forward(&mut self, ids: &[u32], which: Logits) -> Result<Vec<f32>>;
    /// Appends `ids` and picks the token after the last, or after each,
    /// as `rules` say (see [`CausalModel::forward_pick`]).
    fn forward_pick(&mut self, ids: &[u32], rules: &[PickRule]) -> Result<Vec<u32>>;
    /// Positions the sequence's cache holds.
    fn cached(&self) -> usize;
    /// Forgets every position after the first `len`.
    fn truncate(&mut self, len: usize);
    /// Keeps what the caches need to forget up to `positions` of the
    /// latest positions (a speculative step's drafts) with
    /// [`CausalLm::truncate`].
    fn keep_history(&mut self, positions: usize);
}

/// A model and one sequence's context: what the generation loop drives.
pub struct Session<'m, R: Runtime> {
    model: &'m dyn CausalModel<R>,
    context: Context,
}

impl<'m, R: Runtime> Session<'m, R> {
    pub fn new(model: &'m dyn CausalModel<R>, capacity: usize) -> Result<Self> {
        Ok(Session {
            context: model.new_context(capacity)?,
            model,
        })
    }
}

impl<R: Runtime> CausalLm for Session<'_, R> {
    fn vocab_size(&self) -> usize {
        self.model.vocab_size()
    }

    fn capacity(&self) -> usize {
        self.context.capacity()
    }

    fn max_positions(&self) -> usize {
        self.model.max_positions()
    }

    fn forward(&mut self, ids: &[u32], which: Logits) -> Result<Vec<f32>> {
        self.model.forward(&mut self.context, ids, which)
    }

    fn forward_pick(&mut self, ids: &[u32], rules: &[PickRule]) -> Result<Vec<u32>> {
        self.model.forward_pick(&mut self.context, 0, ids, rules)
    }

    fn cached(&self) -> usize {
        self.context.len(0)
    }

    fn truncate(&mut self, len: usize) {
        self.context.truncate(0, len);
    }

    fn keep_history(&mut self, positions: usize) {
        self.context.keep_history(positions);
    }
}

/// `logits` (`[rows, vocab]`, on `client`'s device) on the host:
/// soft-capped (`cap · tanh(l / cap)`) where `softcap`, and checked to be
/// finite.
pub fn read_logits<R: Runtime>(client: &ComputeClient<R>, logits: &Tensor, softcap: Option<f32>) -> Result<Vec<f32>> {
    let mut logits = logits.to_vec(client)?;
    if let Some(cap) = softcap {
        logits.iter_mut().for_each(|l| *l = (*l / cap).tanh() * cap);
    }
    // Sampling from a NaN or an infinity would pick a token that means
    // nothing, silently.
    check_finite(&logits, || "the logits".into(), LOGITS_HINT)?;
    Ok(logits)
}

/// What may have made logits NaN or infinite.
const LOGITS_HINT: &str = " (an activation overflowed: check the weights, the adapters and their scales)";

/// Fails on the first NaN or infinity among `values`, naming them `what`,
/// with `hint` on what may have overflowed.
pub fn check_finite(values: &[f32], what: impl FnOnce() -> String, hint: &'static str) -> Result<()> {
    match values.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(index) => Err(ModelError::NonFinite {
            what: what(),
            index,
            hint,
        }),
    }
}

/// Checks one sequence's ids against the vocabulary and the positions an
/// encoder takes.
pub fn check_ids(ids: &[u32], vocab_size: usize, max_positions: usize) -> Result<()> {
    if ids.is_empty() {
        return Err(ModelError::EmptyPrompt);
    }
    if ids.len() > max_positions {
        return Err(ModelError::PromptTooLong {
            tokens: ids.len(),
            context: max_positions,
            max: max_positions,
        });
    }
    match ids.iter().find(|&&id| id as usize >= vocab_size) {
        Some(&id) => Err(ModelError::TokenId { id, vocab: vocab_size }),
        None => Ok(()),
    }
}
