//! `POST /v1/responses` in the shape of OpenAI's Responses API, stateless:
//! `input` (a text, or message items) and `instructions` become a chat's
//! messages, answered as the chat API answers them, in a response object
//! or as the API's stream of typed events; `text.format` holds the answer
//! to JSON as the chat API's `response_format` does. Nothing is stored, so
//! `previous_response_id` is refused; tools are refused until cleave
//! implements them.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cleave_engine::StopReason;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::api::{parse, ApiError, GenerationRequest, Message};
use crate::routes::{body, collect, fresh_seed, queue, Endpoint, Queued};
use crate::scheduler::Event;
use crate::structured::StructuredFields;
use crate::AppState;

/// A request to `/v1/responses`. Fields that do not change the answer
/// (`store`, `metadata`, `user`, `parallel_tool_calls`, `truncation`,
/// `include`) are accepted and ignored.
#[derive(Debug, Deserialize)]
pub struct ResponsesRequest {
    pub model: Option<String>,
    pub input: Input,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<usize>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub stream: Option<bool>,
    /// Refused when they ask for something (see [`refused`]).
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub previous_response_id: Option<String>,
    pub text: Option<Value>,
    pub reasoning: Option<Value>,
    pub background: Option<bool>,
    pub top_logprobs: Option<usize>,
}

/// `input`: a text (one user message) or a list of message items.
#[derive(Debug)]
pub struct Input(Vec<Message>);

impl<'de> Deserialize<'de> for Input {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Shape {
            Text(String),
            Items(Vec<Value>),
        }
        let text = |t: String| Message {
            role: "user".into(),
            content: t,
            ..Message::default()
        };
        match Shape::deserialize(d).map_err(|_| serde::de::Error::custom("expected a string or a list of items"))? {
            Shape::Text(t) => Ok(Input(vec![text(t)])),
            Shape::Items(items) => items
                .iter()
                .enumerate()
                .map(|(i, item)| message(item).map_err(|e| serde::de::Error::custom(format!("item {i}: {e}"))))
                .collect::<Result<_, _>>()
                .map(Input),
        }
    }
}

/// A message item as a chat message: its role (`developer` is the chat
/// API's `system`) and its text parts joined. Items of other types
/// (function calls and their outputs, reasoning) and parts that are not
/// text are named.
fn message(item: &Value) -> Result<Message, String> {
    let kind = item.get("type").and_then(Value::as_str).unwrap_or("message");
    if kind != "message" {
        return Err(format!(
            "items of type '{kind}' are not supported: cleave takes message items"
        ));
    }
    let role = match item.get("role").and_then(Value::as_str) {
        Some("developer") => "system",
        Some(role @ ("user" | "assistant" | "system")) => role,
        Some(other) => {
            return Err(format!(
                "role '{other}' is not one of user, assistant, system, developer"
            ))
        }
        None => return Err("a message item needs a role".into()),
    };
    let content = match item.get("content") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                match (
                    part.get("type").and_then(Value::as_str),
                    part.get("text").and_then(Value::as_str),
                ) {
                    (Some("input_text" | "output_text" | "text"), Some(piece)) => text.push_str(piece),
                    (kind, _) => {
                        return Err(format!(
                            "content parts of type '{}' are not supported: cleave's models read text only",
                            kind.unwrap_or("(none)")
                        ))
                    }
                }
            }
            text
        }
        _ => return Err("a message item's content is a string or a list of text parts".into()),
    };
    Ok(Message {
        role: role.into(),
        content,
        ..Message::default()
    })
}

