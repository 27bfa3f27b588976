//! The HTTP endpoints: OpenAI's `/v1/models`, `/v1/completions` and
//! `/v1/chat/completions` (plain JSON or Server-Sent Events) and
//! `/v1/responses` for a language model, `/v1/images/generations` for a FLUX pipeline, `/v1/embeddings`
//! for a sentence encoder, `/health` and Prometheus `/metrics`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cleave_engine::{Limits, SamplerConfig, StopReason};
use cleave_grammar::Constraint;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::api::{parse, ApiError, GenerationRequest, Prompt};
use crate::budget::{logit_bias, logprobs, max_new_tokens, penalties, sampling, Sampling};
use crate::dispatch::{Refused, ReplicaStats};
use crate::harmony::{self, Channels, HarmonyStream};
use crate::logprobs::{self as reports, TokenReport};
use crate::scheduler::{Event, Job, TextStats};
use crate::structured;
use crate::tools::{self, ToolRequest};
use crate::{AppState, EmbeddingService, ImageService, Served, TextService};

impl Served {
    /// What the model is, in words, and the routes it answers: for the
    /// 404s that name them.
    fn kind(&self) -> (&'static str, &'static str) {
        match self {
            Served::Text(_) => ("a language model", "/v1/models, /v1/completions, /v1/chat/completions"),
            Served::Images(_) => ("an image pipeline", "/v1/models, /v1/images/generations"),
            Served::Embeddings(_) => ("a sentence encoder", "/v1/models, /v1/embeddings"),
        }
    }
}

impl AppState {
    /// The 404 of a route that another kind of model serves: `what` it
    /// asked for.
    fn wrong_kind(&self, what: &str) -> ApiError {
        let (kind, routes) = self.served.kind();
        ApiError::not_found(format!(
            "{} is {kind}: this server serves {routes}, not {what}",
            self.model_id
        ))
    }

    /// The language model, or a 404 naming what this server serves.
    pub(crate) fn text(&self) -> Result<&TextService, ApiError> {
        match &self.served {
            Served::Text(text) => Ok(text),
            _ => Err(self.wrong_kind("text")),
        }
    }

    /// A request's `model`, which must be the served one when given.
    pub(crate) fn check_model(&self, asked: Option<&str>) -> Result<(), ApiError> {
        crate::api::check_model(asked, &self.model_id)
    }

    /// The image pipeline, or a 404 naming what this server serves.
    pub(crate) fn images(&self) -> Result<&ImageService, ApiError> {
        match &self.served {
            Served::Images(images) => Ok(images),
            _ => Err(self.wrong_kind("images")),
        }
    }

    /// The sentence encoder, or a 404 naming what this server serves.
    pub(crate) fn embeddings(&self) -> Result<&EmbeddingService, ApiError> {
        match &self.served {
            Served::Embeddings(embeddings) => Ok(embeddings),
            _ => Err(self.wrong_kind("embeddings")),
        }
    }
}

/// The error of a refused job.
pub(crate) fn refusal(refused: Refused) -> ApiError {
    match refused {
        Refused::Full => ApiError::overloaded(),
        Refused::Failed => ApiError::groups_failed(),
    }
}

/// Which OpenAI endpoint a request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Completion,
    Chat,
}

impl Endpoint {
    /// The request field that carries the prompt.
    fn prompt_field(self) -> &'static str {
        match self {
            Endpoint::Completion => "prompt",
            Endpoint::Chat => "messages",
        }
    }

    fn id_prefix(self) -> &'static str {
        match self {
            Endpoint::Completion => "cmpl",
            Endpoint::Chat => "chatcmpl",
        }
    }

    fn object(self, streaming: bool) -> &'static str {
        match (self, streaming) {
            (Endpoint::Completion, _) => "text_completion",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
        }
    }
}

/// `ok` while every group serves, `degraded` (still 200) when some have
/// failed or fail every request, `failed` with 503 when none serves.
pub async fn health(State(state): State<Arc<AppState>>) -> Response {
    let (groups, working) = state.served.groups();
    let (status, word) = match working {
        0 => (StatusCode::SERVICE_UNAVAILABLE, "failed"),
        n if n < groups => (StatusCode::OK, "degraded"),
        _ => (StatusCode::OK, "ok"),
    };
    (
        status,
        Json(json!({"status": word, "groups": groups, "groups_working": working})),
    )
        .into_response()
}

