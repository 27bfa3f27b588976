//! `POST /v1/responses` in the shape of OpenAI's Responses API, stateless:
//! `input` (a text, or message, function call and call output items) and
//! `instructions` become a chat's messages, answered as the chat API
//! answers them, in a response object or as the API's stream of typed
//! events; `text.format` holds the answer to JSON as the chat API's
//! `response_format` does, and function tools are the chat's tools, their
//! calls `function_call` items. Nothing is stored, so
//! `previous_response_id` is refused, and so are OpenAI's hosted tools.

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
use crate::harmony::{self, HarmonyStream};
use crate::routes::{body, collect, fresh_seed, queue, Endpoint, Queued};
use crate::scheduler::Event;
use crate::structured::StructuredFields;
use crate::tools::{ToolCall, ToolFormat, ToolRequest};
use crate::AppState;

/// A request to `/v1/responses`. Fields that do not change the answer
/// (`store`, `metadata`, `user`, `truncation`, `include`) are accepted and
/// ignored.
#[derive(Debug, Deserialize)]
pub struct ResponsesRequest {
    pub model: Option<String>,
    pub input: Input,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<usize>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub stream: Option<bool>,
    /// Functions, each `{"type": "function", "name", "description",
    /// "parameters", "strict"}` (see [`chat_tools`]).
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub previous_response_id: Option<String>,
    pub text: Option<Value>,
    pub reasoning: Option<Value>,
    pub background: Option<bool>,
    pub top_logprobs: Option<usize>,
}

/// `input`: a text (one user message) or a list of items.
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
            Shape::Items(items) => {
                let mut messages = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    add_item(&mut messages, item).map_err(|e| serde::de::Error::custom(format!("item {i}: {e}")))?;
                }
                Ok(Input(messages))
            }
        }
    }
}

/// Adds an input item to the chat's `messages`: a message; a function call,
/// which joins the assistant message before it (or starts one) as one of
/// its `tool_calls`; a call's output, as a `tool` message. Items of other
/// types (reasoning, hosted tools' calls) are named.
fn add_item(messages: &mut Vec<Message>, item: &Value) -> Result<(), String> {
    let text = |field: &str| item.get(field).and_then(Value::as_str).map(str::to_string);
    match item.get("type").and_then(Value::as_str).unwrap_or("message") {
        "message" => messages.push(message(item)?),
        "function_call" => {
            let (Some(call_id), Some(name), Some(arguments)) = (text("call_id"), text("name"), text("arguments")) else {
                return Err("a function_call item needs call_id, name and arguments (a JSON text)".into());
            };
            let arguments: Value =
                serde_json::from_str(&arguments).map_err(|e| format!("the function_call's arguments are not JSON: {e}"))?;
            let call = json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}});
            match messages.last_mut() {
                Some(last) if last.role == "assistant" => last.tool_calls.get_or_insert_with(Vec::new).push(call),
                _ => messages.push(Message {
                    role: "assistant".into(),
                    tool_calls: Some(vec![call]),
                    ..Message::default()
                }),
            }
        }
        "function_call_output" => {
            let (Some(call_id), Some(output)) = (text("call_id"), text("output")) else {
                return Err("a function_call_output item needs call_id and output (a text)".into());
            };
            // Templates that render a tool message by its function's name
            // find it on the call it answers.
            let name = messages
                .iter()
                .flat_map(|m| m.tool_calls.iter().flatten())
                .find(|call| call["id"] == call_id.as_str())
                .and_then(|call| call.pointer("/function/name")?.as_str().map(str::to_string));
            messages.push(Message {
                role: "tool".into(),
                content: output,
                tool_call_id: Some(call_id),
                name,
                ..Message::default()
            });
        }
        kind => {
            return Err(format!(
                "items of type '{kind}' are not supported: cleave takes message, function_call and function_call_output items"
            ))
        }
    }
    Ok(())
}