/// The first field that asks for what cleave does not do here, and why.
fn refused(request: &ResponsesRequest) -> Option<(&'static str, &'static str)> {
    let tool_choice = request.tool_choice.as_ref().and_then(Value::as_str);
    [
        (
            request.previous_response_id.is_some(),
            (
                "previous_response_id",
                "cleave stores no responses: send the conversation as input",
            ),
        ),
        (
            request.tools.as_ref().is_some_and(|t| !t.is_empty()),
            ("tools", "cleave does not implement tool calls yet"),
        ),
        (
            request.tool_choice.is_some() && !matches!(tool_choice, Some("none" | "auto")),
            ("tool_choice", "cleave does not implement tool calls yet"),
        ),
        (
            request.reasoning.as_ref().is_some_and(|r| !r.is_null()),
            ("reasoning", "cleave's models take no reasoning settings"),
        ),
        (
            request.background == Some(true),
            ("background", "cleave answers in the foreground only"),
        ),
        (
            request.top_logprobs.is_some_and(|n| n > 0),
            (
                "top_logprobs",
                "the Responses API's log-probabilities are not implemented: use the chat API's",
            ),
        ),
    ]
    .into_iter()
    .find_map(|(asked, refusal)| asked.then_some(refusal))
}

/// The chat request a responses request is: `instructions` first, as a
/// system message.
fn as_chat(request: ResponsesRequest) -> GenerationRequest {
    let mut messages = Vec::with_capacity(request.input.0.len() + 1);
    if let Some(instructions) = request.instructions {
        messages.push(Message {
            role: "system".into(),
            content: instructions,
            ..Message::default()
        });
    }
    messages.extend(request.input.0);
    let response_format = request.text.as_ref().and_then(|t| t.get("format")).map(chat_format);
    GenerationRequest {
        structured: StructuredFields {
            response_format,
            ..Default::default()
        },
        model: request.model,
        messages: Some(messages),
        max_completion_tokens: request.max_output_tokens,
        temperature: request.temperature,
        top_p: request.top_p,
        stream: request.stream,
        ..Default::default()
    }
}

/// A Responses `text.format` as the chat API's `response_format`: the
/// same types, a JSON schema's `name`, `schema` and `strict` on the format
/// itself rather than under `json_schema`.
fn chat_format(format: &Value) -> Value {
    match format["type"].as_str() {
        Some("json_schema") => json!({"type": "json_schema", "json_schema": format}),
        _ => format.clone(),
    }
}

/// What a response object says of its request, and its ids.
struct Shape {
    id: String,
    message_id: String,
    created: u64,
    model: String,
    prompt_tokens: usize,
    echo: Value,
}

impl Shape {
    /// The response object, `status` and its `output` so far.
    fn object(&self, status: &str, output: Vec<Value>, usage: Value, incomplete: Option<&str>) -> Value {
        let mut object = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.model,
            "output": output,
            "usage": usage,
            "incomplete_details": incomplete.map(|reason| json!({"reason": reason})),
            "error": null,
            "tools": [],
            "tool_choice": "none",
            "parallel_tool_calls": false,
            "store": false,
            "previous_response_id": null,
            "metadata": {},
        });
        if let (Value::Object(object), Value::Object(echo)) = (&mut object, &self.echo) {
            object.extend(echo.clone());
        }
        object
    }

    /// The assistant's message item holding `text`.
    fn message(&self, text: &str, status: &str) -> Value {
        json!({
            "type": "message",
            "id": self.message_id,
            "status": status,
            "role": "assistant",
            "content": [output_text(text)],
        })
    }

    fn usage(&self, completion_tokens: usize, cached_tokens: usize) -> Value {
        json!({
            "input_tokens": self.prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached_tokens},
            "output_tokens": completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.prompt_tokens + completion_tokens,
        })
    }

    /// The whole response of an answer that ended for `reason`.
    fn finished(&self, text: &str, reason: StopReason, usage: Value) -> Value {
        match reason {
            StopReason::Length | StopReason::ContextFull => self.object(
                "incomplete",
                vec![self.message(text, "incomplete")],
                usage,
                Some("max_output_tokens"),
            ),
            StopReason::Eos | StopReason::Stop | StopReason::Cancelled => {
                self.object("completed", vec![self.message(text, "completed")], usage, None)
            }
        }
    }
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": []})
}

