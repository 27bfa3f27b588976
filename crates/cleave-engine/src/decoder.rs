//! One sequence's generation, a token at a time: sampling, the stop rules
//! (EOS, stop strings, length, a full context) and the text that becomes
//! printable after each token. The model is driven by the caller, so the
//! same decoder serves `cleave run` (one sequence) and the server (many
//! sequences decoded together).

use std::sync::{Arc, Mutex};

use cleave_grammar::Constraint;
use cleave_hf::Tokenizer;
use cleave_nn::{Allowed, AllowedIds, ModelError, PickRule};

use crate::generate::{Limits, StopReason};
use crate::sampler::Sampler;

/// What to do after a token.
#[derive(Debug, PartialEq)]
pub enum Step {
    /// Feed `id` to the model and call [`Decoder::accept`] with the token
    /// it picks after it by [`Decoder::pick_rule`].
    /// `text` is what became printable (may be empty).
    Next { id: u32, text: String },
    /// Generation is over; `text` is the last printable piece.
    Stop { reason: StopReason, text: String },
}

pub struct Decoder<'t> {
    tokenizer: &'t Tokenizer,
    sampler: Sampler,
    /// Ids never picked (see [`Limits::banned`]).
    banned: Vec<u32>,
    /// Added to the logits before each pick, and how many alternatives'
    /// log-probabilities each pick reports (see [`PickRule`]).
    bias: Vec<(u32, f32)>,
    logprobs: Option<usize>,
    /// The grammar the text must match.
    constraint: Option<Arc<Grammar>>,
    /// Whether special tokens are written in the text (see
    /// [`Decoder::with_special_tokens`]).
    special_tokens: bool,
    stop_strings: Vec<String>,
    /// Most tokens this sequence may generate, and why it would stop there.
    max_new: usize,
    full_stop: StopReason,
    new_ids: Vec<u32>,
    /// Bytes of the generated text already handed out.
    emitted: usize,
}

impl<'t> Decoder<'t> {
    /// A decoder for a prompt of `prompt_len` tokens in a context of
    /// `capacity` positions (of the `max_positions` the model knows).
    pub fn new(
        tokenizer: &'t Tokenizer,
        sampler: Sampler,
        limits: Limits,
        stop_strings: Vec<String>,
        (prompt_len, capacity, max_positions): (usize, usize, usize),
    ) -> Result<Self, ModelError> {
        if prompt_len == 0 {
            return Err(ModelError::EmptyPrompt);
        }
        if prompt_len > capacity {
            return Err(ModelError::PromptTooLong {
                tokens: prompt_len,
                context: capacity,
                max: max_positions,
            });
        }
        // Each generated token but the last goes back through the model, so
        // a context with `room` free positions yields `room + 1` tokens.
        let room = capacity - prompt_len;
        let (max_new, full_stop) = if limits.max_new_tokens <= room + 1 {
            (limits.max_new_tokens, StopReason::Length)
        } else {
            (room + 1, StopReason::ContextFull)
        };
        Ok(Decoder {
            tokenizer,
            sampler,
            banned: limits.banned(tokenizer),
            bias: Vec::new(),
            logprobs: None,
            constraint: None,
            special_tokens: false,
            stop_strings: stop_strings.into_iter().filter(|s| !s.is_empty()).collect(),
            max_new,
            full_stop,
            new_ids: Vec::new(),
            emitted: 0,
        })
    }

    /// This decoder, adding `bias` to the logits (id, bias) before each
    /// pick.
    pub fn with_logit_bias(self, bias: Vec<(u32, f32)>) -> Self {
        Decoder { bias, ..self }
    }

    /// This decoder, each pick reporting its token's log-probability and
    /// those of the `top` most likely tokens (`None`: nothing).
    pub fn with_logprobs(self, top: Option<usize>) -> Self {
        Decoder { logprobs: top, ..self }
    }

    /// This decoder, its text held to `constraint`'s grammar: each pick
    /// takes only an id the grammar allows there, and the text ends where
    /// the grammar does.
    pub fn with_constraint(self, constraint: Constraint) -> Self {
        let grammar = Grammar(Mutex::new(Matching {
            constraint,
            allowed: None,
        }));
        Decoder {
            constraint: Some(Arc::new(grammar)),
            ..self
        }
    }

