#!/usr/bin/env python3
"""Writes a tiny random-weight Qwen2-VL model directory for the real vision-language engine tests.

    python make_tiny_vl.py OUT QWEN3_DIR [--tokenizer-only]

OUT gets the real Qwen3 tokenizer from QWEN3_DIR (../shared/fixtures/qwen3, read, never copied into
the repository), its chat template taught content lists as Qwen-VL templates write them (text parts
joined, <|vision_start|><|image_pad|><|vision_end|> where an image stands), a Qwen2-VL image
processor configuration (patch 14, merge 2, 3,136 to 200,704 pixels: at most 256 tokens an image),
and, unless --tokenizer-only, a Qwen2VLForConditionalGeneration with random weights small enough
for a CPU (two text layers of width 128, head size 64 as vLLM's CPU attention needs; a two-block
vision tower). The weights are random: what the tests check is how the engine renders, sizes and
counts images, not what the model says.
"""

import json
import os
import shutil
import sys

# The Qwen3 template's lines that read a message's text, and what Qwen-VL templates write there.
QWEN3_CONTENT = """{%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}"""
VL_CONTENT = """{%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set ns2 = namespace(text='') %}
        {%- for part in message.content %}
            {%- if part.type == 'image' or 'image' in part or 'image_url' in part %}
                {%- set ns2.text = ns2.text + '<|vision_start|><|image_pad|><|vision_end|>' %}
            {%- elif 'text' in part %}
                {%- set ns2.text = ns2.text + part.text %}
            {%- endif %}
        {%- endfor %}
        {%- set content = ns2.text %}
    {%- endif %}"""

PROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "min_pixels": 3136,
    "max_pixels": 200704,
    "patch_size": 14,
    "merge_size": 2,
    "temporal_patch_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "do_resize": True,
    "do_rescale": True,
    "do_normalize": True,
    "do_convert_rgb": True,
    "rescale_factor": 0.00392156862745098,
}


def tokenizer_files(out, qwen3):
    shutil.copy(os.path.join(qwen3, "tokenizer.json"), os.path.join(out, "tokenizer.json"))
    with open(os.path.join(qwen3, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    template = cfg["chat_template"]
    if template.count(QWEN3_CONTENT) != 1:
        sys.exit("the Qwen3 template changed: update QWEN3_CONTENT")
    cfg["chat_template"] = template.replace(QWEN3_CONTENT, VL_CONTENT)
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False)
    with open(os.path.join(out, "preprocessor_config.json"), "w", encoding="utf-8") as f:
        json.dump(PROCESSOR, f, indent=1)


def weights(out):
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    cfg = Qwen2VLConfig(
        text_config=dict(
            vocab_size=151936, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32768,
            rope_scaling={"type": "mrope", "mrope_section": [8, 12, 12]}, tie_word_embeddings=True,
        ),
        vision_config=dict(
            depth=2, embed_dim=64, hidden_size=128, num_heads=1, mlp_ratio=2, patch_size=14,
            spatial_merge_size=2, temporal_patch_size=2, in_channels=3,
        ),
        image_token_id=151655, video_token_id=151656, vision_start_token_id=151652,
        vision_end_token_id=151653, tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = Qwen2VLForConditionalGeneration(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)


def main():
    out, qwen3 = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    tokenizer_files(out, qwen3)
    if "--tokenizer-only" not in sys.argv[3:]:
        weights(out)


if __name__ == "__main__":
    main()
