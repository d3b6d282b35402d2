//! Hint injection: the teacher sees the turn's prompt with the chosen hint appended to the last user
//! message, followed by the policy's response verbatim (`docs/upstream-protocols.md` section 6).

use ps_chat_template::{ChatTemplateError, ChatTokenizer, EncodedPrefix};
use ps_core::message::{flatten_content, normalize_messages, normalize_messages_with};
use serde_json::{Map, Value, json};

use crate::parse::py_strip;

/// The label that introduces the hint inside the teacher's prompt.
pub const HINT_MARKER: &str = "[user's hint / instruction]";

/// `messages` with `hint` appended to the target message, normalised for the chat template.
///
/// The target is the **last** message with role `user`, or the last message when there is none. Its
/// content is flattened to text and becomes `strip(old + "\n\n[user's hint / instruction]\n" +
/// strip(hint))` (Python's `strip`). An empty list gives one user message
/// `"[user's hint / instruction]\n" + hint`. The result is normalised (`developer` becomes `system`,
/// content lists are flattened); `messages` itself is left untouched. A target that is not a JSON
/// object (never produced by a valid request) is replaced by a user message holding the hint.
pub fn append_hint(messages: &[Value], hint: &str) -> Vec<Value> {
    if messages.is_empty() {
        return vec![json!({"role": "user", "content": format!("{HINT_MARKER}\n{hint}")})];
    }
    let mut out = messages.to_vec();
    let target = out
        .iter()
        .rposition(|m| m.get("role").and_then(Value::as_str) == Some("user"))
        .unwrap_or(out.len() - 1);
    let old = out[target]
        .get("content")
        .map(flatten_content)
        .unwrap_or_default();
    let content = py_strip(&format!("{old}\n\n{HINT_MARKER}\n{}", py_strip(hint))).to_owned();
    match out[target].as_object_mut() {
        Some(obj) => {
            obj.insert("content".to_owned(), Value::String(content));
        }
        None => out[target] = json!({"role": "user", "content": content}),
    }
    normalize_messages(&out)
}

/// [`append_hint`] for a template that loops over a message's content (`keep_lists`,
/// `ChatTokenizer::keeps_content_lists`): a target whose content is a list (a vision-language
/// prompt with its images) keeps its parts and gets the hint as one more text part,
/// `"\n\n[user's hint / instruction]\n" + strip(hint)` (what the template joins to the text
/// before it, as a string target gets it); every content list stays a list. Unlike a string
/// target, the list's own text is not stripped around the hint (the policy saw it as it is).
pub fn append_hint_keeping_lists(messages: &[Value], hint: &str, keep_lists: bool) -> Vec<Value> {
    let target = messages
        .iter()
        .rposition(|m| m.get("role").and_then(Value::as_str) == Some("user"))
        .unwrap_or(messages.len().saturating_sub(1));
    let list_target = messages
        .get(target)
        .and_then(|m| m.get("content"))
        .is_some_and(Value::is_array);
    if !keep_lists || messages.is_empty() {
        return append_hint(messages, hint);
    }
    if !list_target {
        // A string target: as `append_hint`, the other lists kept.
        let hinted = append_hint(&messages[target..=target], hint);
        let mut out = messages.to_vec();
        out[target] = hinted.into_iter().next().unwrap_or(Value::Null);
        return normalize_messages_with(&out, true);
    }
    let mut out = messages.to_vec();
    if let Some(Value::Array(parts)) = out[target].get_mut("content") {
        parts.push(
            json!({"type": "text", "text": format!("\n\n{HINT_MARKER}\n{}", py_strip(hint))}),
        );
    }
    normalize_messages_with(&out, true)
}

/// The teacher's input text for one turn: `messages` with `hint` appended ([`append_hint`]),
/// rendered with the policy chat template, `tools` and `template_kwargs` and the generation prompt,
/// followed by `response_text` (the policy's rendered response) verbatim. The caller tokenizes this
/// whole string once; the last `T` tokens are the ones the teacher scores.
///
/// Template rendering is CPU-bound: async callers run this on the blocking pool.
pub fn teacher_input_text(
    tok: &ChatTokenizer,
    messages: &[Value],
    tools: Option<&Value>,
    hint: &str,
    response_text: &str,
    template_kwargs: Option<&Map<String, Value>>,
) -> Result<String, ChatTemplateError> {
    let enhanced = append_hint(messages, hint);
    let mut text = tok.render(&enhanced, tools, true, template_kwargs)?;
    text.push_str(response_text);
    Ok(text)
}

