//! The answer as the client asked for it: what the proxy added to the upstream request for
//! training (log-probs, top log-probs, token ids) is taken out of the answer again, so that it keeps
//! the shape the client expects — written from the raw bytes for a whole answer
//! ([`ClientShape::write_answer`]), edited in the tree for synthesized chunks
//! ([`ClientShape::reshape`]) and per event for a streamed one.

use ps_json::{self as raw, Edit, RawObject};
use ps_sglang_client::{Answer, Choice, choices_of};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::request::{ChatRequest, Forwarded};

/// What the client asked for, so that what we added for training (log-probs, top log-probs, token
/// ids) is taken out again and the answer keeps the shape the client expects.
#[derive(Debug, Clone, Copy)]
pub struct ClientShape {
    logprobs: bool,
    top_logprobs: u64,
    injected_token_ids: bool,
    /// The client asked for `return_prompt_token_ids` itself: its prompt ids stay.
    client_prompt_ids: bool,
    /// We asked for routed experts (`return_routed_experts`): SGLang's `sglext.routed_experts`
    /// is taken out again.
    injected_experts: bool,
}

impl ClientShape {
    pub fn of(client: &ChatRequest, forwarded: &Forwarded) -> Self {
        Self {
            logprobs: client.is_true("logprobs"),
            top_logprobs: client.u64_of("top_logprobs").unwrap_or(0),
            injected_token_ids: forwarded.return_token_ids
                && !client.contains_key("return_token_ids"),
            client_prompt_ids: client.is_true("return_prompt_token_ids"),
            injected_experts: forwarded.injected_experts,
        }
    }

    pub(crate) fn needs_reshape(&self) -> bool {
        !self.logprobs || self.top_logprobs == 0 || self.injected_token_ids || self.injected_experts
    }

    /// A stream chunk that carried nothing but the experts we asked for (SGLang's final
    /// `choices: []` chunk with `sglext`): not sent to the client at all.
    pub(crate) fn drops_chunk(&self, chunk: &RawObject<'_>) -> bool {
        self.injected_experts
            && chunk
                .get("choices")
                .and_then(raw::array)
                .is_some_and(|c| c.is_empty())
            && !chunk.contains_key("usage")
            && chunk
                .get("sglext")
                .is_some_and(|x| sglext_without_experts(x).is_none())
    }

