//! Chat messages as clients send them, and the normalisation applied before rendering.
//!
//! Messages stay `serde_json::Value`s so that unknown fields (`tool_call_id`, `name`, …) and key order
//! survive untouched; the chat template ignores what it does not use.

use serde_json::{Map, Value};

/// Flattens a message content to text: a string stays as is; a list of parts becomes the `text` of its
/// `{"type": "text"}` parts joined by one space, a text part without a string `text` contributing
/// `""` as in the reference (so `[{"type":"text"},{"type":"text","text":"a"}]` is `" a"`); other
/// parts are dropped; anything else is `""`.
pub fn flatten_content(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
            .map(|p| p.get("text").and_then(Value::as_str).unwrap_or(""))
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    }
}

/// Why a conversation cannot be captured exactly: the first content part of `messages` that is not
/// text (an image, audio, a video, a file, a refusal or any other kind, or a part that is not an
/// object), as a drop reason (`image_unsupported`, `audio_unsupported`, `video_unsupported`,
/// `file_unsupported`, `content_part_unsupported`) and a sentence saying where it is. The chat
/// template sees text only ([`flatten_content`] leaves other parts out), so a turn with such a
/// part would be a sample of a prompt the policy never saw: it is dropped with this reason
/// instead.
pub fn unsupported_part(messages: &[Value]) -> Option<(&'static str, String)> {
    unsupported_part_with(messages, false)
}

/// [`unsupported_part`], with image parts left out when `images_captured` (a vision-language
/// model captures them exactly; they are checked on their own).
pub fn unsupported_part_with(
    messages: &[Value],
    images_captured: bool,
) -> Option<(&'static str, String)> {
    for (i, m) in messages.iter().enumerate() {
        let Some(Value::Array(parts)) = m.get("content") else {
            continue;
        };
        for (j, p) in parts.iter().enumerate() {
            let kind = p.get("type").and_then(Value::as_str);
            if images_captured && is_image_part(p) {
                continue;
            }
            if let Some(reason) = part_reason(kind) {
                return Some((reason, unsupported_detail(i, j, kind)));
            }
        }
    }
    None
}

/// The drop reason of a content part whose `type` is `kind` (`None`: a part without a string
/// `type`, or not an object); `None` for text, the one kind that is captured.
pub fn part_reason(kind: Option<&str>) -> Option<&'static str> {
    Some(match kind {
        Some("text") => return None,
        k if is_image_kind(k) => "image_unsupported",
        Some("input_audio" | "audio" | "audio_url") => "audio_unsupported",
        Some("video_url" | "video") => "video_unsupported",
        Some("file" | "input_file") => "file_unsupported",
        _ => "content_part_unsupported",
    })
}

/// Where the part that is not text is, and why that turn gives no sample.
pub fn unsupported_detail(message: usize, part: usize, kind: Option<&str>) -> String {
    let what = kind.map_or_else(
        || "a part without a string `type`".to_owned(),
        |k| format!("a `{k}` part"),
    );
    format!(
        "messages[{message}].content[{part}] is {what}: only text is captured, so a sample would \
         hold a prompt the policy never saw"
    )
}

/// Normalises one request message the way the reference server does before rendering:
/// role `developer` becomes `system`; a content list is flattened with [`flatten_content`];
/// a `null` or missing content is left as it is (the template treats it as empty). A message
/// whose reasoning is under vLLM's name, `reasoning`, with no `reasoning_content` beside it, gets
/// it as `reasoning_content` too, the key chat templates read (vLLM hands its template both:
/// docs/upstream-protocols.md, "vLLM as the policy engine"). Tool-call arguments sent as a JSON
/// string are parsed into the object they hold, as SGLang and vLLM do before they render
/// (the template then writes them with `tojson`); a string that does not hold an object becomes
/// `{}` as in vLLM (SGLang refuses such a request, so it is never rendered there).
pub fn normalize_message(message: &Value) -> Value {
    normalize_message_with(message, false)
}

