"""Qwen3 dense decoder (HF ``Qwen3ForCausalLM``) in flax.nnx, with a pure-function core.

Architecture (HF transformers ``modeling_qwen3.py``; Qwen3 technical report, arXiv:2505.09388):
pre-norm decoder layers ``h = x + attn(rmsnorm(x)); out = h + mlp(rmsnorm(h))``; RMSNorm
(Zhang & Sennrich 2019) in HF rounding order; per-head RMSNorm on q and k over ``head_dim``
before rotary embeddings (RoPE, Su et al. 2021, split-half "NeoX" layout); grouped-query
attention (Ainslie et al. 2023); SwiGLU MLP (Shazeer 2020); no biases; lm_head tied to the
embedding or not as the config says.

Two ways to use it:

* ``Qwen3(cfg, rngs)`` — an ``nnx.Module`` holding fp32 master params, each an ``nnx.Param``
  with ``logical_axes`` metadata used by :mod:`jaxrl.parallel`;
* the pure functions :func:`forward`, :func:`logprobs`, :func:`forward_with_cache` of a
  params pytree (``to_params(model)``), which is what the trainer jits.

This module holds the nnx module, the param-tree helpers, the remat policies and the training
forward (:func:`hidden_states`, :func:`forward`, :func:`logprobs`). The rest lives next to it and is
re-exported here: the config (:mod:`jaxrl.models.qwen3_config`), the shared building blocks
(:mod:`jaxrl.models.qwen3_core`: :func:`rms_norm`, RoPE, :func:`attention`, the decoder layer), the
chunked logprob head with its custom VJP (:mod:`jaxrl.models.logprob_head`), the KV-cache path
(:mod:`jaxrl.models.qwen3_kv_cache`) and the rollout engine's layouts, prefill and decode step
(:mod:`jaxrl.models.qwen3_engine`).

Param tree (``nnx.state(model, nnx.Param).to_pure_dict()``), shapes with
V=vocab, E=hidden, L=layers, Nq/Nkv=heads, D=head_dim, I=intermediate, all float32::

    {'embed_tokens': [V, E]                         ('vocab', 'embed')
     'layers': {                                     every leaf has a leading [L] ('layers') axis
        'input_layernorm': {'scale': [L, E]},
        'q_proj': [L, E, Nq, D]                     ('layers', 'embed', 'heads', 'head_dim')
        'k_proj': [L, E, Nkv, D], 'v_proj': [L, E, Nkv, D]   (..., 'kv_heads', 'head_dim')
        'o_proj': [L, Nq, D, E]                     ('layers', 'heads', 'head_dim', 'embed')
        'q_norm': {'scale': [L, D]}, 'k_norm': {'scale': [L, D]},
        'post_attention_layernorm': {'scale': [L, E]},
        'gate_proj': [L, E, I], 'up_proj': [L, E, I]  ('layers', 'embed', 'mlp')
        'down_proj': [L, I, E]                      ('layers', 'mlp', 'embed')},
     'norm': {'scale': [E]},
     'lm_head': [E, V]                              ('embed', 'vocab'); absent when tied}

Projections are stored ``[in, out]`` (HF stores ``[out, in]``); see :mod:`jaxrl.models.hf_io`.
:class:`Qwen3Config` (re-exported here) is defined in :mod:`jaxrl.models.qwen3_config`, which is
importable without JAX.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl import parallel
from jaxrl.models import attention as attention_lib

# Re-exported: the config, the shared building blocks, the chunked logprob head, the KV-cache path
# and the rollout engine live in their own modules (module docstring).
from jaxrl.models.logprob_head import chunk_positions, logprobs_from_hidden, unchunk_positions  # noqa: F401
from jaxrl.models.qwen3_config import ATTENTION_IMPLS, DTYPES, PRESETS, REMAT_POLICIES, Qwen3Config  # noqa: F401
from jaxrl.models.qwen3_core import (  # noqa: F401
    _embed,
    _layer,
    apply_rope,
    attention,
    lm_head_weight,
    rms_norm,
    rope_cos_sin,
    segment_mask,
)
from jaxrl.models.qwen3_engine import (  # noqa: F401
    ENGINE_LAYOUTS,
    KV_LAYOUT,
    SKINNY_MAX_ROWS,
    decode_step,
    engine_layout,
    engine_params,
    init_decode_cache,
    prefill,
    row_cache,
)
from jaxrl.models.qwen3_kv_cache import CacheOutput, forward_with_cache, init_cache  # noqa: F401


# --------------------------------------------------------------------------------------------
# nnx module (params + logical-axis metadata)
# --------------------------------------------------------------------------------------------

def _normal(rngs, shape, std=0.02):
    return std * jax.random.normal(rngs.params(), shape, jnp.float32)


class RMSNorm(nnx.Module):
    """Holds an RMSNorm ``scale`` (init 1) of shape ``prefix + (dim,)``; math in :func:`rms_norm`."""

    def __init__(self, dim: int, axis: str, prefix: tuple[int, ...] = (), prefix_axes: tuple = ()):
        self.scale = nnx.Param(jnp.ones(prefix + (dim,), jnp.float32), logical_axes=prefix_axes + (axis,))


class Qwen3Layers(nnx.Module):
    """All decoder layers' params stacked on a leading ``[L]`` axis (run with ``lax.scan``)."""

    def __init__(self, cfg: Qwen3Config, rngs: nnx.Rngs):
        L, E, I = cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size
        Nq, Nkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        lp, la = (L,), ("layers",)
        self.input_layernorm = RMSNorm(E, "embed", lp, la)
        self.q_proj = nnx.Param(_normal(rngs, (L, E, Nq, D)), logical_axes=la + ("embed", "heads", "head_dim"))
        self.k_proj = nnx.Param(_normal(rngs, (L, E, Nkv, D)), logical_axes=la + ("embed", "kv_heads", "head_dim"))
        self.v_proj = nnx.Param(_normal(rngs, (L, E, Nkv, D)), logical_axes=la + ("embed", "kv_heads", "head_dim"))
        self.o_proj = nnx.Param(_normal(rngs, (L, Nq, D, E)), logical_axes=la + ("heads", "head_dim", "embed"))
        self.q_norm = RMSNorm(D, "head_dim", lp, la)
        self.k_norm = RMSNorm(D, "head_dim", lp, la)
        self.post_attention_layernorm = RMSNorm(E, "embed", lp, la)
        self.gate_proj = nnx.Param(_normal(rngs, (L, E, I)), logical_axes=la + ("embed", "mlp"))
        self.up_proj = nnx.Param(_normal(rngs, (L, E, I)), logical_axes=la + ("embed", "mlp"))
        self.down_proj = nnx.Param(_normal(rngs, (L, I, E)), logical_axes=la + ("mlp", "embed"))


