"""The pure-function building blocks of Qwen3 shared by the training forward
(:mod:`jaxrl.models.qwen3`), the KV-cache path (:mod:`jaxrl.models.qwen3_kv_cache`) and the rollout
engine (:mod:`jaxrl.models.qwen3_engine`): RMSNorm, RoPE, the reference grouped-query attention
with an explicit mask, one decoder layer on the stacked param tree, the embedding lookup and the
output-projection weight. All are re-exported by :mod:`jaxrl.models.qwen3`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl import parallel
from jaxrl.models import rope as rope_lib
from jaxrl.models.qwen3_config import Qwen3Config


def rms_norm(x, scale, eps: float):
    """HF Qwen3RMSNorm: ``(x32 * rsqrt(mean(x32², -1) + eps)).astype(x.dtype) * scale.astype(x.dtype)``.

    The cast back to the input dtype happens *before* the weight multiply (HF rounding order).
    """
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return scale.astype(x.dtype) * y.astype(x.dtype)


def rope_cos_sin(positions, head_dim: int, theta: float, dtype, scaling=None):
    """RoPE tables for integer ``positions [B, S]`` -> ``cos, sin [B, S, head_dim]`` in ``dtype``;
    ``scaling`` a :class:`jaxrl.models.rope.RopeScaling` (YaRN) or None. See :func:`jaxrl.models.rope.cos_sin`."""
    return rope_lib.cos_sin(positions, head_dim, theta, dtype, scaling)


def apply_rope(x, cos, sin):
    """``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = cat(-x2, x1)``; x ``[B,S,N,D]``."""
    d = x.shape[-1] // 2
    rot = jnp.concatenate([-x[..., d:], x[..., :d]], axis=-1)
    return x * cos[:, :, None, :] + rot * sin[:, :, None, :]


def attention(q, k, v, mask, impl: str = "xla"):
    """Grouped-query softmax attention with an explicit boolean mask.

    Args:
      q: ``[B, S, Nq, D]``; k, v: ``[B, C, Nkv, D]`` (Nq a multiple of Nkv); same dtype.
      mask: ``[B, S, C]`` bool, True where query s may attend key c. A query row with no allowed
        key gets a uniform average (finite; such rows are padding and never used).
      impl: ``'xla'`` (scores and softmax in float32) or ``'cudnn'``.
    Returns ``[B, S, Nq, D]`` in q's dtype. Scale ``D**-0.5`` (Vaswani et al. 2017, eq. 1).
    """
    B, S, Nq, D = q.shape
    Nkv = k.shape[2]
    if impl in ("cudnn", "cudnn_no_fallback"):
        return jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], implementation="cudnn")
    qg = q.reshape(B, S, Nkv, Nq // Nkv, D)
    s = jnp.einsum("bskgd,bckd->bkgsc", qg, k, preferred_element_type=jnp.float32) * (D ** -0.5)
    s = jnp.where(mask[:, None, None], s, jnp.finfo(jnp.float32).min)
    p = jax.nn.softmax(s, axis=-1).astype(v.dtype)
    o = jnp.einsum("bkgsc,bckd->bskgd", p, v)
    return o.reshape(B, S, Nq, D)


def segment_mask(segment_ids):
    """``[B, T]`` segment ids -> ``[B, T, T]`` causal, same-segment, non-padding (id != 0) mask.

    Quadratic in T: a reference for tests and short inputs; the training forward never builds it.
    """
    T = segment_ids.shape[1]
    idx = jnp.arange(T)
    causal = idx[:, None] >= idx[None, :]
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    return causal[None] & same & (segment_ids[:, None, :] != 0)


def _layer(cfg: Qwen3Config, p: dict, x, cos, sin, attend):
    """One decoder layer on residual ``x [B, S, E]``; ``attend(q, k, v) -> (out, aux)``."""
    dt = cfg.compute_dtype
    eps = cfg.rms_norm_eps
    h = rms_norm(x, p["input_layernorm"]["scale"], eps)
    q = jnp.einsum("bse,end->bsnd", h, p["q_proj"].astype(dt))
    k = jnp.einsum("bse,end->bsnd", h, p["k_proj"].astype(dt))
    v = jnp.einsum("bse,end->bsnd", h, p["v_proj"].astype(dt))
    q = apply_rope(rms_norm(q, p["q_norm"]["scale"], eps), cos, sin)
    k = apply_rope(rms_norm(k, p["k_norm"]["scale"], eps), cos, sin)
    a, aux = attend(q, k, v)
    x = x + jnp.einsum("bsnd,nde->bse", a, p["o_proj"].astype(dt))
    h = rms_norm(x, p["post_attention_layernorm"]["scale"], eps)
    g = jnp.einsum("bse,ei->bsi", h, p["gate_proj"].astype(dt))
    u = jnp.einsum("bse,ei->bsi", h, p["up_proj"].astype(dt))
    x = x + jnp.einsum("bsi,ie->bse", jax.nn.silu(g) * u, p["down_proj"].astype(dt))
    return parallel.constrain(x, ("batch", None, None)), aux


def _embed(params, cfg: Qwen3Config, tokens):
    table = params["embed_tokens"].astype(cfg.compute_dtype)
    # Gathering from a table sharded on both axes forces a full rematerialization in SPMD;
    # keep it sharded over the vocabulary only for the lookup.
    table = parallel.constrain(table, ("vocab", None))
    return parallel.constrain(jnp.take(table, tokens, axis=0), ("batch", None, None))


def lm_head_weight(params: dict, cfg: Qwen3Config):
    """The output projection ``[E, V]`` (fp32 master): ``lm_head`` or, when tied, ``embed_tokens.T``."""
    return params["embed_tokens"].T if cfg.tie_word_embeddings else params["lm_head"]
