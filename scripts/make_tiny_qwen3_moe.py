#!/usr/bin/env python3
"""Build a tiny random-weight Qwen3MoeForCausalLM with the REAL Qwen3 tokenizer.

Adapted from ../shared/real-engine/make_tiny_qwen3.py (run with its venv's python). What vLLM 0.32
made of it on this CPU is in docs/upstream-protocols.md section 9 and
tests/fixtures/real/vllm-0.32-moe-without-experts.json.

usage: make_tiny_qwen3_moe.py OUT_DIR [FIXTURES_DIR]

Idempotent: if OUT_DIR/config.json and OUT_DIR/model.safetensors exist it
only re-copies the tokenizer files.  Weights are seeded (torch.manual_seed(0)).
"""
import json
import os
import shutil
import sys

out = sys.argv[1]
fx = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(__file__), "..", "..", "shared", "fixtures", "qwen3")
os.makedirs(out, exist_ok=True)

if not (os.path.exists(os.path.join(out, "config.json"))
        and os.path.exists(os.path.join(out, "model.safetensors"))):
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(
        vocab_size=151936,            # same padded vocab as the real Qwen3 models
        hidden_size=128,
        intermediate_size=256,        # unused when every layer is sparse
        moe_intermediate_size=64,
        num_experts=8,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
        output_router_logits=False,
        router_aux_loss_coef=0.001,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=128,                 # real Qwen3 head_dim; safest for CPU attention kernels
        max_position_embeddings=40960,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=151643,
        eos_token_id=151645,
        pad_token_id=151643,
        torch_dtype="bfloat16",
    )
    model = Qwen3MoeForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)

# Real Qwen3-4B generation_config.json (the engine reads default sampling from it).
gen = {
    "bos_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
}
with open(os.path.join(out, "generation_config.json"), "w") as f:
    json.dump(gen, f, indent=2)

for name in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copyfile(os.path.join(fx, name), os.path.join(out, name))
if os.path.exists(os.path.join(fx, "LICENSE-Apache-2.0.txt")):
    shutil.copyfile(os.path.join(fx, "LICENSE-Apache-2.0.txt"), os.path.join(out, "LICENSE"))
print("model ready in", out, sorted(os.listdir(out)))
