//! Replicas and the work they do: each device group holds one copy of the
//! model on a thread of its own, takes jobs into the slots of one shared KV
//! cache (up to `--parallel`), and decodes every running sequence in one
//! pass per step. New prompts are read up to one chunk's worth of tokens
//! (`--prefill-chunk`) per step, between the decode steps of the others, so
//! a long prompt delays them by a chunk at a time rather than by its whole
//! prefill. Jobs wait in a bounded queue per replica (`dispatch`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::sync::Arc;

use cleave_device::{DeviceGroup, RuntimeTask};
use cleave_engine::{Decoder, Limits, PrefillChunk, Sampler, SamplerConfig, Step, StopReason};
use cleave_grammar::Constraint;
use cleave_hf::{LoraAdapter, LoraMode, Tokenizer};
use cleave_models::ModelDir;
use cleave_nn::{CausalModel, Context, Logits, ModelError, PickRule, Placed, TokenLogprobs};
use cleave_plan::Plan;
use cleave_shaders::cubecl::prelude::*;
use tokio::sync::mpsc::UnboundedSender;

use crate::dispatch::{spawn_replica, Dispatcher, ReplicaHandle, ReplicaStats, IDLE_POLL};
use crate::logprobs::TokenReport;
use crate::prefix::{Placement, Slots};

/// What one request asks of the model.
pub struct Job {
    pub prompt_ids: Vec<u32>,
    pub sampler: SamplerConfig,
    pub limits: Limits,
    pub stop: Vec<String>,
    /// Added to the logits before each pick.
    pub logit_bias: Vec<(u32, f32)>,
    /// How many alternatives' log-probabilities each token reports
    /// (`None`: none).
    pub logprobs: Option<usize>,
    /// The grammar the text is held to, compiled for the model.
    pub constraint: Option<Constraint>,
    /// Whether the text writes the special tokens picked (see
    /// `Decoder::with_special_tokens`).
    pub special_tokens: bool,
    /// Where the generated text goes; a closed receiver (the client went
    /// away) frees the job's slot at the next step.
    pub events: UnboundedSender<Event>,
}

/// What a job reports back, in order: text pieces (each generated token's
/// log-probabilities before the text it adds, where asked), then one
/// `Done` (or an `Error`).
#[derive(Debug)]
pub enum Event {
    Text(String),
    Logprobs(TokenReport),
    Done {
        reason: StopReason,
        completion_tokens: usize,
        /// The prompt's first tokens read from a slot's cache rather than
        /// prefilled (OpenAI's `cached_tokens`).
        cached_tokens: usize,
    },
    Error(String),
}

/// What a text replica counts beside its queue, for `/metrics`.
#[derive(Default)]
pub struct TextStats {
    /// The prompt tokens of served requests, and those of them read from
    /// a slot's cache rather than prefilled.
    pub prompt_tokens: AtomicU64,
    pub reused_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Positions the running sequences hold in the KV cache, of the
    /// `cache_capacity` its slots have in all.
    pub cache_positions: AtomicU64,
    pub cache_capacity: AtomicU64,
    /// The model's expert caches and uploads since it was loaded.
    pub expert_hits: AtomicU64,
    pub expert_misses: AtomicU64,
    pub uploaded_bytes: AtomicU64,
}

pub type TextDispatcher = Dispatcher<Job, TextStats>;
type Stats = ReplicaStats<TextStats>;

/// How one replica is built and how much it takes on.
pub struct ReplicaConfig {
    pub name: String,
    pub group: DeviceGroup,
    pub plan: Plan,
    pub context: usize,
    pub parallel: usize,
    pub queue_limit: usize,
    pub adapters: Vec<LoraAdapter>,
    pub lora_mode: LoraMode,
    pub prefill: PrefillChunk,
}

/// Starts a replica on a thread of its own: loads the model onto its group,
/// then serves jobs until the dispatcher is dropped or `cancel` is set.
/// Returns once the model is loaded (or failed to load).
pub fn start_replica(
    model: Arc<ModelDir>,
    config: ReplicaConfig,
    cancel: Arc<AtomicBool>,
) -> Result<ReplicaHandle<Job, TextStats>, String> {
    let name = config.name.clone();
    spawn_replica(
        &name,
        config.parallel,
        config.queue_limit,
        move |receiver, stats, ready| {
            let group = config.group.clone();
            group.run(Replica {
                model,
                config,
                receiver,
                stats,
                cancel,
                ready,
            })
        },
    )
}

