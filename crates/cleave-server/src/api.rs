//! The OpenAI API as cleave speaks it: request bodies (one type for
//! completions and chat), and errors as OpenAI's error object.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::structured::StructuredFields;

/// A request to `/v1/completions` (with `prompt`) or `/v1/chat/completions`
/// (with `messages`). Fields that change the answer and that cleave does
/// not implement are refused ([`Unsupported`]); others (`user`, `store`,
/// ...) are accepted and ignored, as OpenAI's own server ignores unknown
/// ones.
#[derive(Debug, Default, Deserialize)]
pub struct GenerationRequest {
    /// Must name the served model when given.
    pub model: Option<String>,
    pub prompt: Option<Prompt>,
    pub messages: Option<Vec<Message>>,
    pub max_tokens: Option<usize>,
    /// The chat API's newer name for `max_tokens`.
    pub max_completion_tokens: Option<usize>,
    /// Read as f64 and judged once narrowed to the sampler's f32
    /// (`budget::sampling`), so that an error names the value sent.
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// Not OpenAI's, but llama.cpp's and vLLM's.
    pub top_k: Option<usize>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<usize>,
    /// Not OpenAI's, but llama.cpp's: generate exactly `max_tokens`.
    pub ignore_eos: Option<bool>,
    /// OpenAI's penalties, in [-2, 2], over the last `repeat_last_n`
    /// tokens of prompt and completion (as llama.cpp's server counts).
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    /// Not OpenAI's, but llama.cpp's and vLLM's (`repetition_penalty`
    /// there): above 0, 1 is off.
    pub repeat_penalty: Option<f64>,
    /// Not OpenAI's, but llama.cpp's: the window the penalties count (64).
    pub repeat_last_n: Option<usize>,
    /// Completions: how many alternatives' log-probabilities each token
    /// reports (an integer). Chat: whether each token reports its own
    /// (a bool), with `top_logprobs` alternatives. Judged by
    /// `budget::logprobs`.
    pub logprobs: Option<Value>,
    pub top_logprobs: Option<usize>,
    /// Token id (as a string) to a bias in [-100, 100] added to its logit.
    pub logit_bias: Option<std::collections::BTreeMap<String, f64>>,
    /// Functions the model may call (chat only), whether and which one it
    /// must, and whether it may call several at once.
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    /// The grammar the answer is held to, by whichever name it was sent.
    #[serde(flatten)]
    pub structured: StructuredFields,
    /// OpenAI parameters cleave does not implement, kept to refuse them
    /// when they ask for something (rather than answer as if they did not).
    #[serde(flatten)]
    pub unsupported: Unsupported,
}

/// Fields that change an answer and that cleave does not implement yet:
/// refused when they ask for something, rather than answered as if they
/// had not been sent.
#[derive(Debug, Default, Deserialize)]
pub struct Unsupported {
    echo: Option<Value>,
    best_of: Option<Value>,
    suffix: Option<Value>,
    functions: Option<Value>,
    function_call: Option<Value>,
}

impl Unsupported {
    /// The first field that asks for something: anything but absent, null,
    /// false, empty, or a value that means "off" for that field (1 for
    /// `best_of`, `"none"` or `"auto"` for a legacy function call).
    pub fn first_asked(&self) -> Option<&'static str> {
        let one = [json!(1)];
        let no_tool = [json!("none"), json!("auto")];
        let fields: [(&str, &Option<Value>, &[Value]); 5] = [
            ("echo", &self.echo, &[]),
            ("best_of", &self.best_of, &one),
            ("suffix", &self.suffix, &[]),
            ("functions", &self.functions, &[]),
            ("function_call", &self.function_call, &no_tool),
        ];
        // Bound before it is returned: the iterator borrows the arrays above.
        let asked = fields
            .into_iter()
            .find(|(_, value, off)| !value.as_ref().is_none_or(|v| asks_nothing(v, off)))
            .map(|(name, _, _)| name);
        asked
    }
}

/// Whether `value` is null, false, empty, or one of `off` (numbers
/// compared as numbers, so `0.0` is `0`).
fn asks_nothing(value: &Value, off: &[Value]) -> bool {
    match value {
        Value::Null | Value::Bool(false) => true,
        Value::String(s) if s.is_empty() => true,
        Value::Array(a) if a.is_empty() => true,
        Value::Object(o) if o.is_empty() => true,
        Value::Number(n) => off.iter().any(|o| o.as_f64() == n.as_f64()),
        _ => off.contains(value),
    }
}

