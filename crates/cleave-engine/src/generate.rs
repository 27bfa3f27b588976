//! The generation loop: prefill the prompt, then decode one token at a
//! time through the KV cache, streaming text as it becomes printable.

use std::num::NonZeroUsize;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use cleave_grammar::Constraint;
use cleave_hf::Tokenizer;
use cleave_nn::{CausalLm, Logits, ModelError};

use crate::decoder::{Decoder, Step};
use crate::profile::{DecodeProfile, Profiler};
use crate::sampler::{Sampler, SamplerConfig};
use crate::speculate::{Speculation, SpeculationStats};

/// When generation stops, besides EOS.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_new_tokens: usize,
    /// Never pick an end-of-sequence token (llama.cpp's --ignore-eos, and
    /// transformers' min_new_tokens): generate exactly `max_new_tokens`.
    pub ignore_eos: bool,
}

impl Limits {
    /// The ids never picked under these limits: `tokenizer`'s
    /// end-of-sequence ids where they are ignored.
    pub fn banned(&self, tokenizer: &Tokenizer) -> Vec<u32> {
        match self.ignore_eos {
            true => tokenizer.eos_ids().to_vec(),
            false => Vec::new(),
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct Timings {
    pub prompt_tokens: usize,
    pub prompt: Duration,
    pub generated_tokens: usize,
    pub generation: Duration,
}

impl Timings {
    pub fn prompt_tokens_per_second(&self) -> f64 {
        per_second(self.prompt_tokens, self.prompt)
    }

    pub fn generation_tokens_per_second(&self) -> f64 {
        per_second(self.generated_tokens, self.generation)
    }
}

fn per_second(tokens: usize, time: Duration) -> f64 {
    if time.is_zero() {
        0.0
    } else {
        tokens as f64 / time.as_secs_f64()
    }
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced an end-of-sequence token.
    Eos,
    /// The text reached one of the stop strings.
    Stop,
    /// The requested number of tokens was reached.
    Length,
    /// The context is full.
    ContextFull,
    /// Whoever read the text went away (`on_text` said stop).
    Cancelled,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Eos => "eos",
            StopReason::Stop => "stop",
            StopReason::Length => "length",
            StopReason::ContextFull => "context_full",
            StopReason::Cancelled => "cancelled",
        }
    }
}

pub struct Output {
    pub new_ids: Vec<u32>,
    pub text: String,
    pub stop: StopReason,
    pub timings: Timings,
    /// Where the decode steps' time went, when asked for.
    pub profile: Option<DecodeProfile>,
    /// How many drafted tokens were kept, where it speculated.
    pub speculation: Option<SpeculationStats>,
}

/// How many prompt tokens one forward pass takes. A long prompt goes in
/// chunks so that a server can run the other sequences' decode steps
/// between them instead of stalling them for the whole prompt; `cleave run`
/// cuts prompts the same way, so a prompt gives the same logits in both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefillChunk(Option<NonZeroUsize>);

impl PrefillChunk {
    /// llama.cpp's default batch.
    pub const DEFAULT_TOKENS: usize = 512;

    /// Chunks of `tokens`; 0 takes every prompt in one pass.
    pub fn new(tokens: usize) -> PrefillChunk {
        PrefillChunk(NonZeroUsize::new(tokens))
    }

    /// Tokens one pass takes at most; `None`: a whole prompt.
    pub fn tokens(self) -> Option<usize> {
        self.0.map(NonZeroUsize::get)
    }

    /// `ids` in the pieces one forward pass each takes (none for no ids:
    /// `Decoder::new` refuses an empty prompt before anything is read).
    pub fn split(self, ids: &[u32]) -> std::slice::Chunks<'_, u32> {
        ids.chunks(self.0.map_or(ids.len(), NonZeroUsize::get).max(1))
    }
}

impl Default for PrefillChunk {
    fn default() -> Self {
        PrefillChunk::new(PrefillChunk::DEFAULT_TOKENS)
    }
}

