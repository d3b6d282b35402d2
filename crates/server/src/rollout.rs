//! The trainer-facing rollout API: pull samples (long-poll), commit what was consumed, pause and
//! resume submission around weight updates, status, and the PRM eval scores.
//!
//! | route | |
//! |---|---|
//! | `GET /v1/rollout/samples?after=SEQ&max=N&wait_ms=MS[&format=msgpack][&consumer=NAME]` | `{"samples": [{"seq", "sample"}], "last_seq"}`; waits up to `wait_ms` when nothing is newer than `after`; JSON, or MessagePack (named fields) with `format=msgpack` or `Accept: application/msgpack`; `consumer` names the reader in a Redis consumer group (default `trainer`) |
//! | `POST /v1/rollout/commit` `{"through": SEQ[, "consumer": NAME]}` | records what the trainer consumed |
//! | `POST /v1/rollout/pause`, `POST /v1/rollout/resume` | submission state |
//! | `GET /v1/rollout/status` | submission state, seqs, pending turns by reason, sessions, eval scores |
//! | `GET /v1/rollout/blobs/{hash}` | the bytes of an image a kept sample references (`images[].hash`); 404 `blob_not_found` once no kept sample does |
//! | `POST /v1/rollout/eval-scores/drain` | returns and clears the collected PRM scores |

use std::collections::HashMap;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use ps_core::{EncodedSample, LogError, StoredSample};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::plumbing::read_body;
use crate::state::AppState;
pub use crate::state::Rollout;

/// Default and largest `max` of one pull.
pub const DEFAULT_PULL_MAX: usize = 64;
pub const MAX_PULL_MAX: usize = 1024;
/// Longest long-poll.
pub const MAX_WAIT_MS: u64 = 60_000;

fn rollout(app: &AppState) -> Result<&Rollout, ApiError> {
    app.0.rollout.as_ref().ok_or(ApiError::RolloutDisabled)
}

fn parse_param<T: std::str::FromStr>(
    q: &HashMap<String, String>,
    name: &'static str,
    default: T,
    valid: impl Fn(&T) -> bool,
    expected: &str,
) -> Result<T, ApiError> {
    match q.get(name) {
        None => Ok(default),
        Some(raw) => raw
            .trim()
            .parse::<T>()
            .ok()
            .filter(|v| valid(v))
            .ok_or_else(|| {
                ApiError::invalid(
                    "invalid_query",
                    format!("query parameter `{name}` = {raw:?}: expected {expected}"),
                )
            }),
    }
}

/// Longest trainer consumer name (`consumer=` of a pull).
pub const MAX_CONSUMER_LEN: usize = 64;

/// The trainer's consumer name (default [`ps_core::log::DEFAULT_CONSUMER`]), checked.
fn consumer<'a>(
    given: Option<&'a str>,
    code: &'static str,
    what: &str,
) -> Result<&'a str, ApiError> {
    match given {
        None => Ok(ps_core::log::DEFAULT_CONSUMER),
        Some(c)
            if (1..=MAX_CONSUMER_LEN).contains(&c.len())
                && c.bytes().all(|b| {
                    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-')
                }) =>
        {
            Ok(c)
        }
        Some(c) => Err(ApiError::invalid(
            code,
            format!(
                "{what} `consumer` = {c:?}: expected 1 to {MAX_CONSUMER_LEN} of A-Z a-z 0-9 _ . : -"
            ),
        )),
    }
}

/// MessagePack's media type.
pub const MSGPACK: &str = "application/msgpack";

/// Whether the trainer asked for MessagePack (`format=msgpack`, or an `Accept` naming it).
fn wants_msgpack(q: &HashMap<String, String>, headers: &HeaderMap) -> Result<bool, ApiError> {
    match q.get("format").map(|f| f.trim().to_ascii_lowercase()) {
        Some(f) if f == "msgpack" => return Ok(true),
        Some(f) if f == "json" => return Ok(false),
        Some(f) => {
            return Err(ApiError::invalid(
                "invalid_query",
                format!("query parameter `format` = {f:?}: expected \"json\" or \"msgpack\""),
            ));
        }
        None => {}
    }
    Ok(headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains(MSGPACK) || a.contains("application/x-msgpack")))
}

