//! A recording reverse proxy for the real-counterpart tests: placed between `policy-serving` and a
//! real engine, it forwards every request as it came and keeps each exchange (the request body,
//! the answer's bytes), so that a test compares the samples with exactly what the engine said.
//! Answers are forwarded once whole (a stream too: its events reach the proxy at once, in order,
//! as the engine wrote them).
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use serde_json::Value;

/// One exchange with the engine.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub path: String,
    pub request: Value,
    pub status: u16,
    /// The answer's body: JSON, or a stream's `data:` payloads (`[DONE]` left out).
    pub answer: Answer,
}

#[derive(Debug, Clone)]
pub enum Answer {
    Whole(Value),
    Stream(Vec<Value>),
}

impl Exchange {
    /// `choices[0].finish_reason`, from the whole answer or the stream chunk that carries it.
    pub fn finish_reason(&self) -> Option<String> {
        let of = |v: &Value| v["choices"][0]["finish_reason"].as_str().map(str::to_owned);
        match &self.answer {
            Answer::Whole(v) => of(v),
            Answer::Stream(chunks) => chunks.iter().rev().find_map(of),
        }
    }

    /// The engine's prompt ids, its sampled ids and their log-probs, read from the answer
    /// (`choices[0]`), streamed or not, wherever vLLM puts them.
    pub fn ids_and_logprobs(&self) -> Option<(Vec<u32>, Vec<u32>, Vec<f64>)> {
        let ids = |v: &Value| -> Option<Vec<u32>> {
            v.as_array()?
                .iter()
                .map(|x| x.as_u64().map(|n| n as u32))
                .collect()
        };
        let lps = |choice: &Value| -> Vec<f64> {
            choice["logprobs"]["content"]
                .as_array()
                .map(|c| c.iter().filter_map(|e| e["logprob"].as_f64()).collect())
                .unwrap_or_default()
        };
        match &self.answer {
            Answer::Whole(v) => Some((
                ids(&v["prompt_token_ids"])?,
                ids(&v["choices"][0]["token_ids"])?,
                lps(&v["choices"][0]),
            )),
            Answer::Stream(chunks) => {
                let mut prompt = None;
                let (mut response, mut logprobs) = (Vec::new(), Vec::new());
                for c in chunks {
                    if let Some(p) = ids(&c["prompt_token_ids"]) {
                        prompt = Some(p);
                    }
                    if let Some(choice) = c["choices"].get(0) {
                        response.extend(ids(&choice["token_ids"]).unwrap_or_default());
                        logprobs.extend(lps(choice));
                    }
                }
                Some((prompt?, response, logprobs))
            }
        }
    }
}

#[derive(Clone)]
struct Upstream {
    base: String,
    http: reqwest::Client,
    log: Arc<Mutex<Vec<Exchange>>>,
}

/// The recorder: `url()` stands for the engine's base URL.
pub struct Recorder {
    pub addr: std::net::SocketAddr,
    log: Arc<Mutex<Vec<Exchange>>>,
    _task: tokio::task::JoinHandle<()>,
}

impl Recorder {
    /// Forwards to `upstream_base` (`http://host:port`).
    pub async fn start(upstream_base: &str) -> Recorder {
        let log = Arc::new(Mutex::new(Vec::new()));
        let state = Upstream {
            base: upstream_base.trim_end_matches('/').to_owned(),
            // Bounded: an engine that stalls fails the test (the proxy's own timeout is longer).
            http: reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(600))
                .build()
                .unwrap(),
            log: log.clone(),
        };
        let app = axum::Router::new().fallback(forward).with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Recorder {
            addr,
            log,
            _task: task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn exchanges(&self) -> Vec<Exchange> {
        self.log.lock().unwrap().clone()
    }
}

async fn forward(State(up): State<Upstream>, req: Request) -> Response {
    let path = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let method = req.method().clone();
    let mut headers = req.headers().clone();
    headers.remove(axum::http::header::HOST);
    let body = axum::body::to_bytes(req.into_body(), 64 << 20)
        .await
        .unwrap();
    let resp = up
        .http
        .request(method, format!("{}{path}", up.base))
        .headers(headers)
        .body(body.clone())
        .send()
        .await;
    let resp = match resp {
        Ok(r) => r,
        Err(e) => {
            let mut r = Response::new(axum::body::Body::from(e.to_string()));
            *r.status_mut() = StatusCode::BAD_GATEWAY;
            return r;
        }
    };
    let status = resp.status().as_u16();
    let content_type = resp.headers().get("content-type").cloned();
    let bytes: Bytes = resp.bytes().await.unwrap_or_default();
    let stream = content_type
        .as_ref()
        .and_then(|c| c.to_str().ok())
        .is_some_and(|c| c.contains("text/event-stream"));
    let answer = if stream {
        let text = String::from_utf8_lossy(&bytes);
        Answer::Stream(
            text.split("\n\n")
                .filter_map(|ev| ev.trim().strip_prefix("data:"))
                .map(str::trim)
                .filter(|d| *d != "[DONE]")
                .filter_map(|d| serde_json::from_str(d).ok())
                .collect(),
        )
    } else {
        Answer::Whole(serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    };
    up.log.lock().unwrap().push(Exchange {
        path,
        request: serde_json::from_slice(&body).unwrap_or(Value::Null),
        status,
        answer,
    });
    let mut r = Response::new(axum::body::Body::from(bytes));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    if let Some(c) = content_type {
        r.headers_mut().insert("content-type", c);
    } else {
        r.headers_mut()
            .insert("content-type", HeaderValue::from_static("application/json"));
    }
    r
}
