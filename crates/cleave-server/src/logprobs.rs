//! Tokens' log-probabilities as OpenAI's two APIs write them: the chat
//! API's `{"content": [{token, logprob, bytes, top_logprobs}]}` and the
//! completions API's `{tokens, token_logprobs, top_logprobs, text_offset}`.

use cleave_hf::Tokenizer;
use cleave_nn::TokenLogprobs;
use serde_json::{json, Map, Value};

/// One generated token's log-probability and its alternatives', with
/// their text.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenReport {
    pub token: String,
    pub logprob: f32,
    pub top: Vec<(String, f32)>,
}

impl TokenReport {
    /// `picked` with each token's text as `tokenizer` decodes it alone (a
    /// special token's is empty; a byte of a character split across
    /// tokens is U+FFFD).
    pub fn new(tokenizer: &Tokenizer, picked: &TokenLogprobs) -> Self {
        let text = |id: u32| tokenizer.decode(&[id]).unwrap_or_default();
        TokenReport {
            token: text(picked.id),
            logprob: picked.logprob,
            top: picked.top.iter().map(|&(id, logprob)| (text(id), logprob)).collect(),
        }
    }
}

/// The chat API's `logprobs` of `tokens`.
pub fn chat(tokens: &[TokenReport]) -> Value {
    let entry = |token: &str, logprob: f32| json!({"token": token, "logprob": logprob, "bytes": token.as_bytes()});
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let mut e = entry(&t.token, t.logprob);
            e["top_logprobs"] = t.top.iter().map(|(token, logprob)| entry(token, *logprob)).collect();
            e
        })
        .collect();
    json!({ "content": content })
}

/// The completions API's `logprobs` of `tokens`, whose text starts
/// `offset` characters into the completion (each `text_offset` counts
/// from its start).
pub fn completion(tokens: &[TokenReport], offset: usize) -> Value {
    let mut text_offset = Vec::with_capacity(tokens.len());
    let mut at = offset;
    for t in tokens {
        text_offset.push(at);
        at += t.token.chars().count();
    }
    // A dict per token, as OpenAI writes it: alternatives whose text is
    // the same keep the likelier one's value.
    let top: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let mut alternatives = Map::new();
            for (token, logprob) in &t.top {
                alternatives.entry(token.clone()).or_insert(json!(logprob));
            }
            Value::Object(alternatives)
        })
        .collect();
    json!({
        "tokens": tokens.iter().map(|t| t.token.as_str()).collect::<Vec<_>>(),
        "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": text_offset,
    })
}

/// Characters `tokens`' texts add up to: where the next token's
/// `text_offset` starts.
pub fn chars(tokens: &[TokenReport]) -> usize {
    tokens.iter().map(|t| t.token.chars().count()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(token: &str, logprob: f32, top: &[(&str, f32)]) -> TokenReport {
        TokenReport {
            token: token.into(),
            logprob,
            top: top.iter().map(|&(t, l)| (t.into(), l)).collect(),
        }
    }

    #[test]
    fn both_apis_write_what_openai_writes() {
        let tokens = [
            report(" é", -0.5, &[(" é", -0.5), (" e", -1.5)]),
            report("x", -2.0, &[("y", -1.0), ("y", -1.25)]),
        ];
        assert_eq!(
            chat(&tokens[..1]),
            json!({"content": [{"token": " é", "logprob": -0.5, "bytes": [32, 195, 169], "top_logprobs": [
                {"token": " é", "logprob": -0.5, "bytes": [32, 195, 169]},
                {"token": " e", "logprob": -1.5, "bytes": [32, 101]},
            ]}]})
        );
        assert_eq!(
            completion(&tokens, 4),
            json!({
                "tokens": [" é", "x"],
                "token_logprobs": [-0.5, -2.0],
                "top_logprobs": [{" é": -0.5, " e": -1.5}, {"y": -1.0}],
                "text_offset": [4, 6],
            })
        );
        assert_eq!(chars(&tokens), 3);
    }
}