#[derive(serde::Serialize)]
struct Page<'a> {
    samples: &'a [StoredSample],
    last_seq: u64,
}

pub async fn samples(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let r = rollout(&app)?;
    let msgpack = wants_msgpack(&q, &headers)?;
    let after = parse_param(&q, "after", 0u64, |_| true, "a sequence number (0 or more)")?;
    let max = parse_param(
        &q,
        "max",
        DEFAULT_PULL_MAX,
        |m| (1..=MAX_PULL_MAX).contains(m),
        &format!("an integer from 1 to {MAX_PULL_MAX}"),
    )?;
    let wait_ms = parse_param(
        &q,
        "wait_ms",
        0u64,
        |w| *w <= MAX_WAIT_MS,
        &format!("milliseconds from 0 to {MAX_WAIT_MS}"),
    )?;
    let consumer = consumer(
        q.get("consumer").map(String::as_str),
        "invalid_query",
        "query parameter",
    )?;
    let wait = Duration::from_millis(wait_ms);
    let _waiting = (wait_ms > 0).then(|| crate::state::Waiting::new(&app.0.waiting_pulls));
    let (body, content_type) = if msgpack {
        let records = long_poll(r, after, wait, || {
            r.store.read_records(after, max, consumer)
        })
        .await?;
        let last_seq = r.store.stats().await?.last_seq;
        let images = page_images(r, &records).await?;
        (msgpack_page(&records, last_seq, &images)?, MSGPACK)
    } else {
        let samples = long_poll(r, after, wait, || r.store.read(after, max, consumer)).await?;
        let page = Page {
            samples: &samples,
            last_seq: r.store.stats().await?.last_seq,
        };
        let mut body = Vec::with_capacity(page_size_hint(&samples));
        serde_json::to_writer(&mut body, &page).map_err(|e| ApiError::Encode(e.to_string()))?;
        (body, "application/json")
    };
    let mut resp = body.into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    Ok(resp)
}

/// The bytes of the image stored under `hash` (64 hex digits), while a kept sample references it.
pub async fn blob(
    State(app): State<AppState>,
    Path(hash): Path<String>,
) -> Result<Response, ApiError> {
    let r = rollout(&app)?;
    if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ApiError::invalid(
            "invalid_blob_hash",
            format!("{hash:?} is not an image hash (64 hex digits, a sample's images[].hash)"),
        ));
    }
    match r.store.blob(&hash.to_ascii_lowercase()).await? {
        Some(bytes) => {
            let mut resp = bytes.into_response();
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            Ok(resp)
        }
        None => Err(ApiError::NotFound {
            code: "blob_not_found",
            message: format!(
                "no kept sample references image {hash}{}",
                if r.store.keeps_images() {
                    " (its samples were committed and compacted, or it never was)"
                } else {
                    ": this sample store does not keep images"
                }
            ),
        }),
    }
}

/// At most this many bytes of images inline in one MessagePack page; the others are left to
/// `GET /v1/rollout/blobs/{hash}` (the Python bridge fetches what a page does not carry).
pub const MAX_PAGE_IMAGE_BYTES: usize = 64 << 20;

/// The images and blocks of routed experts the samples of a page reference, each once (hash →
/// bytes), up to [`MAX_PAGE_IMAGE_BYTES`]: a MessagePack page carries them inline. Only records
/// that hold an `images` or `rollout_routed_experts` key are decoded to find them. An image gone since the records were read (compacted
/// in between) is left out, as are those beyond the budget.
async fn page_images(
    r: &Rollout,
    records: &[EncodedSample],
) -> Result<Vec<(String, Vec<u8>)>, ApiError> {
    let mut hashes: Vec<String> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for rec in records {
        // The keys as MessagePack writes them: `images` and `rollout_routed_experts` (fixstr).
        let references = [&b"\xa6images"[..], b"\xb6rollout_routed_experts"]
            .iter()
            .any(|key| memchr::memmem::find(rec.record(), key).is_some());
        if !references {
            continue;
        }
        let sample = ps_core::codec::decode_sample(rec.seq(), rec.record())
            .map_err(|e| ApiError::Encode(format!("sample {}: {e}", rec.seq())))?;
        for blob in sample.blobs() {
            if seen.insert(blob.hash.to_owned()) {
                hashes.push(blob.hash.to_owned());
            }
        }
    }
    let mut out = Vec::with_capacity(hashes.len());
    let mut total = 0usize;
    for hash in hashes {
        if let Some(bytes) = r.store.blob(&hash).await? {
            total += bytes.len();
            if total > MAX_PAGE_IMAGE_BYTES {
                break;
            }
            out.push((hash, bytes));
        }
    }
    Ok(out)
}

