//! [`SglangTeacher`]: teacher log-probs from SGLang's native `POST /generate` with `input_ids`, no new
//! tokens, `return_logprob` and `logprob_start_len` (`docs/upstream-protocols.md` 2.2 and 2.4).
//!
//! Layout: SGLang returns `L - S` input entries for `logprob_start_len = S`, entry `j` being for input
//! position `S + j`, and **entry 0 is always null** (`docs/upstream-protocols.md` 2.2). The reference sends `S = L - T` and so
//! loses the first response token's value (it becomes a 0.0 placeholder). We send `S = L - T - 1`: entry
//! 0 is then the last prompt token (null, dropped) and entries `1..=T` are the `T` response positions,
//! all real values. A null among them (SGLang's orjson writes a `-inf` log-prob as null) is an error
//! naming the position, never a 0.0.

use std::{fmt, time::Duration};

use async_trait::async_trait;
use serde::{
    Deserialize, Deserializer, Serialize,
    de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor},
};

use ps_core::ports::{CallError, TeacherLogprobs, TeacherScorer};

use crate::{
    error::{BACKEND_KEY, ParseError, TeacherError, URL_KEY, chat_endpoint_error},
    http::{Endpoint, build_client, is_chat_path, parse_http_url, snippet},
};

/// Settings of [`SglangTeacher`] (from `[teacher]` with `backend = "sglang"`). `Debug` hides the key.
#[derive(Clone, Debug, PartialEq)]
pub struct SglangTeacherConfig {
    /// The teacher's `/generate` URL (`teacher.url`); a bare `http://host:port` gets `/generate`.
    pub url: String,
    /// Whole-call timeout: connect, answer and body (`teacher.timeout_sec`).
    pub timeout: Duration,
    /// Bearer key, the value of the variable named by `teacher.api_key_env` (SGLang's `--api-key`).
    pub api_key: Option<ps_core::Secret>,
    /// The teacher serves a vision-language model and takes `image_data` (`teacher.images`);
    /// otherwise image turns are refused ([`TeacherScorer::takes_images`] is false).
    pub images: bool,
}

/// The `/generate` URL for a configured teacher URL: a bare root (`http://host:port` or with `/`) gets
/// `/generate`; any other path is used as is. A chat URL is [`TeacherError::ChatEndpoint`]; a
/// completions URL is an error saying to use backend `openai_completions`.
pub fn generate_url(configured: &str) -> Result<String, TeacherError> {
    let invalid = |detail: String| TeacherError::InvalidUrl {
        url: configured.to_owned(),
        detail,
        config_key: URL_KEY,
    };
    let mut url = parse_http_url(configured).map_err(invalid)?;
    let path = url.path().trim_end_matches('/').to_owned();
    if is_chat_path(&path) {
        return Err(chat_endpoint_error(configured));
    }
    if path.ends_with("/completions") {
        return Err(TeacherError::InvalidUrl {
            url: configured.to_owned(),
            detail: format!(
                "a completions URL needs `{BACKEND_KEY} = \"openai_completions\"`; for SGLang write \
                 its /generate URL, such as http://127.0.0.1:30003/generate"
            ),
            config_key: URL_KEY,
        });
    }
    if path.is_empty() {
        url.set_path("/generate");
    }
    Ok(url.to_string())
}

/// `logprob_start_len` for scoring the last `response_len` (T) of `input_len` (L) tokens with all `T`
/// values real: `S = L - T - 1`, so that the always-null entry 0 falls on the last prompt token. `None`
/// when `T >= L` (no prompt token before the response: [`TeacherError::NoContext`]).
pub fn logprob_start_len(input_len: usize, response_len: usize) -> Option<usize> {
    input_len.checked_sub(response_len)?.checked_sub(1)
}

#[derive(Serialize)]
struct SamplingParams {
    temperature: f64,
    max_new_tokens: u32,
    skip_special_tokens: bool,
}

