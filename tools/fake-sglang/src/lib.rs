//! An in-process simulator of SGLang's HTTP protocol, for tests, demos and benchmarks. It is never used
//! in production paths.
//!
//! It owns one idea: speak SGLang's wire protocol faithfully (see `docs/upstream-protocols.md`, sections
//! 1, 2, 5 and 6) from a deterministic fake model, on a real HTTP server bound to
//! `127.0.0.1:0`, with a request recorder, injectable [`Fault`]s and a hold/release gate so tests observe
//! in-flight state without sleeping. It depends on the chat-template crate only (for real token ids);
//! nothing in the serving path may depend on it.
//!
//! # The fake model
//! - **Chat** (`POST /v1/chat/completions`): the answer is a function of the request. With reasoning on
//!   (the default, unless `chat_template_kwargs.enable_thinking` is `false`) the model samples
//!   `<think>\n{reasoning}\n</think>\n\n{content}{eos}`, otherwise `{content}{eos}`, where the reasoning is
//!   `The user said: "<first words>". …` and the content `<Opener> You said "<first words>" (turn N).`
//!   (N = 1 + the number of assistant messages; "The tool returned" after a tool message). Non-ASCII
//!   characters of the echoed text are dropped so the text tokenizes cleanly. A `[reply_words=N]`
//!   directive in the last message lengthens the reasoning (the content when reasoning is off) by N
//!   words of that message, for benchmarks that need long replies. The sampled ids are the
//!   tokenizer's encoding of each part in turn (markers, whitespace, reasoning, content, eos). The
//!   prompt's ids are its full encoding; a bounded cache of encoded prefixes (`encoder.rs`,
//!   [`FakeBuilder::prefix_cache_bytes`]) makes a conversation's next prompt encode only what is
//!   new, as a real server's prefix cache, without changing any id.
//! - **Tool calls** when `tools` is non-empty and `tool_choice` is `"required"` or names a function, or
//!   (with `tool_choice` auto/absent) the *last message* is a user message containing `[call_tool]`.
//!   The sampled text then holds `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>` instead of
//!   content; arguments are derived from the tool's JSON schema.
//! - **`/generate`** with a text prompt (or `input_ids`, decoded) answers like a judge: a hint judge (the
//!   prompt mentions `[HINT_START]`) gives `[HINT_START]…[HINT_END]` and `\boxed{1}`, or `\boxed{-1}`;
//!   otherwise a PRM-like `\boxed{1|-1|0}`. A `FAKE_VOTES=1,-1,x` directive in the prompt scripts the
//!   votes: successive calls with that same text cycle through the list (`x` = no boxed value).
//!   With `return_logprob`, prompt logprobs follow SGLang's layout (entry 0 always null) with values
//!   [`teacher_logprob`] and [`teacher_top_logprobs`].
//! - A chat prompt containing `FAKE_PROMPT_DRIFT` is answered with its last prompt id replaced by
//!   the next id ([`drift_prompt`]): an engine whose template or tokenizer differs from the
//!   proxy's, for the drift check and what depends on it.
//! - **`/v1/completions`** answers in **vLLM's** shape (SGLang's own route differs): a token-id or text
//!   prompt with `prompt_logprobs: N` gives `prompt_logprobs[0] = null` and, at each later position, the
//!   prompt token with [`teacher_logprob`] plus the top-`N` of [`teacher_top_logprobs`] ranked `1..=N`;
//!   `return_token_ids` echoes `prompt_token_ids`. It stands in for a vLLM-served teacher.
//! - Sampled-token logprobs are [`policy_logprob`]`(id, position)`.
//!
//! # Streaming
//! One chunk per sampled token whose text delta is non-empty. The `<think>`/`</think>` markers and the
//! whitespace around them, the tool-call markup and the eos send no chunk, so their logprobs are lost, as
//! in SGLang (docs/upstream-protocols.md 1.3). Concatenated `reasoning_content`/`content` deltas equal the non-streamed fields.
//!
//! # Hosted provider
//! [`FakeProvider`] stands in for an external OpenAI-compatible provider (section 4): Bearer key,
//! nested error bodies, judge-like answers, scriptable [`ProviderFault`]s (429 with `Retry-After`,
//! 5xx, slow, garbage, rejected key) and an in-flight high-water mark for concurrency-cap tests.

mod chat;
mod completions;
mod det;
mod encoder;
mod fault;
mod generate;
mod http;
mod model;
mod net;
mod provider;
mod quirks;
mod server_task;
mod state;

