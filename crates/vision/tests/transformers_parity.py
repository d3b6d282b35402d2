"""Pad-token counts of images as transformers' own Qwen-VL processor makes them.

Prints one JSON line per (processor config, image): the config as preprocessor_config.json holds
it, the image as a data URL (PNG, JPEG, WebP or GIF, encoded by PIL), and the processor's
image_grid_thw and pad count. tests/transformers_parity.rs reads them and checks ps-vision
against every line. Needs transformers and Pillow (the real engine's venv has both).
"""

import base64
import io
import json
import random

from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

CONFIGS = [
    # Qwen2-VL / Qwen2.5-VL checkpoints: min/max pixels spelled out.
    {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "merge_size": 2, "temporal_patch_size": 2},
    # Qwen3-VL / Qwen3.5: the bounds under size, patch 16.
    {"size": {"shortest_edge": 65536, "longest_edge": 16777216}, "patch_size": 16, "merge_size": 2,
     "temporal_patch_size": 2},
    # Tight bounds, so that both clamps act on ordinary sizes.
    {"min_pixels": 200704, "max_pixels": 401408, "patch_size": 14, "merge_size": 2, "temporal_patch_size": 2},
    # Nothing but the class defaults.
    {},
]

SIZES = [
    (1, 1), (3, 5), (27, 28), (28, 28), (29, 29), (56, 56), (42, 70), (70, 42), (98, 98), (126, 14),
    (1, 200), (200, 1), (10, 2000), (2000, 10), (15, 3000), (3000, 15), (28, 5600), (640, 480),
    (480, 640), (800, 600), (1024, 768), (1280, 720), (1920, 1080), (1080, 1920), (2048, 2048),
    (4000, 3000), (3000, 4000), (7680, 4320), (12000, 100), (448, 448), (896, 448), (224, 224),
    (336, 336), (14, 14), (512, 512), (1000, 1000), (1001, 999), (333, 777), (1366, 768),
    (2560, 1440), (3840, 2160), (100, 100), (123, 456), (999, 1), (5, 995),
]
rng = random.Random(31)
SIZES += [(rng.randint(1, 3000), rng.randint(1, 3000)) for _ in range(25)]
SIZES = [(w, h) for (w, h) in SIZES if max(w, h) / min(w, h) <= 200]
FORMATS = ["PNG", "JPEG", "WEBP", "GIF"]


def data_url(img, fmt):
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


def main():
    for ci, config in enumerate(CONFIGS):
        # Rescaling and normalising change pixel values, never the grid: left out to save time.
        proc = Qwen2VLImageProcessorPil(**config, do_rescale=False, do_normalize=False)
        merge = proc.merge_size
        for si, (w, h) in enumerate(SIZES):
            # Each image over 4 megapixels once, under one config: they take seconds each.
            if w * h > 4_000_000 and si % len(CONFIGS) != ci:
                continue
            fmt = FORMATS[(si + ci) % len(FORMATS)]
            if fmt == "WEBP" and max(w, h) > 16383:
                fmt = "PNG"
            img = Image.new("RGB", (w, h), (si % 256, ci * 40, 200))
            url = data_url(img, fmt)
            # The processor reads the image as it is decoded from those bytes, as an engine does.
            decoded = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB")
            grid = proc(images=[decoded], return_tensors="np")["image_grid_thw"][0].tolist()
            pads = grid[0] * grid[1] * grid[2] // (merge * merge)
            print(json.dumps({"config": config, "width": w, "height": h, "format": fmt,
                              "data_url": url, "grid_thw": grid, "pads": pads}))


if __name__ == "__main__":
    main()
