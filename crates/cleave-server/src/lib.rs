//! cleave's OpenAI-compatible server: one replica of the model per device
//! group, requests to the least-loaded one. A language model decodes
//! several sequences together on each replica; a FLUX pipeline draws one
//! image at a time on each.

mod api;
mod budget;
mod chat;
mod chat_json;
mod chat_process;
mod dispatch;
mod embedding_api;
mod embeddings;
mod harmony;
mod image_api;
mod images;
mod listen;
mod logprobs;
mod metrics;
mod prefix;
mod responses_api;
mod routes;
mod scheduler;
mod structured;
mod tools;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use cleave_grammar::Constrainer;
use cleave_models::{EncoderDir, FluxDir, ModelDir};

use crate::api::ApiError;

pub use api::{parse as parse_request, GenerationRequest, Message};
pub use chat::ChatTemplate;
pub use chat_process::{render_chat_command, ChatRenderer, RenderLimits};
pub use dispatch::{Dispatcher, ReplicaHandle, ReplicaStats};
pub use embeddings::{start_embedding_replica, EmbeddingDispatcher, EmbeddingReplicaConfig, EmbeddingStats};
pub use image_api::ImageRequest;
pub use images::{start_image_replica, ImageDispatcher, ImageReplicaConfig, ImageStats};
pub use listen::ConnectionLimits;
pub use scheduler::{start_replica, ReplicaConfig, TextDispatcher, TextStats};
pub use tools::ToolFormat;

use metrics::Metrics;

/// How the server listens and behaves, beside its replicas.
pub struct ServeOptions {
    /// Bound before the model loads, so a taken port fails at once.
    pub listener: std::net::TcpListener,
    /// Required as `Authorization: Bearer KEY` on /v1 (and /metrics) when set.
    pub api_key: Option<String>,
    /// Serve /metrics without the API key.
    pub metrics_public: bool,
    /// Largest request body, in bytes.
    pub max_body: usize,
    /// How long a request's body may take to arrive.
    pub body_timeout: Duration,
    /// Open connections, and how long a request's headers may take.
    pub connections: ConnectionLimits,
    /// After SIGINT/SIGTERM, how long running requests may go on.
    pub shutdown_deadline: Duration,
    /// The model's name in /v1/models and in responses.
    pub model_id: String,
}

/// What a server serves: the kind of its model directory decides its
/// routes.
pub enum Served {
    Text(Box<TextService>),
    Images(ImageService),
    Embeddings(EmbeddingService),
}

/// A causal language model: completions and chat.
pub struct TextService {
    pub model: Arc<ModelDir>,
    /// Positions each sequence may hold.
    pub context: usize,
    pub chat: ChatRenderer,
    pub dispatcher: TextDispatcher,
    /// A prompt text longer than this cannot fit the context, whatever it
    /// encodes to: it is refused before the tokenizer sees it.
    pub max_prompt_bytes: usize,
    /// What the grammars of structured outputs share for this model, built
    /// by the first request that asks for one.
    constrainer: OnceLock<Result<Constrainer, String>>,
    /// How the model writes tool calls: read from its chat template, or
    /// given (`--tool-format`); none where it writes none cleave reads.
    pub tool_format: Option<ToolFormat>,
    /// Whether the model's chat template writes gpt-oss's harmony format,
    /// whose answers are read by channel ([`harmony`]).
    pub harmony: bool,
}

impl TextService {
    pub fn new(model: Arc<ModelDir>, context: usize, chat: ChatRenderer, dispatcher: TextDispatcher) -> Self {
        // Normalizers can fold a few bytes into one (composing accents):
        // leave room for that, the bound only has to stop texts that are
        // far too long.
        let max_prompt_bytes = context
            .saturating_mul(model.tokenizer.longest_token_bytes())
            .saturating_mul(4);
        let tool_format = model.tokenizer.chat_template().and_then(ToolFormat::of_template);
        let harmony = model.tokenizer.chat_template().is_some_and(harmony::is_harmony);
        TextService {
            model,
            context,
            chat,
            dispatcher,
            max_prompt_bytes,
            constrainer: OnceLock::new(),
            tool_format,
            harmony,
        }
    }

    /// The model's constrainer, built on first use; a 400 where its
    /// tokenizer cannot be constrained.
    fn constrainer(&self, field: &str) -> Result<&Constrainer, ApiError> {
        let built = self
            .constrainer
            .get_or_init(|| Constrainer::new(&self.model.tokenizer).map_err(|e| e.to_string()));
        built
            .as_ref()
            .map_err(|reason| ApiError::invalid(format!("{field}: {reason}"), Some(field.into())))
    }
}

/// A sentence encoder: embeddings.
pub struct EmbeddingService {
    pub dir: Arc<EncoderDir>,
    pub dispatcher: EmbeddingDispatcher,
}

/// A FLUX pipeline: image generations.
pub struct ImageService {
    pub dir: Arc<FluxDir>,
    pub dispatcher: ImageDispatcher,
    /// The largest image a request may ask for, `(width, height)`: the
    /// plans were made for it.
    pub max_size: (usize, usize),
}