/// [`normalize_message`], with content lists kept as they are when `keep_lists`: for a template
/// that loops over a message's content (engines hand such a template the list, "openai" content
/// format: it joins the text parts itself and writes each image's placeholder where it stands,
/// as Qwen-VL templates do).
pub fn normalize_message_with(message: &Value, keep_lists: bool) -> Value {
    let Some(obj) = message.as_object() else {
        return message.clone();
    };
    let mut out = Map::with_capacity(obj.len() + 1);
    for (k, v) in obj {
        let v = match (k.as_str(), v) {
            ("role", Value::String(r)) if r == "developer" => Value::String("system".into()),
            ("content", Value::Array(_)) if keep_lists => v.clone(),
            ("content", Value::Array(_)) => Value::String(flatten_content(v)),
            ("tool_calls", Value::Array(calls)) => {
                Value::Array(calls.iter().map(parsed_arguments).collect())
            }
            _ => v.clone(),
        };
        out.insert(k.clone(), v);
    }
    if let Some(reasoning) = vllm_reasoning(obj) {
        out.insert(
            "reasoning_content".into(),
            Value::String(reasoning.to_owned()),
        );
    }
    Value::Object(out)
}

/// A tool call with its `function.arguments` as the engines hand it to the template: a JSON
/// string parsed into its object, anything else that is not an object `{}`.
fn parsed_arguments(call: &Value) -> Value {
    let mut call = call.clone();
    if let Some(f) = call.get_mut("function").and_then(Value::as_object_mut) {
        let args = match f.get("arguments") {
            Some(Value::Object(_)) => return call,
            Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                Ok(v @ Value::Object(_)) => v,
                _ => Value::Object(Map::new()),
            },
            _ => Value::Object(Map::new()),
        };
        f.insert("arguments".into(), args);
    }
    call
}

/// The reasoning of a message that carries it only under vLLM's key `reasoning` (a string, with
/// `reasoning_content` missing or `null`).
fn vllm_reasoning(obj: &Map<String, Value>) -> Option<&str> {
    match obj.get("reasoning_content") {
        None | Some(Value::Null) => obj.get("reasoning").and_then(Value::as_str),
        Some(_) => None,
    }
}

/// Moves an answer's reasoning from vLLM's key `reasoning` to `reasoning_content`, the key the
/// rest of the pipeline (rendering, records, judges) reads; an answer with `reasoning_content`
/// already is left as it is.
pub fn reasoning_to_content_key(message: &mut Value) {
    let Some(obj) = message.as_object_mut() else {
        return;
    };
    if vllm_reasoning(obj).is_some()
        && let Some(r) = obj.shift_remove("reasoning")
    {
        obj.insert("reasoning_content".into(), r);
    }
}

/// Normalises every message of a request.
pub fn normalize_messages(messages: &[Value]) -> Vec<Value> {
    messages.iter().map(normalize_message).collect()
}

/// [`normalize_message_with`] over a conversation.
pub fn normalize_messages_with(messages: &[Value], keep_lists: bool) -> Vec<Value> {
    messages
        .iter()
        .map(|m| normalize_message_with(m, keep_lists))
        .collect()
}

/// Whether a content part's `type` is an image's (OpenAI `image_url`, Responses `input_image`,
/// Anthropic and `transformers` `image`).
pub fn is_image_kind(kind: Option<&str>) -> bool {
    matches!(kind, Some("image_url" | "input_image" | "image"))
}

/// Whether a content part is an image ([`is_image_kind`] of its `type`).
pub fn is_image_part(part: &Value) -> bool {
    is_image_kind(part.get("type").and_then(Value::as_str))
}

/// Where an image part's image is: inline data or a URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageSource<'a> {
    /// A data URL (`data:<mime>[;base64],<data>`) or Anthropic's base64 `source`: the media type
    /// (as given), whether the data is declared base64, and the data.
    Data {
        mime: &'a str,
        base64: bool,
        data: &'a str,
    },
    /// Anything else: a remote URL (or not a URL at all).
    Url(&'a str),
}

/// An image part's source, in any of the shapes clients send: OpenAI `{"type": "image_url",
/// "image_url": {"url": …}}` (or the URL as a string), Responses `{"type": "input_image",
/// "image_url": …}`, `transformers` `{"type": "image", "image" | "url": …}`, Anthropic
/// `{"type": "image", "source": {"type": "base64", "media_type", "data"} | {"type": "url",
/// "url"}}`. `None` when the part names none.
pub fn image_source(part: &Value) -> Option<ImageSource<'_>> {
    fn s(v: Option<&Value>) -> Option<&str> {
        v.and_then(Value::as_str)
    }
    let url = match (part.get("source"), part.get("image_url")) {
        (Some(src @ Value::Object(_)), _) => {
            if let Some(data) = s(src.get("data")) {
                return Some(ImageSource::Data {
                    mime: s(src.get("media_type")).unwrap_or(""),
                    base64: true,
                    data,
                });
            }
            s(src.get("url"))?
        }
        (_, Some(Value::Object(o))) => s(o.get("url"))?,
        (_, Some(Value::String(u))) => u,
        _ => s(part.get("image")).or(s(part.get("url")))?,
    };
    let Some(rest) = url.strip_prefix("data:") else {
        return Some(ImageSource::Url(url));
    };
    let (meta, data) = rest.split_once(',').unwrap_or((rest, ""));
    Some(match meta.strip_suffix(";base64") {
        Some(mime) => ImageSource::Data {
            mime,
            base64: true,
            data,
        },
        None => ImageSource::Data {
            mime: meta,
            base64: false,
            data,
        },
    })
}