/// The `/generate` body of one teacher call.
#[derive(Serialize)]
struct GenerateBody<'a> {
    input_ids: &'a [u32],
    sampling_params: SamplingParams,
    return_logprob: bool,
    logprob_start_len: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_logprobs_num: Option<usize>,
    /// The prompt's images in order (data URLs), for a vision-language teacher whose `input_ids`
    /// hold each image's run of pads (SGLang runs its processor on them again: its settings must
    /// be the policy's, or the answer's length or ids differ and the turn is dropped, never
    /// padded).
    #[serde(skip_serializing_if = "Option::is_none")]
    image_data: Option<&'a [String]>,
}

impl<'a> GenerateBody<'a> {
    fn new(input_ids: &'a [u32], start: usize, top_k: usize, temperature: f64) -> Self {
        Self {
            input_ids,
            // Prefill only: the teacher scores the given tokens and samples none. The temperature
            // is `opd.teacher_temperature` (0, greedy, as the reference); SGLang does not apply it
            // to input log-probs.
            sampling_params: SamplingParams {
                temperature,
                max_new_tokens: 0,
                skip_special_tokens: false,
            },
            return_logprob: true,
            logprob_start_len: start,
            // One request gives both the log-probs and the top-K. The reference sends two prefill
            // passes over the same input_ids (one without and one with `top_logprobs_num`, docs/upstream-protocols.md 2.4);
            // SGLang returns `input_token_logprobs` and `input_top_logprobs` together, so one is enough.
            top_logprobs_num: (top_k > 0).then_some(top_k),
            image_data: None,
        }
    }
}

/// [`TeacherScorer`] over SGLang's `POST /generate`. One `reqwest` client is shared by every call.
#[derive(Debug, Clone)]
pub struct SglangTeacher {
    endpoint: Endpoint,
    images: bool,
}

impl SglangTeacher {
    /// A teacher with its own connection pool.
    pub fn new(config: SglangTeacherConfig) -> Result<Self, TeacherError> {
        let http = build_client(&config.url, config.timeout)?;
        Self::with_client(http, config)
    }

    /// A teacher sharing `http`'s connection pool.
    pub fn with_client(
        http: reqwest::Client,
        config: SglangTeacherConfig,
    ) -> Result<Self, TeacherError> {
        let url = generate_url(&config.url)?;
        Ok(Self {
            endpoint: Endpoint {
                http,
                url,
                api_key: config.api_key,
                timeout: config.timeout,
            },
            images: config.images,
        })
    }

    /// The URL every call is POSTed to.
    pub fn url(&self) -> &str {
        &self.endpoint.url
    }

    /// The `/generate` body scoring the last `response_len` tokens of `input_ids` (`None` when
    /// `response_len >= input_ids.len()`).
    pub fn request_body(
        input_ids: &[u32],
        response_len: usize,
        top_k: usize,
    ) -> Option<serde_json::Value> {
        let start = logprob_start_len(input_ids.len(), response_len)?;
        serde_json::to_value(GenerateBody::new(input_ids, start, top_k, 0.0)).ok()
    }
}

/// The teacher port's calls with this crate's own error (the port wraps it in a `CallError`).
impl SglangTeacher {
    /// See [`TeacherScorer::score`].
    pub async fn score(
        &self,
        input_ids: &[u32],
        response_len: usize,
        top_k: usize,
    ) -> Result<TeacherLogprobs, TeacherError> {
        self.score_with_images(input_ids, response_len, top_k, &[])
            .await
    }

    /// See [`TeacherScorer::takes_images`].
    pub fn takes_images(&self) -> bool {
        self.images
    }

    /// See [`TeacherScorer::score_with_images`].
    pub async fn score_with_images(
        &self,
        input_ids: &[u32],
        response_len: usize,
        top_k: usize,
        image_data: &[String],
    ) -> Result<TeacherLogprobs, TeacherError> {
        self.score_at(input_ids, response_len, top_k, image_data, 0.0)
            .await
    }