    /// This decoder, the special tokens it picks written in its text as
    /// their text where `kept` (a syntax marked by one, such as Mistral's
    /// `[TOOL_CALLS]`), left out otherwise.
    pub fn with_special_tokens(self, kept: bool) -> Self {
        Decoder {
            special_tokens: kept,
            ..self
        }
    }

    /// Most tokens this sequence may generate: the limit asked for, or what
    /// the context has room for.
    pub fn max_new_tokens(&self) -> usize {
        self.max_new
    }

    /// How the model picks this sequence's next token: greedily, or
    /// sampling as the host's sampler would (see [`Sampler::rule`]), never
    /// an end-of-sequence id where they are ignored, with its bias,
    /// log-probabilities and grammar.
    pub fn pick_rule(&self) -> PickRule {
        PickRule {
            bias: self.bias.clone(),
            logprobs: self.logprobs,
            allowed: self.constraint.clone().map(|grammar| Allowed::new(grammar)),
            ..self.sampler.rule(self.banned.clone())
        }
    }

    /// Takes `id`, picked by [`Decoder::pick_rule`]: the end of generation,
    /// or text.
    pub fn accept(&mut self, id: u32) -> Result<Step, ModelError> {
        if self.new_ids.len() >= self.max_new {
            return Ok(self.full());
        }
        self.sampler.accept(id);
        let finished = match &self.constraint {
            Some(grammar) => grammar.accept(id)?,
            None => false,
        };
        if self.tokenizer.is_eos(id) {
            // What was held back (a character not yet whole, the start of
            // a stop string) ends the text now.
            let text = self.decoded()?;
            return Ok(Step::Stop {
                reason: StopReason::Eos,
                text: text.get(self.emitted..).unwrap_or_default().to_string(),
            });
        }
        self.new_ids.push(id);
        let text = self.decoded()?;
        if let Some(at) = self.first_stop_string(&text) {
            let piece = text.get(self.emitted..at).unwrap_or_default().to_string();
            return Ok(Step::Stop {
                reason: StopReason::Stop,
                text: piece,
            });
        }
        if finished {
            // The grammar allows nothing after this token but the end.
            return Ok(Step::Stop {
                reason: StopReason::Eos,
                text: text.get(self.emitted..).unwrap_or_default().to_string(),
            });
        }
        let piece = self.printable(&text);
        if self.new_ids.len() >= self.max_new {
            // The last token: nothing is held back any more.
            let rest = text.get(self.emitted..).unwrap_or_default();
            return Ok(Step::Stop {
                reason: self.full_stop,
                text: piece + rest,
            });
        }
        Ok(Step::Next { id, text: piece })
    }

    /// Tokens it may still generate.
    pub fn remaining(&self) -> usize {
        self.max_new - self.new_ids.len()
    }

    /// Generation is over because it reached its length or the context's.
    fn full(&self) -> Step {
        Step::Stop {
            reason: self.full_stop,
            text: String::new(),
        }
    }

    /// Where the first stop string begins in `text`, if one occurs.
    fn first_stop_string(&self, text: &str) -> Option<usize> {
        self.stop_strings.iter().filter_map(|s| text.find(s.as_str())).min()
    }

    /// The text after what was handed out that can be handed out now: not
    /// ending inside a multi-byte character, and holding back a tail that
    /// might be the start of a stop string.
    fn printable(&mut self, text: &str) -> String {
        if text.ends_with('\u{FFFD}') {
            return String::new();
        }
        let held = self
            .stop_strings
            .iter()
            .flat_map(|s| (1..s.len()).filter(|&n| s.is_char_boundary(n) && text.ends_with(&s[..n])))
            .max()
            .unwrap_or(0);
        let end = text.len() - held;
        if end <= self.emitted || !text.is_char_boundary(self.emitted) || !text.is_char_boundary(end) {
            return String::new();
        }
        let piece = text[self.emitted..end].to_string();
        self.emitted = end;
        piece
    }

    /// All the tokens generated so far as text, special tokens written
    /// where they are kept.
    fn decoded(&self) -> Result<String, ModelError> {
        let text = match self.special_tokens {
            true => self.tokenizer.decode_with_special(&self.new_ids)?,
            false => self.tokenizer.decode(&self.new_ids)?,
        };
        Ok(text)
    }

    /// The tokens generated so far.
    pub fn new_ids(&self) -> &[u32] {
        &self.new_ids
    }

    /// The generated text, up to a stop string that ended it.
    pub fn text(&self) -> Result<String, ModelError> {
        let mut text = self.decoded()?;
        if let Some(at) = self.first_stop_string(&text) {
            text.truncate(at);
        }
        Ok(text)
    }
}

