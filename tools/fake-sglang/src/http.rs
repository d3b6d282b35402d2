//! Response helpers shared by the routes: SGLang's error bodies, the request prelude (record, auth,
//! in-flight, gate, faults, latency) and the SSE body with its stream faults.

use std::{io, time::Duration};

use axum::{
    body::{Body, Bytes, to_bytes},
    extract::{ConnectInfo, Request},
    http::{HeaderValue, StatusCode, header, request::Parts},
    response::{IntoResponse, Response},
};
use futures::{StreamExt, stream};
use serde_json::{Value, json};

use crate::{
    Fault,
    net::ConnKill,
    state::{FakeState, InFlightGuard},
};

/// Largest request body the fake accepts.
const MAX_BODY: usize = 64 * 1024 * 1024;

/// Pause before a cut, so the bytes sent before it reach the client first.
const CUT_FLUSH: Duration = Duration::from_millis(20);

/// Which error shape a route uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// OpenAI routes: flat `{object, message, type, param, code}`.
    OpenAi,
    /// Native `/generate`: `{"error": {"message"}}`.
    Native,
}

pub(crate) fn json_response(status: StatusCode, body: &Value) -> Response {
    // The same bytes as `to_string`, without the `fmt::Write` adapter (a `Value` always serializes).
    let bytes = serde_json::to_vec(body).unwrap_or_else(|_| body.to_string().into_bytes());
    (status, [(header::CONTENT_TYPE, "application/json")], bytes).into_response()
}

/// SGLang's flat OpenAI-route error body.
pub(crate) fn flat_error(status: StatusCode, kind: &str, message: &str) -> Response {
    json_response(
        status,
        &json!({
            "object": "error",
            "message": message,
            "type": kind,
            "param": null,
            "code": status.as_u16(),
        }),
    )
}

/// SGLang's `/generate` error body.
pub(crate) fn native_error(status: StatusCode, message: &str) -> Response {
    json_response(status, &json!({"error": {"message": message}}))
}

pub(crate) fn route_error(route: Route, status: StatusCode, message: &str) -> Response {
    match route {
        Route::OpenAi => {
            let kind = if status.is_server_error() {
                "InternalServerError"
            } else {
                "BadRequestError"
            };
            flat_error(status, kind, message)
        }
        Route::Native => native_error(status, message),
    }
}

/// A request that passed the prelude.
pub(crate) struct Admitted {
    pub body: Result<Value, String>,
    pub guard: InFlightGuard,
    /// `CutStream` / `StreamError` still to be applied by the route (they need the answer).
    pub stream_fault: Option<Fault>,
}

/// Records the request, checks the API key, counts it in flight, waits at the gate, applies the
/// request-level faults and the configured latency.
pub(crate) async fn prelude(
    state: &FakeState,
    route: Route,
    req: Request,
) -> Result<Admitted, Response> {
    let (parts, body) = req.into_parts();
    let bytes = to_bytes(body, MAX_BODY).await.map_err(|e| {
        route_error(
            route,
            StatusCode::BAD_REQUEST,
            &format!("cannot read body: {e}"),
        )
    })?;
    let parsed: Result<Value, String> = if bytes.is_empty() {
        Err("request body is empty".to_owned())
    } else {
        serde_json::from_slice(&bytes).map_err(|e| format!("JSON decode error: {e}"))
    };
    let recorded = match &parsed {
        Ok(v) => v.clone(),
        Err(_) if bytes.is_empty() => Value::Null,
        Err(_) => Value::String(String::from_utf8_lossy(&bytes).into_owned()),
    };
    state.record(
        parts.method.as_str(),
        parts.uri.path(),
        &parts.headers,
        recorded,
    );
    if !state.authorized(&parts.headers) {
        return Err(json_response(
            StatusCode::UNAUTHORIZED,
            &json!({"error": "Unauthorized"}),
        ));
    }
    let guard = state.enter();
    state.pass_gate().await;
    let stream_fault = match state.take_fault() {
        None => None,
        Some(Fault::Delay(d)) => {
            tokio::time::sleep(d).await;
            None
        }
        Some(Fault::Refuse) => return Err(refuse(&parts)),
        Some(Fault::Status(code, body)) => return Err(status_fault(code, body)),
        Some(Fault::Garbage) => {
            return Err((
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                "<html>fake-sglang garbage: this is not JSON</html>",
            )
                .into_response());
        }
        Some(f @ (Fault::CutStream { .. } | Fault::StreamError { .. })) => Some(f),
    };
    let latency = state.config().latency;
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    Ok(Admitted {
        body: parsed,
        guard,
        stream_fault,
    })
}