/// What `read` returns once something newer than `after` was stored (at once when there is, or
/// when `wait` is 0), or empty once `wait` has passed.
async fn long_poll<T, F, Fut>(
    r: &Rollout,
    after: u64,
    wait: Duration,
    read: F,
) -> Result<Vec<T>, ApiError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Vec<T>, LogError>>,
{
    let deadline = tokio::time::Instant::now() + wait;
    let mut last_seq = r.store.wait_newer(after, wait).await?;
    let mut samples = read().await?;
    // Newer samples exist but went to other consumers (Redis consumer groups): wait for the next
    // append within what is left of `wait_ms` instead of answering at once (no busy polling).
    while samples.is_empty() && tokio::time::Instant::now() < deadline {
        let left = deadline - tokio::time::Instant::now();
        let newest = r.store.wait_newer(last_seq, left).await?;
        if newest <= last_seq {
            break;
        }
        last_seq = newest;
        samples = read().await?;
    }
    Ok(samples)
}

/// At least the size of the MessagePack page of `records` (written from records as stored):
/// each record grows by its envelope and seq (`{"seq": S, "sample": …}` and the values of `index`
/// and `group_index`: at most 37 bytes), the page by its own (at most 32).
fn msgpack_page_size(records: &[EncodedSample]) -> usize {
    records.iter().map(|s| s.record().len() + 48).sum::<usize>() + 32
}

/// A page in MessagePack with named fields, as `rmp_serde::encode::write_named` writes [`Page`]:
/// the trainer decodes it with `msgpack.unpackb` into the same dicts as JSON, at about half the
/// size (floats stay f64, bit-exact). Written from the stores' records without decoding them
/// ([`EncodedSample::write_named`]): each sample is copied, not decoded and encoded
/// again, which was ~9 % of the proxy's CPU in the agent scenario (docs/benchmarks-history.md).
fn msgpack_page(
    records: &[EncodedSample],
    last_seq: u64,
    images: &[(String, Vec<u8>)],
) -> Result<Vec<u8>, ApiError> {
    use rmp::encode::{write_array_len, write_bin, write_map_len, write_str, write_uint};
    let image_bytes: usize = images.iter().map(|(h, b)| h.len() + b.len() + 8).sum();
    let mut body = Vec::with_capacity(msgpack_page_size(records) + image_bytes);
    // Writing into a Vec cannot fail.
    let _ = write_map_len(&mut body, if images.is_empty() { 2 } else { 3 });
    let _ = write_str(&mut body, "samples");
    let _ = write_array_len(&mut body, u32::try_from(records.len()).unwrap_or(u32::MAX));
    for s in records {
        // A checked record decodes: not expected, but never a page with a sample left out.
        s.write_named(&mut body).map_err(|e| {
            ApiError::Encode(format!(
                "sample {} could not be read from its record: {e}",
                s.seq()
            ))
        })?;
    }
    let _ = write_str(&mut body, "last_seq");
    let _ = write_uint(&mut body, last_seq);
    // The page's images inline, each once (only when the page has any: a page without is the
    // one `write_named` makes of `Page`).
    if !images.is_empty() {
        let _ = write_str(&mut body, "images");
        let _ = write_map_len(&mut body, u32::try_from(images.len()).unwrap_or(u32::MAX));
        for (hash, bytes) in images {
            let _ = write_str(&mut body, hash);
            let _ = write_bin(&mut body, bytes);
        }
    }
    Ok(body)
}

