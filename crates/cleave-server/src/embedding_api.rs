//! `POST /v1/embeddings` in the shape of OpenAI's Embeddings API: `input`
//! (a text, a list of texts, token ids or a list of id lists),
//! `encoding_format` (`float` or `base64`), answered with the pooled
//! embedding `cleave embed` prints for each input. Texts are tokenized as
//! sentence-transformers tokenizes them, cut at the model's
//! `max_seq_length`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::api::{parse, ApiError};
use crate::dispatch;
use crate::embeddings::EmbeddingJob;
use crate::routes::{body, refusal};
use crate::{AppState, EmbeddingService};

/// Most inputs one request may carry (OpenAI's bound).
const MAX_INPUTS: usize = 2048;

/// A request to `/v1/embeddings`. Fields that do not change an embedding
/// (`user`) are accepted and ignored.
#[derive(Debug, Deserialize)]
pub struct EmbeddingRequest {
    pub model: Option<String>,
    pub input: Input,
    pub encoding_format: Option<String>,
    /// Only the model's own width: a BERT encoder's embeddings cannot be
    /// shortened.
    pub dimensions: Option<usize>,
}

/// The shapes OpenAI takes for `input`.
#[derive(Debug)]
pub enum Input {
    Texts(Vec<String>),
    Ids(Vec<Vec<u32>>),
}

impl<'de> Deserialize<'de> for Input {
    /// A text, a list of texts, a list of ids or a list of id lists; any
    /// other shape gets a message that lists these.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Shape {
            Text(String),
            Texts(Vec<String>),
            Ids(Vec<u32>),
            IdLists(Vec<Vec<u32>>),
            Other(serde::de::IgnoredAny),
        }
        match Shape::deserialize(d)? {
            Shape::Text(t) => Ok(Input::Texts(vec![t])),
            Shape::Texts(t) => Ok(Input::Texts(t)),
            Shape::Ids(ids) => Ok(Input::Ids(vec![ids])),
            Shape::IdLists(lists) => Ok(Input::Ids(lists)),
            Shape::Other(_) => Err(serde::de::Error::custom(
                "expected a string, a list of strings, token ids (integers below 2^32) or a list of token-id lists",
            )),
        }
    }
}

/// How the embeddings are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Encoding {
    Float,
    /// The little-endian f32 bytes, in base64 (what the `openai` client
    /// asks for by default).
    Base64,
}