/// Drops the connection without an answer: kills the socket when served by the fake's own listener,
/// and in any case answers with a body that fails at once.
fn refuse(parts: &Parts) -> Response {
    if let Some(ConnectInfo(kill)) = parts.extensions.get::<ConnectInfo<ConnKill>>() {
        kill.kill();
    }
    let body = stream::once(async {
        Err::<Bytes, io::Error>(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "fake-sglang fault: refuse",
        ))
    });
    Response::new(Body::from_stream(body))
}

fn status_fault(code: u16, body: String) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let content_type = if serde_json::from_str::<Value>(&body).is_ok() {
        "application/json"
    } else {
        "text/plain; charset=utf-8"
    };
    (status, [(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// A non-streaming answer under a stream fault: `CutStream` sends half the body then drops the
/// connection; `StreamError` answers 500.
pub(crate) fn faulted_json(route: Route, fault: Option<&Fault>, body: &Value) -> Response {
    match fault {
        Some(Fault::CutStream { .. }) => {
            let text = body.to_string();
            let half = Bytes::from(text.as_bytes()[..text.len() / 2].to_vec());
            let chunks = stream::iter([Some(half), None]).then(|item| async move {
                match item {
                    Some(b) => Ok(b),
                    None => {
                        // Let hyper flush what was sent before the connection is dropped.
                        tokio::time::sleep(CUT_FLUSH).await;
                        Err(io::Error::new(
                            io::ErrorKind::ConnectionAborted,
                            "fake-sglang fault: cut",
                        ))
                    }
                }
            });
            let mut resp = Response::new(Body::from_stream(chunks));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            resp
        }
        Some(Fault::StreamError { .. }) => route_error(
            route,
            StatusCode::INTERNAL_SERVER_ERROR,
            "fake-sglang fault: internal error",
        ),
        _ => json_response(StatusCode::OK, body),
    }
}

/// One SSE event.
pub(crate) fn sse(data: &str) -> Bytes {
    Bytes::from(format!("data: {data}\n\n"))
}

/// Streams `events` (then `data: [DONE]`) with `delay` between events, applying a stream fault, and
/// keeps `guard` alive until the body ends.
pub(crate) fn sse_response(
    events: Vec<Bytes>,
    error_event: Value,
    fault: Option<Fault>,
    delay: Duration,
    guard: InFlightGuard,
) -> Response {
    enum Item {
        Data(Bytes),
        Cut,
    }
    let mut items: Vec<Item> = Vec::with_capacity(events.len() + 2);
    match fault {
        Some(Fault::CutStream { after_chunks }) => {
            items.extend(events.into_iter().take(after_chunks).map(Item::Data));
            items.push(Item::Cut);
        }
        Some(Fault::StreamError { after_chunks }) => {
            items.extend(events.into_iter().take(after_chunks).map(Item::Data));
            items.push(Item::Data(sse(&error_event.to_string())));
            items.push(Item::Data(sse("[DONE]")));
        }
        _ => {
            items.extend(events.into_iter().map(Item::Data));
            items.push(Item::Data(sse("[DONE]")));
        }
    }
    let body = stream::iter(items.into_iter().enumerate())
        .then(move |(i, item)| async move {
            if i > 0 && !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if matches!(item, Item::Cut) {
                // Let hyper flush the events sent so far before the connection is dropped.
                tokio::time::sleep(CUT_FLUSH).await;
            }
            item
        })
        .map(move |item| {
            let _alive = &guard;
            match item {
                Item::Data(b) => Ok(b),
                Item::Cut => Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "fake-sglang fault: stream cut",
                )),
            }
        });
    let mut resp = Response::new(Body::from_stream(body));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// Runs blocking work (tokenization, template rendering) off the executor.
pub(crate) async fn blocking<T: Send + 'static>(
    route: Route,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Response> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        route_error(
            route,
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("worker failed: {e}"),
        )
    })
}

/// Never fails; lets handlers return `Result<Response, Response>`.
pub(crate) fn either(r: Result<Response, Response>) -> Response {
    r.unwrap_or_else(|e| e)
}