/// A completion's `prompt`: text, or token ids.
#[derive(Debug)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
}

impl<'de> Deserialize<'de> for Prompt {
    /// The shapes OpenAI takes (a string, a list of strings, a list of ids,
    /// a list of id lists); a list of one id list counts as its ids. Any
    /// other shape gets a message that lists these, not serde's "did not
    /// match any variant".
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
            Shape::Text(t) => Ok(Prompt::Text(t)),
            // `[]` matches every list shape: it is an empty prompt.
            Shape::Texts(t) if t.is_empty() => Ok(Prompt::Ids(Vec::new())),
            Shape::Texts(t) => Ok(Prompt::Texts(t)),
            Shape::Ids(ids) => Ok(Prompt::Ids(ids)),
            Shape::IdLists(mut lists) if lists.len() == 1 => Ok(Prompt::Ids(lists.remove(0))),
            Shape::IdLists(_) => Err(serde::de::Error::custom(
                "cleave takes one prompt per request, not a batch of token-id lists",
            )),
            Shape::Other(_) => Err(serde::de::Error::custom(
                "expected a string, a list of one string, or token ids (a list of integers below 2^32, \
                 or a list of one such list)",
            )),
        }
    }
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

#[derive(Clone, Debug, Default, Deserialize, serde::Serialize)]
pub struct Message {
    pub role: String,
    #[serde(default, deserialize_with = "content_text")]
    pub content: String,
    /// An assistant's calls, each `{"id", "type", "function": {"name",
    /// "arguments"}}`, the arguments read from their JSON text into an
    /// object: what chat templates render (as vLLM passes them).
    #[serde(default, deserialize_with = "tool_calls", skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Value>>,
    /// A tool message's call, and a tool's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// An assistant message's `tool_calls`, their arguments parsed from JSON
/// text (OpenAI's form) into objects (the templates' form).
fn tool_calls<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<Value>>, D::Error> {
    let Some(mut calls) = Option::<Vec<Value>>::deserialize(d)? else {
        return Ok(None);
    };
    for (i, call) in calls.iter_mut().enumerate() {
        let arguments = call.pointer_mut("/function/arguments");
        if let Some(Value::String(text)) = arguments {
            let parsed: Value = serde_json::from_str(text).map_err(|e| {
                serde::de::Error::custom(format!("tool_calls[{i}].function.arguments is not JSON: {e}"))
            })?;
            *call.pointer_mut("/function/arguments").unwrap_or(&mut Value::Null) = parsed;
        }
    }
    Ok(Some(calls))
}

/// A message's content: a string, or a list of text parts (what the
/// vision-capable chat API sends). Parts of other types (`image_url`,
/// `input_audio`, `file`) are refused: cleave's models read text, and
/// answering without them would answer another question.
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
        Content::Parts(parts) => {
            if let Some(other) = parts.iter().find(|p| p.kind != "text") {
                return Err(serde::de::Error::custom(format!(
                    "content parts of type '{}' are not supported: cleave's models read text only",
                    other.kind
                )));
            }
            parts.into_iter().filter_map(|p| p.text).collect()
        }
        Content::Null(()) => String::new(),
    })
}

/// A request's `model` against the `served` one: when it names another
/// (an empty name counts as none), the client gets OpenAI's 404 rather
/// than this model's answer under the other's name.
pub fn check_model(asked: Option<&str>, served: &str) -> Result<(), ApiError> {
    match asked {
        Some(asked) if !asked.is_empty() && asked != served => Err(ApiError::model_not_found(asked, served)),
        _ => Ok(()),
    }
}