    /// See [`TeacherScorer::score_at`]: `temperature` is the request's
    /// `sampling_params.temperature`.
    pub async fn score_at(
        &self,
        input_ids: &[u32],
        response_len: usize,
        top_k: usize,
        image_data: &[String],
        temperature: f64,
    ) -> Result<TeacherLogprobs, TeacherError> {
        if response_len == 0 {
            return Ok(TeacherLogprobs {
                temperature,
                ..TeacherLogprobs::empty(top_k)
            });
        }
        let start = logprob_start_len(input_ids.len(), response_len).ok_or_else(|| {
            TeacherError::NoContext {
                url: self.url().to_owned(),
                input_len: input_ids.len(),
                response_len,
                config_key: URL_KEY,
            }
        })?;
        let mut body = GenerateBody::new(input_ids, start, top_k, temperature);
        body.image_data = (!image_data.is_empty()).then_some(image_data);
        let bytes = self.endpoint.post(&body).await?;
        let mut scored = parse_generate(&bytes, start, response_len, top_k)
            .map_err(|e| self.endpoint.parse_error(e, top_k))?;
        scored.temperature = temperature;
        Ok(scored)
    }

    /// See [`TeacherScorer::describe`].
    pub fn describe(&self) -> String {
        format!("sglang /generate at {}", self.url())
    }
}

#[async_trait]
impl TeacherScorer for SglangTeacher {
    async fn score(
        &self,
        input_ids: &[u32],
        response_len: usize,
        top_k: usize,
    ) -> Result<TeacherLogprobs, CallError> {
        Ok(SglangTeacher::score(self, input_ids, response_len, top_k).await?)
    }

    fn takes_images(&self) -> bool {
        SglangTeacher::takes_images(self)
    }

    async fn score_at(
        &self,
        input_ids: &[u32],
        response_len: usize,
        top_k: usize,
        image_data: &[String],
        temperature: f64,
    ) -> Result<TeacherLogprobs, CallError> {
        Ok(SglangTeacher::score_at(
            self,
            input_ids,
            response_len,
            top_k,
            image_data,
            temperature,
        )
        .await?)
    }

    async fn score_with_images(
        &self,
        input_ids: &[u32],
        response_len: usize,
        top_k: usize,
        image_data: &[String],
    ) -> Result<TeacherLogprobs, CallError> {
        Ok(
            SglangTeacher::score_with_images(self, input_ids, response_len, top_k, image_data)
                .await?,
        )
    }

    fn describe(&self) -> String {
        SglangTeacher::describe(self)
    }
}

/// One logprob entry: the triple `[logprob|null, token_id, text|null]`, or (accepted like the
/// reference) an object `{"logprob", "token_id"}`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Entry {
    logprob: Option<f64>,
    id: u32,
}

impl<'de> Deserialize<'de> for Entry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct EntryVisitor;
        impl<'de> Visitor<'de> for EntryVisitor {
            type Value = Entry;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a logprob triple [logprob, token_id, text]")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Entry, A::Error> {
                let logprob: Option<f64> = seq
                    .next_element()?
                    .ok_or_else(|| de::Error::invalid_length(0, &self))?;
                let id: u32 = seq
                    .next_element()?
                    .ok_or_else(|| de::Error::invalid_length(1, &self))?;
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Entry { logprob, id })
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entry, A::Error> {
                let (mut logprob, mut id) = (None, None);
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "logprob" => logprob = map.next_value::<Option<f64>>()?,
                        "token_id" => id = Some(map.next_value::<u32>()?),
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                let id = id.ok_or_else(|| de::Error::missing_field("token_id"))?;
                Ok(Entry { logprob, id })
            }
        }
        d.deserialize_any(EntryVisitor)
    }
}

#[derive(Deserialize)]
struct Reply {
    meta_info: MetaInfo,
}