class Qwen3(nnx.Module):
    """Qwen3ForCausalLM. ``model(tokens, positions, segment_ids)`` -> float32 logits ``[B, T, V]``.

    Weights are initialised N(0, 0.02²) (HF ``initializer_range``) and norms to 1; real weights
    come from :func:`jaxrl.models.hf_io.load_hf_checkpoint`.
    """

    def __init__(self, cfg: Qwen3Config, rngs: nnx.Rngs):
        self.config = cfg
        self.embed_tokens = nnx.Param(_normal(rngs, (cfg.vocab_size, cfg.hidden_size)),
                                      logical_axes=("vocab", "embed"))
        self.layers = Qwen3Layers(cfg, rngs)
        self.norm = RMSNorm(cfg.hidden_size, "embed")
        if not cfg.tie_word_embeddings:
            self.lm_head = nnx.Param(_normal(rngs, (cfg.hidden_size, cfg.vocab_size)),
                                     logical_axes=("embed", "vocab"))

    def __call__(self, tokens, positions, segment_ids):
        return forward(to_params(self), self.config, tokens, positions, segment_ids)


def to_params(model: nnx.Module) -> dict:
    """The module's params as a pure nested dict of arrays (layout in the module docstring)."""
    return nnx.state(model, nnx.Param).to_pure_dict()


def split(model: nnx.Module):
    """``(graphdef, params)``: params as a pure dict; :func:`merge` rebuilds the module."""
    graphdef, state = nnx.split(model)
    return graphdef, state.to_pure_dict()


def merge(graphdef, params: dict) -> nnx.Module:
    """Inverse of :func:`split`: a module whose params are the arrays in ``params`` (metadata
    such as ``logical_axes`` comes from ``graphdef``)."""
    return nnx.merge(graphdef, nnx.State(params))


def abstract_model(cfg: Qwen3Config) -> Qwen3:
    """A Qwen3 module whose params are ShapeDtypeStructs (no memory allocated)."""
    return nnx.eval_shape(lambda: Qwen3(cfg, nnx.Rngs(0)))


def abstract_params(cfg: Qwen3Config) -> dict:
    """Param tree of ``jax.ShapeDtypeStruct`` (float32) for ``cfg``."""
    return nnx.state(abstract_model(cfg), nnx.Param).to_pure_dict()


def param_logical_axes(cfg: Qwen3Config) -> dict:
    """Param tree of logical-axis-name tuples, read from the module's nnx metadata."""
    return parallel.logical_axes_of(abstract_model(cfg))


def init_params(cfg: Qwen3Config, seed: int = 0, shardings: dict | None = None) -> dict:
    """Random fp32 params (see :class:`Qwen3`), created directly with ``shardings`` if given
    (a tree of NamedSharding, e.g. from :func:`jaxrl.parallel.param_shardings`)."""
    fn = jax.jit(lambda: to_params(Qwen3(cfg, nnx.Rngs(seed))), out_shardings=shardings)
    return fn()


# --------------------------------------------------------------------------------------------
# Pure-function forward pass (building blocks in jaxrl.models.qwen3_core)
# --------------------------------------------------------------------------------------------

def _saves_attention(prim, *_, **__) -> bool:
    """Remat policy: keep the outputs of the cuDNN fused-attention forward (output and softmax
    statistics; the primitive behind ``jax.nn.dot_product_attention(implementation='cudnn')``)."""
    return prim.name.startswith("dot_product_attention_fwd")