    /// What the top-level `sglext` becomes: kept, without `routed_experts`, or dropped.
    fn sglext_edit(&self, value: &RawValue) -> Edit<'static> {
        if !self.injected_experts {
            return Edit::Keep;
        }
        match sglext_without_experts(value) {
            Some(b) => Edit::Replace(b.into()),
            None => Edit::Drop,
        }
    }

    /// Writes an answer or chunk (an object read raw) as [`Self::reshape`] would leave it, without
    /// building a tree: every part the client gets unchanged is copied as the upstream's bytes.
    /// `extra` is a field set on the top-level object (in place when present, else last).
    /// `choices` are the object's choices when already read.
    pub fn write(
        &self,
        obj: &RawObject<'_>,
        choices: Option<&[Choice<'_>]>,
        extra: Option<(&str, &[u8])>,
        out: &mut Vec<u8>,
    ) {
        let reshape = self.needs_reshape();
        let drop_prompt_ids = reshape && self.injected_token_ids && !self.client_prompt_ids;
        let read;
        let choices = match choices {
            Some(c) => Some(c),
            None if reshape => {
                read = choices_of(obj.get("choices"));
                read.as_deref()
            }
            None => None,
        };
        let choices = choices.filter(|_| reshape).map(|elems| {
            let len = obj.get("choices").map_or(0, |c| c.get().len());
            let mut b = Vec::with_capacity(len);
            b.push(b'[');
            for (i, (text, choice)) in elems.iter().enumerate() {
                if i > 0 {
                    b.push(b',');
                }
                self.write_choice(text, choice.as_ref(), &mut b);
            }
            b.push(b']');
            b
        });
        let append: Vec<(&str, &[u8])> = extra
            .filter(|(k, _)| !obj.contains_key(k))
            .into_iter()
            .collect();
        raw::write_object(
            out,
            obj,
            |k, v| match k {
                "prompt_token_ids" if drop_prompt_ids => Edit::Drop,
                "sglext" => self.sglext_edit(v),
                "choices" if choices.is_some() => {
                    Edit::Replace(choices.as_deref().unwrap_or_default().into())
                }
                _ => match extra {
                    Some((key, v)) if key == k => Edit::Replace(v.into()),
                    _ => Edit::Keep,
                },
            },
            &append,
        );
    }

    /// Writes a non-streamed answer as [`Self::write`] writes an object read raw, from the
    /// entries the answer's single pass recorded (no part of it is read again, except the
    /// log-probs of a client that wants them without top lists).
    pub fn write_answer(&self, answer: &Answer, extra: Option<(&str, &[u8])>, out: &mut Vec<u8>) {
        let reshape = self.needs_reshape();
        let drop_prompt_ids = reshape && self.injected_token_ids && !self.client_prompt_ids;
        let append: Vec<(&str, &[u8])> = extra
            .filter(|(k, _)| !answer.contains_key(k))
            .into_iter()
            .collect();
        let choice = reshape.then_some(|k: &str, v: &[u8]| self.choice_edit(k, v));
        answer.write(
            out,
            |k, v| match k {
                "prompt_token_ids" if drop_prompt_ids => Edit::Drop,
                "sglext" => match serde_json::from_slice::<&RawValue>(v) {
                    Ok(raw) => self.sglext_edit(raw),
                    Err(_) => Edit::Keep,
                },
                _ => match extra {
                    Some((key, v)) if key == k => Edit::Replace(v.into()),
                    _ => Edit::Keep,
                },
            },
            choice,
            &append,
        );
    }

    /// What [`Self::write_answer`] does with one entry of a choice.
    fn choice_edit(&self, key: &str, value: &[u8]) -> Edit<'static> {
        match key {
            "token_ids" | "response_token_ids" if self.injected_token_ids => Edit::Drop,
            "prompt_token_ids" if self.injected_token_ids && !self.client_prompt_ids => Edit::Drop,
            "logprobs" if !self.logprobs => Edit::Replace(b"null".as_slice().into()),
            "logprobs" if self.top_logprobs == 0 => {
                match serde_json::from_slice::<&RawValue>(value)
                    .ok()
                    .and_then(without_top_logprobs)
                {
                    Some(b) => Edit::Replace(b.into()),
                    None => Edit::Keep,
                }
            }
            _ => Edit::Keep,
        }
    }

    fn write_choice(&self, choice: &RawValue, obj: Option<&RawObject<'_>>, out: &mut Vec<u8>) {
        let Some(obj) = obj else {
            out.extend_from_slice(choice.get().as_bytes());
            return;
        };
        let logprobs = if !self.logprobs {
            obj.contains_key("logprobs").then(|| b"null".to_vec())
        } else if self.top_logprobs == 0 {
            obj.get("logprobs").and_then(without_top_logprobs)
        } else {
            None
        };
        raw::write_object(
            out,
            obj,
            |k, _| match k {
                "token_ids" | "response_token_ids" if self.injected_token_ids => Edit::Drop,
                "prompt_token_ids" if self.injected_token_ids && !self.client_prompt_ids => {
                    Edit::Drop
                }
                "logprobs" => match &logprobs {
                    Some(b) => Edit::Replace(b.as_slice().into()),
                    None => Edit::Keep,
                },
                _ => Edit::Keep,
            },
            &[],
        );
    }
}

/// An `sglext` object without `routed_experts`; `None` when nothing else is left in it. Not an
/// object: kept as it is.
fn sglext_without_experts(sglext: &RawValue) -> Option<Vec<u8>> {
    let Some(obj) = RawObject::of(sglext) else {
        return Some(sglext.get().as_bytes().to_vec());
    };
    if obj.entries().all(|(k, _)| k == "routed_experts") {
        return None;
    }
    let mut out = Vec::with_capacity(64);
    raw::write_object(
        &mut out,
        &obj,
        |k, _| match k {
            "routed_experts" => Edit::Drop,
            _ => Edit::Keep,
        },
        &[],
    );
    Some(out)
}

/// `logprobs` with every `content[]` entry's `top_logprobs` set to `[]`; `None` when there is no
/// `content` array (nothing changes).
fn without_top_logprobs(logprobs: &RawValue) -> Option<Vec<u8>> {
    let obj = RawObject::of(logprobs)?;
    let entries = obj.get("content").and_then(raw::array)?;
    let mut content = Vec::with_capacity(logprobs.get().len());
    raw::write_array(&mut content, &entries, |out, e| match RawObject::of(e) {
        Some(entry) => {
            let append: &[(&str, &[u8])] = if entry.contains_key("top_logprobs") {
                &[]
            } else {
                &[("top_logprobs", b"[]")]
            };
            raw::write_object(
                out,
                &entry,
                |k, _| match k {
                    "top_logprobs" => Edit::Replace(b"[]".as_slice().into()),
                    _ => Edit::Keep,
                },
                append,
            );
        }
        None => out.extend_from_slice(e.get().as_bytes()),
    });
    let mut out = Vec::with_capacity(content.len() + 64);
    raw::write_object(
        &mut out,
        &obj,
        |k, _| match k {
            "content" => Edit::Replace(content.as_slice().into()),
            _ => Edit::Keep,
        },
        &[],
    );
    Some(out)
}