struct Replica {
    model: Arc<ModelDir>,
    config: ReplicaConfig,
    receiver: mpsc::Receiver<Job>,
    stats: Arc<Stats>,
    cancel: Arc<AtomicBool>,
    ready: mpsc::Sender<Result<(), String>>,
}

/// One decode step of the running jobs that have a token to feed
/// (`steps`, in their order): each job's next token picked by its own
/// rule, on the device wherever every job's can be.
fn decode_step<R: Runtime>(
    model: &dyn CausalModel<R>,
    ctx: &mut Context,
    running: &[Running],
    steps: &[(usize, u32)],
) -> Result<Vec<u32>, ModelError> {
    let rules: Vec<PickRule> = running
        .iter()
        .filter(|r| r.next.is_some())
        .map(|r| r.decoder.pick_rule())
        .collect();
    model.decode_pick(ctx, steps, &rules)
}

/// Takes the jobs that `done` says are over out of `running`, each slot's
/// cache kept for a later prompt to reuse.
fn retire(running: &mut Vec<Running>, slots: &mut Slots, done: impl Fn(&Running) -> bool) {
    let (over, going): (Vec<Running>, Vec<Running>) = running.drain(..).partition(|r| done(r));
    *running = going;
    for job in over {
        slots.release(job.slot, job.cached);
    }
}

/// The log-probabilities of the `i`th token the last pick took, where
/// its rule asked for them.
fn picked_logprobs(ctx: &Context, i: usize) -> Option<&TokenLogprobs> {
    ctx.logprobs().get(i).and_then(Option::as_ref)
}

/// A job in a slot of the KV cache.
struct Running<'t> {
    slot: usize,
    decoder: Decoder<'t>,
    events: UnboundedSender<Event>,
    /// The prompt tokens not yet in the cache, how many there were, and
    /// how many of the first the slot's cache already held.
    unread: Vec<u32>,
    prompt_len: usize,
    reused: usize,
    /// The tokens in the slot's cache, in order (emptied where a failed
    /// pass leaves that unknown), for a later prompt to reuse.
    cached: Vec<u32>,
    /// The token to feed next, once the prompt is in.
    next: Option<u32>,
}

impl Running<'_> {
    /// Whether it still has a prompt to read or a token to feed.
    fn alive(&self) -> bool {
        !self.unread.is_empty() || self.next.is_some()
    }
}

impl RuntimeTask for Replica {
    type Output = ();

    fn run<R: Runtime>(self, clients: Vec<ComputeClient<R>>) {
        let c = &self.config;
        // The clients are those of the group's first runtime slot (every
        // member, unless the group spans runtimes).
        let mut devices = Placed::group(clients, &c.group.slots()[0].group);
        let loaded = Placed::arm_faults(&mut devices, &c.name)
            .and_then(|()| {
                let adapters = (c.adapters.as_slice(), c.lora_mode);
                self.model
                    .load_on_group(devices, &c.group, c.plan.clone(), adapters, &mut |_| {})
            })
            .and_then(|model| {
                let ctx = model.new_context_slots(c.context, c.parallel)?;
                Ok((model, ctx))
            });
        let (model, mut ctx) = match loaded {
            Ok(loaded) => loaded,
            Err(e) => {
                let _ = self.ready.send(Err(format!("{}: {e}", c.name)));
                return;
            }
        };
        self.record_memory(model.as_ref());
        let capacity = ctx.capacity().saturating_mul(ctx.slots());
        self.stats.work.cache_capacity.store(capacity as u64, Ordering::Relaxed);
        let _ = self.ready.send(Ok(()));
        self.serve(model.as_ref(), &mut ctx);
    }
}