def remat_policy(name: str):
    """The ``jax.checkpoint`` policy of a remat setting (``Qwen3Config.remat``), None for 'none'.

    * ``full``: nothing saved; each layer's forward is recomputed in the backward pass.
    * ``save_dots``: matmul outputs without batch dims (the q/k/v/o and MLP projections) saved.
    * ``save_attention``: only the attention output and its log-sum-exp saved (names
      ``attention_out`` / ``attention_lse`` of the xla and splash kernels, and the cuDNN forward's
      outputs), so the attention forward is never recomputed; about ``T·Nq·D`` values per layer.
    * ``save_dots_attention``: both of the above.

    Raises:
      ValueError: for an unknown name.
    """
    cp = jax.checkpoint_policies
    attention = cp.save_from_both_policies(
        cp.save_only_these_names(attention_lib.ATTENTION_OUT, attention_lib.ATTENTION_LSE), _saves_attention)
    policies = {"none": None, "full": cp.nothing_saveable, "save_dots": cp.dots_with_no_batch_dims_saveable,
                "save_attention": attention,
                "save_dots_attention": cp.save_from_both_policies(cp.dots_with_no_batch_dims_saveable, attention)}
    if name not in policies:
        raise ValueError(f"unknown remat policy {name!r}; use one of {sorted(policies)}")
    return policies[name]


def _remat(fn, policy: str):
    if policy == "none":
        return fn
    return jax.checkpoint(fn, policy=remat_policy(policy), prevent_cse=False)


def hidden_states(params: dict, cfg: Qwen3Config, tokens, positions, segment_ids):
    """Final-norm hidden states ``[B, T, E]`` in the compute dtype (input of the lm_head).

    Args:
      tokens: ``[B, T]`` int32 token ids.
      positions: ``[B, T]`` int32 RoPE positions (restart at 0 for each packed sequence;
        ``cumsum(mask) - 1`` for left-padded rows).
      segment_ids: ``[B, T]`` int32; 0 = padding, >0 = sequence id within the row. Attention is
        causal and never crosses segments, so right-, left-padded and packed rows all work.
        It runs the kernel ``cfg.attention`` (:mod:`jaxrl.models.attention`), which never holds a
        ``[T, T]`` mask or score matrix: memory grows linearly in T.
    """
    x = _embed(params, cfg, tokens)
    cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, cfg.compute_dtype, cfg.rope_scaling)

    def attend(q, k, v):
        out = attention_lib.causal_segment_attention(q, k, v, segment_ids, cfg.attention, cfg.attention_block)
        return out, None

    def body(x, p):
        # The barrier keeps the saved per-layer input in the compute dtype: without it XLA may
        # hoist the float32 convert of rms_norm out of the backward loop over the whole [L, B, T, E]
        # stack of saved inputs (seen on CPU: 2x the stack's memory).
        x = jax.lax.optimization_barrier(x)
        x, _ = _layer(cfg, p, x, cos, sin, attend)
        return x, None

    x, _ = jax.lax.scan(_remat(body, cfg.remat), x, params["layers"])
    return rms_norm(x, params["norm"]["scale"], cfg.rms_norm_eps)


def forward(params: dict, cfg: Qwen3Config, tokens, positions, segment_ids):
    """Logits ``[B, T, V]`` float32 (matmul in the compute dtype, float32 accumulation).

    Inputs as in :func:`hidden_states`. Materializes ``[B, T, V]``: for training use
    :func:`logprobs`, which never does.
    """
    h = hidden_states(params, cfg, tokens, positions, segment_ids)
    w = lm_head_weight(params, cfg).astype(cfg.compute_dtype)
    return jnp.einsum("bte,ev->btv", h, w, preferred_element_type=jnp.float32)


# --------------------------------------------------------------------------------------------
# Chunked logprobs / entropy (the head in jaxrl.models.logprob_head)
# --------------------------------------------------------------------------------------------

def logprobs(params: dict, cfg: Qwen3Config, tokens, positions, segment_ids, targets=None,
             temperature: float = 1.0, chunk_size: int = 512, save_probs: bool = False):
    """Per-token log-probabilities and entropies of ``softmax(logits / temperature)`` (float32).

    Args:
      tokens, positions, segment_ids: ``[B, T]`` int32 as in :func:`hidden_states`.
      targets: ``[B, T]`` int32 token scored at each position; default ``None`` means next-token
        targets, and the outputs are then **target-aligned** ``[B, T-1]`` (entry t is the logprob
        of ``tokens[:, t+1]`` given the prefix, docs/architecture.md §3).
      temperature, chunk_size, save_probs: see :func:`logprobs_from_hidden`.
    Returns ``(logprobs, entropy)``, both ``[B, T]`` (or ``[B, T-1]`` for next-token targets).
    """
    h = hidden_states(params, cfg, tokens, positions, segment_ids)
    if targets is None:
        h, targets = h[:, :-1], tokens[:, 1:]
    return logprobs_from_hidden(h, lm_head_weight(params, cfg), targets, temperature, chunk_size, save_probs)