pub async fn models(State(state): State<Arc<AppState>>) -> Json<Value> {
    let mut model = json!({
        "id": state.model_id,
        "object": "model",
        "created": state.started,
        "owned_by": "cleave",
    });
    if let Served::Text(text) = &state.served {
        model["context_length"] = text.context.into();
    }
    Json(json!({"object": "list", "data": [model]}))
}

pub async fn completions(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    generate(state, body, Endpoint::Completion)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

pub async fn chat_completions(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    generate(state, body, Endpoint::Chat)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

pub async fn responses(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    crate::responses_api::responses(state, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

pub async fn embeddings(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    crate::embedding_api::embeddings(state, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

pub async fn image_generations(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    crate::image_api::generations(state, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

pub async fn not_found(State(state): State<Arc<AppState>>) -> ApiError {
    let (_, routes) = state.served.kind();
    ApiError::not_found(format!("no such endpoint (cleave serves {routes}, /health, /metrics)"))
}

/// Requires `Authorization: Bearer KEY` when the server has a key.
pub async fn require_key(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(key.as_str()) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(request).await
}

/// Reads the whole request body before any handler runs: a `Content-Length`
/// past `--max-body` is refused before a byte of it is read, and a body
/// that does not arrive within the read timeout (a client that announces
/// much and trickles) gets 408, so no client holds a connection that way.
pub async fn read_body(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let announced = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > state.max_body as u64) {
        return ApiError::too_large(state.max_body).into_response();
    }
    let (parts, body) = request.into_parts();
    let reading = Limited::new(body, state.max_body).collect();
    let bytes = match tokio::time::timeout(state.body_timeout, reading).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return ApiError::too_large(state.max_body).into_response()
        }
        Ok(Err(e)) => {
            return ApiError::invalid(format!("the request body could not be read: {e}"), None).into_response()
        }
        Err(_) => return ApiError::body_timeout(state.body_timeout).into_response(),
    };
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}

/// Counts every response by path and status, for `/metrics`.
pub async fn count(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let path = request.uri().path().to_string();
    let response = next.run(request).await;
    state.metrics.count(&path, response.status().as_u16());
    response
}

pub async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(&state.served, &state.model_id),
    )
}

/// The prompt ids, sampling and limits of a request, checked.
struct Checked {
    prompt_ids: Vec<u32>,
    sampler: SamplerConfig,
    limits: Limits,
    stop: Vec<String>,
    logit_bias: Vec<(u32, f32)>,
    logprobs: Option<usize>,
    constraint: Option<Constraint>,
    tools: Option<ToolRequest>,
    stream: bool,
    include_usage: bool,
}

fn check(state: &TextService, request: GenerationRequest, endpoint: Endpoint) -> Result<Checked, ApiError> {
    let tokenizer = &state.model.tokenizer;
    let within_bounds = |text: &str| {
        if text.len() > state.max_prompt_bytes {
            return Err(ApiError::invalid(
                format!(
                    "the prompt is {} bytes: more than this model's context of {} tokens can hold",
                    text.len(),
                    state.context
                ),
                Some(endpoint.prompt_field().into()),
            )
            .with_code("context_length_exceeded"));
        }
        Ok(())
    };
    let encoding_failed = |e: cleave_hf::ReadError| ApiError::invalid(e.to_string(), None);
    let encode = |text: &str| {
        within_bounds(text)?;
        tokenizer.encode(text).map_err(encoding_failed)
    };
    // A rendered chat is tokenized as transformers tokenizes it: its
    // template writes the BOS a model wants.
    let encode_chat = |text: &str| {
        within_bounds(text)?;
        tokenizer.encode_rendered(text).map_err(encoding_failed)
    };
    let tools = match endpoint {
        Endpoint::Chat => tools::check(
            request.tools.as_ref(),
            request.tool_choice.as_ref(),
            request.parallel_tool_calls,
            state.tool_format,
        )?,
        Endpoint::Completion if request.tools.as_ref().is_some_and(|t| !t.is_null()) => {
            return Err(ApiError::invalid(
                "tools are declared in the chat API (/v1/chat/completions)",
                Some("tools".into()),
            ))
        }
        Endpoint::Completion => None,
    };
    let prompt_ids = match (endpoint, request.prompt, request.messages) {
        (Endpoint::Completion, Some(Prompt::Text(text)), _) => encode(&text)?,
        (Endpoint::Completion, Some(Prompt::Texts(texts)), _) if texts.len() == 1 => encode(&texts[0])?,
        (Endpoint::Completion, Some(Prompt::Texts(_)), _) => {
            return Err(ApiError::invalid(
                "cleave takes one prompt per request",
                Some("prompt".into()),
            ))
        }
        (Endpoint::Completion, Some(Prompt::Ids(ids)), _) => ids,
        (Endpoint::Completion, None, _) => {
            return Err(ApiError::invalid("'prompt' is required", Some("prompt".into())))
        }
        (Endpoint::Chat, _, Some(messages)) if !messages.is_empty() => {
            encode_chat(&state.chat.render(&messages, tools.as_ref().map(|t| &t.tools))?)?
        }
        (Endpoint::Chat, _, _) => {
            return Err(ApiError::invalid(
                "'messages' must be a non-empty list",
                Some("messages".into()),
            ))
        }
    };
    if prompt_ids.is_empty() {
        return Err(ApiError::invalid("the prompt is empty", Some("prompt".into())));
    }
    let vocab = state.model.vocab_size();
    if let Some(id) = prompt_ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(ApiError::invalid(
            format!("token id {id} is outside the vocabulary (size {vocab})"),
            Some("prompt".into()),
        ));
    }
    if let Some(field) = request.unsupported.first_asked() {
        return Err(ApiError::invalid(
            format!("cleave does not implement '{field}' yet: leave it out (or null) for a plain answer"),
            Some(field.into()),
        ));
    }
    if request.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid(
            "cleave generates one choice per request (n = 1)",
            Some("n".into()),
        ));
    }
    let Sampling { temperature, top_p } = sampling(request.temperature, request.top_p)?;
    let penalties = penalties(
        request.presence_penalty,
        request.frequency_penalty,
        request.repeat_penalty,
        request.repeat_last_n,
    )?;
    let logprobs = logprobs(endpoint, request.logprobs, request.top_logprobs)?;
    let logit_bias = logit_bias(request.logit_bias, vocab)?;
    let tool_grammar = tools
        .as_ref()
        .and_then(|t| t.grammar(|text| tokenizer.special_id(text)))
        .map(|g| (g, "tool_choice"));
    let grammar = match (request.structured.grammar()?, tool_grammar) {
        (Some((_, field)), Some(_)) => {
            return Err(ApiError::invalid(
                format!("{field} and a tool_choice that asks for a call both constrain the answer: send one"),
                Some("tool_choice".into()),
            ))
        }
        (structured, tool) => structured.or(tool),
    };
    let constraint = match grammar {
        Some((grammar, field)) => Some(structured::compile(state.constrainer(field)?, &grammar, field)?),
        None => None,
    };
    let stop = request.stop.map(|s| s.into_vec()).unwrap_or_default();
    if stop.len() > 4 {
        return Err(ApiError::invalid("at most 4 stop sequences", Some("stop".into())));
    }
    // Without max_tokens, generate until EOS or a full context.
    let max_new_tokens = max_new_tokens(
        prompt_ids.len(),
        state.context,
        request.max_completion_tokens.or(request.max_tokens),
        endpoint.prompt_field(),
    )?;
    Ok(Checked {
        prompt_ids,
        sampler: SamplerConfig {
            temperature,
            top_k: request.top_k.unwrap_or(DEFAULT_TOP_K),
            top_p,
            seed: request.seed.map_or_else(fresh_seed, |s| s as u64),
            penalties,
        },
        limits: Limits {
            max_new_tokens,
            ignore_eos: request.ignore_eos.unwrap_or(false),
        },
        stop,
        logit_bias,
        logprobs,
        constraint,
        tools,
        stream: request.stream.unwrap_or(false),
        include_usage: request.stream_options.is_some_and(|o| o.include_usage),
    })
}