/// Parses a request body, naming the field whose value is wrong.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
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

    /// 408: the body did not arrive in time.
    pub fn body_timeout(limit: std::time::Duration) -> Self {
        ApiError {
            status: StatusCode::REQUEST_TIMEOUT,
            message: format!("the request body did not arrive within {} s", limit.as_secs_f32()),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_timeout"),
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

    /// 503: no group can serve anymore.
    pub fn groups_failed() -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "every device group of this server has failed (its log says why)".into(),
            kind: "server_error",
            param: None,
            code: Some("groups_failed"),
            retry_after: None,
        }
    }

    /// 503: the server is shutting down and did not serve the request.
    pub fn shutting_down() -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "the server is shutting down: this request was not served, send it again".into(),
            kind: "server_error",
            param: None,
            code: Some("shutting_down"),
            retry_after: None,
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

    /// 404, as OpenAI answers a model it does not have.
    pub fn model_not_found(asked: &str, served: &str) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("the model '{asked}' does not exist here: this server serves '{served}' (GET /v1/models)"),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
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
        let err = parse::<GenerationRequest>(br#"{"prompt": "hi", "max_tokens": "ten"}"#).unwrap_err();
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
        assert_eq!(err.param.as_deref(), Some("max_tokens"));
        assert!(err.message.contains("max_tokens"), "{}", err.message);
    }

    #[test]
    fn every_prompt_shape_is_taken_or_named() {
        let prompt = |body: &str| parse::<GenerationRequest>(body.as_bytes()).map(|r| r.prompt);
        assert!(matches!(prompt(r#"{"prompt": [[0, 100, 200]]}"#), Ok(Some(Prompt::Ids(ids))) if ids == [0, 100, 200]));
        assert!(matches!(prompt(r#"{"prompt": []}"#), Ok(Some(Prompt::Ids(ids))) if ids.is_empty()));
        assert!(matches!(prompt(r#"{"prompt": ["a"]}"#), Ok(Some(Prompt::Texts(t))) if t == ["a"]));
        for (body, says) in [
            (r#"{"prompt": [[1], [2]]}"#, "not a batch of token-id lists"),
            (
                r#"{"prompt": 5}"#,
                "expected a string, a list of one string, or token ids",
            ),
            (r#"{"prompt": [-1]}"#, "expected a string"),
            (r#"{"prompt": {"a": 1}}"#, "expected a string"),
        ] {
            let err = prompt(body).unwrap_err();
            assert_eq!(err.param.as_deref(), Some("prompt"), "{body}");
            assert!(err.message.contains(says), "{body}: {}", err.message);
        }
    }

    #[test]
    fn unimplemented_parameters_are_named_when_they_ask_for_something() {
        let asked = |body: &str| {
            parse::<GenerationRequest>(body.as_bytes())
                .unwrap()
                .unsupported
                .first_asked()
        };
        assert_eq!(asked(r#"{"echo": false, "best_of": 1, "presence_penalty": 0}"#), None);
        assert_eq!(asked(r#"{"echo": true}"#), Some("echo"));
        assert_eq!(asked(r#"{"best_of": 3}"#), Some("best_of"));
        assert_eq!(
            asked(
                r#"{"tools": [], "tool_choice": "auto", "functions": null, "function_call": "none", "presence_penalty": 0.0}"#
            ),
            None
        );
        assert_eq!(asked(r#"{"functions": [{"name": "f"}]}"#), Some("functions"));
    }

    #[test]
    fn another_model_is_not_found_as_openai_says_it() {
        assert!(check_model(None, "tiny").is_ok());
        assert!(check_model(Some(""), "tiny").is_ok());
        assert!(check_model(Some("tiny"), "tiny").is_ok());
        let err = check_model(Some("gpt-4o"), "tiny").unwrap_err();
        assert_eq!(err.status, StatusCode::NOT_FOUND);
        assert_eq!(
            (err.code, err.param.as_deref()),
            (Some("model_not_found"), Some("model"))
        );
        assert!(err
            .message
            .contains("'gpt-4o' does not exist here: this server serves 'tiny'"));
    }

    #[test]
    fn malformed_json_says_so() {
        let err = parse::<GenerationRequest>(br#"{"prompt": "hi""#).unwrap_err();
        assert!(err.message.contains("not a valid JSON"), "{}", err.message);
        assert_eq!(err.param, None);
    }

    #[test]
    fn content_parts_and_unknown_fields() {
        let req = parse::<GenerationRequest>(
            br#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
                 "user": "x", "logit_bias": {}, "stop": "\n"}"#,
        )
        .unwrap();
        assert_eq!(req.messages.unwrap()[0].content, "ab");
        assert_eq!(req.stop.unwrap().into_vec(), vec!["\n".to_string()]);
    }

    #[test]
    fn content_parts_that_are_not_text_are_refused_by_place_and_type() {
        let err = parse::<GenerationRequest>(
            br#"{"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "data:,"}}]}]}"#,
        )
        .unwrap_err();
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
        assert_eq!(err.param.as_deref(), Some("messages[1].content"));
        assert!(
            err.message
                .contains("content parts of type 'image_url' are not supported"),
            "{}",
            err.message
        );
    }
}