impl Served {
    /// Groups in all, and those that still serve: not failed, and not
    /// failing every request.
    fn groups(&self) -> (usize, usize) {
        match self {
            Served::Text(t) => (t.dispatcher.replicas.len(), t.dispatcher.healthy().count()),
            Served::Images(i) => (i.dispatcher.replicas.len(), i.dispatcher.healthy().count()),
            Served::Embeddings(e) => (e.dispatcher.replicas.len(), e.dispatcher.healthy().count()),
        }
    }

    /// At shutdown: work still waiting for its turn before it reaches a
    /// replica (chat renderings) is refused with a 503.
    fn stop_waiting(&self) {
        if let Served::Text(t) = self {
            t.chat.stop_waiting();
        }
    }

    /// Past the shutdown deadline: ends every running sequence, image and
    /// chat rendering.
    fn end_running(&self) {
        match self {
            Served::Text(t) => {
                t.dispatcher.cancel.store(true, Ordering::Relaxed);
                t.chat.end_running();
            }
            Served::Images(i) => i.dispatcher.cancel.store(true, Ordering::Relaxed),
            Served::Embeddings(e) => e.dispatcher.cancel.store(true, Ordering::Relaxed),
        }
    }
}

/// What every handler sees.
pub struct AppState {
    pub served: Served,
    pub model_id: String,
    pub api_key: Option<String>,
    pub metrics_public: bool,
    pub max_body: usize,
    pub body_timeout: Duration,
    pub metrics: Metrics,
    pub started: u64,
}

pub fn router(state: Arc<AppState>) -> Router {
    let keyed = Router::new()
        .route("/v1/models", get(routes::models))
        .route("/v1/completions", post(routes::completions))
        .route("/v1/chat/completions", post(routes::chat_completions))
        .route("/v1/images/generations", post(routes::image_generations))
        .route("/v1/embeddings", post(routes::embeddings))
        .route("/v1/responses", post(routes::responses));
    let (keyed, open) = if state.metrics_public {
        (keyed, Router::new().route("/metrics", get(routes::metrics)))
    } else {
        (keyed.route("/metrics", get(routes::metrics)), Router::new())
    };
    let keyed = keyed.route_layer(axum::middleware::from_fn_with_state(state.clone(), routes::require_key));
    Router::new()
        .merge(keyed)
        .merge(open)
        .route("/health", get(routes::health))
        .fallback(routes::not_found)
        .layer(axum::middleware::from_fn_with_state(state.clone(), routes::read_body))
        .layer(axum::middleware::from_fn_with_state(state.clone(), routes::count))
        // The body is whole by now (read_body); this lets the handlers take it.
        .layer(DefaultBodyLimit::max(state.max_body))
        .with_state(state)
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Serves until SIGINT or SIGTERM, then stops accepting, refuses what
/// still waits for its turn, lets running requests finish for up to the
/// deadline, ends the rest, and returns. `on_listening` is told the bound
/// address (useful with port 0).
pub fn serve(options: ServeOptions, served: Served, on_listening: impl FnOnce(SocketAddr)) -> Result<(), ServeError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let state = Arc::new(AppState {
        served,
        model_id: options.model_id,
        api_key: options.api_key,
        metrics_public: options.metrics_public,
        max_body: options.max_body,
        body_timeout: options.body_timeout,
        metrics: Metrics::default(),
        started: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
    });
    let result = runtime.block_on(async move {
        options.listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(options.listener)?;
        on_listening(listener.local_addr()?);
        let (stopping, mut stopped) = tokio::sync::watch::channel(false);
        let server = listen::serve_connections(listener, router(state.clone()), options.connections, async move {
            shutdown_signal().await;
            let _ = stopping.send(true);
        });
        let mut server = tokio::spawn(server);
        tokio::select! {
            done = &mut server => return joined(done),
            _ = stopped.wait_for(|s| *s) => {}
        }
        state.served.stop_waiting();
        eprintln!(
            "shutting down: no new connections; running requests have {} s to finish",
            options.shutdown_deadline.as_secs()
        );
        if let Ok(done) = tokio::time::timeout(options.shutdown_deadline, &mut server).await {
            return joined(done);
        }
        // Past the deadline: end every running sequence (each stream gets
        // an error event and closes), image and chat rendering (a 503),
        // and give the connections a moment.
        eprintln!("the deadline has passed: ending the requests still running");
        state.served.end_running();
        let _ = tokio::time::timeout(Duration::from_secs(2), &mut server).await;
        Ok(())
    });
    // Work on blocking threads (a rendering's last moments, a tokenizer
    // run) has been told to end: dropping the runtime would wait for all
    // of it without a bound.
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

/// The server task's outcome.
fn joined(done: Result<(), tokio::task::JoinError>) -> Result<(), ServeError> {
    done.map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(())
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(_) => return interrupt.await.unwrap_or(()),
        };
        tokio::select! {
            _ = interrupt => {},
            _ = terminate.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}