/// `cleave run`'s (and llama.cpp's) default.
const DEFAULT_TOP_K: usize = 40;

pub(crate) fn fresh_seed() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// The request body, or the error that says why there is none.
pub(crate) fn body(state: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::too_large(state.max_body),
        _ => ApiError::invalid(rejection.body_text(), None),
    })
}

async fn generate(
    state: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    endpoint: Endpoint,
) -> Result<Response, ApiError> {
    state.text()?;
    let request: GenerationRequest = parse(&crate::routes::body(&state, body)?)?;
    let queued = queue(&state, request, endpoint).await?;
    if queued.stream {
        Ok(stream(queued.reply, queued.events, queued.include_usage, queued.replica).into_response())
    } else {
        let answer = collect(queued.events, &queued.replica).await?;
        let reply = &queued.reply;
        let calls = reply
            .tools
            .as_ref()
            .map(|t| t.parse(&answer.text))
            .filter(|p| !p.calls.is_empty());
        let choice = match calls {
            Some(parsed) => reply.tool_call_choice(parsed.content.as_deref(), &parsed.calls, &answer.tokens),
            None if reply.harmony => {
                let channels = harmony::split(&answer.text);
                reply.channels_choice(&channels, &answer.tokens, finish_reason(answer.reason))
            }
            None => reply.choice(
                false,
                &answer.text,
                (&answer.tokens, 0),
                Some(finish_reason(answer.reason)),
            ),
        };
        let usage = reply.usage(answer.completion_tokens, answer.cached_tokens);
        Ok(Json(reply.object(false, choice, Some(usage))).into_response())
    }
}