#[derive(Deserialize)]
struct MetaInfo {
    #[serde(default)]
    input_token_logprobs: Option<Vec<Entry>>,
    #[serde(default)]
    input_top_logprobs: Option<Vec<Option<Vec<Entry>>>>,
}

const TOKEN_FIELD: &str = "input_token_logprobs";
const TOP_FIELD: &str = "input_top_logprobs";

/// The teacher's values for the `response_len` (T) positions after input position `start` (S), from a
/// `/generate` answer to a request with `logprob_start_len = S`: entries `1..=T` of
/// `input_token_logprobs` (entry 0, always null, is dropped) and, with `top_k` > 0, of
/// `input_top_logprobs` (the first `K` triples of each, best first).
pub(crate) fn parse_generate(
    bytes: &[u8],
    start: usize,
    response_len: usize,
    top_k: usize,
) -> Result<TeacherLogprobs, ParseError> {
    let invalid = |detail: String| ParseError::Invalid(detail);
    let json_error = |e: serde_json::Error| {
        invalid(format!(
            "not SGLang /generate JSON: {e} (body starts with {:?})",
            snippet(bytes)
        ))
    };
    // A batch-shaped answer (a list of results) is accepted when it holds exactly one result.
    let reply: Reply = if bytes.trim_ascii_start().starts_with(b"[") {
        let mut list: Vec<Reply> = serde_json::from_slice(bytes).map_err(json_error)?;
        if list.len() != 1 {
            return Err(invalid(format!(
                "a list of {} results instead of one",
                list.len()
            )));
        }
        list.remove(0)
    } else {
        serde_json::from_slice(bytes).map_err(json_error)?
    };
    let expected = response_len + 1;
    let count_error = |field: &str, got: usize| {
        invalid(format!(
            "`meta_info.{field}` has {got} entries, expected {expected} (input length - logprob_start_len {start})"
        ))
    };
    let entries = reply
        .meta_info
        .input_token_logprobs
        .ok_or_else(|| invalid(format!("no `meta_info.{TOKEN_FIELD}`")))?;
    if entries.len() != expected {
        return Err(count_error(TOKEN_FIELD, entries.len()));
    }
    let mut log_probs = Vec::with_capacity(response_len);
    let mut echoed_ids = Vec::with_capacity(response_len);
    // Entry 0 (input position S, the last prompt token) is always null: skipped.
    for (position, entry) in entries[1..].iter().enumerate() {
        let lp = entry.logprob.ok_or(ParseError::Missing {
            field: TOKEN_FIELD,
            position,
            input_position: start + 1 + position,
        })?;
        log_probs.push(lp);
        echoed_ids.push(entry.id);
    }
    let (topk_log_probs, topk_indices) = if top_k == 0 {
        (None, None)
    } else {
        let rows = reply
            .meta_info
            .input_top_logprobs
            .ok_or_else(|| invalid(format!("no `meta_info.{TOP_FIELD}`")))?;
        if rows.len() != expected {
            return Err(count_error(TOP_FIELD, rows.len()));
        }
        let mut lps = Vec::with_capacity(response_len);
        let mut ids = Vec::with_capacity(response_len);
        for (position, row) in rows.into_iter().skip(1).enumerate() {
            let missing = ParseError::Missing {
                field: TOP_FIELD,
                position,
                input_position: start + 1 + position,
            };
            let row = row.ok_or_else(|| missing.clone())?;
            if row.len() < top_k {
                return Err(ParseError::ShortTopK {
                    position,
                    got: row.len(),
                });
            }
            let mut row_lps = Vec::with_capacity(top_k);
            let mut row_ids = Vec::with_capacity(top_k);
            for e in &row[..top_k] {
                row_lps.push(e.logprob.ok_or_else(|| missing.clone())?);
                row_ids.push(e.id);
            }
            lps.push(row_lps);
            ids.push(row_ids);
        }
        (Some(lps), Some(ids))
    };
    Ok(TeacherLogprobs {
        log_probs,
        topk_log_probs,
        topk_indices,
        echoed_ids,
        echo_verified: true,
        temperature: 0.0,
        temperature_assumed: false,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn start_is_one_before_the_response() {
        // L = 12, T = 3: the reference's 9 would lose position 9; we start at 8.
        assert_eq!(logprob_start_len(12, 3), Some(8));
        assert_eq!(logprob_start_len(4, 3), Some(0));
        assert_eq!(logprob_start_len(3, 3), None);
        assert_eq!(logprob_start_len(2, 3), None);
    }

    #[test]
    fn the_body_has_the_contract_shape() {
        let ids = [1u32, 2, 3, 4, 5];
        let body = SglangTeacher::request_body(&ids, 2, 0).unwrap();
        assert_eq!(
            body,
            json!({"input_ids": ids,
                   "sampling_params": {"temperature": 0.0, "max_new_tokens": 0, "skip_special_tokens": false},
                   "return_logprob": true, "logprob_start_len": 2})
        );
        let with_top = SglangTeacher::request_body(&ids, 2, 5).unwrap();
        assert_eq!(with_top["top_logprobs_num"], 5);
        assert!(SglangTeacher::request_body(&ids, 5, 0).is_none());
    }

    /// The protocols doc's example (L = 12, T = 3) answered for our start S = 8: four entries, the
    /// null one on the last prompt token (198 at position 8).
    fn doc_reply() -> serde_json::Value {
        json!({"text": "", "output_ids": [], "meta_info": {
            "id": "x", "finish_reason": {"type": "length", "length": 0},
            "prompt_tokens": 12, "completion_tokens": 0,
            "input_token_logprobs": [[null, 198, null], [-1.5, 9707, null], [-0.02, 151645, null], [-0.40, 198, null]],
            "output_token_logprobs": [],
            "input_top_logprobs": [null,
                [[-0.5, 9703, null], [-1.5, 9707, null], [-2.0, 1, null]],
                [[-0.02, 151645, null], [-4.0, 2, null], [-5.0, 3, null]],
                [[-0.40, 198, null], [-1.0, 4, null], [-6.0, 5, null]]],
            "output_top_logprobs": []}})
    }

    fn parse(v: &serde_json::Value, t: usize, k: usize) -> Result<TeacherLogprobs, ParseError> {
        parse_generate(v.to_string().as_bytes(), 12 - t - 1, t, k)
    }

    #[test]
    fn entry_zero_is_dropped_and_all_t_values_are_real() {
        let r = parse(&doc_reply(), 3, 0).unwrap();
        assert_eq!(r.log_probs, vec![-1.5, -0.02, -0.40]);
        assert_eq!(r.echoed_ids, vec![9707, 151645, 198]);
        assert!(r.topk_log_probs.is_none() && r.topk_indices.is_none());
        assert!(r.echo_verified);
    }

    #[test]
    fn top_k_rows_are_cut_to_k_best_first() {
        let r = parse(&doc_reply(), 3, 2).unwrap();
        assert_eq!(
            r.topk_log_probs.unwrap(),
            vec![vec![-0.5, -1.5], vec![-0.02, -4.0], vec![-0.40, -1.0]]
        );
        assert_eq!(
            r.topk_indices.unwrap(),
            vec![vec![9703, 9707], vec![151645, 2], vec![198, 4]]
        );
    }

    #[test]
    fn a_short_top_k_row_is_an_error_not_padding() {
        let mut v = doc_reply();
        v["meta_info"]["input_top_logprobs"][2] = json!([[-0.02, 151645, null]]);
        assert_eq!(
            parse(&v, 3, 3).unwrap_err(),
            ParseError::ShortTopK {
                position: 1,
                got: 1
            }
        );
        v["meta_info"]["input_top_logprobs"][3] = json!(null);
        v["meta_info"]["input_top_logprobs"][2] =
            doc_reply()["meta_info"]["input_top_logprobs"][2].clone();
        assert_eq!(
            parse(&v, 3, 3).unwrap_err(),
            ParseError::Missing {
                field: TOP_FIELD,
                position: 2,
                input_position: 11
            }
        );
        let mut no_top = doc_reply();
        no_top["meta_info"]
            .as_object_mut()
            .unwrap()
            .remove("input_top_logprobs");
        assert!(matches!(parse(&no_top, 3, 3), Err(ParseError::Invalid(_))));
    }

    #[test]
    fn a_null_response_value_names_its_position() {
        let mut v = doc_reply();
        v["meta_info"]["input_token_logprobs"][2] = json!([null, 151645, null]);
        assert_eq!(
            parse(&v, 3, 0).unwrap_err(),
            ParseError::Missing {
                field: TOKEN_FIELD,
                position: 1,
                input_position: 10
            }
        );
    }

    #[test]
    fn the_reference_start_gives_one_entry_too_few() {
        // Answering a request with S = L - T (T entries, the first null) is caught by the count.
        let mut v = doc_reply();
        v["meta_info"]["input_token_logprobs"] = json!([
            [null, 9707, null],
            [-0.02, 151645, null],
            [-0.40, 198, null]
        ]);
        let ParseError::Invalid(detail) = parse(&v, 3, 0).unwrap_err() else {
            panic!("expected Invalid")
        };
        assert!(detail.contains("3 entries, expected 4"), "{detail}");
    }

    #[test]
    fn other_shapes() {
        // Object entries, as the reference also accepts, and unknown fields.
        let v = json!({"meta_info": {"input_token_logprobs": [
            {"logprob": null, "token_id": 1}, {"logprob": -0.5, "token_id": 2, "x": 1}], "other": 1}});
        let r = parse_generate(v.to_string().as_bytes(), 0, 1, 0).unwrap();
        assert_eq!((r.log_probs, r.echoed_ids), (vec![-0.5], vec![2]));
        // A one-result list.
        let list = json!([v]);
        assert!(parse_generate(list.to_string().as_bytes(), 0, 1, 0).is_ok());
        let two = json!([v, v]);
        assert!(parse_generate(two.to_string().as_bytes(), 0, 1, 0).is_err());
        for bad in [
            "<html>".as_bytes(),
            br#"{"meta_info": {}}"#,
            br#"{"meta_info": {"input_token_logprobs": [[null, -1, null], [0.0, 1, null]]}}"#,
            br#"{"meta_info": {"input_token_logprobs": [[null], [0.0, 1, null]]}}"#,
            br#"{"text": "x"}"#,
        ] {
            assert!(
                matches!(parse_generate(bad, 0, 1, 0), Err(ParseError::Invalid(_))),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn urls() {
        assert_eq!(generate_url("http://h:1").unwrap(), "http://h:1/generate");
        assert_eq!(generate_url("http://h:1/").unwrap(), "http://h:1/generate");
        assert_eq!(
            generate_url("http://h:1/generate").unwrap(),
            "http://h:1/generate"
        );
        assert_eq!(
            generate_url("https://h/teacher/generate").unwrap(),
            "https://h/teacher/generate"
        );
        assert!(matches!(
            generate_url("http://h:1/v1/chat/completions"),
            Err(TeacherError::ChatEndpoint { .. })
        ));
        let e = generate_url("http://h:1/v1/completions").unwrap_err();
        assert!(e.to_string().contains("openai_completions"), "{e}");
        for bad in ["not a url", "ftp://h/generate", "unix:/tmp/s"] {
            let e = generate_url(bad).unwrap_err();
            assert!(matches!(e, TeacherError::InvalidUrl { .. }), "{e}");
            assert!(e.to_string().contains(URL_KEY), "{e}");
        }
    }
}