use std::{
    net::SocketAddr,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use axum::{
    Router,
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, post},
};
use ps_chat_template::ChatTokenizer;
use serde_json::json;
use tokio::{net::TcpListener, sync::oneshot};

pub use det::{policy_logprob, teacher_logprob};
pub use encoder::DEFAULT_PREFIX_CACHE_BYTES;
pub use fault::{Fault, FaultParseError};
pub use generate::teacher_top_logprobs;
pub use model::{PROMPT_DRIFT, drift_prompt};
pub use provider::{
    FakeProvider, FakeProviderBuilder, FakeProviderHandle, ProviderFault, ProviderRequest,
};
pub use quirks::{IdField, MoeRouting, Quirks, StreamLogprobs};
pub use state::{FakeState, RecordedRequest};

use crate::server_task::ServerTask;
use crate::{
    http::json_response,
    net::{ConnKill, FakeListener},
    state::Config,
};

/// Entry point: `FakeSglang::builder()…spawn().await`.
#[derive(Debug, Clone, Copy)]
pub struct FakeSglang;

impl FakeSglang {
    pub fn builder() -> FakeBuilder {
        FakeBuilder::default()
    }
}

/// Configures a fake server.
pub struct FakeBuilder {
    tokenizer: Option<Arc<ChatTokenizer>>,
    model_name: String,
    latency: Duration,
    token_delay: Duration,
    api_key: Option<String>,
    reasoning: bool,
    record_limit: Option<usize>,
    quirks: Quirks,
    model_path: Option<String>,
    vocab_size: Option<u64>,
    model_info_route: bool,
    prefix_cache_bytes: usize,
}

/// The mini model's directory in this source tree: what the fake reports as its model and
/// tokenizer path unless told otherwise ([`FakeBuilder::model_path`]).
pub const MINI_MODEL_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../config/mini-model");
/// The mini model with images (`ChatTokenizer::mini_vl`): give it with [`FakeBuilder::tokenizer`]
/// and [`FakeBuilder::model_path`] for a Qwen-VL-style engine.
pub const MINI_VL_MODEL_DIR: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../config/mini-vl-model");

impl Default for FakeBuilder {
    fn default() -> Self {
        Self {
            tokenizer: None,
            model_name: "default".into(),
            latency: Duration::ZERO,
            token_delay: Duration::ZERO,
            api_key: None,
            reasoning: true,
            record_limit: None,
            quirks: Quirks::default(),
            model_path: Some(MINI_MODEL_DIR.to_owned()),
            vocab_size: None,
            model_info_route: true,
            prefix_cache_bytes: DEFAULT_PREFIX_CACHE_BYTES,
        }
    }
}

impl std::fmt::Debug for FakeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeBuilder")
            .field("model_name", &self.model_name)
            .field("latency", &self.latency)
            .field("token_delay", &self.token_delay)
            .field("api_key", &self.api_key.as_ref().map(|_| "<set>"))
            .field("reasoning", &self.reasoning)
            .finish_non_exhaustive()
    }
}

impl FakeBuilder {
    /// The tokenizer the fake samples with (default: [`ChatTokenizer::mini`]).
    pub fn tokenizer(mut self, tokenizer: Arc<ChatTokenizer>) -> Self {
        self.tokenizer = Some(tokenizer);
        self
    }

    /// The name `/v1/models` lists (default `"default"`). Responses echo the request's `model`.
    pub fn model_name(mut self, name: &str) -> Self {
        self.model_name = name.to_owned();
        self
    }

    /// Wait before the first byte of every chat / generate answer.
    pub fn latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    /// Wait between streamed chunks.
    pub fn token_delay(mut self, delay: Duration) -> Self {
        self.token_delay = delay;
        self
    }

    /// Require `Authorization: Bearer <key>` (except on `/health*`), as SGLang's `--api-key`.
    pub fn api_key(mut self, key: Option<String>) -> Self {
        self.api_key = key;
        self
    }

    /// Whether answers carry reasoning (default true, like a server with `--reasoning-parser`).
    pub fn reasoning(mut self, on: bool) -> Self {
        self.reasoning = on;
        self
    }

    /// Behave like another SGLang build ([`Quirks`]; default: current SGLang).
    pub fn quirks(mut self, quirks: Quirks) -> Self {
        self.quirks = quirks;
        self
    }

    /// Keep only the `n` most recent recorded requests. Tests keep them all (the default); a
    /// long-running standalone fake (benchmarks) would otherwise grow by every request it answered.
    pub fn record_limit(mut self, n: usize) -> Self {
        self.record_limit = Some(n);
        self
    }