/// About how many bytes `samples` take in a page (a little more than the usual shapes need): the
/// page is written into a buffer of that size at once. Written into a buffer that doubles as it
/// fills, as before, each doubling copied what was written and faulted in fresh pages: ~5 % of
/// the proxy's CPU in the agent scenario (docs/benchmarks-history.md). A page larger than the
/// hint only grows its buffer; the bytes written are the same either way.
fn page_size_hint(samples: &[StoredSample]) -> usize {
    // Per id (up to 6 digits and a comma) and per float (up to ~24 characters).
    let (per_id, per_float) = (7, 24);
    // A text's length as written: JSON escapes quotes, backslashes and control characters
    // (agent prompts are full of the JSON of tool schemas).
    let text = |t: &str| {
        t.len()
            + t.bytes()
                .map(|b| match b {
                    b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 1,
                    0..0x20 => 5,
                    _ => 0,
                })
                .sum::<usize>()
            + 2
    };
    let of = |s: &ps_core::sample::Sample| {
        let floats = s.rollout_log_probs.len()
            + s.teacher_log_probs.as_ref().map_or(0, Vec::len)
            + s.teacher_topk_log_probs
                .as_ref()
                .map_or(0, |t| t.iter().map(Vec::len).sum());
        let ids = s.tokens.len()
            + s.teacher_topk_indices
                .as_ref()
                .map_or(0, |t| t.iter().map(Vec::len).sum());
        let topk_rows = s.teacher_topk_log_probs.as_ref().map_or(0, Vec::len)
            + s.teacher_topk_indices.as_ref().map_or(0, Vec::len);
        text(&s.prompt) + text(&s.response)
            + topk_rows * 3
            + s.loss_mask.len() * 2
            + ids * per_id
            + floats * per_float
            // The other fields and the metadata (votes, hints, ids of the session).
            + 2048
    };
    samples.iter().map(|s| of(&s.sample)).sum::<usize>() + 64
}

/// Largest body of a rollout admin request (`{"through": SEQ}` is a few bytes).
pub const MAX_ADMIN_BODY_BYTES: usize = 64 * 1024;

pub async fn commit(
    State(app): State<AppState>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Json<Value>, ApiError> {
    let r = rollout(&app)?;
    let body = read_body(&headers, body, MAX_ADMIN_BODY_BYTES).await?;
    let v: Value =
        serde_json::from_slice(&body).map_err(|e| ApiError::InvalidJson(e.to_string()))?;
    let through = v.get("through").and_then(Value::as_u64).ok_or_else(|| {
        ApiError::invalid(
            "invalid_commit",
            format!(
                "`through` must be a sequence number (0 or more), got {}",
                v.get("through").unwrap_or(&Value::Null)
            ),
        )
    })?;
    let consumer = match v.get("consumer") {
        None | Some(Value::Null) => consumer(None, "invalid_commit", "field")?,
        Some(Value::String(c)) => consumer(Some(c), "invalid_commit", "field")?,
        Some(other) => {
            return Err(ApiError::invalid(
                "invalid_commit",
                format!("`consumer` must be a string, got {other}"),
            ));
        }
    };
    r.store.commit(through, consumer).await?;
    let st = r.store.stats().await?;
    Ok(Json(
        json!({"committed_seq": st.committed, "last_seq": st.last_seq}),
    ))
}

pub async fn pause(State(app): State<AppState>) -> Result<Json<Value>, ApiError> {
    let r = rollout(&app)?;
    app.set_submission(false);
    if let Some(h) = &r.on_pause {
        h.on_pause();
    }
    tracing::info!("submission paused by the trainer");
    Ok(Json(json!({"submission_enabled": false})))
}

/// `POST /v1/rollout/resume`, with an optional body `{"weight_version": V}`: the policy version the
/// trainer has just loaded, stamped on samples whose answer carries none (streamed answers).
pub async fn resume(
    State(app): State<AppState>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Json<Value>, ApiError> {
    rollout(&app)?;
    let body = read_body(&headers, body, MAX_ADMIN_BODY_BYTES).await?;
    let version = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        let v: Value =
            serde_json::from_slice(&body).map_err(|e| ApiError::InvalidJson(e.to_string()))?;
        match v.get("weight_version") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if !s.trim().is_empty() => Some(s.trim().to_owned()),
            Some(Value::Number(n)) => Some(n.to_string()),
            Some(other) => {
                return Err(ApiError::invalid(
                    "invalid_weight_version",
                    format!("`weight_version` must be a non-empty string or a number, got {other}"),
                ));
            }
        }
    };
    if let Some(v) = &version {
        app.set_trainer_weight_version(Some(v.clone()));
    }
    app.set_submission(true);
    tracing::info!(
        weight_version = version.as_deref(),
        "submission resumed by the trainer"
    );
    Ok(Json(
        json!({"submission_enabled": true, "weight_version": app.trainer_weight_version()}),
    ))
}