/// Answers a responses request: checked, translated into a chat and
/// queued as one.
pub async fn responses(state: Arc<AppState>, body_bytes: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    state.text()?;
    let request: ResponsesRequest = parse(&body(&state, body_bytes)?)?;
    if let Some((field, why)) = refused(&request) {
        return Err(ApiError::invalid(format!("'{field}': {why}"), Some(field.into())));
    }
    let echo = json!({
        "text": request.text.clone().unwrap_or_else(|| json!({"format": {"type": "text"}})),
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
    });
    let queued = queue(&state, as_chat(request), Endpoint::Chat).await?;
    let seed = fresh_seed();
    let shape = Shape {
        id: format!("resp_{seed:x}"),
        message_id: format!("msg_{seed:x}"),
        created: queued.reply.created,
        model: queued.reply.model.clone(),
        prompt_tokens: queued.reply.prompt_tokens,
        echo,
    };
    if queued.stream {
        return Ok(stream(shape, queued).into_response());
    }
    let answer = collect(queued.events, &queued.replica).await?;
    let usage = shape.usage(answer.completion_tokens, answer.cached_tokens);
    Ok(Json(shape.finished(&answer.text, answer.reason, usage)).into_response())
}

/// Sends one event of the stream, numbered; false once the client has
/// gone.
async fn emit(
    sender: &mpsc::Sender<Result<SseEvent, Infallible>>,
    sequence: &mut u64,
    kind: &str,
    mut data: Value,
) -> bool {
    data["type"] = json!(kind);
    data["sequence_number"] = json!(*sequence);
    *sequence += 1;
    let event = SseEvent::default().event(kind).data(data.to_string());
    sender.send(Ok(event)).await.is_ok()
}