    /// The path reported as the model's and tokenizer's directory, as a real server reports the
    /// directory it loaded: `model_path` and `tokenizer_path` of `GET /get_model_info`, `root` of
    /// `GET /v1/models`. Default: [`MINI_MODEL_DIR`] (set it when giving another tokenizer).
    /// `None`: nothing reported (`/get_model_info` answers 404, `/v1/models` has no `root`).
    pub fn model_path(mut self, path: Option<&str>) -> Self {
        self.model_path = path.map(str::to_owned);
        self
    }

    /// A `vocab_size` reported by `GET /get_model_info` (default: none, as most builds).
    pub fn vocab_size(mut self, n: Option<u64>) -> Self {
        self.vocab_size = n;
        self
    }

    /// Whether `GET /get_model_info` exists (default true, SGLang). `false`: it answers 404 and only
    /// `/v1/models` reports the path, as vLLM.
    pub fn model_info_route(mut self, on: bool) -> Self {
        self.model_info_route = on;
        self
    }

    /// Bound of the cache of encoded prompt prefixes, in bytes (default
    /// [`DEFAULT_PREFIX_CACHE_BYTES`]; 0 turns it off and every prompt is encoded whole). The ids
    /// are the same either way; the cache only saves the fake's CPU, as a real server's prefix
    /// cache saves its GPU.
    pub fn prefix_cache_bytes(mut self, bytes: usize) -> Self {
        self.prefix_cache_bytes = bytes;
        self
    }

    /// The state to serve with [`router`].
    pub fn build(self) -> FakeState {
        FakeState::new(Config {
            tokenizer: self
                .tokenizer
                .unwrap_or_else(|| Arc::new(ChatTokenizer::mini())),
            model_name: self.model_name,
            latency: self.latency,
            token_delay: self.token_delay,
            api_key: self.api_key,
            reasoning: self.reasoning,
            record_limit: self.record_limit,
            quirks: self.quirks,
            model_path: self.model_path,
            vocab_size: self.vocab_size,
            model_info_route: self.model_info_route,
            prompts: encoder::PromptEncoder::new(self.prefix_cache_bytes),
        })
    }

    /// Binds `127.0.0.1:0` and serves in the background.
    pub async fn spawn(self) -> std::io::Result<FakeHandle> {
        let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        self.serve(listener).await
    }

    /// Serves on `listener` in the background (used by the binary). [`Fault::Refuse`] kills the
    /// connection at socket level here.
    pub async fn serve(self, listener: TcpListener) -> std::io::Result<FakeHandle> {
        let addr = listener.local_addr()?;
        let state = self.build();
        let app = router(state.clone()).into_make_service_with_connect_info::<ConnKill>();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(FakeListener(listener), app)
                .with_graceful_shutdown(async move {
                    // A dropped sender also means stop.
                    let _ = stop_rx.await;
                })
                .await
        });
        tracing::debug!(%addr, "fake-sglang listening");
        Ok(FakeHandle {
            state,
            addr,
            server: ServerTask::new("fake-sglang", stop_tx, task),
        })
    }
}

/// A running fake server. Dropping it stops the server (and releases the gate).
pub struct FakeHandle {
    state: FakeState,
    addr: SocketAddr,
    server: ServerTask,
}

