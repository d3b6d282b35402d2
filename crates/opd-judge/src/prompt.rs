//! The hint-judge prompt: a `[system, user]` pair showing one assistant response and the state that
//! followed it, asking for hindsight. The wording is ours; the behaviour follows
//! `docs/upstream-protocols.md` section 6.

use ps_core::ports::JudgeInput;
use ps_judge::turn_prompt;
use serde_json::Value;

const SYSTEM: &str = "You look back at one step of an AI assistant working on a multi-turn task. \
You are shown the assistant's response exactly as it was produced (reasoning and tool-call markup \
included) and the next state: the message that arrived right after it, either the user's next \
message or the output of a tool the assistant called.

Your job is hindsight. Decide whether the next state reveals something the assistant did not know \
or did not use when it responded (a correction, a preference, a missing detail, an error message, \
a fact from the tool output) that would have let it give a better response in the first place.

- If it does, answer \\boxed{1} and give one hint for the assistant, written as an instruction it \
could have followed before responding: concise (one to three sentences), specific and actionable. \
Put the hint between [HINT_START] and [HINT_END], exactly once.
- If it does not (the response was already good, or the next state teaches nothing useful), \
answer \\boxed{-1} and give no hint.

End with exactly one boxed decision: \\boxed{1} or \\boxed{-1}.";

/// The hint-judge messages for one turn: `[system, user]`, ready for the judge's chat template.
pub fn hint_messages(input: &JudgeInput) -> Vec<Value> {
    turn_prompt(
        SYSTEM,
        input,
        "Knowing the next state, is there a hint that would have made the assistant's response \
         better? If so, write it between [HINT_START] and [HINT_END] and finish with \\boxed{1}; \
         if not, give no hint and finish with \\boxed{-1}.",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(role: &str) -> JudgeInput {
        JudgeInput {
            response_text: "<think>\nplan\n</think>\n\n<tool_call>\n{\"name\": \"ls\"}\n</tool_call><|im_end|>\n"
                .into(),
            next_state_text: "ls: no such directory".into(),
            next_state_role: role.into(),
        }
    }

    #[test]
    fn system_then_user_with_both_texts_and_the_role() {
        let msgs = hint_messages(&input("tool"));
        assert_eq!(msgs.len(), 2);
        assert_eq!(msgs[0]["role"], "system");
        assert_eq!(msgs[1]["role"], "user");
        let user = msgs[1]["content"].as_str().unwrap_or_default();
        assert!(user.contains(&input("tool").response_text), "{user}");
        assert!(user.contains("ls: no such directory"), "{user}");
        assert!(user.contains("role: tool"), "{user}");
        let user_role = hint_messages(&input("user"));
        assert!(
            user_role[1]["content"]
                .as_str()
                .unwrap_or_default()
                .contains("role: user")
        );
        assert!(
            hint_messages(&input("observation"))[1]["content"]
                .as_str()
                .unwrap_or_default()
                .contains("role: observation")
        );
    }

    #[test]
    fn both_messages_state_the_answer_format() {
        for m in hint_messages(&input("user")) {
            let c = m["content"].as_str().unwrap_or_default();
            for needle in [r"\boxed{1}", r"\boxed{-1}", "[HINT_START]", "[HINT_END]"] {
                assert!(c.contains(needle), "{needle} missing in {c}");
            }
            // Zero is not an answer of this judge.
            assert!(!c.contains(r"\boxed{0}"), "{c}");
        }
    }
}
