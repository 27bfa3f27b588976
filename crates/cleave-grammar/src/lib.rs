//! Constrained decoding: a grammar (a JSON schema, a Lark or GBNF grammar,
//! a regex) compiled by llguidance, the library llama.cpp and vLLM use,
//! into the set of tokens each step of one sequence may pick.
//!
//! [`Constrainer`] holds what every grammar of one model shares (its
//! vocabulary's trie and llguidance's token slices); [`Constrainer::compile`]
//! makes a [`Constraint`] for one sequence, which says what the next pick
//! may be ([`Constraint::allowed`]) and follows the tokens taken.

mod gbnf;
mod vocabulary;

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{InferenceCapabilities, TokEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};

pub use gbnf::to_lark as gbnf_to_lark;

/// Most bytes a grammar's text (or a schema's JSON) may hold.
pub const MAX_GRAMMAR_BYTES: usize = 1 << 20;

/// What a sequence's text must match.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// A JSON value that validates against this JSON schema.
    JsonSchema(Value),
    /// llguidance's Lark dialect (llguidance's docs/syntax.md).
    Lark(String),
    /// llama.cpp's GBNF.
    Gbnf(String),
    /// A regular expression (Rust `regex` syntax), matched whole.
    Regex(String),
}

impl Grammar {
    /// Any JSON object: OpenAI's `{"type": "json_object"}`.
    pub fn json_object() -> Grammar {
        Grammar::JsonSchema(json!({"type": "object"}))
    }

    /// A grammar as llama.cpp takes one: GBNF, or llguidance's Lark after
    /// a first line `%llguidance {}`.
    pub fn llama_cpp(text: &str) -> Grammar {
        match text.trim_start().strip_prefix("%llguidance") {
            Some(rest) => Grammar::Lark(rest.trim_start_matches([' ', '\t', '{', '}']).to_string()),
            None => Grammar::Gbnf(text.to_string()),
        }
    }

    fn top_level(&self) -> Result<TopLevelGrammar, GrammarError> {
        let size = match self {
            Grammar::JsonSchema(schema) => schema.to_string().len(),
            Grammar::Lark(text) | Grammar::Gbnf(text) | Grammar::Regex(text) => text.len(),
        };
        if size > MAX_GRAMMAR_BYTES {
            return Err(GrammarError::Invalid(format!(
                "the grammar is {size} bytes: at most {MAX_GRAMMAR_BYTES}"
            )));
        }
        Ok(match self {
            Grammar::JsonSchema(schema) => {
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(GrammarError::Invalid(
                        "a JSON schema is an object (or true/false)".into(),
                    ));
                }
                TopLevelGrammar::from_json_schema(with_compact_layout(schema))
            }
            Grammar::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
            Grammar::Gbnf(text) => TopLevelGrammar::from_lark(gbnf::to_lark(text).map_err(GrammarError::Invalid)?),
            Grammar::Regex(rx) => TopLevelGrammar::from_regex(rx),
        })
    }
}

/// `schema` with llguidance's layout options, where it sets none: JSON as
/// Python's `json.dumps` writes it (`", "` and `": "`, no other
/// whitespace). With whitespace free, a weak model can spend every token
/// on spaces and never write a value.
fn with_compact_layout(schema: &Value) -> Value {
    let mut schema = schema.clone();
    if let Some(object) = schema.as_object_mut() {
        object
            .entry("x-guidance")
            .or_insert_with(|| json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}));
    }
    schema
}

#[derive(Debug, thiserror::Error)]
pub enum GrammarError {
    /// The grammar cannot be compiled: what llguidance (or the GBNF reader)
    /// says is wrong with it.
    #[error("{0}")]
    Invalid(String),
    /// The grammar compiles but no text matches it.
    #[error("no text matches the grammar: its first token can be none of the vocabulary's")]
    MatchesNothing,
    /// The model's vocabulary cannot be walked by a grammar.
    #[error("the tokenizer cannot be constrained: {0}")]
    Vocabulary(String),
    #[error(transparent)]
    Tokenizer(#[from] cleave_hf::ReadError),
    /// A token the grammar did not allow was taken (a bug, or a pick that
    /// ignored the mask), or llguidance failed while stepping.
    #[error("the constrained sequence failed: {0}")]
    Step(String),
}

/// What every grammar of one model shares. Building it walks the whole
/// vocabulary (tens of milliseconds for 150,000 tokens): keep one a model.
pub struct Constrainer {
    factory: ParserFactory,
    /// Every id that ends a sequence: llguidance knows one, and any of
    /// them ends the sequence where the grammar may end.
    eos: Vec<u32>,
}

impl Constrainer {
    pub fn new(tokenizer: &cleave_hf::Tokenizer) -> Result<Constrainer, GrammarError> {
        let env: TokEnv = vocabulary::token_env(tokenizer)?;
        let slices = llguidance::earley::SlicedBiasComputer::general_slices();
        let mut factory = ParserFactory::new(&env, InferenceCapabilities::default(), &slices)
            .map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        factory.quiet();
        // Errors name what is wrong, without echoing the grammar back.
        *factory.limits_mut() = ParserLimits {
            verbose_errors: false,
            ..ParserLimits::default()
        };
        Ok(Constrainer {
            factory,
            eos: tokenizer.eos_ids().to_vec(),
        })
    }

    /// A constraint for one sequence by `grammar`, checked to allow some
    /// first token.
    pub fn compile(&self, grammar: &Grammar) -> Result<Constraint, GrammarError> {
        let parser = self
            .factory
            .create_parser(grammar.top_level()?)
            .map_err(|e| GrammarError::Invalid(e.to_string()))?;
        let mut constraint = Constraint {
            matcher: Matcher::new(Ok(parser)),
            eos: self.eos.clone(),
            tok_eos: self.factory.tok_env().tok_trie().eos_token(),
        };
        // llguidance fails the first mask, or leaves it empty, where no
        // token can start a matching text.
        if constraint.allowed().map_or(true, |words| words.iter().all(|&w| w == 0)) {
            return Err(GrammarError::MatchesNothing);
        }
        Ok(constraint)
    }
}

/// One sequence's grammar, where its text stands.
pub struct Constraint {
    matcher: Matcher,
    eos: Vec<u32>,
    tok_eos: u32,
}

impl Constraint {
    /// The ids the next pick may take, as bits (id `i` is bit `i % 32` of
    /// word `i / 32`) over the tokenizer's vocabulary; every
    /// end-of-sequence id where the text may end here.
    pub fn allowed(&mut self) -> Result<Vec<u32>, GrammarError> {
        let mask = self.matcher.compute_mask_or_eos().map_err(step_error)?;
        let mut words = mask.as_slice().to_vec();
        if mask.is_allowed(self.tok_eos) {
            for &id in &self.eos {
                if let Some(word) = words.get_mut(id as usize / 32) {
                    *word |= 1 << (id % 32);
                }
            }
        }
        Ok(words)
    }

    /// Moves on past `id`, a token [`Constraint::allowed`] allowed.
    pub fn accept(&mut self, id: u32) -> Result<(), GrammarError> {
        let id = if self.eos.contains(&id) { self.tok_eos } else { id };
        self.matcher.consume_token(id).map_err(step_error)
    }

    /// Whether the text is complete: the grammar allows nothing after it.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}

fn step_error(e: impl std::fmt::Display) -> GrammarError {
    GrammarError::Step(e.to_string())
}
