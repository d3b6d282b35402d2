//! Harness: the real server on a free loopback port in front of the in-process fake SGLang, with a
//! channel sink that receives every captured turn.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use ps_chat_template::ChatTokenizer;
use ps_core::{CapturedTurn, TurnSink};
use ps_fake_sglang::{FakeHandle, FakeSglang};
use ps_server::{AppState, CaptureQueue, ServerOptions};
use ps_sglang_client::{SglangClient, SglangClientConfig};
use tokio::sync::mpsc;

/// A turn the server gave up on: (session id, turn, reason).
pub type Abandoned = (String, u64, String);

pub struct ChannelSink {
    turns: Mutex<mpsc::UnboundedSender<CapturedTurn>>,
    abandoned: Arc<Mutex<Vec<Abandoned>>>,
}

impl TurnSink for ChannelSink {
    fn accept(&self, turn: CapturedTurn) {
        let _ = self.turns.lock().unwrap().send(turn);
    }

    fn abandon(&self, session_id: &str, turn: u64, reason: &str) {
        self.abandoned
            .lock()
            .unwrap()
            .push((session_id.to_owned(), turn, reason.to_owned()));
    }
}

pub struct Harness {
    pub url: String,
    pub fake: Option<FakeHandle>,
    pub turns: mpsc::UnboundedReceiver<CapturedTurn>,
    pub tokenizer: Arc<ChatTokenizer>,
    /// Every turn abandoned so far, in order.
    pub abandoned: Arc<Mutex<Vec<Abandoned>>>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<()>>,
}

pub struct Setup {
    pub options: ServerOptions,
    pub timeout: Duration,
    pub chat_url: Option<String>,
    pub fake: Option<ps_fake_sglang::FakeBuilder>,
    pub max_turn_tokens: usize,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            options: ServerOptions {
                default_turn_type: ps_core::DefaultTurnType::Main,
                ..ServerOptions::default()
            },
            timeout: Duration::from_secs(10),
            chat_url: None,
            fake: Some(FakeSglang::builder()),
            max_turn_tokens: usize::MAX,
        }
    }
}

impl Harness {
    pub async fn start() -> Self {
        Self::with(Setup::default()).await
    }

    pub async fn with(setup: Setup) -> Self {
        let tokenizer = Arc::new(ChatTokenizer::mini());
        let fake = match setup.fake {
            Some(b) => Some(b.tokenizer(tokenizer.clone()).spawn().await.unwrap()),
            None => None,
        };
        let chat_url = setup
            .chat_url
            .or_else(|| fake.as_ref().map(FakeHandle::chat_url))
            .expect("a chat url");
        let policy = SglangClient::new(SglangClientConfig {
            chat_url,
            api_key: None,
            timeout: setup.timeout,
            connect_timeout: Duration::from_secs(2),
        })
        .unwrap();
        let (tx, turns) = mpsc::unbounded_channel();
        let abandoned = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::new(ChannelSink {
            turns: Mutex::new(tx),
            abandoned: abandoned.clone(),
        });
        let capture = CaptureQueue::start(
            tokenizer.clone(),
            sink,
            setup.options.align_policy,
            // Every engine-id turn is also re-tokenized and compared.
            ps_server::capture::DriftCheck::new(u64::MAX, 0),
            64,
            1,
        )
        .unwrap()
        .with_max_turn_tokens(setup.max_turn_tokens);
        let app = AppState::new(setup.options, Arc::new(policy), capture, None);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            ps_server::serve(listener, app, async {
                let _ = rx.await;
            })
            .await
            .unwrap();
        });
        Self {
            url,
            fake,
            turns,
            tokenizer,
            abandoned,
            shutdown: Some(tx),
            server: Some(server),
        }
    }

    pub fn fake(&self) -> &FakeHandle {
        self.fake.as_ref().expect("fake")
    }

    pub fn chat_url(&self) -> String {
        format!("{}/v1/chat/completions", self.url)
    }

    /// The next captured turn, failing after 10 s.
    pub async fn next_turn(&mut self) -> CapturedTurn {
        tokio::time::timeout(Duration::from_secs(10), self.turns.recv())
            .await
            .expect("a captured turn within 10 s")
            .expect("sink open")
    }

    /// Tells the server to shut down without waiting for it: it stops accepting connections and
    /// finishes the requests it is serving ([`Harness::stop`] then waits for it).
    pub fn signal_stop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    /// Stops the server and drains capture; returns every turn captured that was not yet read.
    pub async fn stop(mut self) -> Vec<CapturedTurn> {
        self.signal_stop();
        if let Some(s) = self.server.take() {
            s.await.unwrap();
        }
        let mut rest = Vec::new();
        while let Ok(t) = self.turns.try_recv() {
            rest.push(t);
        }
        rest
    }
}
