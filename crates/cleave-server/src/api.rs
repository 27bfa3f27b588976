//! The OpenAI API as cleave speaks it: request bodies (one type for
//! completions and chat), and errors as OpenAI's error object.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

/// A request to `/v1/completions` (with `prompt`) or `/v1/chat/completions`
/// (with `messages`). Fields OpenAI defines that cleave does not use are
/// accepted and ignored, as OpenAI's own server ignores unknown ones.
#[derive(Debug, Default, Deserialize)]
pub struct GenerationRequest {
    pub prompt: Option<Prompt>,
    pub messages: Option<Vec<Message>>,
    pub max_tokens: Option<usize>,
    /// The chat API's newer name for `max_tokens`.
    pub max_completion_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// Not OpenAI's, but llama.cpp's and vLLM's.
    pub top_k: Option<usize>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<usize>,
    /// Not OpenAI's, but llama.cpp's: generate exactly `max_tokens`.
    pub ignore_eos: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

#[derive(Debug, Deserialize, serde::Serialize)]
pub struct Message {
    pub role: String,
    #[serde(deserialize_with = "content_text")]
    pub content: String,
}

/// A message's content: a string, or a list of parts of which the text
/// ones count (what the vision-capable chat API sends).
fn content_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Content {
        Text(String),
        Parts(Vec<Part>),
        Null(()),
    }
    #[derive(Deserialize)]
    struct Part {
        #[serde(rename = "type")]
        kind: String,
        text: Option<String>,
    }
    Ok(match Content::deserialize(d)? {
        Content::Text(t) => t,
        Content::Parts(parts) => parts
            .into_iter()
            .filter(|p| p.kind == "text")
            .filter_map(|p| p.text)
            .collect(),
        Content::Null(()) => String::new(),
    })
}

/// Parses a request body, naming the field whose value is wrong.
pub fn parse(body: &[u8]) -> Result<GenerationRequest, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() || path == "." {
            ApiError::invalid(format!("the body is not a valid JSON request: {inner}"), None)
        } else {
            ApiError::invalid(format!("'{path}': {inner}"), Some(path))
        }
    })
}

/// An error as OpenAI sends it: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds a client should wait before trying again.
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// 400: the request is wrong; `param` names the field.
    pub fn invalid(message: impl Into<String>, param: Option<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            code: None,
            retry_after: None,
        }
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn unauthorized() -> Self {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "invalid or missing API key: send 'Authorization: Bearer KEY'".into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("invalid_api_key"),
            retry_after: None,
        }
    }

    pub fn too_large(limit: usize) -> Self {
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("the request body is larger than {limit} bytes"),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_too_large"),
            retry_after: None,
        }
    }

    /// 503: every replica's queue is full.
    pub fn overloaded() -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "the server is busy: every slot and queue place is taken, try again shortly".into(),
            kind: "server_error",
            param: None,
            code: Some("server_overloaded"),
            retry_after: Some(1),
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
            retry_after: None,
        }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// The error object alone, as a stream's error event carries it.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_type_names_the_field() {
        let err = parse(br#"{"prompt": "hi", "max_tokens": "ten"}"#).unwrap_err();
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
        assert_eq!(err.param.as_deref(), Some("max_tokens"));
        assert!(err.message.contains("max_tokens"), "{}", err.message);
    }

    #[test]
    fn malformed_json_says_so() {
        let err = parse(br#"{"prompt": "hi""#).unwrap_err();
        assert!(err.message.contains("not a valid JSON"), "{}", err.message);
        assert_eq!(err.param, None);
    }

    #[test]
    fn content_parts_and_unknown_fields() {
        let req = parse(
            br#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}]}],
                 "user": "x", "logit_bias": {}, "stop": "\n"}"#,
        )
        .unwrap();
        assert_eq!(req.messages.unwrap()[0].content, "ab");
        assert_eq!(req.stop.unwrap().into_vec(), vec!["\n".to_string()]);
    }
}
