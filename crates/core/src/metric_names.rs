//! The catalogue of metrics: every name any crate of the product records, in one place. Names carry the product
//! prefix, counters end in `_total` and durations in `_seconds`; labels are low-cardinality (never a
//! session id).

/// Chat requests, labelled `turn_type` (`main`|`side`) and `outcome` (`ok`|`client_error`|`upstream_error`).
pub const REQUESTS_TOTAL: &str = "policy_serving_requests_total";
/// Streams whose client went away before the end; the upstream request is cancelled.
pub const STREAM_CANCELLED_TOTAL: &str = "policy_serving_stream_cancelled_total";
/// Streams that broke upstream after the answer started.
pub const STREAM_BROKEN_TOTAL: &str = "policy_serving_stream_broken_total";
/// Main turns handed to capture, labelled `outcome` (`captured`|`queue_full`|`render_failed`|
/// `turn_too_long`|`no_engine_ids`|`engine_logprob_count_mismatch`|`stream_logprobs_missing`|
/// `request_unreadable`: the request's messages, tools or template kwargs did not parse on the
/// capture thread; `answer_unreadable`: the upstream's answer did not, there; `image_unsupported`,
/// `audio_unsupported`, `video_unsupported`, `file_unsupported`, `content_part_unsupported`: a
/// message holds a content part that is not text, which is not captured; `door_untranslatable`:
/// an answer the request's door cannot give its client, such as tool arguments that are not an
/// object through the Messages door, refused with a 502 and not trained on; `engine_aborted`,
/// `stream_error`: through another door, an answer the engine aborted or whose stream carried an
/// error, which that door's client gets as an error).
pub const CAPTURE_TOTAL: &str = "policy_serving_capture_total";
/// Turns whose full text did not start with the prompt text (response = full text).
pub const PROMPT_NOT_PREFIX_TOTAL: &str = "policy_serving_capture_prompt_not_prefix_total";
/// Turns where some sampled token found no place in the re-rendered response.
pub const TOKEN_MISMATCH_TOTAL: &str = "policy_serving_capture_token_mismatch_total";
/// Response positions marked as having no log-prob, labelled `source` (`eos_unreported`|`unsampled`).
pub const MARKED_POSITIONS_TOTAL: &str = "policy_serving_capture_marked_positions_total";
/// Response positions of submitted samples whose rollout log-prob is a placeholder (`0.0`, the
/// upstream reported none), labelled `outcome`: `trained` (loss mask 1, listed per sample in
/// `metadata.trained_without_rollout_logprob`) or `masked` (taken out of the loss because a teacher
/// field would otherwise have carried the placeholder: Combine's RL-only samples).
pub const SAMPLE_POSITIONS_WITHOUT_LOGPROB_TOTAL: &str =
    "policy_serving_sample_positions_without_logprob_total";
/// Captured main turns by where their token ids came from, labelled `source` (`engine`|`retokenized`).
pub const TOKEN_SOURCE_TOTAL: &str = "policy_serving_capture_token_source_total";
/// Turns whose engine was asked for its token ids and answered without them (an old build, a router
/// that strips them): re-tokenized under `sglang.token_ids = "auto"`, no sample under `"engine"`.
pub const ENGINE_IDS_MISSING_TOTAL: &str = "policy_serving_capture_engine_ids_missing_total";
/// Engine-id turns whose re-tokenization differs from the engine's ids, labelled `part`
/// (`prompt`|`response`): our template or tokenizer disagrees with the engine's.
pub const RETOKENIZE_DRIFT_TOTAL: &str = "policy_serving_retokenize_drift_total";
/// Time from request to upstream answer headers (non-stream: whole answer).
pub const UPSTREAM_SECONDS: &str = "policy_serving_upstream_seconds";
/// Time a capture worker spent rendering, tokenizing and aligning one turn.
pub const CAPTURE_SECONDS: &str = "policy_serving_capture_seconds";