/// A checked request on its replica's queue: what its answers share, the
/// events it will send, and the replica.
pub(crate) struct Queued {
    pub reply: Reply,
    pub events: mpsc::UnboundedReceiver<Event>,
    pub replica: Arc<ReplicaStats<TextStats>>,
    pub stream: bool,
    pub include_usage: bool,
}

/// Checks `request` as `endpoint` takes it and queues it on the
/// least-loaded replica.
pub(crate) async fn queue(
    state: &Arc<AppState>,
    request: GenerationRequest,
    endpoint: Endpoint,
) -> Result<Queued, ApiError> {
    let text = state.text()?;
    state.check_model(request.model.as_deref())?;
    // Rendering and tokenizing take CPU in proportion to the request: on a
    // blocking thread, they leave the async workers free for /health and
    // for streams.
    let checked = {
        let state = state.clone();
        tokio::task::spawn_blocking(move || check(state.text()?, request, endpoint))
            .await
            .map_err(|e| ApiError::internal(format!("checking the request failed: {e}")))??
    };
    let (events, receiver) = mpsc::unbounded_channel();
    // Chats of a model whose template writes harmony are read by channel.
    let harmony = endpoint == Endpoint::Chat && text.harmony;
    let prompt_tokens = checked.prompt_ids.len();
    let replica = text
        .dispatcher
        .submit(Job {
            prompt_ids: checked.prompt_ids,
            sampler: checked.sampler,
            limits: checked.limits,
            stop: checked.stop,
            logit_bias: checked.logit_bias,
            logprobs: checked.logprobs,
            constraint: checked.constraint,
            // Harmony's channels are read from their markers.
            special_tokens: checked
                .tools
                .as_ref()
                .is_some_and(|t| t.format().keeps_special_tokens())
                || harmony,
            events,
        })
        .map_err(refusal)?;
    let reply = Reply {
        id: format!("{}-{:x}", endpoint.id_prefix(), fresh_seed()),
        model: state.model_id.clone(),
        created: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        endpoint,
        prompt_tokens,
        logprobs: checked.logprobs.is_some(),
        tools: checked.tools,
        harmony,
    };
    Ok(Queued {
        reply,
        events: receiver,
        replica,
        stream: checked.stream,
        include_usage: checked.include_usage,
    })
}

/// What every response of one request shares.
pub(crate) struct Reply {
    id: String,
    pub model: String,
    pub created: u64,
    endpoint: Endpoint,
    pub prompt_tokens: usize,
    /// Whether each choice carries its tokens' log-probabilities.
    logprobs: bool,
    /// The functions the answer may call, where it may.
    pub tools: Option<ToolRequest>,
    /// Whether the answer is read by harmony's channels.
    pub harmony: bool,
}