/// Generates after `prompt_ids`, calling `on_text` with each printable piece;
/// generation stops early when it answers `Break`.
///
/// The prompt fills the context in chunks of `prefill`; the generated
/// tokens then go through the model one at a time, reusing the cache, or
/// with the tokens `speculation` drafts after them, checked in the same
/// pass. With `constraint`, the text matches its grammar (never beside
/// speculation, whose drafts the grammar has not seen). With `profile`,
/// the output says where the decode steps' time went.
#[allow(clippy::too_many_arguments)]
pub fn generate(
    model: &mut dyn CausalLm,
    tokenizer: &Tokenizer,
    sampler: SamplerConfig,
    prompt_ids: &[u32],
    limits: Limits,
    prefill: PrefillChunk,
    profile: bool,
    mut speculation: Option<Speculation<'_>>,
    constraint: Option<Constraint>,
    on_text: &mut dyn FnMut(&str) -> ControlFlow<()>,
) -> Result<Output, ModelError> {
    let shape = (prompt_ids.len(), model.capacity(), model.max_positions());
    let sampler = Sampler::new(sampler, prompt_ids);
    let mut decoder = Decoder::new(tokenizer, sampler, limits, Vec::new(), shape)?;
    if let Some(constraint) = constraint {
        if speculation.is_some() {
            return Err(ModelError::Constraint(
                "a grammar cannot be combined with speculative decoding".into(),
            ));
        }
        decoder = decoder.with_constraint(constraint);
    }
    // Every generated token but the last goes back through the model.
    let mut profiler = profile.then(|| Profiler::new(decoder.max_new_tokens().saturating_sub(1)));
    let mut stats = speculation.as_ref().map(|_| SpeculationStats::default());
    if let Some(s) = &mut speculation {
        // A step's drafts that are not kept are cut from the cache again.
        model.keep_history(s.max_drafts);
        s.drafter.prepare(s.max_drafts);
    }
    let mut step_index = 0;
    let mut timings = Timings {
        prompt_tokens: prompt_ids.len(),
        ..Timings::default()
    };
    let start = Instant::now();
    let mut pieces = prefill.split(prompt_ids).peekable();
    let mut picked = None;
    while let Some(piece) = pieces.next() {
        if pieces.peek().is_some() {
            model.forward(piece, Logits::None)?;
        } else {
            picked = model.forward_pick(piece, &[decoder.pick_rule()])?.first().copied();
        }
    }
    let mut picked = picked.ok_or(ModelError::EmptyPrompt)?;
    timings.prompt = start.elapsed();
    // The prompt and the tokens kept since: what drafts are made from.
    let mut sequence = prompt_ids.to_vec();
    let start = Instant::now();
    // A token taken: the id to go on from, or why generation ends.
    let mut take = |decoder: &mut Decoder, id: u32| -> Result<ControlFlow<StopReason, u32>, ModelError> {
        let (text, next) = match decoder.accept(id)? {
            Step::Next { id, text } => (text, ControlFlow::Continue(id)),
            Step::Stop { reason, text } => (text, ControlFlow::Break(reason)),
        };
        if !text.is_empty() && on_text(&text).is_break() {
            return Ok(ControlFlow::Break(StopReason::Cancelled));
        }
        Ok(next)
    };
    let stop = 'generation: loop {
        let id = match take(&mut decoder, picked)? {
            ControlFlow::Continue(id) => id,
            ControlFlow::Break(reason) => break reason,
        };
        sequence.push(id);
        // Drafts stop short of the length limit: the pick after the last
        // is a token too.
        let drafts = match &mut speculation {
            Some(s) if decoder.remaining() > 1 => {
                s.drafter.draft(&sequence, s.max_drafts.min(decoder.remaining() - 1))?
            }
            _ => Vec::new(),
        };
        let mut rules = vec![decoder.pick_rule()];
        for &draft in &drafts {
            let next = rules[rules.len() - 1].after(draft);
            rules.push(next);
        }
        let cached = model.cached();
        let fed: Vec<u32> = std::iter::once(id).chain(drafts.iter().copied()).collect();
        if let Some(p) = &mut profiler {
            p.before_step(step_index, decoder.remaining());
        }
        let picks = model.forward_pick(&fed, &rules)?;
        step_index += 1;
        let kept = picks
            .iter()
            .zip(&drafts)
            .take_while(|(pick, draft)| pick == draft)
            .count();
        if let Some(p) = &mut profiler {
            // The kept drafts and the pick after them.
            p.after_step(kept + 1);
        }
        if let Some(stats) = &mut stats {
            if !drafts.is_empty() {
                stats.steps += 1;
                stats.drafted += drafts.len();
                stats.accepted += kept;
            }
        }
        // The cache keeps the drafts that were kept, not those after.
        model.truncate(cached + 1 + kept);
        for &draft in &drafts[..kept] {
            if let ControlFlow::Break(reason) = take(&mut decoder, draft)? {
                break 'generation reason;
            }
            sequence.push(draft);
        }
        picked = picks[kept];
    };
    timings.generation = start.elapsed();
    timings.generated_tokens = decoder.new_ids().len();
    Ok(Output {
        text: decoder.text()?,
        new_ids: decoder.new_ids().to_vec(),
        stop,
        timings,
        profile: profiler.map(Profiler::finish),
        speculation: stats,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_split_into_whole_chunks_and_a_rest() {
        let ids: Vec<u32> = (0..10).collect();
        let lengths = |chunk: usize, n: usize| -> Vec<usize> {
            PrefillChunk::new(chunk).split(&ids[..n]).map(<[u32]>::len).collect()
        };
        assert_eq!(lengths(4, 10), [4, 4, 2]);
        assert_eq!(lengths(5, 10), [5, 5]);
        assert_eq!(lengths(0, 10), [10]);
        assert_eq!(lengths(512, 3), [3]);
        assert_eq!(lengths(4, 0), [0usize; 0]);
        let rejoined: Vec<u32> = PrefillChunk::new(3).split(&ids).flatten().copied().collect();
        assert_eq!(rejoined, ids);
    }
}