/// RL samples handed to the trainer, labelled `outcome` (`effective`|`excluded`).
pub const SAMPLES_SUBMITTED_TOTAL: &str = "policy_serving_samples_submitted_total";
/// Stored samples by what their sampling means for their log-probs, labelled `kind`
/// (`full`|`truncated`|`greedy`|`engine_defaults`; `truncated` and `greedy` samples carry
/// `metadata.truncated_sampling_without_sets`).
pub const SAMPLES_BY_SAMPLING_TOTAL: &str = "policy_serving_samples_by_sampling_total";
/// Samples excluded from training (all-zero loss mask), labelled `reason`
/// (`no_next_state`|`score_zero`|`prm_disabled`).
pub const SAMPLES_EXCLUDED_TOTAL: &str = "policy_serving_samples_excluded_total";
/// Samples that could not be stored after retries, labelled `reason`.
pub const SAMPLES_DROPPED_TOTAL: &str = "policy_serving_samples_dropped_total";
/// Main turns that never became a sample, labelled `reason` (`upstream_failed`, `client_cancelled`, …).
pub const TURNS_ABANDONED_TOTAL: &str = "policy_serving_turns_abandoned_total";
/// Sessions closed, labelled `reason` (`done`|`timeout`|`evicted`|`shutdown`).
pub const SESSIONS_CLOSED_TOTAL: &str = "policy_serving_sessions_closed_total";
/// PRM votes, labelled `outcome` (`1`|`-1`|`0`|`failed`).
pub const PRM_VOTES_TOTAL: &str = "policy_serving_prm_votes_total";
/// Time to score one turn (all votes).
pub const PRM_SECONDS: &str = "policy_serving_prm_seconds";
/// Records dropped or not written, labelled `kind` (`conversations`|`prm`|`opd`) and `reason`
/// (`queue_full`|`write_error`|`writer_stopped`).
pub const RECORDS_FAILED_TOTAL: &str = "policy_serving_records_failed_total";
/// OPD turns whose teacher echoed other token ids than the response's (a tokenizer mismatch).
pub const TEACHER_MISMATCH_TOTAL: &str = "policy_serving_teacher_mismatch_total";
/// Turns that produced no sample, labelled `reason`: in OPD/Combine
/// `no_next_state`|`no_hint`|`teacher_error`|`teacher_token_mismatch`|`nothing_to_learn`; in any
/// mode `judge_backlog` (more than `prm.max_backlog` turns were already waiting for a judge).
pub const TURNS_DROPPED_TOTAL: &str = "policy_serving_turns_dropped_total";
/// Time of one teacher call.
pub const TEACHER_SECONDS: &str = "policy_serving_teacher_seconds";

