//! The generation loop: prefill the prompt, then decode one token at a
//! time through the KV cache, streaming text as it becomes printable.

use std::time::{Duration, Instant};

use cleave_model::{CausalLm, Logits, ModelError, Tokenizer};

use crate::sampler::Sampler;

/// When generation stops, besides EOS.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_new_tokens: usize,
    /// Never pick an end-of-sequence token (llama.cpp's --ignore-eos, and
    /// transformers' min_new_tokens): generate exactly `max_new_tokens`.
    pub ignore_eos: bool,
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
    /// The requested number of tokens was reached.
    Length,
    /// The context is full.
    ContextFull,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Eos => "eos",
            StopReason::Length => "length",
            StopReason::ContextFull => "context_full",
        }
    }
}

pub struct Output {
    pub new_ids: Vec<u32>,
    pub text: String,
    pub stop: StopReason,
    pub timings: Timings,
}

/// Turns a growing list of ids into text pieces, holding back a piece while
/// it ends inside a multi-byte character.
struct TextStream<'t> {
    tokenizer: &'t Tokenizer,
    emitted: usize,
}

impl TextStream<'_> {
    fn next_piece(&mut self, ids: &[u32]) -> Result<Option<String>, ModelError> {
        let text = self.tokenizer.decode(ids)?;
        if text.ends_with('\u{FFFD}') || text.len() <= self.emitted || !text.is_char_boundary(self.emitted) {
            return Ok(None);
        }
        let piece = text[self.emitted..].to_string();
        self.emitted = text.len();
        Ok(Some(piece))
    }
}

/// Generates after `prompt_ids`, calling `on_text` with each printable piece.
///
/// The prompt fills the context in one prefill; the generated tokens then
/// go through the model one at a time, reusing the cache.
pub fn generate(
    model: &mut dyn CausalLm,
    tokenizer: &Tokenizer,
    sampler: &mut Sampler,
    prompt_ids: &[u32],
    limits: Limits,
    on_text: &mut dyn FnMut(&str),
) -> Result<Output, ModelError> {
    if prompt_ids.is_empty() {
        return Err(ModelError::EmptyPrompt);
    }
    if prompt_ids.len() > model.capacity() {
        return Err(ModelError::PromptTooLong {
            tokens: prompt_ids.len(),
            context: model.capacity(),
            max: model.max_positions(),
        });
    }
    let mut timings = Timings {
        prompt_tokens: prompt_ids.len(),
        ..Timings::default()
    };
    let start = Instant::now();
    let mut logits = model.forward(prompt_ids, Logits::Last)?;
    timings.prompt = start.elapsed();

    // Each generated token but the last goes back through the model, so
    // a context with `room` free positions yields `room + 1` tokens.
    let room = model.capacity() - prompt_ids.len();
    let (max_new, full_stop) = if limits.max_new_tokens <= room + 1 {
        (limits.max_new_tokens, StopReason::Length)
    } else {
        (room + 1, StopReason::ContextFull)
    };
    let mut new_ids = Vec::new();
    let mut stream = TextStream { tokenizer, emitted: 0 };
    let mut stop = full_stop;
    let start = Instant::now();
    while new_ids.len() < max_new {
        if limits.ignore_eos {
            for &eos in tokenizer.eos_ids() {
                if let Some(l) = logits.get_mut(eos as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        let id = sampler.sample(&logits);
        if tokenizer.is_eos(id) {
            stop = StopReason::Eos;
            break;
        }
        new_ids.push(id);
        if let Some(piece) = stream.next_piece(&new_ids)? {
            on_text(&piece);
        }
        if new_ids.len() < max_new {
            logits = model.forward(&[id], Logits::Last)?;
        }
    }
    timings.generation = start.elapsed();
    timings.generated_tokens = new_ids.len();
    Ok(Output {
        text: tokenizer.decode(&new_ids)?,
        new_ids,
        stop,
        timings,
    })
}
