"""Full prompt ids of conversations with images, as transformers makes them for a Qwen-VL model.

    python vl_prompt_parity.py MODEL_DIR

MODEL_DIR holds tokenizer.json, tokenizer_config.json and preprocessor_config.json. For ~60
conversations (1 to 3 images a message, images in earlier turns, sizes from 1x1 to 4K and aspect
ratios up to 200), the prompt is rendered by the tokenizer's own apply_chat_template, each image's
<|image_pad|> is repeated as Qwen2VLProcessor.__call__ repeats it (image_grid_thw.prod() //
merge_size**2, the grid from transformers' image processor on the decoded image), and the text is
tokenized. One JSON line per conversation: its messages and prompt ids. The messages are handed
to the template as an engine hands them: developer -> system, and content lists kept as they are
for an "openai" content-format template (vLLM's own detection, printed first as
{"content_format": ...} for the test to compare with the proxy's), else text parts joined with
spaces (the proxy's flattening for "string" templates). One process does both: importing vLLM
and transformers is most of its time.
"""

import base64
import io
import json
import random
import sys

from PIL import Image
from transformers import AutoTokenizer
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

SIZES = [
    (1, 1), (28, 28), (42, 70), (56, 56), (98, 98), (640, 480), (480, 640), (1920, 1080), (1, 200),
    (200, 1), (15, 3000), (224, 224), (1000, 1001), (333, 777), (3840, 2160), (123, 45), (7, 700),
    (1280, 720), (2048, 2048), (10, 10),
]
rng = random.Random(7)
SIZES += [(rng.randint(1, 2500), rng.randint(1, 2500)) for _ in range(40)]
SIZES = [(w, h) for (w, h) in SIZES if max(w, h) / min(w, h) <= 200]


def image_part(w, h, i):
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (i % 256, 90, 30)).save(buf, format=["PNG", "JPEG", "GIF", "WEBP"][i % 4])
    kind = ["png", "jpeg", "gif", "webp"][i % 4]
    url = f"data:image/{kind};base64," + base64.b64encode(buf.getvalue()).decode()
    return {"type": "image_url", "image_url": {"url": url}}


def conversations():
    sizes = iter(SIZES)
    out = []
    i = 0
    while True:
        try:
            first = next(sizes)
        except StopIteration:
            return out
        kind = i % 4
        img = image_part(*first, i)
        if kind == 0:
            msgs = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, img]}]
        elif kind == 1:
            second = next(sizes, (64, 64))
            msgs = [
                {"role": "system", "content": "You describe pictures."},
                {"role": "user", "content": [img, {"type": "text", "text": "and"}, image_part(*second, i + 1),
                                             {"type": "text", "text": " compare them."}]},
            ]
        elif kind == 2:
            msgs = [
                {"role": "user", "content": [img, {"type": "text", "text": "Describe it."}]},
                {"role": "assistant", "content": "A plain square of colour."},
                # A list of text parts only: joined by the template itself in the openai format.
                {"role": "user", "content": [{"type": "text", "text": "Which"}, {"type": "text", "text": "colour?"}]},
            ]
        else:
            second = next(sizes, (64, 64))
            msgs = [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "one"}, img]},
                {"role": "assistant", "content": "Seen."},
                {"role": "user", "content": [{"type": "text", "text": "two"}, image_part(*second, i + 2),
                                             {"type": "text", "text": "three"}]},
            ]
        out.append(msgs)
        i += 1


def normalize(m, content_format):
    m = dict(m)
    if m.get("role") == "developer":
        m["role"] = "system"
    c = m.get("content")
    if isinstance(c, list) and content_format == "string":
        m["content"] = " ".join(p.get("text", "") for p in c if p.get("type") == "text")
    return m


def main():
    from vllm.renderers.hf import _detect_content_format

    model_dir = sys.argv[1]
    with open(f"{model_dir}/tokenizer_config.json") as f:
        content_format = _detect_content_format(json.load(f)["chat_template"], default="string")
    print(json.dumps({"content_format": content_format}))
    tok = AutoTokenizer.from_pretrained(model_dir)
    with open(f"{model_dir}/preprocessor_config.json") as f:
        config = json.load(f)
    config.pop("image_processor_type", None)
    proc = Qwen2VLImageProcessorPil(**config, do_rescale=False, do_normalize=False)
    merge = proc.merge_size
    for msgs in conversations():
        text = tok.apply_chat_template([normalize(m, content_format) for m in msgs], tokenize=False, add_generation_prompt=True)
        images = [p for m in msgs if isinstance(m["content"], list) for p in m["content"]
                  if p["type"] == "image_url"]
        # Qwen2VLProcessor.__call__: each image token in turn becomes its count of placeholders.
        for p in images:
            raw = base64.b64decode(p["image_url"]["url"].split(",", 1)[1])
            decoded = Image.open(io.BytesIO(raw)).convert("RGB")
            grid = proc(images=[decoded], return_tensors="np")["image_grid_thw"][0]
            n = int(grid.prod()) // (merge * merge)
            text = text.replace("<|image_pad|>", "<|placeholder|>" * n, 1)
        text = text.replace("<|placeholder|>", "<|image_pad|>")
        ids = tok(text, add_special_tokens=False)["input_ids"]
        print(json.dumps({"messages": msgs, "prompt_ids": ids}))


if __name__ == "__main__":
    main()