/// What identifies an image part's image whatever shape it is sent in ([`image_source`]): the
/// payload of its inline data (media type left out), or its URL.
pub fn image_identity(part: &Value) -> Option<&str> {
    Some(match image_source(part)? {
        ImageSource::Data { data, .. } => data.trim(),
        ImageSource::Url(url) => url.trim(),
    })
}

/// What a judge reads where a message had an image (judges read text): stated, not left out.
pub const IMAGE_PLACEHOLDER: &str = "[image]";

/// `messages` with each image part replaced by a text part [`IMAGE_PLACEHOLDER`] (what the
/// judges read of a vision-language policy's conversation); `None` when none has an image.
pub fn images_as_placeholders(messages: &[Value]) -> Option<Vec<Value>> {
    image_parts(messages).next()?;
    Some(
        messages
            .iter()
            .map(|m| {
                let mut m = m.clone();
                if let Some(Value::Array(parts)) = m.get_mut("content") {
                    for p in parts.iter_mut().filter(|p| is_image_part(p)) {
                        *p = serde_json::json!({"type": "text", "text": IMAGE_PLACEHOLDER});
                    }
                }
                m
            })
            .collect(),
    )
}

/// The image parts of `messages`, in prompt order.
pub fn image_parts(messages: &[Value]) -> impl Iterator<Item = &Value> {
    messages
        .iter()
        .filter_map(|m| m.get("content").and_then(Value::as_array))
        .flatten()
        .filter(|p| is_image_part(p))
}

