//! [`CompletionsTeacher`]: teacher log-probs from an OpenAI-compatible `POST /v1/completions` with
//! vLLM's `prompt_logprobs` (`docs/upstream-protocols.md` 3), so a team without a local SGLang teacher
//! can use a vLLM server or a host built on it.
//!
//! Layout: `choices[0].prompt_logprobs` has one entry per prompt token; only entry 0 is null. Entry
//! `i` maps `str(token id)` to `{logprob, rank, decoded_token}` for the prompt token and the top-`N`
//! alternatives (`prompt_logprobs: N`), so the prompt token may be the `N+1`-th key. We read the last
//! `T` entries. vLLM caps `N` by its `--max-logprobs` (default 20): a larger `K` is an HTTP 400.

use std::{collections::HashMap, time::Duration};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use ps_core::ports::{CallError, TeacherLogprobs, TeacherScorer};

use crate::{
    error::{MODEL_KEY, ParseError, TeacherError, URL_KEY, chat_endpoint_error},
    http::{Endpoint, build_client, is_chat_path, parse_http_url, snippet},
};

/// Settings of [`CompletionsTeacher`] (from `[teacher]` with `backend = "openai_completions"`, or the
/// provider section's base URL and key). `Debug` hides the key.
#[derive(Clone, Debug, PartialEq)]
pub struct CompletionsTeacherConfig {
    /// The provider root (`https://host`, `https://host/v1`, with or without a trailing `/`) or its
    /// full `/v1/completions` URL (`teacher.url`).
    pub base_url: String,
    /// The model name sent in every request (`teacher.model`).
    pub model: String,
    /// Bearer key, the value of the variable named by `teacher.api_key_env`. Never logged.
    pub api_key: Option<ps_core::Secret>,
    /// Whole-call timeout: connect, answer and body (`teacher.timeout_sec`).
    pub timeout: Duration,
}

/// The completions URL for a configured base: `<root>/v1/completions` from a provider root with or
/// without a trailing `/v1` or `/`; a URL already ending in `/completions` is used as is. A URL ending
/// in `/chat/completions` is [`TeacherError::ChatEndpoint`], which says what to write instead.
pub fn completions_url(base: &str) -> Result<String, TeacherError> {
    let mut url = parse_http_url(base).map_err(|detail| TeacherError::InvalidUrl {
        url: base.to_owned(),
        detail,
        config_key: URL_KEY,
    })?;
    let path = url.path().trim_end_matches('/').to_owned();
    if is_chat_path(&path) {
        return Err(chat_endpoint_error(base));
    }
    let path = if path.ends_with("/completions") {
        path
    } else if path.ends_with("/v1") {
        format!("{path}/completions")
    } else {
        format!("{path}/v1/completions")
    };
    url.set_path(&path);
    Ok(url.to_string())
}

/// The `/v1/completions` body of one teacher call.
#[derive(Serialize)]
struct CompletionsBody<'a> {
    model: &'a str,
    prompt: &'a [u32],
    /// One throw-away output token (some builds reject 0).
    max_tokens: u32,
    temperature: f64,
    prompt_logprobs: usize,
    /// Newer vLLM builds then echo `prompt_token_ids`, which we check against our ids.
    return_token_ids: bool,
}

/// [`TeacherScorer`] over an OpenAI-compatible `/v1/completions` with `prompt_logprobs` (vLLM). One
/// `reqwest` client is shared by every call.
#[derive(Debug, Clone)]
pub struct CompletionsTeacher {
    endpoint: Endpoint,
    model: String,
}

impl CompletionsTeacher {
    /// A teacher with its own connection pool.
    pub fn new(config: CompletionsTeacherConfig) -> Result<Self, TeacherError> {
        let http = build_client(&config.base_url, config.timeout)?;
        Self::with_client(http, config)
    }

    /// A teacher sharing `http`'s connection pool.
    pub fn with_client(
        http: reqwest::Client,
        config: CompletionsTeacherConfig,
    ) -> Result<Self, TeacherError> {
        let url = completions_url(&config.base_url)?;
        if config.model.trim().is_empty() {
            return Err(TeacherError::InvalidConfig {
                url,
                detail: "the model name is empty; a completions teacher needs one".to_owned(),
                config_key: MODEL_KEY,
            });
        }
        Ok(Self {
            endpoint: Endpoint {
                http,
                url,
                api_key: config.api_key,
                timeout: config.timeout,
            },
            model: config.model,
        })
    }

