//! The `policy-serving tokenize` tool: JSONL turns in, JSONL [`TurnTokens`] out.

use std::io::{BufRead, Write};

use serde_json::{Map, Value, json};

use crate::{ChatTemplateError, ChatTokenizer, TurnInput, TurnTokens};

/// What [`tokenize_jsonl`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct TokenizeStats {
    /// Non-blank input lines read.
    pub lines: usize,
    /// Lines turned into a [`TurnTokens`] object.
    pub ok: usize,
    /// Lines answered with an `{"line": N, "error": ".."}` object.
    pub errors: usize,
}

/// Reads one JSON object per line (`{"messages": [..], "tools": [..]?, "response_message": {..},
/// "chat_template_kwargs": {..}?}`) and writes one JSON object per line with `prompt_text`,
/// `full_text`, `response_text`, `prompt_is_prefix`, `prompt_ids` and `response_ids`.
///
/// A line that cannot be used (bad JSON, missing fields, a template error) yields
/// `{"line": N, "error": "..."}` (N counts from 1) and processing continues; blank lines are skipped.
/// Only I/O failures stop it.
pub fn tokenize_jsonl(
    tok: &ChatTokenizer,
    mut input: impl BufRead,
    mut output: impl Write,
) -> Result<TokenizeStats, ChatTemplateError> {
    let mut stats = TokenizeStats::default();
    let mut buf = Vec::new();
    let mut line_no = 0usize;
    loop {
        buf.clear();
        let n =
            input
                .read_until(b'\n', &mut buf)
                .map_err(|source| ChatTemplateError::ReadInput {
                    line: line_no,
                    source,
                })?;
        if n == 0 {
            break;
        }
        line_no += 1;
        if buf.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        stats.lines += 1;
        let out_line = match process_line(tok, &buf) {
            Ok(tokens) => {
                stats.ok += 1;
                serde_json::to_string(&tokens)
            }
            Err(message) => {
                stats.errors += 1;
                serde_json::to_string(&json!({"line": line_no, "error": message}))
            }
        }
        .map_err(|e| ChatTemplateError::WriteOutput {
            line: line_no,
            source: e.into(),
        })?;
        output
            .write_all(out_line.as_bytes())
            .and_then(|()| output.write_all(b"\n"))
            .map_err(|source| ChatTemplateError::WriteOutput {
                line: line_no,
                source,
            })?;
    }
    output
        .flush()
        .map_err(|source| ChatTemplateError::WriteOutput {
            line: line_no,
            source,
        })?;
    Ok(stats)
}

fn process_line(tok: &ChatTokenizer, raw: &[u8]) -> Result<TurnTokens, String> {
    let text = std::str::from_utf8(raw).map_err(|e| format!("line is not UTF-8: {e}"))?;
    let obj: Map<String, Value> =
        serde_json::from_str(text.trim()).map_err(|e| format!("invalid JSON object: {e}"))?;
    let messages = match obj.get("messages") {
        Some(Value::Array(m)) => m.as_slice(),
        Some(_) => return Err("`messages` must be a list".into()),
        None => return Err("missing `messages`".into()),
    };
    let response_message = match obj.get("response_message") {
        Some(r @ Value::Object(_)) => r,
        Some(_) => return Err("`response_message` must be an object".into()),
        None => return Err("missing `response_message`".into()),
    };
    let tools = match obj.get("tools") {
        None | Some(Value::Null) => None,
        Some(t @ Value::Array(_)) => Some(t),
        Some(_) => return Err("`tools` must be a list".into()),
    };
    let template_kwargs = match obj.get("chat_template_kwargs") {
        None | Some(Value::Null) => None,
        Some(Value::Object(k)) => Some(k),
        Some(_) => return Err("`chat_template_kwargs` must be an object".into()),
    };
    tok.split_turn(&TurnInput {
        messages,
        tools,
        response_message,
        template_kwargs,
    })
    .map_err(|e| e.to_string())
}