pub async fn status(State(app): State<AppState>) -> Result<Json<Value>, ApiError> {
    let r = rollout(&app)?;
    let st = r.store.stats().await?;
    let b = r.buffer.status();
    Ok(Json(json!({
        "submission_enabled": app.submission_enabled(),
        "pause_mode": app.options().pause_mode.as_str(),
        "next_seq": st.last_seq + 1,
        "last_seq": st.last_seq,
        "committed_seq": st.committed,
        "stored": st.stored,
        "lag": st.lag,
        "live_sessions": b.live_sessions,
        "pending": b.pending,
        "eval_scores": {"count": b.eval_scores, "mean": b.eval_score_mean},
        "samples": {
            "submitted": b.samples_submitted,
            "effective": b.samples_effective,
            "excluded": b.samples_excluded,
            "dropped": b.samples_dropped,
        },
        "turns_abandoned": b.turns_abandoned,
        "turns_dropped": b.turns_dropped,
        "held_requests": app.0.held_requests.load(std::sync::atomic::Ordering::Relaxed),
        "waiting_pulls": app.0.waiting_pulls.load(std::sync::atomic::Ordering::Relaxed),
        "teacher_mismatches": b.teacher_mismatches,
        // Positions of stored samples whose rollout log-prob is a 0.0 placeholder: trained (listed
        // per sample in metadata.trained_without_rollout_logprob) or taken out of the loss.
        "turns_abandoned_by_reason": b.turns_abandoned_by_reason,
        "turns_dropped_by_reason": b.turns_dropped_by_reason,
        "token_ids": app.capture().stats().to_json(),
        "routed_experts": app.capture().stats().experts.to_json(),
        "capture_queue": app.capture().queued().to_json(),
        "samples_by_token_source": b.samples_by_token_source,
        "samples_by_weight_version": b.samples_by_weight_version,
        "samples_by_sampling": b.samples_by_sampling,
        "trainer_weight_version": app.trainer_weight_version(),
        "positions_without_logprob": {
            "trained": b.positions_trained_without_logprob,
            "masked": b.positions_masked_without_logprob,
        },
        "mode": r.buffer.mode_name(),
        "store": r.store.describe(),
        "sessions": {"timed_out": b.sessions_timed_out, "evicted": b.sessions_evicted},
        "session_inference": crate::infer::status(app.options().inference.mode, app.0.matcher.as_ref()),
    })))
}

pub async fn drain_eval_scores(State(app): State<AppState>) -> Result<Json<Value>, ApiError> {
    let r = rollout(&app)?;
    let scores = r.buffer.drain_eval_scores();
    let mean = (!scores.is_empty()).then(|| scores.iter().sum::<f64>() / scores.len() as f64);
    Ok(Json(
        json!({"count": scores.len(), "mean": mean, "scores": scores}),
    ))
}

