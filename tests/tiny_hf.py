"""Builders for tiny random HF-format Qwen3 checkpoints (no hub access; torch + transformers)."""
from __future__ import annotations

import os


def tiny_hf_config(**overrides):
    """A small `transformers.Qwen3Config`; keyword overrides replace fields."""
    from transformers import Qwen3Config

    kw = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_theta=1e6,
    )
    kw.update(overrides)
    rope_theta = kw.pop("rope_theta")
    rope_scaling = kw.pop("rope_scaling", None)  # e.g. {"rope_type": "yarn", "factor": 4.0, ...}
    cfg = Qwen3Config(**kw)
    # transformers v5 keeps rope_theta (and the scaling) in rope_parameters; v4 as attributes.
    if getattr(cfg, "rope_parameters", None) is not None:
        cfg.rope_parameters["rope_theta"] = rope_theta
        cfg.rope_parameters.update(rope_scaling or {})
    else:
        cfg.rope_theta = rope_theta
        cfg.rope_scaling = rope_scaling
    return cfg


def make_tiny_hf_checkpoint(path, seed: int = 0, dtype: str = "float32", **overrides):
    """Writes a random `Qwen3ForCausalLM` with `save_pretrained` to `path`; returns the torch model.

    Weights are drawn with a wider std than HF's default init so logits are not near-uniform.
    """
    import torch
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_hf_config(**overrides)
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))
    os.makedirs(path, exist_ok=True)
    if dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    model.save_pretrained(path)
    return model
