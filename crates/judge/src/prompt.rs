//! The PRM judge prompt: a `[system, user]` pair showing one assistant response and the state that
//! followed it. The wording is ours; the behaviour follows `docs/upstream-protocols.md` section 6.

use serde_json::{Value, json};

use ps_core::ports::JudgeInput;

const SYSTEM: &str = "You review one step of an AI assistant working on a multi-turn task. \
You are shown the assistant's response exactly as it was produced (reasoning and tool-call markup \
included) and the message that arrived right after it, the next state: either the user's next \
message or the output of a tool the assistant called. Treat the next state as evidence of how \
good the response was.

Answer \\boxed{1} when the next state shows the response was correct or moved the task forward, \
for example the user goes on to the next step, confirms or builds on it, or the tool call ran and \
returned something useful.
Answer \\boxed{-1} when the next state shows the response was wrong or unhelpful, for example the \
user corrects it, repeats the request or complains, or the tool call failed or was malformed.
Answer \\boxed{0} when the next state does not let you tell either way.

Reason briefly, then end with exactly one boxed value: \\boxed{1}, \\boxed{-1} or \\boxed{0}.";

/// What the next state is, in words, for the prompt.
fn describe_role(role: &str) -> String {
    match role {
        "user" => "role: user, the user's next message".to_owned(),
        "tool" => "role: tool, the output of the assistant's tool call".to_owned(),
        other => format!("role: {other}"),
    }
}

/// The frame every vote judge's prompt shares: `[system, user]`, the user message showing the
/// assistant's response and the next state (with its role in words), then `question`.
pub fn turn_prompt(system: &str, input: &JudgeInput, question: &str) -> Vec<Value> {
    let user = format!(
        "=== Assistant response ===\n{response}\n=== End of assistant response ===\n\n\
         === Next state ({role}) ===\n{next}\n=== End of next state ===\n\n{question}",
        response = input.response_text,
        role = describe_role(&input.next_state_role),
        next = input.next_state_text,
    );
    vec![
        json!({"role": "system", "content": system}),
        json!({"role": "user", "content": user}),
    ]
}

/// The judge messages for one turn: `[system, user]`, ready for the judge's chat template.
pub fn judge_messages(input: &JudgeInput) -> Vec<Value> {
    turn_prompt(
        SYSTEM,
        input,
        "Judging by the next state, did the assistant's response move the task forward? Reason \
         briefly, then finish with exactly one of \\boxed{1} (correct or helpful), \\boxed{-1} \
         (wrong or unhelpful) or \\boxed{0} (cannot tell).",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(role: &str) -> JudgeInput {
        JudgeInput {
            response_text: "<think>\nplan\n</think>\n\n<tool_call>\n{\"name\": \"ls\"}\n</tool_call><|im_end|>\n"
                .into(),
            next_state_text: "file_a file_b".into(),
            next_state_role: role.into(),
        }
    }

    #[test]
    fn system_then_user_with_both_texts_and_the_role() {
        let msgs = judge_messages(&input("tool"));
        assert_eq!(msgs.len(), 2);
        assert_eq!(msgs[0]["role"], "system");
        assert_eq!(msgs[1]["role"], "user");
        let user = msgs[1]["content"].as_str().unwrap();
        assert!(user.contains(&input("tool").response_text), "{user}");
        assert!(user.contains("file_a file_b"));
        assert!(user.contains("role: tool"));
        assert!(
            judge_messages(&input("user"))[1]["content"]
                .as_str()
                .unwrap()
                .contains("role: user")
        );
        for m in &msgs {
            let c = m["content"].as_str().unwrap();
            for b in [r"\boxed{1}", r"\boxed{-1}", r"\boxed{0}"] {
                assert!(c.contains(b), "{b} missing in {c}");
            }
        }
    }
}
