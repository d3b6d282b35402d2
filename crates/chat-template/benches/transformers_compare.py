"""Tokens per second of Python `transformers` on the conversation of `benches/incremental.rs`.

The same 50-turn conversation (same texts), the same work per turn as the reference server: render
the prompt and the full text with `apply_chat_template`, split, and tokenize prompt and response
with `add_special_tokens=False`. Run after `cargo bench -p ps-chat-template --bench incremental`,
which prints the Rust figures for the same conversation:

    python3 -m pip install transformers
    python3 crates/chat-template/benches/transformers_compare.py [QWEN3_FIXTURE_DIR]
"""

import sys
import time
from pathlib import Path

from transformers import AutoTokenizer

TURNS = 50
REPS = 5


def conversation():
    messages = [{"role": "system", "content": "You are a coding agent. " * 40}]
    per_turn = []
    for i in range(TURNS):
        messages.append({"role": "user", "content": f"Step {i}: please refactor module {i} and explain the change in two sentences."})
        answer = {"role": "assistant", "content": f"Refactored module {i}: extracted a helper and renamed two functions. Tests pass.",
                  "reasoning_content": "Look at the module, find the duplication, extract it."}
        per_turn.append((list(messages), answer))
        messages.append(answer)
    return per_turn


def main():
    here = Path(__file__).resolve()
    fixture = Path(sys.argv[1]) if len(sys.argv) > 1 else here.parents[4] / "shared" / "fixtures" / "qwen3"
    tok = AutoTokenizer.from_pretrained(str(fixture))
    per_turn = conversation()

    def one_turn(messages, answer):
        prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        full = tok.apply_chat_template(messages + [answer], tokenize=False, add_generation_prompt=False)
        response = full[len(prompt):] if full.startswith(prompt) else full
        p = tok(prompt, add_special_tokens=False)["input_ids"]
        r = tok(response, add_special_tokens=False)["input_ids"]
        return len(p) + len(r)

    tokens = sum(one_turn(m, a) for m, a in per_turn)
    started = time.perf_counter()
    for _ in range(REPS):
        for m, a in per_turn:
            one_turn(m, a)
    secs = (time.perf_counter() - started) / REPS
    print(f"transformers {__import__('transformers').__version__}: {TURNS} turns, {tokens} tokens, "
          f"{secs * 1e3:.1f} ms per conversation, {tokens / secs:,.0f} tokens/s")


if __name__ == "__main__":
    main()