/// A sequence's grammar, shared with the picks it steers: the next pick
/// works out the mask ([`AllowedIds::words`]) once its pass is queued.
struct Grammar(Mutex<Matching>);

struct Matching {
    constraint: Constraint,
    /// The ids allowed next, once worked out.
    allowed: Option<Arc<[u32]>>,
}

impl Grammar {
    /// Moves the grammar past `id`; whether it allows nothing after it.
    fn accept(&self, id: u32) -> Result<bool, ModelError> {
        let mut matching = self.lock()?;
        matching.constraint.accept(id).map_err(constraint_failed)?;
        matching.allowed = None;
        Ok(matching.constraint.is_finished())
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Matching>, ModelError> {
        self.0
            .lock()
            .map_err(|_| ModelError::Constraint("a grammar's step failed on another thread".into()))
    }
}

impl AllowedIds for Grammar {
    fn words(&self) -> Result<Arc<[u32]>, ModelError> {
        let mut matching = self.lock()?;
        if let Some(allowed) = &matching.allowed {
            return Ok(allowed.clone());
        }
        let allowed: Arc<[u32]> = matching.constraint.allowed().map_err(constraint_failed)?.into();
        matching.allowed = Some(allowed.clone());
        Ok(allowed)
    }
}

fn constraint_failed(e: cleave_grammar::GrammarError) -> ModelError {
    ModelError::Constraint(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::SamplerConfig;

    fn tokenizer() -> Tokenizer {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/fortune-llama-3m");
        Tokenizer::from_dir(&dir, &[]).expect("the demo model's tokenizer")
    }

    fn greedy() -> Sampler {
        Sampler::new(SamplerConfig::greedy(), &[])
    }

    /// Drives a decoder through the tokens of `text`; returns the pieces
    /// handed out and how it stopped.
    fn run(text: &str, stop: &[&str], max_new: usize) -> (Vec<String>, StopReason, String) {
        let tokenizer = tokenizer();
        let ids = tokenizer.encode(text).unwrap();
        let ids = &ids[1..]; // no BOS
        let limits = Limits {
            max_new_tokens: max_new,
            ignore_eos: false,
        };
        let stop = stop.iter().map(|s| s.to_string()).collect();
        let mut decoder = Decoder::new(&tokenizer, greedy(), limits, stop, (1, 512, 512)).unwrap();
        let mut pieces = Vec::new();
        for &id in ids.iter().chain(std::iter::repeat(&1)) {
            match decoder.accept(id).unwrap() {
                Step::Next { text, .. } => pieces.push(text),
                Step::Stop { reason, text } => {
                    pieces.push(text);
                    return (pieces, reason, decoder.text().unwrap());
                }
            }
        }
        unreachable!()
    }

    #[test]
    fn pieces_add_up_to_the_text_and_eos_stops() {
        let (pieces, reason, text) = run("The best way to go", &[], 100);
        assert_eq!(reason, StopReason::Eos);
        assert_eq!(pieces.concat(), "The best way to go");
        assert_eq!(text, "The best way to go");
    }

    #[test]
    fn a_stop_string_ends_the_text_before_it_and_is_never_handed_out() {
        let (pieces, reason, text) = run("The best way to go", &["way"], 100);
        assert_eq!(reason, StopReason::Stop);
        assert_eq!(pieces.concat(), "The best ");
        assert_eq!(text, "The best ");
        // A tail that may begin a stop string is held back, then released
        // when it turns out not to.
        let (pieces, reason, _) = run("The best way to go", &["best wax"], 100);
        assert_eq!(reason, StopReason::Eos);
        assert_eq!(pieces.concat(), "The best way to go");
    }

    /// What is held back when the sequence ends is handed out with its
    /// end: here the start of a stop string that never came.
    #[test]
    fn the_end_of_sequence_hands_out_what_was_held_back() {
        let (pieces, reason, text) = run("The best way to go", &["go now"], 100);
        assert_eq!(reason, StopReason::Eos);
        assert_eq!(pieces.concat(), "The best way to go");
        assert_eq!(text, "The best way to go");
    }

    #[test]
    fn the_length_limit_hands_out_everything_generated() {
        let (pieces, reason, text) = run("The best way to go", &["go now"], 3);
        assert_eq!(reason, StopReason::Length);
        assert_eq!(pieces.concat(), text);
        assert!(!text.is_empty());
    }
}