impl ClientShape {
    /// Removes from an answer or chunk what the client did not ask for.
    pub fn reshape(&self, answer: &mut Value) {
        if !self.needs_reshape() {
            return;
        }
        if self.injected_token_ids
            && !self.client_prompt_ids
            && let Some(top) = answer.as_object_mut()
        {
            // vLLM answers the prompt ids at the response level.
            top.remove("prompt_token_ids");
        }
        if self.injected_experts
            && let Some(top) = answer.as_object_mut()
            && let Some(sglext) = top.get_mut("sglext").and_then(Value::as_object_mut)
        {
            sglext.remove("routed_experts");
            if sglext.is_empty() {
                top.remove("sglext");
            }
        }
        let Some(choices) = answer.get_mut("choices").and_then(Value::as_array_mut) else {
            return;
        };
        for choice in choices {
            let Some(choice) = choice.as_object_mut() else {
                continue;
            };
            if self.injected_token_ids {
                // Wherever the build put them (docs/upstream-protocols.md, 1.5).
                choice.remove("token_ids");
                choice.remove("response_token_ids");
                if !self.client_prompt_ids {
                    choice.remove("prompt_token_ids");
                }
            }
            if !self.logprobs {
                if choice.contains_key("logprobs") {
                    choice.insert("logprobs".into(), Value::Null);
                }
            } else if self.top_logprobs == 0 {
                let entries = choice
                    .get_mut("logprobs")
                    .and_then(|l| l.get_mut("content"))
                    .and_then(Value::as_array_mut);
                for e in entries.into_iter().flatten() {
                    if let Some(e) = e.as_object_mut() {
                        e.insert("top_logprobs".into(), Value::Array(Vec::new()));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use serde_json::json;

    fn shapes() -> Vec<ClientShape> {
        let mut out = Vec::new();
        for logprobs in [false, true] {
            for top_logprobs in [0, 2] {
                for injected_token_ids in [false, true] {
                    for client_prompt_ids in [false, true] {
                        for injected_experts in [false, true] {
                            out.push(ClientShape {
                                logprobs,
                                top_logprobs,
                                injected_token_ids,
                                client_prompt_ids,
                                injected_experts,
                            });
                        }
                    }
                }
            }
        }
        out
    }

    fn answers() -> Vec<Value> {
        let entry = |t: &str| json!({"token": t, "bytes": [104], "logprob": -0.25, "top_logprobs": [{"token": t, "logprob": -0.25}]});
        vec![
            json!({"id": "x", "object": "chat.completion", "choices": [{"index": 0,
                "message": {"role": "assistant", "content": "Hi"},
                "logprobs": {"content": [entry("Hi"), {"token": "!", "logprob": -1.5}, 7]},
                "finish_reason": "stop", "matched_stop": 151645,
                "response_token_ids": [1, 2], "prompt_token_ids": [3]}],
                "usage": {"prompt_tokens": 1}, "metadata": {"weight_version": "v1"}}),
            // vLLM: prompt ids at the response level, `token_ids` per choice
            json!({"prompt_token_ids": [3, 4], "choices": [{"index": 0, "message": {"content": "a"},
                "logprobs": {"content": [entry("a")]}, "token_ids": [5]}], "session_id": "old"}),
            // a chunk, a choice without log-probs, one that is not an object
            json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "c"},
                "logprobs": null}, 3, {"index": 1, "logprobs": {"content": "x"}}]}),
            json!({"choices": "none", "prompt_token_ids": [1]}),
            json!({"choices": [], "usage": {}}),
            // SGLang's routed experts, whole, beside ids, alone (a stream's last chunk), odd
            json!({"choices": [{"index": 0, "message": {"content": "a"}}],
                "sglext": {"routed_experts": "AAAA", "output_ids": [[5]]}}),
            json!({"id": "c", "choices": [], "sglext": {"routed_experts": "AAAA"}}),
            json!({"choices": [], "sglext": 5}),
        ]
    }