    /// The URL every call is POSTed to.
    pub fn url(&self) -> &str {
        &self.endpoint.url
    }

    /// The request body scoring `input_ids` with the top `top_k` (at least 1 is asked for).
    pub fn request_body(&self, input_ids: &[u32], top_k: usize) -> serde_json::Value {
        serde_json::to_value(self.body(input_ids, top_k, 0.0)).unwrap_or_default()
    }

    fn body<'a>(
        &'a self,
        input_ids: &'a [u32],
        top_k: usize,
        temperature: f64,
    ) -> CompletionsBody<'a> {
        CompletionsBody {
            model: &self.model,
            prompt: input_ids,
            max_tokens: 1,
            temperature,
            prompt_logprobs: top_k.max(1),
            return_token_ids: true,
        }
    }
}

/// The teacher port's calls with this crate's own error (the port wraps it in a `CallError`).
impl CompletionsTeacher {
    /// See [`TeacherScorer::score`].
    pub async fn score(
        &self,
        input_ids: &[u32],
        response_len: usize,
        top_k: usize,
    ) -> Result<TeacherLogprobs, TeacherError> {
        self.score_at(input_ids, response_len, top_k, 0.0).await
    }

    /// See [`TeacherScorer::score_at`]: `temperature` is sent as the request's (vLLM does not
    /// apply it to `prompt_logprobs`).
    pub async fn score_at(
        &self,
        input_ids: &[u32],
        response_len: usize,
        top_k: usize,
        temperature: f64,
    ) -> Result<TeacherLogprobs, TeacherError> {
        if response_len == 0 {
            return Ok(TeacherLogprobs {
                temperature,
                ..TeacherLogprobs::empty(top_k)
            });
        }
        if response_len >= input_ids.len() {
            return Err(TeacherError::NoContext {
                url: self.url().to_owned(),
                input_len: input_ids.len(),
                response_len,
                config_key: URL_KEY,
            });
        }
        let bytes = match self
            .endpoint
            .post(&self.body(input_ids, top_k, temperature))
            .await
        {
            // vLLM answers an unknown model with 404 "The model `x` does not exist.".
            Err(TeacherError::Status {
                url,
                status: 404,
                body,
                ..
            }) if body.contains("model") => {
                return Err(TeacherError::Status {
                    url,
                    status: 404,
                    body,
                    config_key: MODEL_KEY,
                });
            }
            other => other?,
        };
        let mut scored = parse_completions(&bytes, input_ids, response_len, top_k)
            .map_err(|e| self.endpoint.parse_error(e, top_k))?;
        scored.temperature = temperature;
        Ok(scored)
    }

    /// See [`TeacherScorer::describe`].
    pub fn describe(&self) -> String {
        format!(
            "openai-compatible /v1/completions at {} (model {})",
            self.url(),
            self.model
        )
    }
}

#[async_trait]
impl TeacherScorer for CompletionsTeacher {
    async fn score(
        &self,
        input_ids: &[u32],
        response_len: usize,
        top_k: usize,
    ) -> Result<TeacherLogprobs, CallError> {
        Ok(CompletionsTeacher::score(self, input_ids, response_len, top_k).await?)
    }

    async fn score_at(
        &self,
        input_ids: &[u32],
        response_len: usize,
        top_k: usize,
        image_data: &[String],
        temperature: f64,
    ) -> Result<TeacherLogprobs, CallError> {
        if !image_data.is_empty() {
            // Ids only: the port's refusal, with its reason.
            return self
                .score_with_images(input_ids, response_len, top_k, image_data)
                .await;
        }
        Ok(CompletionsTeacher::score_at(self, input_ids, response_len, top_k, temperature).await?)
    }

    fn describe(&self) -> String {
        CompletionsTeacher::describe(self)
    }
}

#[derive(Deserialize)]
struct Reply {
    choices: Vec<Choice>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    prompt_logprobs: Option<Vec<Option<HashMap<String, PromptLogprob>>>>,
    #[serde(default)]
    prompt_token_ids: Option<Vec<u32>>,
}

#[derive(Deserialize)]
struct PromptLogprob {
    #[serde(default)]
    logprob: Option<f64>,
    #[serde(default)]
    rank: Option<u64>,
}