impl Reply {
    /// `usage`, with the prompt's first `cached_tokens` read from a
    /// slot's cache.
    fn usage(&self, completion_tokens: usize, cached_tokens: usize) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens},
        })
    }

    /// A response object with `choices` (and `usage`, when given).
    fn object(&self, streaming: bool, choice: Value, usage: Option<Value>) -> Value {
        let mut object = json!({
            "id": self.id,
            "object": self.endpoint.object(streaming),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        });
        if let Some(usage) = usage {
            object["usage"] = usage;
        }
        object
    }

    /// A choice carrying `text`, the whole answer or a stream's piece, and
    /// the log-probabilities of its `tokens` (which start `offset`
    /// characters into the completion).
    fn choice(
        &self,
        streaming: bool,
        text: &str,
        (tokens, offset): (&[TokenReport], usize),
        finish: Option<&str>,
    ) -> Value {
        let logprobs = match (self.logprobs, self.endpoint) {
            (false, _) => Value::Null,
            (true, Endpoint::Completion) => reports::completion(tokens, offset),
            (true, Endpoint::Chat) => reports::chat(tokens),
        };
        match (self.endpoint, streaming) {
            (Endpoint::Completion, _) => {
                json!({"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish})
            }
            (Endpoint::Chat, false) => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
            (Endpoint::Chat, true) => {
                let delta = if finish.is_some() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                json!({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
            }
        }
    }
}

impl Reply {
    /// The whole answer's choice in harmony's channels: the final one as
    /// its content, the analysis as `reasoning_content`.
    fn channels_choice(&self, channels: &Channels, tokens: &[TokenReport], finish: &str) -> Value {
        let mut choice = self.choice(false, &channels.content, (tokens, 0), Some(finish));
        choice["message"]["reasoning_content"] = json!(channels.reasoning);
        choice
    }

    /// A stream's chunk of harmony's channels: its reasoning and its
    /// content, where each has text.
    fn channels_delta(&self, channels: &Channels, tokens: (&[TokenReport], usize)) -> Value {
        let mut choice = self.choice(true, &channels.content, tokens, None);
        if channels.content.is_empty() {
            choice["delta"] = json!({});
        }
        if !channels.reasoning.is_empty() {
            choice["delta"]["reasoning_content"] = json!(channels.reasoning);
        }
        self.object(true, choice, None)
    }

    /// The whole answer's choice where the model called tools: its
    /// message's content (none but the text around the calls) and calls.
    fn tool_call_choice(&self, content: Option<&str>, calls: &[tools::ToolCall], tokens: &[TokenReport]) -> Value {
        let logprobs = if self.logprobs {
            reports::chat(tokens)
        } else {
            Value::Null
        };
        json!({
            "index": 0,
            "message": {"role": "assistant", "content": content, "tool_calls": self.calls_json(calls, false)},
            "logprobs": logprobs,
            "finish_reason": "tool_calls",
        })
    }

    /// `calls` as OpenAI's `tool_calls` entries, with fresh ids as the
    /// model's templates take them back (calls come only where tools do).
    fn calls_json(&self, calls: &[tools::ToolCall], streaming: bool) -> Value {
        match &self.tools {
            Some(tools) => tools.calls_json(calls, streaming, fresh_seed()),
            None => json!([]),
        }
    }

    /// A stream's chunk holding the answer's calls.
    fn tool_call_delta(&self, calls: &[tools::ToolCall]) -> Value {
        let delta = json!({"tool_calls": self.calls_json(calls, true)});
        self.object(
            true,
            json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": null}),
            None,
        )
    }
}

/// OpenAI's finish reasons: "stop" for EOS or a stop string, "length" for
/// max_tokens or a full context.
fn finish_reason(reason: StopReason) -> &'static str {
    match reason {
        StopReason::Eos | StopReason::Stop => "stop",
        StopReason::Length | StopReason::ContextFull => "length",
        // A stream whose client left has no one to tell.
        StopReason::Cancelled => "stop",
    }
}

/// A whole answer: its text, its tokens' log-probabilities (where
/// asked), why it ended, and its tokens generated and read from a cache.
pub(crate) struct Answer {
    pub text: String,
    pub tokens: Vec<TokenReport>,
    pub reason: StopReason,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
}

/// Waits for the whole answer, noting how it ended on `replica`.
pub(crate) async fn collect(
    mut events: mpsc::UnboundedReceiver<Event>,
    replica: &ReplicaStats<TextStats>,
) -> Result<Answer, ApiError> {
    let mut text = String::new();
    let mut tokens = Vec::new();
    while let Some(event) = events.recv().await {
        match event {
            Event::Text(piece) => text.push_str(&piece),
            Event::Logprobs(token) => tokens.push(token),
            Event::Done {
                reason,
                completion_tokens,
                cached_tokens,
            } => {
                replica.note_outcome(true);
                return Ok(Answer {
                    text,
                    tokens,
                    reason,
                    completion_tokens,
                    cached_tokens,
                });
            }
            Event::Error(message) => {
                replica.note_outcome(false);
                return Err(ApiError::internal(message));
            }
        }
    }
    Err(ApiError::internal(
        "the request ended without an answer (the server is shutting down?)",
    ))
}

/// Streams the answer as Server-Sent Events ending in `data: [DONE]`, each
/// chunk with the log-probabilities of the tokens since the last (where
/// asked). A client that goes away drops the stream, which closes
/// `events`, which frees the job's slot at the replica's next step.
fn stream(
    reply: Reply,
    mut events: mpsc::UnboundedReceiver<Event>,
    include_usage: bool,
    replica: Arc<ReplicaStats<TextStats>>,
) -> impl IntoResponse {
    let (sender, receiver) = mpsc::channel::<Result<SseEvent, Infallible>>(16);
    tokio::spawn(async move {
        let send = |value: Value| sender.send(Ok(SseEvent::default().data(value.to_string())));
        if reply.endpoint == Endpoint::Chat {
            let role = json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null});
            if send(reply.object(true, role, None)).await.is_err() {
                return;
            }
        }
        // The tokens not yet sent, and the characters of those sent.
        let mut tokens = Vec::new();
        let mut offset = 0;
        // Where the answer may call tools, what may be a call is held back.
        let mut held = reply.tools.as_ref().map(ToolRequest::stream);
        let mut channels = reply.harmony.then(HarmonyStream::default);
        while let Some(event) = events.recv().await {
            let chunk = match event {
                Event::Logprobs(token) => {
                    tokens.push(token);
                    continue;
                }
                Event::Text(piece) if channels.is_some() => {
                    // Calls are read from the whole answer at its end.
                    if let Some(held) = &mut held {
                        held.push(&piece);
                    }
                    let out = channels.as_mut().map(|c| c.push(&piece)).unwrap_or_default();
                    if !out.has_text() {
                        continue;
                    }
                    reply.channels_delta(&out, (&tokens, offset))
                }
                Event::Text(piece) => {
                    let piece = match &mut held {
                        Some(held) => held.push(&piece),
                        None => piece,
                    };
                    if piece.is_empty() {
                        continue;
                    }
                    reply.object(true, reply.choice(true, &piece, (&tokens, offset), None), None)
                }
                Event::Done {
                    reason,
                    completion_tokens,
                    cached_tokens,
                } => {
                    replica.note_outcome(true);
                    let mut finish = finish_reason(reason);
                    let rest = channels.take().map(HarmonyStream::finish).filter(Channels::has_text);
                    if let Some(rest) = rest {
                        if send(reply.channels_delta(&rest, (&tokens, offset))).await.is_err() {
                            return;
                        }
                        offset += reports::chars(&tokens);
                        tokens.clear();
                    }
                    if let Some(held) = held.take() {
                        let (mut rest, calls) = held.finish();
                        // Harmony's channels were handed out above.
                        if reply.harmony {
                            rest.clear();
                        }
                        let mut chunks = Vec::new();
                        if !rest.is_empty() {
                            chunks.push(reply.object(true, reply.choice(true, &rest, (&tokens, offset), None), None));
                            offset += reports::chars(&tokens);
                            tokens.clear();
                        }
                        if !calls.is_empty() {
                            chunks.push(reply.tool_call_delta(&calls));
                            finish = "tool_calls";
                        }
                        for chunk in chunks {
                            if send(chunk).await.is_err() {
                                return;
                            }
                        }
                    }
                    let usage = include_usage.then(|| reply.usage(completion_tokens, cached_tokens));
                    let choice = reply.choice(true, "", (&tokens, offset), Some(finish));
                    reply.object(true, choice, usage)
                }
                Event::Error(message) => {
                    replica.note_outcome(false);
                    ApiError::internal(message).body()
                }
            };
            offset += reports::chars(&tokens);
            tokens.clear();
            if send(chunk).await.is_err() {
                return;
            }
        }
        let _ = sender.send(Ok(SseEvent::default().data("[DONE]"))).await;
    });
    Sse::new(ReceiverStream::new(receiver)).keep_alive(KeepAlive::default())
}