/// What follows the hinted prompt in the teacher's input.
#[derive(Debug, Clone, Copy)]
pub enum TeacherResponse<'a> {
    /// A re-tokenized turn's response: its rendered text with exactly its own ids
    /// ([`ChatTokenizer::encoded_from`]); the text is appended to the hinted prompt and the whole
    /// is tokenized as one text.
    Text(&'a EncodedPrefix),
    /// The engine's own response ids, scored as they are after the hinted prompt's ids.
    EngineIds(&'a [u32]),
}

/// The ids of the teacher's input for one turn, exactly those of a full encode of
/// [`teacher_input_text`] (with the response's text; for [`TeacherResponse::EngineIds`], without
/// it and followed by those ids), but encoding only what the hint changes: `prompt` is the turn's
/// own prompt (`messages` rendered with the generation prompt) with exactly its own ids, and
/// everything before the hinted message and after it is taken from there
/// ([`ChatTokenizer::encode_around`]); a re-tokenized response is joined at its first added token
/// ([`ChatTokenizer::encode_concat`]). For a tokenizer that does not splice
/// ([`ChatTokenizer::splices`]) the whole input is encoded once and `prompt` is not read.
///
/// Rendering is CPU-bound: async callers run this on the blocking pool.
pub fn teacher_input_ids(
    tok: &ChatTokenizer,
    messages: &[Value],
    tools: Option<&Value>,
    hint: &str,
    response: TeacherResponse<'_>,
    template_kwargs: Option<&Map<String, Value>>,
    prompt: &EncodedPrefix,
) -> Result<Vec<u32>, ChatTemplateError> {
    if !tok.splices() {
        // Nothing can be reused (`prompt` is not read): one encode of the whole input, as before.
        return match response {
            TeacherResponse::Text(response) => tok.encode(&teacher_input_text(
                tok,
                messages,
                tools,
                hint,
                &response.text,
                template_kwargs,
            )?),
            TeacherResponse::EngineIds(ids) => {
                let text = teacher_input_text(tok, messages, tools, hint, "", template_kwargs)?;
                let mut out = tok.encode(&text)?;
                out.extend_from_slice(ids);
                Ok(out)
            }
        };
    }
    let hinted = teacher_input_text(tok, messages, tools, hint, "", template_kwargs)?;
    let hinted = tok.encode_around(&hinted, prompt)?;
    match response {
        TeacherResponse::Text(response) => tok.encode_concat(&hinted, response),
        TeacherResponse::EngineIds(ids) => {
            let mut out = hinted.ids;
            out.extend_from_slice(ids);
            Ok(out)
        }
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_list_target_keeps_its_images_and_gets_the_hint_as_a_text_part() {
        let image = json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}});
        let m = vec![
            json!({"role": "developer", "content": "Be brief."}),
            json!({"role": "user", "content": [{"type": "text", "text": "What?"}, image]}),
        ];
        let out = append_hint_keeping_lists(&m, "  look closer ", true);
        assert_eq!(out[0]["role"], "system");
        assert_eq!(
            out[1]["content"],
            json!([{"type": "text", "text": "What?"}, image,
                {"type": "text", "text": format!("\n\n{HINT_MARKER}\nlook closer")}])
        );
        // A string target is hinted as by `append_hint`, other lists kept.
        let s = vec![
            json!({"role": "user", "content": [{"type": "text", "text": "a"}, image]}),
            json!({"role": "assistant", "content": "b"}),
            json!({"role": "user", "content": "c"}),
        ];
        let out = append_hint_keeping_lists(&s, "h", true);
        assert_eq!(out[0]["content"], s[0]["content"]);
        assert_eq!(out[2], append_hint(&s[2..], "h")[0]);
        // Without kept lists, exactly `append_hint`.
        assert_eq!(
            append_hint_keeping_lists(&s, "h", false),
            append_hint(&s, "h")
        );
        assert_eq!(
            append_hint_keeping_lists(&[], "h", true),
            append_hint(&[], "h")
        );
    }

    use super::*;

    fn content(m: &Value) -> &str {
        m["content"].as_str().unwrap()
    }

    #[test]
    fn the_last_user_message_gets_the_hint() {
        let msgs = vec![
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": "first question"}),
            json!({"role": "assistant", "content": "first answer"}),
            json!({"role": "user", "content": "second question"}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "a.txt"}),
        ];
        let out = append_hint(&msgs, "  Ask which file is meant.\n");
        assert_eq!(out.len(), msgs.len());
        assert_eq!(
            content(&out[3]),
            "second question\n\n[user's hint / instruction]\nAsk which file is meant."
        );
        // The others as the template gets them (normalised as the engines normalise them: the
        // tool call's arguments parsed).
        for i in [0, 1, 2, 4, 5] {
            assert_eq!(
                out[i],
                ps_core::message::normalize_message(&msgs[i]),
                "message {i} changed"
            );
        }
        assert_eq!(out[4]["tool_calls"][0]["function"]["arguments"], json!({}));
    }

    #[test]
    fn the_original_messages_are_untouched() {
        let msgs = vec![
            json!({"role": "developer", "content": "rules"}),
            json!({"role": "user", "content": [{"type": "text", "text": "hi"}]}),
        ];
        let before = msgs.clone();
        let out = append_hint(&msgs, "Say hello back, politely.");
        assert_eq!(msgs, before);
        assert_ne!(out, before);
    }

    #[test]
    fn content_lists_are_flattened_and_other_keys_kept() {
        let msgs = vec![json!({"role": "user", "name": "ann", "content": [
            {"type": "text", "text": "look at"},
            {"type": "image_url", "image_url": {"url": "data:,"}},
            {"type": "text", "text": "this"}
        ]})];
        let out = append_hint(&msgs, "Describe the picture first.");
        assert_eq!(
            out,
            vec![json!({"role": "user", "name": "ann",
                "content": "look at this\n\n[user's hint / instruction]\nDescribe the picture first."})]
        );
    }

    #[test]
    fn without_a_user_message_the_last_message_is_the_target() {
        let msgs = vec![
            json!({"role": "system", "content": "sys"}),
            json!({"role": "tool", "content": [{"type": "text", "text": "exit 1"}]}),
        ];
        let out = append_hint(&msgs, "Read the exit code.");
        assert_eq!(out[0], msgs[0]);
        assert_eq!(out[1]["role"], "tool");
        assert_eq!(
            content(&out[1]),
            "exit 1\n\n[user's hint / instruction]\nRead the exit code."
        );
    }

    #[test]
    fn an_empty_list_gets_one_user_message() {
        assert_eq!(
            append_hint(&[], " keep it short "),
            vec![
                json!({"role": "user", "content": "[user's hint / instruction]\n keep it short "})
            ]
        );
    }

    #[test]
    fn the_whole_content_is_stripped() {
        let msgs = vec![json!({"role": "user", "content": "\n  question  \n"})];
        assert_eq!(
            content(&append_hint(&msgs, "hint")[0]),
            "question  \n\n\n[user's hint / instruction]\nhint"
        );
        // Empty or missing old content: the result starts with the marker.
        for m in [
            json!({"role": "user", "content": ""}),
            json!({"role": "user", "content": null}),
            json!({"role": "user"}),
        ] {
            assert_eq!(
                content(&append_hint(&[m], "\thint\t")[0]),
                "[user's hint / instruction]\nhint"
            );
        }
    }

    #[test]
    fn roles_are_normalised() {
        let msgs = vec![
            json!({"role": "developer", "content": [{"type": "text", "text": "dev"}]}),
            json!({"role": "user", "content": "q"}),
            json!({"role": "assistant", "content": [{"type": "text", "text": "a"}]}),
        ];
        let out = append_hint(&msgs, "hint text");
        assert_eq!(out[0], json!({"role": "system", "content": "dev"}));
        assert_eq!(
            out[1],
            json!({"role": "user", "content": "q\n\n[user's hint / instruction]\nhint text"})
        );
        assert_eq!(out[2], json!({"role": "assistant", "content": "a"}));
    }

    #[test]
    fn a_non_object_target_becomes_a_user_message() {
        let out = append_hint(&[json!("oops")], "hint");
        assert_eq!(
            out,
            vec![json!({"role": "user", "content": "[user's hint / instruction]\nhint"})]
        );
    }

    #[test]
    fn teacher_text_has_the_hint_in_the_last_user_turn_and_the_response() {
        let tok = ChatTokenizer::mini();
        let msgs = vec![
            json!({"role": "developer", "content": "Be brief."}),
            json!({"role": "user", "content": "What is in the folder?"}),
        ];
        let response = "<think>\nI will list it.\n</think>\n\nIt has a.txt.<|im_end|>\n";
        let text = teacher_input_text(
            &tok,
            &msgs,
            None,
            "Run ls before answering.",
            response,
            None,
        )
        .unwrap();
        assert_eq!(
            text,
            "<|im_start|>system\nBe brief.<|im_end|>\n\
             <|im_start|>user\nWhat is in the folder?\n\n[user's hint / instruction]\n\
             Run ls before answering.<|im_end|>\n<|im_start|>assistant\n\
             <think>\nI will list it.\n</think>\n\nIt has a.txt.<|im_end|>\n"
        );
        // The prompt part is exactly the rendering of the enhanced messages.
        let prompt = tok
            .render(
                &append_hint(&msgs, "Run ls before answering."),
                None,
                true,
                None,
            )
            .unwrap();
        assert_eq!(text, format!("{prompt}{response}"));
        assert!(!tok.encode(&text).unwrap().is_empty());
    }

    #[test]
    fn teacher_text_keeps_tools_and_template_kwargs() {
        let tok = ChatTokenizer::mini();
        let tools = json!([{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]);
        let msgs = vec![
            json!({"role": "user", "content": "list files"}),
            json!({"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "ls", "arguments": "{}"}}]}),
            json!({"role": "tool", "content": "a.txt"}),
        ];
        let mut kwargs = Map::new();
        kwargs.insert("enable_thinking".into(), json!(false));
        let text = teacher_input_text(
            &tok,
            &msgs,
            Some(&tools),
            "Say which files you found.",
            "Found a.txt.<|im_end|>\n",
            Some(&kwargs),
        )
        .unwrap();
        assert!(text.starts_with("<|im_start|>system\n# Tools"), "{text}");
        assert!(text.contains("\"name\": \"ls\""), "{text}");
        assert!(
            text.contains(
                "<|im_start|>user\nlist files\n\n[user's hint / instruction]\nSay which files you found.<|im_end|>\n"
            ),
            "{text}"
        );
        assert!(
            text.ends_with("<tool_response>\na.txt\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nFound a.txt.<|im_end|>\n"),
            "{text}"
        );
    }
}
