#!/usr/bin/env python3
"""Writes the mini vision-language model from the mini model (../mini-model): the same tokenizer with
three more special tokens (<|vision_start|>=987, <|vision_end|>=988, <|image_pad|>=989), the same
chat template with image parts rendered as Qwen-VL templates render them
(<|vision_start|><|image_pad|><|vision_end|> where the image stands among a message's text parts),
and a Qwen-VL image processor configuration small enough for demos (at most 64 tokens an image).

    python3 config/mini-vl-model/make_mini_vl_model.py
"""

import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
MINI = os.path.join(HERE, "..", "mini-model")

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]

# The mini template reads a message's text as `m.content if m.content is string else ''`; here a
# list of parts is written part by part: text as it is, an image as its placeholder (the processor
# expands the pad to the image's token count).
OLD = "{%- set text = m.content if m.content is string else '' %}"
NEW = """{%- if m.content is string %}
        {%- set text = m.content %}
    {%- elif m.content is iterable and m.content is not mapping %}
        {%- set parts = namespace(text='') %}
        {%- for part in m.content %}
            {%- if part.type == 'image' or part.type == 'image_url' or 'image' in part or 'image_url' in part %}
                {%- set parts.text = parts.text ~ '<|vision_start|><|image_pad|><|vision_end|>' %}
            {%- elif part.type == 'text' %}
                {%- set parts.text = parts.text ~ part.text %}
            {%- endif %}
        {%- endfor %}
        {%- set text = parts.text %}
    {%- else %}
        {%- set text = '' %}
    {%- endif %}"""

PROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "min_pixels": 3136,
    "max_pixels": 50176,
    "patch_size": 14,
    "merge_size": 2,
    "temporal_patch_size": 2,
    "do_resize": True,
}


def main():
    with open(os.path.join(MINI, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    next_id = max(t["id"] for t in tok["added_tokens"]) + 1
    for i, content in enumerate(VISION_TOKENS):
        tok["added_tokens"].append({
            "id": next_id + i, "content": content, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": False, "special": True,
        })
    with open(os.path.join(HERE, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(MINI, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    assert cfg["chat_template"].count(OLD) == 1, "the mini template changed: update OLD"
    cfg["chat_template"] = cfg["chat_template"].replace(OLD, NEW).replace(
        "mini-model chat template", "mini-vl-model chat template (the mini model's, with image parts)")
    with open(os.path.join(HERE, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
        f.write("\n")
    with open(os.path.join(HERE, "preprocessor_config.json"), "w", encoding="utf-8") as f:
        json.dump(PROCESSOR, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