/// Retries of external-provider calls, labelled `reason` (`429`|`5xx`|`timeout`|`connect`|`conflict`|`transport`).
/// HTTP 408 counts as `timeout`, 409 as `conflict`, a connection broken mid-answer as `transport`.
pub const PROVIDER_RETRIES_TOTAL: &str = "policy_serving_provider_retries_total";
/// HTTP 429 answers received from the external provider, labelled `code` (`rate_limit`|`insufficient_quota`).
pub const PROVIDER_RATE_LIMITED_TOTAL: &str = "policy_serving_provider_rate_limited_total";
/// External-provider calls that finally failed, labelled `reason` (`429`|`5xx`|`timeout`|`connect`|
/// `conflict`|`transport`|`unauthorized`|`quota`|`rejected`|`invalid_body`|`deadline`).
pub const PROVIDER_GIVE_UPS_TOTAL: &str = "policy_serving_provider_give_ups_total";
/// External-provider answers of HTTP 401 or 403: the key is missing, wrong or not allowed.
pub const PROVIDER_UNAUTHORIZED_TOTAL: &str = "policy_serving_provider_unauthorized_total";
/// Time of one successful external-provider call, retries and waits included.
pub const PROVIDER_SECONDS: &str = "policy_serving_provider_seconds";
/// Gauge: sessions held (not closing), refreshed when `/metrics` is scraped.
pub const LIVE_SESSIONS: &str = "policy_serving_live_sessions";
/// Gauge: main turns not yet samples, labelled `state` (`waiting_capture`|`waiting_next_state`|`scoring`|`waiting_order`).
pub const PENDING_TURNS: &str = "policy_serving_pending_turns";
/// Gauges: main turns queued for a capture worker and about the bytes they hold (the client's
/// request text and the engine's answer), bounded by `capture.max_queued_mib`; refreshed when
/// `/metrics` is scraped. Rising while requests flow means capture is slower than the chat path.
pub const CAPTURE_QUEUED_TURNS: &str = "policy_serving_capture_queued_turns";
/// Gauge: about the bytes the turns of [`CAPTURE_QUEUED_TURNS`] hold.
pub const CAPTURE_QUEUED_BYTES: &str = "policy_serving_capture_queued_bytes";
/// Gauge: samples kept in the store.
pub const STORE_SAMPLES: &str = "policy_serving_store_samples";
/// Gauge: samples stored but not yet committed by the trainer.
pub const STORE_LAG_SAMPLES: &str = "policy_serving_store_lag_samples";
/// Appends to the Redis store that failed (connection lost, Redis restarting or loading, timeout)
/// and were sent again. A rising count with a flat `samples_submitted_total` means Redis is down.
pub const STORE_APPEND_RETRIES_TOTAL: &str = "policy_serving_store_append_retries_total";
/// Appends to the Redis store that found the deployment's mark gone: Redis lost its data (a restart
/// without its append-only file, a flush, eviction). Must stay 0.
pub const STORE_DATA_LOSS_TOTAL: &str = "policy_serving_store_data_loss_total";
/// Stored samples that could not be decoded (written by an incompatible version): set aside in the
/// Redis store's dead-letter stream and skipped. Must stay 0.
pub const STORE_UNDECODABLE_TOTAL: &str = "policy_serving_store_undecodable_total";
/// Gauge: 1 while submission is enabled, 0 while the trainer has paused it.
pub const SUBMISSION_ENABLED: &str = "policy_serving_submission_enabled";
/// Time the proxy itself added to a non-streamed request (total minus waiting on the upstream).
pub const PROXY_OVERHEAD_SECONDS: &str = "policy_serving_proxy_overhead_seconds";
/// Main requests without a session key whose session was recognised from their history
/// (`server.session_inference`), labelled `outcome`: `continued` (a live session), `new` (no earlier
/// turns), `fork` (a prefix continued a second time: a new session linked to its parent) or
/// `unmatched` (earlier turns that match no live conversation: a new session) or `unreadable` (the
/// messages did not parse: session `unknown`).
pub const SESSION_INFERENCE_TOTAL: &str = "policy_serving_session_inference_total";
/// Main requests whose added messages could not be a next state, labelled `reason`
/// (`image_unsupported`, `audio_unsupported`, …: a part that is not text, which a judge would
/// not see): the previous turn gets no next state (`no_next_state`) instead of a judgement of
/// what is left of it.
pub const NEXT_STATE_UNUSABLE_TOTAL: &str = "policy_serving_next_state_unusable_total";
/// Requests through a door other than chat completions, labelled `door` (`messages`) and
/// `outcome` (`ok`|`client_error`|`upstream_error`); they are also counted in
/// [`REQUESTS_TOTAL`].
pub const DOOR_REQUESTS_TOTAL: &str = "policy_serving_door_requests_total";
/// What a door's translation left out because the engine cannot honour it, labelled `door` and
/// `what` (`hosted_tool`: a tool the engine cannot run, left out of its tool list;
/// `redacted_thinking`: another model's encrypted reasoning in the history).
pub const DOOR_DROPPED_TOTAL: &str = "policy_serving_door_dropped_total";
/// Gauge: conversations held for session inference, refreshed when `/metrics` is scraped.
pub const INFERRED_SESSIONS_LIVE: &str = "policy_serving_inferred_sessions_live";
/// Hint-judge votes, labelled `outcome` (`1`|`-1`|`failed`).
pub const HINT_VOTES_TOTAL: &str = "policy_serving_hint_votes_total";
/// Gauge: the process's resident memory in bytes (Linux `VmRSS`), refreshed when `/metrics` is
/// scraped.
pub const RESIDENT_MEMORY_BYTES: &str = "policy_serving_resident_memory_bytes";
/// Texts whose cached token ids disagreed with them on their added tokens (ids from another
/// tokenizer, e.g. turns kept from before a tokenizer change): nothing of those ids was reused and
/// the whole text was encoded, so the result stays exact (`ps_chat_template::boundary_mismatches`,
/// the OPD teacher's spliced prompt among others). Refreshed when `/metrics` is scraped; it should
/// stay 0.
pub const SPLICE_BOUNDARY_MISMATCHES_TOTAL: &str =
    "policy_serving_splice_boundary_mismatches_total";

/// What kind of series a metric is. Histograms are exported as Prometheus summaries (the exporter's
/// default): `name{quantile="…"}`, `name_sum` and `name_count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    Counter,
    Gauge,
    Histogram,
}

/// One entry of the catalogue: a metric's name, its kind and every label name it is recorded with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricSpec {
    pub name: &'static str,
    pub kind: MetricKind,
    pub labels: &'static [&'static str],
}