/// The answer as the Responses API streams it: the response created, its
/// message item and text part opened, a delta per piece of text, each
/// closed, then the response completed (or incomplete).
fn stream(shape: Shape, queued: Queued) -> impl IntoResponse {
    let (sender, receiver) = mpsc::channel::<Result<SseEvent, Infallible>>(16);
    let Queued {
        mut events, replica, ..
    } = queued;
    tokio::spawn(async move {
        let mut sequence = 0;
        let at = |part: Option<Value>| {
            let mut at = json!({"item_id": shape.message_id, "output_index": 0, "content_index": 0});
            if let Some(part) = part {
                at["part"] = part;
            }
            at
        };
        let started = shape.object("in_progress", vec![], Value::Null, None);
        let opening = [
            ("response.created", json!({ "response": started })),
            ("response.in_progress", json!({ "response": started })),
            (
                "response.output_item.added",
                json!({"output_index": 0, "item": {
                    "type": "message", "id": shape.message_id, "status": "in_progress", "role": "assistant", "content": [],
                }}),
            ),
            ("response.content_part.added", at(Some(output_text("")))),
        ];
        for (kind, data) in opening {
            if !emit(&sender, &mut sequence, kind, data).await {
                return;
            }
        }
        let mut text = String::new();
        while let Some(event) = events.recv().await {
            match event {
                Event::Logprobs(_) => {}
                Event::Text(piece) => {
                    let mut delta = at(None);
                    delta["delta"] = json!(piece);
                    delta["logprobs"] = json!([]);
                    text.push_str(&piece);
                    if !emit(&sender, &mut sequence, "response.output_text.delta", delta).await {
                        return;
                    }
                }
                Event::Done {
                    reason,
                    completion_tokens,
                    cached_tokens,
                } => {
                    replica.note_outcome(true);
                    let mut done = at(None);
                    done["text"] = json!(text);
                    done["logprobs"] = json!([]);
                    let response = shape.finished(&text, reason, shape.usage(completion_tokens, cached_tokens));
                    let last = match response["status"].as_str() {
                        Some("incomplete") => "response.incomplete",
                        _ => "response.completed",
                    };
                    let closing = [
                        ("response.output_text.done", done),
                        ("response.content_part.done", at(Some(output_text(&text)))),
                        (
                            "response.output_item.done",
                            json!({"output_index": 0, "item": response["output"][0]}),
                        ),
                        (last, json!({ "response": response })),
                    ];
                    for (kind, data) in closing {
                        if !emit(&sender, &mut sequence, kind, data).await {
                            return;
                        }
                    }
                    return;
                }
                Event::Error(message) => {
                    replica.note_outcome(false);
                    let error = json!({"code": "server_error", "message": message, "param": null});
                    emit(&sender, &mut sequence, "error", error).await;
                    return;
                }
            }
        }
    });
    Sse::new(ReceiverStream::new(receiver)).keep_alive(KeepAlive::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: &str) -> Result<ResponsesRequest, ApiError> {
        parse::<ResponsesRequest>(body.as_bytes())
    }

    #[test]
    fn input_items_become_chat_messages_and_others_are_named() {
        let r = request(
            r#"{"input": [{"role": "developer", "content": "Be brief."},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}, {"type": "input_text", "text": "!"}]},
                {"role": "assistant", "content": [{"type": "output_text", "text": "Hello"}]}],
                "instructions": "Answer in English.", "max_output_tokens": 9, "store": true}"#,
        )
        .unwrap();
        assert_eq!(refused(&r), None);
        let chat = as_chat(r);
        let messages: Vec<(String, String)> = chat
            .messages
            .unwrap()
            .into_iter()
            .map(|m| (m.role, m.content))
            .collect();
        let pair = |r: &str, c: &str| (r.to_string(), c.to_string());
        assert_eq!(
            messages,
            [
                pair("system", "Answer in English."),
                pair("system", "Be brief."),
                pair("user", "Hi!"),
                pair("assistant", "Hello")
            ]
        );
        assert_eq!(chat.max_completion_tokens, Some(9));
        let text = as_chat(request(r#"{"input": "Hi"}"#).unwrap()).messages.unwrap();
        assert_eq!((text[0].role.as_str(), text[0].content.as_str()), ("user", "Hi"));
        for (body, says) in [
            (
                r#"{"input": [{"type": "function_call_output", "call_id": "c", "output": "1"}]}"#,
                "items of type 'function_call_output'",
            ),
            (
                r#"{"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}"#,
                "parts of type 'input_image'",
            ),
            (r#"{"input": [{"role": "tool", "content": "x"}]}"#, "role 'tool'"),
            (r#"{"input": 5}"#, "expected a string or a list of items"),
        ] {
            let err = request(body).unwrap_err();
            assert_eq!(err.param.as_deref(), Some("input"), "{body}");
            assert!(err.message.contains(says), "{body}: {}", err.message);
        }
    }

    #[test]
    fn what_cleave_does_not_do_is_refused_by_name() {
        for (body, field) in [
            (
                r#"{"input": "a", "previous_response_id": "resp_1"}"#,
                "previous_response_id",
            ),
            (
                r#"{"input": "a", "tools": [{"type": "function", "name": "f"}]}"#,
                "tools",
            ),
            (r#"{"input": "a", "tool_choice": "required"}"#, "tool_choice"),
            (r#"{"input": "a", "reasoning": {"effort": "high"}}"#, "reasoning"),
            (r#"{"input": "a", "background": true}"#, "background"),
        ] {
            assert_eq!(refused(&request(body).unwrap()).map(|(f, _)| f), Some(field), "{body}");
        }
        let plain = r#"{"input": "a", "tools": [], "tool_choice": "auto", "text": {"format": {"type": "text"}}, "reasoning": null}"#;
        assert_eq!(refused(&request(plain).unwrap()), None);
    }

    #[test]
    fn a_text_format_is_the_chats_response_format() {
        let schema = json!({"type": "integer"});
        let body = json!({"input": "a", "text": {"format": {"type": "json_schema", "name": "n", "schema": schema, "strict": true}}});
        let chat = as_chat(request(&body.to_string()).unwrap());
        let format = chat.structured.response_format.unwrap();
        assert_eq!(
            (&format["type"], &format["json_schema"]["schema"]),
            (&json!("json_schema"), &schema)
        );
        let body = json!({"input": "a", "text": {"format": {"type": "json_object"}}});
        let chat = as_chat(request(&body.to_string()).unwrap());
        assert_eq!(chat.structured.response_format, Some(json!({"type": "json_object"})));
    }
}