impl Replica {
    fn serve<R: Runtime>(&self, model: &dyn CausalModel<R>, ctx: &mut Context) {
        let tokenizer = &self.model.tokenizer;
        let mut running: Vec<Running> = Vec::new();
        let mut slots = Slots::new(self.config.parallel);
        loop {
            if self.cancel.load(Ordering::Relaxed) {
                for job in running.drain(..) {
                    let _ = job.events.send(Event::Error("the server is shutting down".into()));
                }
                return;
            }
            // Take waiting jobs into free slots; with nothing running, wait.
            while running.len() < self.config.parallel {
                let job = if running.is_empty() {
                    match self.receiver.recv_timeout(IDLE_POLL) {
                        Ok(job) => job,
                        Err(RecvTimeoutError::Timeout) => break,
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                } else {
                    match self.receiver.try_recv() {
                        Ok(job) => job,
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => return,
                    }
                };
                // The job counts as active while its prompt is prefilled,
                // so the dispatcher never sees a free place that is not.
                self.stats.active.store(running.len() + 1, Ordering::Relaxed);
                self.stats.queued.fetch_sub(1, Ordering::Relaxed);
                let free = (0..self.config.parallel).filter(|s| running.iter().all(|r| r.slot != *s));
                // A slot's cache is reused only as far as it really holds
                // the tokens and can be cut back there.
                let can_cut = |slot: usize, len: usize| ctx.len(slot) >= len && ctx.can_truncate(slot, len);
                let Some(placement) = slots.place(free, &job.prompt_ids, can_cut) else {
                    break;
                };
                running.extend(self.start(model, ctx, tokenizer, placement, job));
                self.stats.active.store(running.len(), Ordering::Relaxed);
            }
            if running.is_empty() {
                continue;
            }
            // A client that went away frees its slot now.
            retire(&mut running, &mut slots, |r| r.events.is_closed());
            if let Err(failure) = self.prefill_step(model, ctx, &mut running) {
                return self.fail(running.into_iter().map(|r| r.events), &failure);
            }
            let steps: Vec<(usize, u32)> = running.iter().filter_map(|r| r.next.map(|id| (r.slot, id))).collect();
            if !steps.is_empty() {
                match decode_step(model, ctx, &running, &steps) {
                    Ok(nexts) => {
                        let jobs = running.iter_mut().filter(|r| r.next.is_some());
                        for (i, (job, next)) in jobs.zip(nexts).enumerate() {
                            job.cached.extend(job.next);
                            self.advance(job, next, picked_logprobs(ctx, i));
                        }
                    }
                    Err(e) if e.is_device_failure() => return self.fail(running.into_iter().map(|r| r.events), &e),
                    Err(e) => {
                        for job in running.drain(..) {
                            let _ = job.events.send(Event::Error(e.to_string()));
                        }
                    }
                }
            }
            let before = running.len();
            retire(&mut running, &mut slots, |r| !r.alive() || r.events.is_closed());
            self.stats.active.store(running.len(), Ordering::Relaxed);
            let positions: usize = running.iter().map(|r| ctx.len(r.slot)).sum();
            self.stats
                .work
                .cache_positions
                .store(positions as u64, Ordering::Relaxed);
            self.record_uploads(model);
            if running.len() != before {
                self.record_memory(model);
            }
        }
    }

    /// A device of the group failed: every running and waiting job gets the
    /// error (a 500), and the replica takes no more, so that the other
    /// groups serve what comes next.
    fn fail(&self, jobs: impl Iterator<Item = UnboundedSender<Event>>, failure: &ModelError) {
        let message = self
            .stats
            .fail(&self.config.name, failure, &self.receiver, |job, message| {
                let _ = job.events.send(Event::Error(message.into()));
            });
        for events in jobs {
            let _ = events.send(Event::Error(message.clone()));
        }
    }

    /// Takes `job` into the slot `placement` gives it, whose cache holds
    /// the prompt's first `reused` tokens (cut back to them), the rest
    /// still to read. A request that cannot run (a prompt too long for the
    /// context, ...) is told so.
    fn start<'t, R: Runtime>(
        &self,
        model: &dyn CausalModel<R>,
        ctx: &mut Context,
        tokenizer: &'t Tokenizer,
        Placement { slot, reused }: Placement,
        job: Job,
    ) -> Option<Running<'t>> {
        if job.events.is_closed() {
            return None;
        }
        let shape = (job.prompt_ids.len(), ctx.capacity(), model.max_positions());
        let sampler = Sampler::new(job.sampler, &job.prompt_ids);
        let decoder = Decoder::new(tokenizer, sampler, job.limits, job.stop, shape).map(|decoder| {
            let decoder = decoder
                .with_logit_bias(job.logit_bias)
                .with_logprobs(job.logprobs)
                .with_special_tokens(job.special_tokens);
            match job.constraint {
                Some(constraint) => decoder.with_constraint(constraint),
                None => decoder,
            }
        });
        match decoder {
            Ok(decoder) => {
                match reused {
                    0 => ctx.clear(slot),
                    shared => ctx.truncate(slot, shared),
                }
                let mut unread = job.prompt_ids;
                let cached = unread.drain(..reused).collect();
                Some(Running {
                    slot,
                    decoder,
                    events: job.events,
                    prompt_len: unread.len() + reused,
                    reused,
                    cached,
                    unread,
                    next: None,
                })
            }
            Err(e) => {
                let _ = job.events.send(Event::Error(e.to_string()));
                None
            }
        }
    }

    /// Reads prompt chunks into their slots, oldest job first, as many as
    /// fit in one chunk's worth of tokens (at least one): a long prompt
    /// goes a chunk per step, several short ones in one step. A chunk is
    /// always the next piece of its prompt's split, so the prompt is cut
    /// where `cleave run` cuts it. A prompt's last chunk gives its first
    /// token. An error of the request's own is reported to it; a device
    /// failure is returned.
    fn prefill_step<R: Runtime>(
        &self,
        model: &dyn CausalModel<R>,
        ctx: &mut Context,
        running: &mut [Running],
    ) -> Result<(), ModelError> {
        let budget = self.config.prefill.tokens().unwrap_or(usize::MAX);
        let mut used = 0;
        for job in running.iter_mut().filter(|r| !r.unread.is_empty()) {
            let chunk = self.config.prefill.split(&job.unread).next().map_or(0, <[u32]>::len);
            if used > 0 && used + chunk > budget {
                break;
            }
            used += chunk;
            let piece = &job.unread[..chunk];
            // The prompt's last chunk gives its first token.
            let read = match chunk == job.unread.len() {
                true => model
                    .forward_pick(ctx, job.slot, piece, &[job.decoder.pick_rule()])
                    .map(|picked| picked.first().copied()),
                false => model.forward_slot(ctx, job.slot, piece, Logits::None).map(|_| None),
            };
            match read {
                Ok(first) => {
                    job.cached.extend(job.unread.drain(..chunk));
                    if let Some(first) = first {
                        let work = &self.stats.work;
                        work.prompt_tokens.fetch_add(job.prompt_len as u64, Ordering::Relaxed);
                        work.reused_tokens.fetch_add(job.reused as u64, Ordering::Relaxed);
                        self.advance(job, first, picked_logprobs(ctx, 0));
                    }
                }
                Err(e) if e.is_device_failure() => return Err(e),
                Err(e) => {
                    job.unread.clear();
                    job.cached.clear();
                    let _ = job.events.send(Event::Error(e.to_string()));
                }
            }
        }
        Ok(())
    }

    /// Takes the next token of `job`, which its pass picked (with its
    /// log-probabilities, where the job asked), and reports it.
    fn advance(&self, job: &mut Running, next: u32, logprobs: Option<&TokenLogprobs>) {
        job.next = None;
        let generated = job.decoder.new_ids().len();
        let step = job.decoder.accept(next);
        // Only a token the completion holds reports (not the EOS that
        // ends it).
        if let Some(picked) = logprobs.filter(|_| job.decoder.new_ids().len() > generated) {
            let _ = job
                .events
                .send(Event::Logprobs(TokenReport::new(&self.model.tokenizer, picked)));
        }
        match step {
            Ok(Step::Next { id, text }) => {
                if text.is_empty() || job.events.send(Event::Text(text)).is_ok() {
                    job.next = Some(id);
                }
            }
            Ok(Step::Stop { reason, text }) => {
                let completion_tokens = job.decoder.new_ids().len();
                self.stats
                    .work
                    .generated_tokens
                    .fetch_add(completion_tokens as u64, Ordering::Relaxed);
                if !text.is_empty() {
                    let _ = job.events.send(Event::Text(text));
                }
                let _ = job.events.send(Event::Done {
                    reason,
                    completion_tokens,
                    cached_tokens: job.reused,
                });
            }
            Err(e) => {
                job.cached.clear();
                let _ = job.events.send(Event::Error(e.to_string()));
            }
        }
    }

    fn record_memory<R: Runtime>(&self, model: &dyn CausalModel<R>) {
        // Every member, those a model spanning runtimes runs a part on too.
        let bytes = model.bytes_in_use().unwrap_or_default();
        self.stats
            .record_memory(self.config.group.names().into_iter().zip(bytes).collect());
    }

    fn record_uploads<R: Runtime>(&self, model: &dyn CausalModel<R>) {
        let uploads = model.upload_stats();
        let work = &self.stats.work;
        work.expert_hits.store(uploads.expert_hits, Ordering::Relaxed);
        work.expert_misses.store(uploads.expert_misses, Ordering::Relaxed);
        work.uploaded_bytes.store(uploads.uploaded_bytes, Ordering::Relaxed);
    }
}