const fn spec(name: &'static str, kind: MetricKind, labels: &'static [&'static str]) -> MetricSpec {
    MetricSpec { name, kind, labels }
}

/// Every metric above with its kind and labels, for the checks of the operators' dashboard and
/// alerts (`deploy/`, checked by `tools/deploy`). A test there reads every `counter!`, `gauge!`
/// and `histogram!` of the workspace and fails when one records a name or label missing here.
pub const CATALOGUE: &[MetricSpec] = {
    use MetricKind::{Counter, Gauge, Histogram};
    &[
        spec(REQUESTS_TOTAL, Counter, &["turn_type", "outcome", "status"]),
        spec(STREAM_CANCELLED_TOTAL, Counter, &[]),
        spec(STREAM_BROKEN_TOTAL, Counter, &[]),
        spec(CAPTURE_TOTAL, Counter, &["outcome"]),
        spec(PROMPT_NOT_PREFIX_TOTAL, Counter, &[]),
        spec(TOKEN_MISMATCH_TOTAL, Counter, &[]),
        spec(MARKED_POSITIONS_TOTAL, Counter, &["source"]),
        spec(
            SAMPLE_POSITIONS_WITHOUT_LOGPROB_TOTAL,
            Counter,
            &["outcome"],
        ),
        spec(TOKEN_SOURCE_TOTAL, Counter, &["source"]),
        spec(ENGINE_IDS_MISSING_TOTAL, Counter, &[]),
        spec(RETOKENIZE_DRIFT_TOTAL, Counter, &["part"]),
        spec(UPSTREAM_SECONDS, Histogram, &[]),
        spec(CAPTURE_SECONDS, Histogram, &[]),
        spec(SAMPLES_SUBMITTED_TOTAL, Counter, &["outcome"]),
        spec(SAMPLES_BY_SAMPLING_TOTAL, Counter, &["kind"]),
        spec(SAMPLES_EXCLUDED_TOTAL, Counter, &["reason"]),
        spec(SAMPLES_DROPPED_TOTAL, Counter, &["reason"]),
        spec(TURNS_ABANDONED_TOTAL, Counter, &["reason"]),
        spec(SESSIONS_CLOSED_TOTAL, Counter, &["reason"]),
        spec(PRM_VOTES_TOTAL, Counter, &["outcome"]),
        spec(PRM_SECONDS, Histogram, &[]),
        spec(RECORDS_FAILED_TOTAL, Counter, &["kind", "reason"]),
        spec(TEACHER_MISMATCH_TOTAL, Counter, &[]),
        spec(TURNS_DROPPED_TOTAL, Counter, &["reason"]),
        spec(TEACHER_SECONDS, Histogram, &[]),
        spec(PROVIDER_RETRIES_TOTAL, Counter, &["reason"]),
        spec(PROVIDER_RATE_LIMITED_TOTAL, Counter, &["code"]),
        spec(PROVIDER_GIVE_UPS_TOTAL, Counter, &["reason"]),
        spec(PROVIDER_UNAUTHORIZED_TOTAL, Counter, &[]),
        spec(PROVIDER_SECONDS, Histogram, &[]),
        spec(LIVE_SESSIONS, Gauge, &[]),
        spec(PENDING_TURNS, Gauge, &["state"]),
        spec(CAPTURE_QUEUED_TURNS, Gauge, &[]),
        spec(CAPTURE_QUEUED_BYTES, Gauge, &[]),
        spec(STORE_SAMPLES, Gauge, &[]),
        spec(STORE_LAG_SAMPLES, Gauge, &[]),
        spec(STORE_APPEND_RETRIES_TOTAL, Counter, &[]),
        spec(STORE_DATA_LOSS_TOTAL, Counter, &[]),
        spec(STORE_UNDECODABLE_TOTAL, Counter, &[]),
        spec(SUBMISSION_ENABLED, Gauge, &[]),
        spec(PROXY_OVERHEAD_SECONDS, Histogram, &[]),
        spec(SESSION_INFERENCE_TOTAL, Counter, &["outcome"]),
        spec(NEXT_STATE_UNUSABLE_TOTAL, Counter, &["reason"]),
        spec(DOOR_REQUESTS_TOTAL, Counter, &["door", "outcome"]),
        spec(DOOR_DROPPED_TOTAL, Counter, &["door", "what"]),
        spec(INFERRED_SESSIONS_LIVE, Gauge, &[]),
        spec(HINT_VOTES_TOTAL, Counter, &["outcome"]),
        spec(RESIDENT_MEMORY_BYTES, Gauge, &[]),
        spec(SPLICE_BOUNDARY_MISMATCHES_TOTAL, Counter, &[]),
    ]
};

/// The catalogue entry of `name`, if any.
pub fn lookup(name: &str) -> Option<&'static MetricSpec> {
    CATALOGUE.iter().find(|m| m.name == name)
}