    /// The experts we asked for are taken out of `sglext` (and an `sglext` left empty with
    /// them); a stream chunk that carried only them is not sent; a client's own ask keeps them.
    #[test]
    fn asked_experts_are_taken_out_again() {
        let shape = |injected_experts| ClientShape {
            logprobs: true,
            top_logprobs: 1,
            injected_token_ids: false,
            client_prompt_ids: false,
            injected_experts,
        };
        let written = |shape: ClientShape, v: &Value| {
            let text = v.to_string();
            let mut out = Vec::new();
            shape.write(&RawObject::parse(&text).unwrap(), None, None, &mut out);
            serde_json::from_slice::<Value>(&out).unwrap()
        };
        let whole = json!({"choices": [], "sglext": {"routed_experts": "AAAA", "output_ids": [1]}});
        assert_eq!(
            written(shape(true), &whole),
            json!({"choices": [], "sglext": {"output_ids": [1]}})
        );
        assert_eq!(written(shape(false), &whole), whole);
        let last = json!({"id": "c", "choices": [], "sglext": {"routed_experts": "AAAA"}});
        let text = last.to_string();
        let chunk = RawObject::parse(&text).unwrap();
        assert!(shape(true).drops_chunk(&chunk));
        assert!(!shape(false).drops_chunk(&chunk));
        assert_eq!(
            written(shape(true), &last),
            json!({"id": "c", "choices": []})
        );
        let with_usage = json!({"choices": [], "usage": {"prompt_tokens": 3}, "sglext": {"routed_experts": "A"}});
        let text = with_usage.to_string();
        assert!(!shape(true).drops_chunk(&RawObject::parse(&text).unwrap()));
    }

    /// The raw writer leaves every answer as reshaping its tree did (the same keys and values);
    /// the session id is set in place or added last.
    #[test]
    fn writing_raw_equals_reshaping_the_tree() {
        for shape in shapes() {
            for answer in answers() {
                let mut expected = answer.clone();
                shape.reshape(&mut expected);
                let text = answer.to_string();
                let obj = RawObject::parse(&text).expect("object");
                let mut out = Vec::new();
                shape.write(&obj, None, None, &mut out);
                let got: Value = serde_json::from_slice(&out).expect("JSON");
                assert_eq!(got, expected, "{shape:?} {answer}");
                if let Some(o) = expected.as_object_mut() {
                    o.insert("session_id".into(), json!("s\"1"));
                }
                let mut out = Vec::new();
                let choices = choices_of(obj.get("choices"));
                shape.write(
                    &obj,
                    choices.as_deref(),
                    Some(("session_id", br#""s\"1""#)),
                    &mut out,
                );
                let got: Value = serde_json::from_slice(&out).expect("JSON");
                assert_eq!(got, expected, "{shape:?} {answer}");
                // Keys the client keeps keep the upstream's order (removals do not reorder); an
                // added session id comes last. Read from the written text, not from a tree.
                let key_order = |text: &str| -> Vec<String> {
                    RawObject::parse(text)
                        .expect("object")
                        .entries()
                        .map(|(k, _)| k.to_owned())
                        .collect()
                };
                let got_keys = key_order(std::str::from_utf8(&out).expect("utf-8"));
                let kept = expected.as_object().expect("object");
                let mut want_keys: Vec<String> = key_order(&text)
                    .into_iter()
                    .filter(|k| kept.contains_key(k))
                    .collect();
                if !want_keys.iter().any(|k| k == "session_id") {
                    want_keys.push("session_id".into());
                }
                assert_eq!(got_keys, want_keys, "{shape:?} {answer}");
                // A whole answer, read in one pass, is written alike.
                let whole = Answer::parse("u", Bytes::from(text.clone())).expect("an answer");
                let mut written = Vec::new();
                shape.write_answer(&whole, Some(("session_id", br#""s\"1""#)), &mut written);
                assert_eq!(written, out, "{shape:?} {answer}");
            }
        }
    }

    /// An event whose data has several lines (an upstream event of several `data:` lines, or JSON
    /// with newlines between tokens) is written with `data: ` before every line.
    /// Nothing to take out: the answer's bytes go to the client as they came.
    #[test]
    fn an_answer_the_client_asked_for_whole_is_passed_on_byte_for_byte() {
        let shape = ClientShape {
            logprobs: true,
            top_logprobs: 1,
            injected_token_ids: false,
            client_prompt_ids: false,
            injected_experts: false,
        };
        let text = r#"{"id":"x","choices":[{"index":0,"logprobs":{"content":[{"token":"a","logprob":-0.10000000000000001,"top_logprobs":[]}]}}]}"#;
        let obj = RawObject::parse(text).expect("object");
        let mut out = Vec::new();
        shape.write(&obj, None, Some(("session_id", b"\"s\"")), &mut out);
        assert_eq!(
            std::str::from_utf8(&out).expect("utf-8"),
            &format!("{},\"session_id\":\"s\"}}", &text[..text.len() - 1])
        );
        let whole = Answer::parse("u", Bytes::from_static(text.as_bytes())).expect("an answer");
        let mut written = Vec::new();
        shape.write_answer(&whole, Some(("session_id", b"\"s\"")), &mut written);
        assert_eq!(written, out);
    }
}