/// A message item as a chat message: its role (`developer` is the chat
/// API's `system`) and its text parts joined. Parts that are not text are
/// named.
fn message(item: &Value) -> Result<Message, String> {
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
    [
        (
            request.previous_response_id.is_some(),
            (
                "previous_response_id",
                "cleave stores no responses: send the conversation as input",
            ),
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
fn as_chat(request: ResponsesRequest) -> Result<GenerationRequest, ApiError> {
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
    Ok(GenerationRequest {
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
        tools: request.tools.as_deref().map(chat_tools).transpose()?,
        tool_choice: request.tool_choice.as_ref().map(chat_tool_choice).transpose()?,
        parallel_tool_calls: request.parallel_tool_calls,
        ..Default::default()
    })
}

/// The Responses API's function tools (`{"type": "function", "name", ...}`)
/// in the chat API's shape (`{"type": "function", "function": {"name",
/// ...}}`), for the chat's checks and its template. OpenAI's hosted tools
/// (web search, file search, computer use) are named.
fn chat_tools(tools: &[Value]) -> Result<Value, ApiError> {
    tools
        .iter()
        .enumerate()
        .map(
            |(i, tool)| match (tool.get("type").and_then(Value::as_str), tool.as_object()) {
                (Some("function"), Some(fields)) => {
                    let function: serde_json::Map<String, Value> = fields
                        .iter()
                        .filter(|(k, _)| *k != "type")
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    Ok(json!({"type": "function", "function": function}))
                }
                (kind, _) => Err(ApiError::invalid(
                    format!(
                    "tools[{i}] is of type '{}': cleave calls the request's functions only, not OpenAI's hosted tools",
                    kind.unwrap_or("(none)")
                ),
                    Some("tools".into()),
                )),
            },
        )
        .collect()
}

/// A Responses `tool_choice` in the chat API's shape: `auto`, `none` and
/// `required` as they are, a function named as `{"type": "function",
/// "name"}`.
fn chat_tool_choice(choice: &Value) -> Result<Value, ApiError> {
    match (choice, choice.get("type").and_then(Value::as_str), choice.get("name")) {
        (Value::String(_), _, _) => Ok(choice.clone()),
        (_, Some("function"), Some(name)) => Ok(json!({"type": "function", "function": {"name": name}})),
        _ => Err(ApiError::invalid(
            format!("tool_choice {choice} is not auto, none, required or {{\"type\": \"function\", \"name\": ...}}"),
            Some("tool_choice".into()),
        )),
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
    /// What tells this response's function calls apart, and how the
    /// model's template spells their ids (where the request has tools).
    call_seed: u64,
    tool_format: Option<ToolFormat>,
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

    /// The function call item of the answer's `index`th call.
    fn call(&self, call: &ToolCall, index: usize) -> Value {
        json!({
            "type": "function_call",
            "id": format!("fc_{:x}{index}", self.call_seed),
            "call_id": self.tool_format.map(|f| f.call_id(self.call_seed, index)),
            "name": call.name,
            "arguments": call.arguments,
            "status": "completed",
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

    /// The whole response of an answer that ended for `reason`: its text
    /// as a message (none where the answer is only calls), then its calls.
    fn finished(&self, text: &str, calls: &[ToolCall], reason: StopReason, usage: Value) -> Value {
        let (status, incomplete) = match reason {
            StopReason::Length | StopReason::ContextFull => ("incomplete", Some("max_output_tokens")),
            StopReason::Eos | StopReason::Stop | StopReason::Cancelled => ("completed", None),
        };
        let message = (!text.is_empty() || calls.is_empty()).then(|| self.message(text, status));
        let calls = calls.iter().enumerate().map(|(i, call)| self.call(call, i));
        self.object(status, message.into_iter().chain(calls).collect(), usage, incomplete)
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
        "tools": request.tools.clone().unwrap_or_default(),
        "tool_choice": request.tool_choice.clone().unwrap_or_else(|| json!("auto")),
        "parallel_tool_calls": request.parallel_tool_calls.unwrap_or(true),
    });
    let queued = queue(&state, as_chat(request)?, Endpoint::Chat).await?;
    let seed = fresh_seed();
    let shape = Shape {
        id: format!("resp_{seed:x}"),
        message_id: format!("msg_{seed:x}"),
        call_seed: seed,
        tool_format: queued.reply.tools.as_ref().map(ToolRequest::format),
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
    let parsed = queued.reply.tools.as_ref().map(|t| t.parse(&answer.text));
    let response = match parsed.filter(|p| !p.calls.is_empty()) {
        Some(p) => shape.finished(p.content.as_deref().unwrap_or_default(), &p.calls, answer.reason, usage),
        // Harmony's final channel is the message.
        None if queued.reply.harmony => {
            let channels = harmony::split(&answer.text);
            shape.finished(&channels.content, &[], answer.reason, usage)
        }
        None => shape.finished(&answer.text, &[], answer.reason, usage),
    };
    Ok(Json(response).into_response())
}

/// The stream's events, numbered, to a client that may go.
struct Events {
    sender: mpsc::Sender<Result<SseEvent, Infallible>>,
    sequence: u64,
}

impl Events {
    /// Sends one event; false once the client has gone.
    async fn emit(&mut self, kind: &str, mut data: Value) -> bool {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        let event = SseEvent::default().event(kind).data(data.to_string());
        self.sender.send(Ok(event)).await.is_ok()
    }

    /// Sends each of `events` in order; false once the client has gone.
    async fn emit_all(&mut self, events: impl IntoIterator<Item = (&str, Value)>) -> bool {
        for (kind, data) in events {
            if !self.emit(kind, data).await {
                return false;
            }
        }
        true
    }
}

/// Where the stream stands in the answer's message item.
struct MessageStream<'s> {
    shape: &'s Shape,
    text: String,
    /// Whether the message item has been announced: at its first text, so
    /// that an answer of calls alone has none.
    open: bool,
}

impl MessageStream<'_> {
    /// Where in the output a text event points, with `part` where given.
    fn at(&self, part: Option<Value>) -> Value {
        let mut at = json!({"item_id": self.shape.message_id, "output_index": 0, "content_index": 0});
        if let Some(part) = part {
            at["part"] = part;
        }
        at
    }

    /// The message item and its text part announced.
    fn opening(&mut self) -> Vec<(&'static str, Value)> {
        if self.open {
            return Vec::new();
        }
        self.open = true;
        let item = json!({"type": "message", "id": self.shape.message_id, "status": "in_progress",
            "role": "assistant", "content": []});
        vec![
            ("response.output_item.added", json!({"output_index": 0, "item": item})),
            ("response.content_part.added", self.at(Some(output_text("")))),
        ]
    }

    /// `piece` of text (announcing the item first, where it is new).
    fn delta(&mut self, piece: &str) -> Vec<(&'static str, Value)> {
        if piece.is_empty() {
            return Vec::new();
        }
        let mut events = self.opening();
        let mut delta = self.at(None);
        delta["delta"] = json!(piece);
        delta["logprobs"] = json!([]);
        self.text.push_str(piece);
        events.push(("response.output_text.delta", delta));
        events
    }

    /// The text and the item closed, as `item` (the finished response's).
    fn closing(&self, item: &Value) -> Vec<(&'static str, Value)> {
        let mut done = self.at(None);
        done["text"] = json!(self.text);
        done["logprobs"] = json!([]);
        vec![
            ("response.output_text.done", done),
            ("response.content_part.done", self.at(Some(output_text(&self.text)))),
            ("response.output_item.done", json!({"output_index": 0, "item": item})),
        ]
    }
}

/// The events of each function call item in `output` (the finished
/// response's) from `first`: added, its arguments whole, done.
fn call_events(output: &[Value], first: usize) -> Vec<(&'static str, Value)> {
    let mut events = Vec::new();
    for (index, item) in output.iter().enumerate().skip(first) {
        let at = json!({"item_id": item["id"], "output_index": index});
        let mut added = item.clone();
        added["arguments"] = json!("");
        added["status"] = json!("in_progress");
        let mut delta = at.clone();
        delta["delta"] = item["arguments"].clone();
        let mut done = at;
        done["arguments"] = item["arguments"].clone();
        events.extend([
            (
                "response.output_item.added",
                json!({"output_index": index, "item": added}),
            ),
            ("response.function_call_arguments.delta", delta),
            ("response.function_call_arguments.done", done),
            (
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            ),
        ]);
    }
    events
}

/// The answer as the Responses API streams it: the response created, its
/// message item and text part opened at the first text, a delta per piece
/// of text, each closed, then each function call item whole (text that may
/// be a call is held back until the end), then the response completed (or
/// incomplete).
fn stream(shape: Shape, queued: Queued) -> impl IntoResponse {
    let (sender, receiver) = mpsc::channel::<Result<SseEvent, Infallible>>(16);
    let Queued {
        mut events,
        replica,
        reply,
        ..
    } = queued;
    tokio::spawn(async move {
        let mut out = Events { sender, sequence: 0 };
        let started = shape.object("in_progress", vec![], Value::Null, None);
        let opening = [
            ("response.created", json!({ "response": started })),
            ("response.in_progress", json!({ "response": started })),
        ];
        if !out.emit_all(opening).await {
            return;
        }
        let mut message = MessageStream {
            shape: &shape,
            text: String::new(),
            open: false,
        };
        let mut held = reply.tools.as_ref().map(ToolRequest::stream);
        let mut channels = reply.harmony.then(HarmonyStream::default);
        while let Some(event) = events.recv().await {
            match event {
                Event::Logprobs(_) => {}
                Event::Text(piece) => {
                    let visible = match (&mut held, &mut channels) {
                        // Calls are read from the whole answer at its end.
                        (held, Some(channels)) => {
                            if let Some(held) = held {
                                held.push(&piece);
                            }
                            channels.push(&piece).content
                        }
                        (Some(held), None) => held.push(&piece),
                        (None, None) => piece,
                    };
                    if !out.emit_all(message.delta(&visible)).await {
                        return;
                    }
                }
                Event::Done {
                    reason,
                    completion_tokens,
                    cached_tokens,
                } => {
                    replica.note_outcome(true);
                    let (mut rest, calls) = held.take().map(|h| h.finish()).unwrap_or_default();
                    if let Some(channels) = channels.take() {
                        rest = channels.finish().content;
                    }
                    let mut closing = message.delta(&rest);
                    let usage = shape.usage(completion_tokens, cached_tokens);
                    let response = shape.finished(&message.text, &calls, reason, usage);
                    if calls.is_empty() {
                        closing.extend(message.opening());
                    }
                    let output = response["output"].as_array().map(Vec::as_slice).unwrap_or_default();
                    if message.open {
                        closing.extend(message.closing(&output[0]));
                    }
                    closing.extend(call_events(output, usize::from(message.open)));
                    let last = match response["status"].as_str() {
                        Some("incomplete") => "response.incomplete",
                        _ => "response.completed",
                    };
                    closing.push((last, json!({ "response": response })));
                    out.emit_all(closing).await;
                    return;
                }
                Event::Error(message) => {
                    replica.note_outcome(false);
                    let error = json!({"code": "server_error", "message": message, "param": null});
                    out.emit("error", error).await;
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
        let chat = as_chat(r).unwrap();
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
        let text = as_chat(request(r#"{"input": "Hi"}"#).unwrap())
            .unwrap()
            .messages
            .unwrap();
        assert_eq!((text[0].role.as_str(), text[0].content.as_str()), ("user", "Hi"));
        for (body, says) in [
            (
                r#"{"input": [{"type": "reasoning", "summary": []}]}"#,
                "items of type 'reasoning'",
            ),
            (
                r#"{"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]}"#,
                "arguments are not JSON",
            ),
            (
                r#"{"input": [{"type": "function_call_output", "call_id": "c"}]}"#,
                "needs call_id and output",
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
        let chat = as_chat(request(&body.to_string()).unwrap()).unwrap();
        let format = chat.structured.response_format.unwrap();
        assert_eq!(
            (&format["type"], &format["json_schema"]["schema"]),
            (&json!("json_schema"), &schema)
        );
        let body = json!({"input": "a", "text": {"format": {"type": "json_object"}}});
        let chat = as_chat(request(&body.to_string()).unwrap()).unwrap();
        assert_eq!(chat.structured.response_format, Some(json!({"type": "json_object"})));
    }

    /// Function tools and a named choice in the chat's shape; a call and
    /// its output as the assistant's `tool_calls` (joining the message
    /// before it) and a tool message naming the function; hosted tools
    /// named.
    #[test]
    fn function_tools_and_calls_become_the_chats() {
        let parameters = json!({"type": "object"});
        let body = json!({
            "input": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "Looking."},
                {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{\"city\": \"Bern\"}"},
                {"type": "function_call", "call_id": "c2", "name": "time", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "21"},
            ],
            "tools": [{"type": "function", "name": "weather", "parameters": parameters, "strict": true}],
            "tool_choice": {"type": "function", "name": "weather"},
            "parallel_tool_calls": false,
        });
        let chat = as_chat(request(&body.to_string()).unwrap()).unwrap();
        assert_eq!(
            chat.tools,
            Some(
                json!([{"type": "function", "function": {"name": "weather", "parameters": parameters, "strict": true}}])
            )
        );
        assert_eq!(
            chat.tool_choice,
            Some(json!({"type": "function", "function": {"name": "weather"}}))
        );
        assert_eq!(chat.parallel_tool_calls, Some(false));
        let messages = chat.messages.unwrap();
        assert_eq!(messages.len(), 3);
        let calls = messages[1].tool_calls.as_ref().unwrap();
        assert_eq!((messages[1].content.as_str(), calls.len()), ("Looking.", 2));
        assert_eq!(
            calls[0],
            json!({"id": "c1", "type": "function", "function": {"name": "weather", "arguments": {"city": "Bern"}}})
        );
        let tool = &messages[2];
        assert_eq!(
            (
                tool.role.as_str(),
                tool.content.as_str(),
                tool.tool_call_id.as_deref(),
                tool.name.as_deref()
            ),
            ("tool", "21", Some("c1"), Some("weather"))
        );
        for (body, field) in [
            (json!({"input": "a", "tools": [{"type": "web_search"}]}), "tools"),
            (
                json!({"input": "a", "tool_choice": {"type": "file_search"}}),
                "tool_choice",
            ),
        ] {
            let err = as_chat(request(&body.to_string()).unwrap()).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(field), "{body}");
        }
    }
}
