#!/usr/bin/env python3
"""Builds the mini model's tokenizer.json and tokenizer_config.json in this directory.

A tiny byte-level BPE (the same pipeline shape as Qwen's tokenizer: NFC normalizer, the GPT-4
style split regex, byte-level pre-tokenizer and decoder) trained on the English text below, plus
ChatML-style added tokens and a Qwen3-like chat template written for this project.

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install tokenizers
    /tmp/venv/bin/python config/mini-model/make_mini_tokenizer.py

Tested with tokenizers 0.23.3. The output is deterministic for a given tokenizers version.
"""

import json
import os

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB_SIZE = 1000  # regular tokens, before the added ones

# The split regex of Qwen2/Qwen3 (letters, single digits, punctuation runs, newlines, spaces).
SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
NON_SPECIAL = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

CORPUS = """
The assistant reads the question, thinks about it step by step, and then answers in a few clear sentences.
A user asked what the weather would be like in the mountains tomorrow. The assistant called a tool to look it up.
The tool returned a forecast: light rain in the morning, a dry afternoon, and a cold, windy evening.
When the answer is not known, the assistant says so instead of guessing, and it suggests where to look.
Please summarise the following paragraph in one sentence, keeping the names of the people and the places.
Here is a short list of things to pack for a hike: water, a map, a warm jacket, some food, and a phone.
The library opens at nine in the morning and closes at six in the evening, except on Sundays.
She wrote the report on Monday, checked the numbers on Tuesday, and sent it to the team on Wednesday.
Can you help me write an email to my landlord about the broken heater in the kitchen?
Sure. Here is a polite email you could send. Feel free to change the details before sending it.
The function takes a city name and returns the current temperature in degrees Celsius.
Training samples are built from the prompt tokens, the response tokens and their log probabilities.
The reward model gives a score between zero and one for every answer the policy produces.
If the tool call fails, the assistant explains the error and tries a different approach.
I think the best answer is the second one, because it is shorter and it is still correct.
Let me check the calendar first. You have a meeting at three, so four o'clock would work better.
The quick brown fox jumps over the lazy dog while the cat watches from the window.
Numbers like 3, 14, 2025 and 1000 are split into single digits before the merges are applied.
We don't know yet; they'll decide tomorrow. It's fine, you're right, I've seen it, we'd agree.
Question: what is two plus three? Answer: two plus three is five.
Translate the sentence into French, then explain the grammar of the verb in simple words.
In a chat, the user, the assistant, the system and each tool take turns; the assistant thinks first.
Hello! How are you today? I'm doing well, thank you. What would you like to talk about?
"""

CODE = """
{"type": "function", "function": {"name": "get_weather", "description": "Get the weather for a city.",
 "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city name"},
 "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
{"name": "search", "arguments": {"query": "opening hours of the library", "limit": 5}}
def add(a, b):
    return a + b

for item in items:
    print(item["name"], item["value"])
"""

# Our own chat template. It behaves like Qwen3's hybrid-thinking template (same turn markup, tool
# block, think blocks after the last user query and tool-call format) but is written independently.
CHAT_TEMPLATE = r"""{#- mini-model chat template: ChatML turns with think blocks and tool calls. -#}
{%- set first = messages[0] if messages else none %}
{%- set has_system = first is not none and first.role == 'system' %}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if has_system and first.content is string and first.content %}
        {{- first.content ~ '\n\n' }}
    {%- endif %}
    {{- '# Tools\n\nYou can call the tools described by these JSON schemas:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' ~ (tool | tojson) }}
    {%- endfor %}
    {{- '\n</tools>\n\nTo call a tool, reply with a JSON object inside <tool_call></tool_call> tags:\n' }}
    {{- '<tool_call>\n{"name": <tool-name>, "arguments": <arguments-object>}\n</tool_call><|im_end|>\n' }}
{%- elif has_system %}
    {{- '<|im_start|>system\n' ~ (first.content if first.content is string else '') ~ '<|im_end|>\n' }}
{%- endif %}
{#- Think blocks are kept only for assistant turns after the last user message. #}
{%- set state = namespace(last_user=-1) %}
{%- for m in messages %}
    {%- if m.role == 'user' %}
        {%- set state.last_user = loop.index0 %}
    {%- endif %}
{%- endfor %}
{%- for m in messages %}
    {%- set text = m.content if m.content is string else '' %}
    {%- if m.role == 'user' or (m.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' ~ m.role ~ '\n' ~ text ~ '<|im_end|>\n' }}
    {%- elif m.role == 'assistant' %}
        {%- set thought = m.reasoning_content if m.reasoning_content is string else '' %}
        {%- if m.reasoning_content is not string and '</think>' in text %}
            {%- set thought = text.split('</think>')[0].split('<think>')[-1].strip('\n') %}
            {%- set text = text.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {{- '<|im_start|>assistant\n' }}
        {%- if loop.index0 > state.last_user and (loop.last or thought) %}
            {{- '<think>\n' ~ thought.strip('\n') ~ '\n</think>\n\n' ~ text.lstrip('\n') }}
        {%- else %}
            {{- text }}
        {%- endif %}
        {%- for call in (m.tool_calls or []) %}
            {%- set f = call.function if call.function else call %}
            {%- if text or not loop.first %}
                {{- '\n' }}
            {%- endif %}
            {{- '<tool_call>\n{"name": "' ~ f.name ~ '", "arguments": ' }}
            {{- f.arguments if f.arguments is string else (f.arguments | tojson) }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif m.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' ~ text ~ '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""


def main() -> None:
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    # Repeat the corpus a little so that common words merge fully.
    tok.train_from_iterator([CORPUS] * 3 + [CODE] * 2, trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in NON_SPECIAL])
    tok.save(os.path.join(HERE, "tokenizer.json"), pretty=False)

    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 32768,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }
    with open(os.path.join(HERE, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")
    print(f"vocab size with added tokens: {tok.get_vocab_size(with_added_tokens=True)}")


if __name__ == "__main__":
    main()