/// Normalises the assistant message returned by the upstream: a `null` or missing content becomes
/// `""` first, then [`normalize_message`] applies.
pub fn normalize_response_message(message: &Value) -> Value {
    let mut m = message.clone();
    if let Some(obj) = m.as_object_mut() {
        match obj.get("content") {
            None | Some(Value::Null) => {
                obj.insert("content".into(), Value::String(String::new()));
            }
            _ => {}
        }
    }
    normalize_message(&m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn images_become_stated_placeholders_for_the_judges() {
        let m = vec![json!({"role": "user", "content": [
            {"type": "text", "text": "and"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
            {"type": "text", "text": "this?"}]})];
        let p = images_as_placeholders(&m).unwrap();
        assert_eq!(flatten_content(&p[0]["content"]), "and [image] this?");
        assert_eq!(unsupported_part(&p), None);
        assert_eq!(
            images_as_placeholders(&[json!({"role": "user", "content": "x"})]),
            None
        );
    }

    #[test]
    fn developer_becomes_system_and_lists_flatten() {
        let m = json!({"role": "developer", "content": [
            {"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}, {"type": "text", "text": "b"}
        ], "name": "x"});
        let n = normalize_message(&m);
        assert_eq!(n, json!({"role": "system", "content": "a b", "name": "x"}));
        // key order is preserved
        let keys: Vec<_> = n
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        assert_eq!(keys, ["role", "content", "name"]);
    }

    #[test]
    fn list_without_text_is_empty_and_null_stays_null() {
        assert_eq!(flatten_content(&json!([{"type": "image_url"}])), "");
        assert_eq!(
            normalize_message(&json!({"role": "user", "content": null})),
            json!({"role": "user", "content": null})
        );
    }

    /// The reference joins `part.get("text", "")` of every text part: a text part without `text`
    /// still adds its separator, which changes the rendered prompt and so the token ids.
    #[test]
    fn a_text_part_without_text_contributes_an_empty_string() {
        let c = json!([{"type": "text"}, {"type": "text", "text": "a"}, {"type": "image_url"},
                       {"type": "text", "text": "b"}, {"type": "text", "text": null}]);
        assert_eq!(flatten_content(&c), " a b ");
        assert_eq!(
            normalize_message(&json!({"role": "user", "content": [{"type": "text"}]})),
            json!({"role": "user", "content": ""})
        );
    }

    #[test]
    fn response_null_content_becomes_empty() {
        let r = normalize_response_message(
            &json!({"role": "assistant", "content": null, "tool_calls": []}),
        );
        assert_eq!(r["content"], json!(""));
        let r = normalize_response_message(&json!({"role": "assistant"}));
        assert_eq!(r["content"], json!(""));
    }

    /// What SGLang and vLLM hand their templates (read in their sources, docs/upstream-protocols.md
    /// "vLLM as the policy engine"): tool-call argument strings parsed into objects, so that the
    /// template writes them with `tojson`; a string that holds no object is `{}` (vLLM).
    #[test]
    fn tool_call_arguments_are_parsed_as_the_engines_parse_them() {
        let m = json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{\"b\":1,\"a\":[2]}"}},
            {"id": "b", "type": "function", "function": {"name": "g", "arguments": "not json"}},
            {"id": "c", "type": "function", "function": {"name": "h", "arguments": "[1]"}},
            {"id": "d", "type": "function", "function": {"name": "i", "arguments": {"x": 1}}},
            {"id": "e", "type": "function", "function": {"name": "j"}}]});
        let n = normalize_message(&m);
        let args: Vec<&Value> = n["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| &c["function"]["arguments"])
            .collect();
        assert_eq!(
            args,
            [
                &json!({"b": 1, "a": [2]}),
                &json!({}),
                &json!({}),
                &json!({"x": 1}),
                &json!({})
            ]
        );
        // Key order survives the parse (the template writes them in the client's order).
        let keys: Vec<&String> = args[0]
            .as_object()
            .into_iter()
            .flat_map(|o| o.keys())
            .collect();
        assert_eq!(keys, ["b", "a"]);
        assert_eq!(n["tool_calls"][0]["id"], "a");
    }

    /// vLLM's reasoning key: rendered as `reasoning_content` when that is missing or null; an
    /// answer's is moved there.
    #[test]
    fn vllm_reasoning_is_read_as_reasoning_content() {
        let n = normalize_message(&json!({"role": "assistant", "content": "a", "reasoning": "r"}));
        assert_eq!(n["reasoning_content"], "r");
        let n = normalize_message(
            &json!({"role": "assistant", "reasoning_content": "s", "reasoning": "r"}),
        );
        assert_eq!(
            n["reasoning_content"], "s",
            "SGLang's key wins when both are set"
        );
        let mut answer = json!({"role": "assistant", "content": null, "reasoning": "r", "reasoning_content": null});
        reasoning_to_content_key(&mut answer);
        assert_eq!(
            answer,
            json!({"role": "assistant", "content": null, "reasoning_content": "r"})
        );
        let mut answer = json!({"role": "assistant", "content": "c", "reasoning_content": "s"});
        let before = answer.clone();
        reasoning_to_content_key(&mut answer);
        assert_eq!(answer, before);
    }

    #[test]
    fn every_part_that_is_not_text_names_its_reason() {
        let with = |part: Value| {
            vec![
                json!({"role": "system", "content": "S"}),
                json!({"role": "user", "content": [{"type": "text", "text": "look"}, part]}),
            ]
        };
        for (part, reason) in [
            (
                json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}),
                "image_unsupported",
            ),
            (
                json!({"type": "input_image", "image_url": "https://x/y.png"}),
                "image_unsupported",
            ),
            (
                json!({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}),
                "audio_unsupported",
            ),
            (
                json!({"type": "video_url", "video_url": {"url": "https://x/y.mp4"}}),
                "video_unsupported",
            ),
            (
                json!({"type": "file", "file": {"file_id": "f"}}),
                "file_unsupported",
            ),
            (
                json!({"type": "refusal", "refusal": "no"}),
                "content_part_unsupported",
            ),
            (json!({"type": "hologram"}), "content_part_unsupported"),
            (json!("a bare string"), "content_part_unsupported"),
            (json!({"text": "no type"}), "content_part_unsupported"),
        ] {
            let (got, detail) = unsupported_part(&with(part.clone())).unwrap();
            assert_eq!(got, reason, "{part}");
            assert!(detail.starts_with("messages[1].content[1]"), "{detail}");
        }
        // Text parts, strings and null contents are captured.
        let text = vec![
            json!({"role": "user", "content": [{"type": "text", "text": "a"}]}),
            json!({"role": "assistant", "content": null}),
            json!({"role": "tool", "content": "out"}),
        ];
        assert_eq!(unsupported_part(&text), None);
        // In any message, earlier turns too.
        let mut later = text.clone();
        later.insert(
            0,
            json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}),
        );
        assert_eq!(
            unsupported_part(&later).map(|(r, _)| r),
            Some("image_unsupported")
        );
    }
}