impl std::fmt::Debug for FakeHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeHandle")
            .field("addr", &self.addr)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl FakeHandle {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://127.0.0.1:PORT/v1/chat/completions`
    pub fn chat_url(&self) -> String {
        format!("{}/v1/chat/completions", self.base_url())
    }

    /// `http://127.0.0.1:PORT/v1/completions` (vLLM-shaped, for completions teachers)
    pub fn completions_url(&self) -> String {
        format!("{}/v1/completions", self.base_url())
    }

    /// `http://127.0.0.1:PORT/generate`
    pub fn generate_url(&self) -> String {
        format!("{}/generate", self.base_url())
    }

    /// The shared state (same controls as the methods below, plus the tokenizer).
    pub fn state(&self) -> &FakeState {
        &self.state
    }

    /// See [`FakeState::requests`].
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.state.requests()
    }

    /// See [`FakeState::clear_requests`].
    pub fn clear_requests(&self) {
        self.state.clear_requests();
    }

    /// See [`FakeState::wait_for_requests`].
    pub async fn wait_for_requests(&self, n: usize) {
        self.state.wait_for_requests(n).await;
    }

    /// See [`FakeState::set_fault`].
    pub fn set_fault(&self, fault: Option<Fault>) {
        self.state.set_fault(fault);
    }

    /// See [`FakeState::push_fault`].
    pub fn push_fault(&self, fault: Fault) {
        self.state.push_fault(fault);
    }

    /// See [`FakeState::hold`].
    pub fn hold(&self) {
        self.state.hold();
    }

    /// See [`FakeState::release`].
    pub fn release(&self) {
        self.state.release();
    }

    /// See [`FakeState::in_flight`].
    pub fn in_flight(&self) -> usize {
        self.state.in_flight()
    }

    /// See [`FakeState::wait_for_in_flight`].
    pub async fn wait_for_in_flight(&self, n: usize) {
        self.state.wait_for_in_flight(n).await;
    }

    /// See [`FakeState::wait_for_in_flight_at_most`].
    pub async fn wait_for_in_flight_at_most(&self, n: usize) {
        self.state.wait_for_in_flight_at_most(n).await;
    }

    /// Stops accepting, releases the gate and waits for in-flight requests to finish.
    pub async fn shutdown(mut self) {
        self.state.release();
        self.server.shutdown().await;
    }
}

impl Drop for FakeHandle {
    fn drop(&mut self) {
        self.state.release();
        // Dropping `server` stops and aborts the serving task.
    }
}

/// The fake's routes. Served with plain `axum::serve`, [`Fault::Refuse`] degrades to a response whose
/// body fails at once (the client still sees an error); [`FakeBuilder::serve`] kills the socket instead.
pub fn router(state: FakeState) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/health_generate", get(health))
        .route("/v1/models", get(models))
        .route("/get_model_info", get(model_info))
        .route("/get_server_info", get(server_info))
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions", post(completions::completions))
        .route(
            "/generate",
            post(generate::generate).put(generate::generate),
        )
        .fallback(not_found)
        .with_state(state)
}

async fn health(State(state): State<FakeState>) -> StatusCode {
    if state.unhealthy() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}

async fn models(State(state): State<FakeState>, headers: axum::http::HeaderMap) -> Response {
    if !state.authorized(&headers) {
        return json_response(StatusCode::UNAUTHORIZED, &json!({"error": "Unauthorized"}));
    }
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut model = json!({
        "id": state.model_name(),
        "object": "model",
        "created": created,
        "owned_by": if state.config().quirks.vllm { "vllm" } else { "sglang" },
        "max_model_len": 32768,
    });
    if let (Some(path), Some(m)) = (&state.config().model_path, model.as_object_mut()) {
        m.insert("root".into(), json!(path));
    }
    json_response(StatusCode::OK, &json!({"object": "list", "data": [model]}))
}

/// SGLang's `GET /get_model_info`: 404 when the fake reports no path (or plays vLLM).
/// SGLang's `GET /get_server_info` (its server arguments; the fake states the one the proxy
/// reads, `enable_return_routed_experts`). vLLM has no such route.
async fn server_info(State(state): State<FakeState>, headers: axum::http::HeaderMap) -> Response {
    if !state.authorized(&headers) {
        return json_response(StatusCode::UNAUTHORIZED, &json!({"error": "Unauthorized"}));
    }
    let quirks = &state.config().quirks;
    if quirks.vllm {
        return not_found().await;
    }
    json_response(
        StatusCode::OK,
        &json!({
            "enable_return_routed_experts": quirks.routed_experts.is_some(),
            "version": "fake",
        }),
    )
}

async fn model_info(State(state): State<FakeState>, headers: axum::http::HeaderMap) -> Response {
    if !state.authorized(&headers) {
        return json_response(StatusCode::UNAUTHORIZED, &json!({"error": "Unauthorized"}));
    }
    let config = state.config();
    let Some(path) = config
        .model_path
        .as_ref()
        .filter(|_| config.model_info_route && !config.quirks.vllm)
    else {
        return not_found().await;
    };
    let mut info = json!({
        "model_path": path,
        "tokenizer_path": path,
        "is_generation": true,
        "preferred_sampling_params": null,
        "weight_version": "default",
        "has_image_understanding": false,
        "has_audio_understanding": false,
    });
    if let (Some(n), Some(m)) = (config.vocab_size, info.as_object_mut()) {
        m.insert("vocab_size".into(), json!(n));
    }
    json_response(StatusCode::OK, &info)
}

async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        axum::Json(json!({"detail": "Not Found"})),
    )
        .into_response()
}