impl From<LogError> for ApiError {
    fn from(e: LogError) -> Self {
        ApiError::Store(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ps_core::sample::Sample;

    /// An agent-shaped sample: a long prompt with JSON in it, 12,000 ids of up to 6 digits, 450
    /// response tokens with log-probs, OPD's teacher log-probs and top-K, and some metadata.
    fn sample(seq: u64) -> StoredSample {
        let n = 450;
        let mut metadata = serde_json::Map::new();
        metadata.insert("votes".into(), json!([1, 1, -1]));
        metadata.insert("hint".into(), json!("Check the \"config\" path first.\n"));
        StoredSample {
            seq,
            sample: Sample {
                prompt: "<|im_start|>system\nYou are \"helpful\".\n{\"type\": \"function\"}\n"
                    .repeat(800),
                response: "The handler retries after a 503.\n".repeat(60),
                tokens: (0..12_000u32).map(|i| (i * 7919 + 13) % 151_000).collect(),
                response_length: n,
                loss_mask: vec![1; n],
                rollout_log_probs: (0..n).map(|i| -(i as f64) / 7.0 - 1e-9).collect(),
                teacher_log_probs: Some((0..n).map(|i| -(i as f64) / 3.0 - 1e-7).collect()),
                teacher_topk_log_probs: Some(vec![vec![-0.123_456_789_012_345; 4]; n]),
                teacher_topk_indices: Some(vec![vec![151_000, 12, 3, 45_678]; n]),
                session_id: "session-with-a-long-name".into(),
                metadata,
                ..Sample::default()
            },
        }
    }

    /// An RL sample (no teacher fields) whose prompt is mostly characters JSON escapes.
    fn escaped(seq: u64) -> StoredSample {
        let mut s = sample(seq);
        s.sample.prompt = "{\"a\": \"b\"}\n".repeat(4_000);
        s.sample.teacher_log_probs = None;
        s.sample.teacher_topk_log_probs = None;
        s.sample.teacher_topk_indices = None;
        s
    }

    /// OPD with top-1: one short row per response token.
    fn top_one(seq: u64) -> StoredSample {
        let mut s = sample(seq);
        let n = s.sample.response_length;
        s.sample.teacher_topk_log_probs = Some(vec![vec![-0.5]; n]);
        s.sample.teacher_topk_indices = Some(vec![vec![7]; n]);
        s
    }

    /// The hint holds a page in one allocation (never less than it needs for these shapes) and
    /// does not ask for much more than it needs.
    #[test]
    fn a_page_fits_the_buffer_its_size_hint_asks_for() {
        let shapes: [fn(u64) -> StoredSample; 3] = [sample, escaped, top_one];
        for (shape, n) in shapes.into_iter().zip([3, 2, 1]) {
            let samples: Vec<StoredSample> = (1..=n).map(shape).collect();
            let page = Page {
                samples: &samples,
                last_seq: n,
            };
            let bytes = serde_json::to_vec(&page).unwrap().len();
            let hint = page_size_hint(&samples);
            assert!(bytes <= hint, "{bytes} bytes, hint {hint}");
            assert!(hint < 2 * bytes, "{bytes} bytes, hint {hint}");
        }
        assert_eq!(page_size_hint(&[]), 64);
    }

    /// The MessagePack page written from the records is byte for byte what `write_named` makes of
    /// the decoded samples, and its buffer is allocated once.
    #[test]
    fn a_msgpack_page_from_records_is_the_page_encoded_whole() {
        let shapes: [fn(u64) -> StoredSample; 3] = [sample, escaped, top_one];
        for (shape, n) in shapes.into_iter().zip([3u64, 2, 1]) {
            // Seqs of three widths; records written before their seq was known (index 0).
            let samples: Vec<StoredSample> = [1, 300, 70_000]
                .into_iter()
                .take(n as usize)
                .map(|seq| {
                    // As the store reads them back: index and group index are the seq.
                    let mut s = shape(seq);
                    (s.sample.index, s.sample.group_index) = (seq, seq);
                    s
                })
                .collect();
            let records: Vec<EncodedSample> = samples
                .iter()
                .map(|s| {
                    let record = ps_core::codec::encode_sample(&Sample {
                        index: 0,
                        group_index: 0,
                        ..s.sample.clone()
                    })
                    .unwrap();
                    EncodedSample::from_record(s.seq, record).unwrap()
                })
                .collect();
            let page = msgpack_page(&records, 70_001, &[]).unwrap();
            let whole = rmp_serde::to_vec_named(&Page {
                samples: &samples,
                last_seq: 70_001,
            })
            .unwrap();
            let differs = page.iter().zip(&whole).position(|(a, b)| a != b);
            assert!(
                page.len() == whole.len() && differs.is_none(),
                "{} bytes against {}, first difference at {differs:?}",
                page.len(),
                whole.len()
            );
            // Written into the buffer allocated first (a regrown one is at least twice as
            // large), which is not much larger than the page.
            let size = msgpack_page_size(&records);
            assert_eq!(page.capacity(), size, "{} bytes", page.len());
            assert!(page.len() <= size && size < page.len() + page.len() / 10);
        }
        assert_eq!(
            msgpack_page(&[], 0, &[]).unwrap(),
            rmp_serde::to_vec_named(&Page {
                samples: &[],
                last_seq: 0
            })
            .unwrap()
        );
    }
}
