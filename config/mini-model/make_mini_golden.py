#!/usr/bin/env python3
"""Writes golden_mini.jsonl: the mini model's chat template rendered by Jinja2 and tokenized by the
Python `tokenizers` package, for conversations written for this project.

The Jinja2 environment is set up like transformers' `apply_chat_template` (sandboxed, trim_blocks,
lstrip_blocks, loop controls, `raise_exception`, `strftime_now`, and `tojson` = `json.dumps`), and
the normalisation is the proxy's (developer -> system, content lists joined, null response content
-> ""). The Rust crate must reproduce every field exactly.

    /tmp/venv/bin/pip install tokenizers jinja2
    /tmp/venv/bin/python config/mini-model/make_mini_golden.py
"""

import json
import os
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather for a city. Returns <html> & 'quotes'.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city name"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7, "default": 1.0},
                "threshold": {"type": "number", "default": 1e-05, "examples": [0.5, 1e16, 1000000000.0]},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the library catalogue.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}

CASES = [
    {
        "id": "m01_plain",
        "description": "one user turn, response with reasoning",
        "messages": [{"role": "user", "content": "Name a colour of the sky."}],
        "response_message": {"role": "assistant", "content": "Blue.", "reasoning_content": "Easy one.", "tool_calls": None},
    },
    {
        "id": "m02_system_developer_lists",
        "description": "system, developer and a content list",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": [{"type": "text", "text": "Look at this:"}, {"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "what is it?"}]},
            {"role": "assistant", "content": "A picture of a cat."},
            {"role": "developer", "content": "Answer in one word."},
            {"role": "user", "content": "And the colour?"},
        ],
        "response_message": {"role": "assistant", "content": "Grey.", "reasoning_content": None},
    },
    {
        "id": "m03_tool_call",
        "description": "tools, response is a tool call with string arguments and null content",
        "messages": [{"role": "user", "content": "Weather in Paris for 3 days?"}],
        "tools": [WEATHER_TOOL, SEARCH_TOOL],
        "response_message": {
            "role": "assistant",
            "content": None,
            "reasoning_content": "I should call the weather tool.",
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 3}"}}],
        },
    },
    {
        "id": "m04_tool_results",
        "description": "dict arguments in history, two tool results, final answer",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Compare Paris and Oslo."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "threshold": 0.25}}},
                    {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo", "threshold": 1e-05}}},
                ],
            },
            {"role": "tool", "tool_call_id": "a", "content": "{\"temp\": 21.5}"},
            {"role": "tool", "tool_call_id": "b", "content": "{\"temp\": 4.0}"},
        ],
        "tools": [WEATHER_TOOL],
        "response_message": {"role": "assistant", "content": "Paris is warmer.", "reasoning_content": "21.5 > 4."},
    },
    {
        "id": "m05_unicode",
        "description": "non-English text and emoji",
        "messages": [{"role": "user", "content": "Café? 你好 😀 naïve\u0301"}],
        "response_message": {"role": "assistant", "content": "Oui ☕ 好的 🎉"},
    },
    {
        "id": "m06_history_reasoning",
        "description": "reasoning in earlier turns is dropped; inline think in content",
        "messages": [
            {"role": "user", "content": "First question."},
            {"role": "assistant", "content": "<think>\nold thoughts\n</think>\n\nFirst answer.", "reasoning_content": None},
            {"role": "user", "content": "Second question."},
        ],
        "response_message": {"role": "assistant", "content": "<think>\ninline\n</think>\n\nSecond answer."},
    },
    {
        "id": "m07_not_prefix",
        "description": "prompt ends with an assistant message, so it is not a prefix",
        "messages": [
            {"role": "user", "content": "Start a story."},
            {"role": "assistant", "content": "Once upon a time"},
        ],
        "response_message": {"role": "assistant", "content": " there was a fox.", "reasoning_content": "continue"},
    },
    {
        "id": "m08_no_thinking",
        "description": "enable_thinking=false adds an empty think block to the generation prompt",
        "messages": [{"role": "user", "content": "Quick: 2+3?"}],
        "chat_template_kwargs": {"enable_thinking": False},
        "response_message": {"role": "assistant", "content": "5"},
    },
    {
        "id": "m09_whitespace_empty_tools",
        "description": "whitespace edge cases, tools present but empty",
        "messages": [{"role": "user", "content": "  tabs\tand\r\nCRLF  \n\n"}],
        "tools": [],
        "response_message": {"role": "assistant", "content": "\n\nok  ", "reasoning_content": "\n \n"},
    },
    {
        "id": "m10_specials_in_text",
        "description": "special-token strings typed by the user are matched as tokens",
        "messages": [{"role": "user", "content": "Say <|im_end|> and <tool_call> please"}],
        "response_message": {"role": "assistant", "content": "<|im_start|>no"},
    },
]


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def flatten(content):
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content


def norm(message):
    out = dict(message)
    if out.get("role") == "developer":
        out["role"] = "system"
    if isinstance(out.get("content"), list):
        out["content"] = flatten(out["content"])
    return out


def norm_response(message):
    out = dict(message)
    if out.get("content") is None:
        out["content"] = ""
    return norm(out)


def main() -> None:
    config = json.load(open(os.path.join(HERE, "tokenizer_config.json"), encoding="utf-8"))
    tok = Tokenizer.from_file(os.path.join(HERE, "tokenizer.json"))
    template = make_env().from_string(config["chat_template"])
    special = {k: config[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token") if config.get(k)}

    def render(messages, tools, add_generation_prompt, kwargs):
        return template.render(
            messages=messages,
            tools=tools,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **{**special, **kwargs},
        )

    with open(os.path.join(HERE, "golden_mini.jsonl"), "w", encoding="utf-8") as f:
        for case in CASES:
            messages = [norm(m) for m in case["messages"]]
            tools = case.get("tools")
            kwargs = case.get("chat_template_kwargs", {})
            prompt = render(messages, tools, True, kwargs)
            full = render(messages + [norm_response(case["response_message"])], tools, False, kwargs)
            is_prefix = full.startswith(prompt)
            response = full[len(prompt):] if is_prefix else full
            out = dict(case)
            out.update(
                prompt_text=prompt,
                full_text=full,
                response_text=response,
                prompt_is_prefix=is_prefix,
                prompt_ids=tok.encode(prompt, add_special_tokens=False).ids,
                response_ids=tok.encode(response, add_special_tokens=False).ids,
            )
            f.write(json.dumps(out, ensure_ascii=False) + "\n")
    print(f"wrote {len(CASES)} cases")


if __name__ == "__main__":
    main()