/// The inputs' token ids and how to write the answer, checked.
fn check(service: &EmbeddingService, request: EmbeddingRequest) -> Result<(Vec<Vec<u32>>, Encoding), ApiError> {
    let invalid = |message: String, field: &str| ApiError::invalid(message, Some(field.into()));
    let encoding = match request.encoding_format.as_deref() {
        None | Some("float") => Encoding::Float,
        Some("base64") => Encoding::Base64,
        Some(other) => {
            return Err(invalid(
                format!("encoding_format '{other}' is not one of float, base64"),
                "encoding_format",
            ))
        }
    };
    let config = &service.dir.config;
    if let Some(asked) = request.dimensions.filter(|&d| d != config.hidden_size) {
        return Err(invalid(
            format!(
                "dimensions {asked}: this model's embeddings have {} and cannot be shortened",
                config.hidden_size
            ),
            "dimensions",
        ));
    }
    let count = match &request.input {
        Input::Texts(texts) => texts.len(),
        Input::Ids(lists) => lists.len(),
    };
    if count == 0 || count > MAX_INPUTS {
        return Err(invalid(
            format!("input holds {count} inputs: give 1 to {MAX_INPUTS}"),
            "input",
        ));
    }
    let ids = match request.input {
        Input::Texts(texts) => texts
            .iter()
            .enumerate()
            .map(|(i, text)| match text.is_empty() {
                true => Err(invalid(format!("input[{i}] is an empty text"), "input")),
                false => service
                    .dir
                    .tokenizer
                    .encode(text)
                    .map_err(|e| invalid(format!("input[{i}]: {e}"), "input")),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Input::Ids(lists) => {
            for (i, ids) in lists.iter().enumerate() {
                if ids.is_empty() || ids.len() > config.max_positions {
                    return Err(invalid(
                        format!(
                            "input[{i}] holds {} token ids: this encoder reads 1 to {}",
                            ids.len(),
                            config.max_positions
                        ),
                        "input",
                    ));
                }
                if let Some(id) = ids.iter().find(|&&id| id as usize >= config.vocab_size) {
                    return Err(invalid(
                        format!(
                            "input[{i}]: token id {id} is outside the vocabulary (size {})",
                            config.vocab_size
                        ),
                        "input",
                    ));
                }
            }
            lists
        }
    };
    Ok((ids, encoding))
}

/// One input's embedding as `encoding` writes it.
fn written(embedding: &[f32], encoding: Encoding) -> Value {
    match encoding {
        Encoding::Float => json!(embedding),
        Encoding::Base64 => {
            let bytes: Vec<u8> = embedding.iter().flat_map(|v| v.to_le_bytes()).collect();
            json!(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
    }
}

/// Checks the request, queues it on the least-loaded replica and answers
/// with every input's embedding, in order.
pub async fn embeddings(state: Arc<AppState>, body_bytes: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    state.embeddings()?;
    let request: EmbeddingRequest = parse(&body(&state, body_bytes)?)?;
    state.check_model(request.model.as_deref())?;
    // Tokenizing takes CPU in proportion to the request: on a blocking
    // thread, it leaves the async workers free.
    let (inputs, encoding) = {
        let state = state.clone();
        tokio::task::spawn_blocking(move || check(state.embeddings()?, request))
            .await
            .map_err(|e| ApiError::internal(format!("checking the request failed: {e}")))??
    };
    let prompt_tokens: usize = inputs.iter().map(Vec::len).sum();
    let (reply, answer) = oneshot::channel();
    let replica = state
        .embeddings()?
        .dispatcher
        .submit(EmbeddingJob { request: inputs, reply })
        .map_err(refusal)?;
    let embeddings = dispatch::answer(answer, &replica, "embeddings").await?;
    let data: Vec<Value> = embeddings
        .iter()
        .enumerate()
        .map(|(index, e)| json!({"object": "embedding", "index": index, "embedding": written(e, encoding)}))
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": state.model_id,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }))
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(body: &str) -> Result<Input, ApiError> {
        parse::<EmbeddingRequest>(body.as_bytes()).map(|r| r.input)
    }

    #[test]
    fn every_shape_of_input_openai_takes_is_read_and_others_are_named() {
        assert!(matches!(input(r#"{"input": "a"}"#).unwrap(), Input::Texts(t) if t == ["a"]));
        assert!(matches!(input(r#"{"input": ["a", "b"]}"#).unwrap(), Input::Texts(t) if t.len() == 2));
        assert!(matches!(input(r#"{"input": [1, 2]}"#).unwrap(), Input::Ids(l) if l == [vec![1, 2]]));
        assert!(matches!(input(r#"{"input": [[1], [2, 3]]}"#).unwrap(), Input::Ids(l) if l.len() == 2));
        for body in [r#"{"input": 7}"#, r#"{"input": [-1]}"#, r#"{"input": {"a": 1}}"#] {
            let err = input(body).unwrap_err();
            assert_eq!(err.param.as_deref(), Some("input"), "{body}");
            assert!(err.message.contains("expected a string"), "{}", err.message);
        }
        assert!(input(r#"{"model": "m"}"#).unwrap_err().message.contains("input"));
    }

    #[test]
    fn base64_holds_the_little_endian_floats() {
        let written = written(&[1.0, -2.5], Encoding::Base64);
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(written.as_str().unwrap())
            .unwrap();
        assert_eq!(bytes, [1.0f32.to_le_bytes(), (-2.5f32).to_le_bytes()].concat());
        assert_eq!(super::written(&[0.5], Encoding::Float), json!([0.5]));
    }
}