const FIELD: &str = "prompt_logprobs";

/// The teacher's values for the last `response_len` (T) of `input_ids` from a `/v1/completions` answer
/// with `prompt_logprobs`. Each position is looked up under the id the teacher echoed there
/// (`prompt_token_ids`; our id when the server does not echo), so a tokenizer mismatch shows up in
/// `echoed_ids` rather than as a missing key. Top-K: the entries with a rank, by rank ascending, first
/// `K`.
pub(crate) fn parse_completions(
    bytes: &[u8],
    input_ids: &[u32],
    response_len: usize,
    top_k: usize,
) -> Result<TeacherLogprobs, ParseError> {
    let invalid = |detail: String| ParseError::Invalid(detail);
    let reply: Reply = serde_json::from_slice(bytes).map_err(|e| {
        invalid(format!(
            "not OpenAI completions JSON: {e} (body starts with {:?})",
            snippet(bytes)
        ))
    })?;
    let choice = reply
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| invalid("no `choices`".to_owned()))?;
    let len = input_ids.len();
    let entries = choice.prompt_logprobs.ok_or_else(|| {
        invalid(format!(
            "no `choices[0].{FIELD}`: the server does not support prompt log-probs (vLLM does)"
        ))
    })?;
    if entries.len() != len {
        return Err(invalid(format!(
            "`choices[0].{FIELD}` has {} entries for a prompt of {len} tokens",
            entries.len()
        )));
    }
    let (echoed_all, echo_verified) = match choice.prompt_token_ids {
        Some(ids) if ids.len() == len => (ids, true),
        Some(ids) => {
            return Err(invalid(format!(
                "`choices[0].prompt_token_ids` has {} ids for a prompt of {len} tokens",
                ids.len()
            )));
        }
        None => (input_ids.to_vec(), false),
    };
    let first = len - response_len;
    let mut log_probs = Vec::with_capacity(response_len);
    let mut topk_lps = Vec::with_capacity(if top_k > 0 { response_len } else { 0 });
    let mut topk_ids = Vec::with_capacity(if top_k > 0 { response_len } else { 0 });
    for (position, entry) in entries.into_iter().skip(first).enumerate() {
        let input_position = first + position;
        let missing = ParseError::Missing {
            field: FIELD,
            position,
            input_position,
        };
        let entry = entry.ok_or_else(|| missing.clone())?;
        let id = echoed_all[input_position];
        let lp = entry
            .get(&id.to_string())
            .and_then(|e| e.logprob)
            .ok_or_else(|| missing.clone())?;
        log_probs.push(lp);
        if top_k > 0 {
            let mut ranked = Vec::with_capacity(entry.len());
            for (key, e) in &entry {
                if let Some(rank) = e.rank {
                    let token: u32 = key
                        .parse()
                        .map_err(|_| invalid(format!("`{FIELD}` key {key:?} is not a token id")))?;
                    ranked.push((rank, token, e.logprob.ok_or_else(|| missing.clone())?));
                }
            }
            if ranked.len() < top_k {
                return Err(ParseError::ShortTopK {
                    position,
                    got: ranked.len(),
                });
            }
            ranked.sort_unstable_by_key(|&(rank, token, _)| (rank, token));
            ranked.truncate(top_k);
            topk_lps.push(ranked.iter().map(|r| r.2).collect());
            topk_ids.push(ranked.iter().map(|r| r.1).collect());
        }
    }
    Ok(TeacherLogprobs {
        log_probs,
        topk_log_probs: (top_k > 0).then_some(topk_lps),
        topk_indices: (top_k > 0).then_some(topk_ids),
        echoed_ids: echoed_all[first..].to_vec(),
        echo_verified,
        temperature: 0.0,
        temperature_assumed: false,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    /// The protocols doc's vLLM example (prompt `[151644, 872, 198, 9707]`).
    fn doc_reply() -> Value {
        json!({"id": "cmpl-1", "object": "text_completion", "created": 1767800000, "model": "teacher",
         "choices": [{
           "index": 0, "text": "!", "logprobs": null, "finish_reason": "length", "stop_reason": null,
           "prompt_token_ids": [151644, 872, 198, 9707], "token_ids": [0],
           "prompt_logprobs": [
             null,
             {"872": {"logprob": -7.12, "rank": 15, "decoded_token": "user"},
              "8948": {"logprob": -0.02, "rank": 1, "decoded_token": "system"}},
             {"198": {"logprob": -0.01, "rank": 1,  "decoded_token": "\n"}},
             {"9707": {"logprob": -3.40, "rank": 4, "decoded_token": "Hello"},
              "9703": {"logprob": -0.90, "rank": 1, "decoded_token": "Hi"}}
           ]}],
         "usage": {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5}})
    }

    const IDS: [u32; 4] = [151644, 872, 198, 9707];

    fn parse(v: &Value, t: usize, k: usize) -> Result<TeacherLogprobs, ParseError> {
        parse_completions(v.to_string().as_bytes(), &IDS, t, k)
    }

    #[test]
    fn the_last_t_positions_are_read_by_key() {
        let r = parse(&doc_reply(), 3, 0).unwrap();
        assert_eq!(r.log_probs, vec![-7.12, -0.01, -3.40]);
        assert_eq!(r.echoed_ids, vec![872, 198, 9707]);
        assert!(r.echo_verified && r.topk_log_probs.is_none());
        let r = parse(&doc_reply(), 1, 0).unwrap();
        assert_eq!(r.log_probs, vec![-3.40]);
    }

    #[test]
    fn top_k_is_by_rank_and_the_actual_token_may_be_extra() {
        let r = parse(&doc_reply(), 2, 1).unwrap();
        // Position 3: the actual token 9707 has rank 4; the top-1 is 9703.
        assert_eq!(r.topk_indices.unwrap(), vec![vec![198], vec![9703]]);
        assert_eq!(r.topk_log_probs.unwrap(), vec![vec![-0.01], vec![-0.90]]);
        assert_eq!(r.log_probs, vec![-0.01, -3.40]);
        // Two ranked entries at position 3 but one at position 2: K = 2 is short there.
        assert_eq!(
            parse(&doc_reply(), 2, 2).unwrap_err(),
            ParseError::ShortTopK {
                position: 0,
                got: 1
            }
        );
        assert_eq!(
            parse(&doc_reply(), 1, 2).unwrap().topk_indices.unwrap(),
            vec![vec![9703, 9707]]
        );
    }

    #[test]
    fn unranked_entries_are_skipped_and_clamps_pass_through() {
        let mut v = doc_reply();
        v["choices"][0]["prompt_logprobs"][3] = json!({
            "9707": {"logprob": -9999.0, "rank": null, "decoded_token": "Hello"},
            "5": {"logprob": -0.1, "rank": 2, "decoded_token": "a"},
            "9703": {"logprob": -0.05, "rank": 1, "decoded_token": "Hi"}});
        let r = parse(&v, 1, 2).unwrap();
        assert_eq!(r.log_probs, vec![-9999.0]);
        assert_eq!(r.topk_indices.unwrap(), vec![vec![9703, 5]]);
    }

    #[test]
    fn position_zero_has_no_value() {
        // T = L would need position 0, which is null.
        assert_eq!(
            parse(&doc_reply(), 4, 0).unwrap_err(),
            ParseError::Missing {
                field: FIELD,
                position: 0,
                input_position: 0
            }
        );
    }

    #[test]
    fn without_an_echo_our_ids_are_used_and_flagged() {
        let mut v = doc_reply();
        v["choices"][0]
            .as_object_mut()
            .unwrap()
            .remove("prompt_token_ids");
        let r = parse(&v, 2, 0).unwrap();
        assert!(!r.echo_verified);
        assert_eq!(r.echoed_ids, vec![198, 9707]);
        v["choices"][0]["prompt_token_ids"] = json!(null);
        assert!(!parse(&v, 2, 0).unwrap().echo_verified);
    }

    #[test]
    fn a_different_echo_is_looked_up_by_the_teachers_id() {
        let mut v = doc_reply();
        v["choices"][0]["prompt_token_ids"] = json!([151644, 872, 198, 9703]);
        let r = parse(&v, 2, 0).unwrap();
        assert_eq!(r.echoed_ids, vec![198, 9703]);
        assert_eq!(r.log_probs, vec![-0.01, -0.90]);
        let m = r.check_alignment(&[198, 9707]).unwrap_err();
        assert_eq!(m.first_position, 1);
    }

    #[test]
    fn bad_answers() {
        let mut missing_key = doc_reply();
        missing_key["choices"][0]["prompt_logprobs"][2] =
            json!({"5": {"logprob": -1.0, "rank": 1}});
        assert_eq!(
            parse(&missing_key, 2, 0).unwrap_err(),
            ParseError::Missing {
                field: FIELD,
                position: 0,
                input_position: 2
            }
        );
        let mut short = doc_reply();
        short["choices"][0]["prompt_logprobs"]
            .as_array_mut()
            .unwrap()
            .pop();
        assert!(matches!(parse(&short, 2, 0), Err(ParseError::Invalid(_))));
        let mut no_lps = doc_reply();
        no_lps["choices"][0]["prompt_logprobs"] = json!(null);
        let ParseError::Invalid(d) = parse(&no_lps, 2, 0).unwrap_err() else {
            panic!("expected Invalid")
        };
        assert!(d.contains("prompt log-probs"), "{d}");
        let mut bad_echo = doc_reply();
        bad_echo["choices"][0]["prompt_token_ids"] = json!([1]);
        assert!(matches!(
            parse(&bad_echo, 2, 0),
            Err(ParseError::Invalid(_))
        ));
        let mut bad_key = doc_reply();
        bad_key["choices"][0]["prompt_logprobs"][3]["x"] = json!({"logprob": -1.0, "rank": 3});
        assert!(matches!(parse(&bad_key, 1, 1), Err(ParseError::Invalid(_))));
        for bad in [
            json!({"choices": []}),
            json!({"object": "error"}),
            json!([1]),
        ] {
            assert!(matches!(parse(&bad, 1, 0), Err(ParseError::Invalid(_))));
        }
        assert!(matches!(
            parse_completions(b"<html>", &IDS, 1, 0),
            Err(ParseError::Invalid(_))
        ));
    }

    fn teacher(base: &str) -> Result<CompletionsTeacher, TeacherError> {
        CompletionsTeacher::new(CompletionsTeacherConfig {
            base_url: base.into(),
            model: "teacher".into(),
            api_key: Some("sk-secret".into()),
            timeout: Duration::from_secs(1),
        })
    }

    #[test]
    fn urls_are_normalised() {
        for (base, want) in [
            ("http://h:8000", "http://h:8000/v1/completions"),
            ("http://h:8000/", "http://h:8000/v1/completions"),
            ("http://h:8000/v1", "http://h:8000/v1/completions"),
            ("http://h:8000/v1/", "http://h:8000/v1/completions"),
            (
                "http://h:8000/v1/completions",
                "http://h:8000/v1/completions",
            ),
            (
                "https://api.example.com/api/v1",
                "https://api.example.com/api/v1/completions",
            ),
            (
                "https://api.example.com/openai",
                "https://api.example.com/openai/v1/completions",
            ),
        ] {
            assert_eq!(completions_url(base).unwrap(), want, "{base}");
            assert_eq!(teacher(base).unwrap().url(), want);
        }
        for chat in [
            "http://h/v1/chat/completions",
            "http://h/v1/chat/completions/",
        ] {
            let e = completions_url(chat).unwrap_err();
            assert!(matches!(e, TeacherError::ChatEndpoint { .. }), "{e}");
            let text = e.to_string();
            assert!(
                text.contains("/v1/completions") && text.contains("/generate"),
                "{text}"
            );
        }
        assert!(matches!(
            completions_url("ftp://h/v1"),
            Err(TeacherError::InvalidUrl { .. })
        ));
    }

    #[test]
    fn the_body_and_the_config_debug() {
        let t = teacher("http://h/v1").unwrap();
        assert_eq!(
            t.request_body(&[1, 2, 3], 0),
            json!({"model": "teacher", "prompt": [1, 2, 3], "max_tokens": 1, "temperature": 0.0,
                   "prompt_logprobs": 1, "return_token_ids": true})
        );
        assert_eq!(t.request_body(&[1, 2, 3], 5)["prompt_logprobs"], 5);
        assert!(!format!("{t:?}").contains("sk-secret"));
        let cfg = CompletionsTeacherConfig {
            base_url: "http://h".into(),
            model: String::new(),
            api_key: Some("sk-secret".into()),
            timeout: Duration::from_secs(1),
        };
        assert!(!format!("{cfg:?}").contains("sk-secret"));
        let e = CompletionsTeacher::new(cfg).unwrap_err();
        assert!(e.to_string().contains(MODEL_KEY), "{e}");
    }
}
