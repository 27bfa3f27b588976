//! A model's vocabulary as llguidance walks it: a byte trie of its tokens.

use std::sync::Arc;

use cleave_hf::{TokenBytes, Tokenizer};
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::GrammarError;

/// Longest token a grammar may allow, in bytes: toktrie's nodes count at
/// most 1,024 parents. Longer tokens (runs of spaces, in a few
/// vocabularies) are never allowed; shorter ones spell the same text.
const MAX_TOKEN_BYTES: usize = 1000;

/// Most ids toktrie's nodes can number (22 bits).
const MAX_VOCAB: usize = 1 << 21;

struct Vocabulary {
    trie: TokTrie,
}

impl TokenizerEnv for Vocabulary {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Longest-match tokenization over the trie. llguidance tokenizes only
    /// to force text a grammar fixes; cleave masks each step and never
    /// forces, so no canonical tokenization is needed.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }
}

/// `tokenizer`'s tokens as llguidance's environment, its first
/// end-of-sequence id the one llguidance allows where a grammar may end.
pub(crate) fn token_env(tokenizer: &Tokenizer) -> Result<TokEnv, GrammarError> {
    let tokens = tokenizer.token_bytes()?;
    if tokens.len() > MAX_VOCAB {
        return Err(GrammarError::Vocabulary(format!(
            "{} tokens: llguidance's trie holds at most {MAX_VOCAB}",
            tokens.len()
        )));
    }
    let eos = *tokenizer
        .eos_ids()
        .first()
        .ok_or_else(|| GrammarError::Vocabulary("the tokenizer names no end-of-sequence token".into()))?;
    let words: Vec<Vec<u8>> = tokens
        .into_iter()
        .map(|token| match token {
            TokenBytes::Text(bytes) if bytes.len() <= MAX_TOKEN_BYTES => bytes,
            TokenBytes::Special(name) if name.len() < MAX_TOKEN_BYTES => {
                // toktrie's mark of a special token: a byte no UTF-8 text has.
                let mut bytes = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                bytes.extend_from_slice(name.as_bytes());
                bytes
            }
            _ => Vec::new(),
        })
        .collect();
    if eos as usize >= words.len() {
        return Err(GrammarError::Vocabulary(format!(
            "end-of-sequence id {eos} is outside the tokenizer's {} tokens",
            words.len()
        )));
    }
    let info = TokRxInfo::new(words.len() as u32, eos);
    Ok(Arc::new(Vocabulary {
        trie: TokTrie::from(&info, &words),
    }))
}
