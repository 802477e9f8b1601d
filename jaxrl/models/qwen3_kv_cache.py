"""The KV-cache forward of the stacked Qwen3 param tree (:func:`forward_with_cache`): new tokens
against a ``[L, B, C, Nkv, D]`` cache with an explicit ``[B, S, C]`` mask, by the same decoder layer
as the training forward. A reference path (tests, scripts/make_default_policy.py); the rollout
engine uses :mod:`jaxrl.models.qwen3_engine`. Re-exported by :mod:`jaxrl.models.qwen3`.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxrl.models.qwen3_config import Qwen3Config
from jaxrl.models.qwen3_core import _embed, _layer, attention, lm_head_weight, rms_norm, rope_cos_sin


class CacheOutput(NamedTuple):
    """Result of :func:`forward_with_cache`.

    logits: ``[B, S, V]`` float32 (``[B, 1, V]`` for the last new token when ``last_only``).
    hidden: final-norm hidden states, same positions as logits, ``[B, S|1, E]`` compute dtype.
    cache: the updated cache ``{'k', 'v'}`` (new K/V written at ``write_index``).
    cache_mask: ``[B, C]`` bool, valid slots after this call (old valid slots outside the
      written range, plus the written slots whose ``token_mask`` is True).
    """

    logits: Any
    hidden: Any
    cache: dict
    cache_mask: Any


def init_cache(cfg: Qwen3Config, batch: int, max_len: int, dtype=None) -> dict:
    """Zeroed KV cache ``{'k': [L, B, C, Nkv, D], 'v': [L, B, C, Nkv, D]}``, C = ``max_len`` slots,
    dtype defaults to the compute dtype. Keys are stored after q/k-norm and RoPE."""
    dtype = cfg.compute_dtype if dtype is None else dtype
    shape = (cfg.num_hidden_layers, batch, max_len, cfg.num_key_value_heads, cfg.head_dim)
    return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}


def forward_with_cache(params: dict, cfg: Qwen3Config, tokens, positions, token_mask, cache: dict,
                       cache_mask, write_index, last_only: bool = False) -> CacheOutput:
    """Runs new tokens against a KV cache (prefill with S = prompt bucket, decode with S = 1).

    Signature::

        forward_with_cache(params, cfg, tokens[B,S] int32, positions[B,S] int32,
                           token_mask[B,S] bool, cache{'k','v': [L,B,C,Nkv,D]},
                           cache_mask[B,C] bool, write_index int32 scalar, last_only=False)
            -> CacheOutput(logits [B,S,V] f32 (or [B,1,V] if last_only),
                           hidden [B,S|1,E], cache, cache_mask [B,C] bool)

    Semantics: the K/V of the S new tokens are written into slots
    ``[write_index, write_index + S)`` of every row (the caller guarantees
    ``write_index + S <= C``; under jit an overflow cannot raise and would be clamped).
    New token s attends to every slot c with ``cache_mask[b, c]`` outside the written range, and
    to new tokens s' <= s with ``token_mask[b, s']`` (causal among the new tokens). Pad tokens
    (``token_mask`` False, e.g. the left padding of a prompt) are never attended to; their own
    outputs are meaningless. ``positions`` are the RoPE positions of the new tokens (for a
    left-padded prompt: ``cumsum(token_mask) - 1``, then continuing by 1 per decoded token).
    Fully jittable with static shapes (``cfg`` and ``last_only`` static); donate ``cache``.
    """
    B, S = tokens.shape
    C = cache["k"].shape[2]
    dt = cfg.compute_dtype
    w = jnp.asarray(write_index, jnp.int32)
    token_mask = token_mask.astype(bool)
    slot = jnp.arange(C)
    rel = slot - w                                           # new-token index held by each slot
    in_new = (rel >= 0) & (rel < S)                          # [C]
    old_valid = cache_mask.astype(bool) & ~in_new[None]      # [B, C]
    new_valid = in_new[None] & jnp.take(token_mask, jnp.clip(rel, 0, S - 1), axis=1)  # [B, C]
    causal = rel[None, :] <= jnp.arange(S)[:, None]          # [S, C]
    mask = old_valid[:, None, :] | (new_valid[:, None, :] & causal[None])              # [B, S, C]

    x = _embed(params, cfg, tokens)
    cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, dt, cfg.rope_scaling)

    def body(x, xs):
        p, ck, cv = xs

        def attend(q, k, v):
            ck2 = jax.lax.dynamic_update_slice(ck, k.astype(ck.dtype), (0, w, 0, 0))
            cv2 = jax.lax.dynamic_update_slice(cv, v.astype(cv.dtype), (0, w, 0, 0))
            out = attention(q, ck2.astype(dt), cv2.astype(dt), mask, cfg.attention)
            return out, (ck2, cv2)

        return _layer(cfg, p, x, cos, sin, attend)

    x, (k_new, v_new) = jax.lax.scan(body, x, (params["layers"], cache["k"], cache["v"]))
    if last_only:
        x = x[:, -1:]
    h = rms_norm(x, params["norm"]["scale"], cfg.rms_norm_eps)
    logits = jnp.einsum("bte,ev->btv", h, lm_head_weight(params, cfg).astype(dt),
                        preferred_element_type=jnp.float32)
    return CacheOutput(logits, h, {"k": k_new, "v": v_new}, old_valid | new_valid)
