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

Projections are stored ``[in, out]`` (HF stores ``[out, in]``); see :mod:`jaxrl.models.hf_io`,
which also defines :class:`Qwen3Config` (re-exported here) so it is importable without JAX.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl import parallel
from jaxrl.models import attention as attention_lib
from jaxrl.models import cpu_kernel
from jaxrl.models import rope as rope_lib

from jaxrl.models.hf_io import ATTENTION_IMPLS, DTYPES, PRESETS, REMAT_POLICIES, Qwen3Config  # noqa: F401


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
# Pure-function forward pass
# --------------------------------------------------------------------------------------------

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
# Chunked logprobs / entropy
# --------------------------------------------------------------------------------------------

def _chunk_stats(hc, w, tc, inv_temp):
    """Forward of one chunk: ``z = (hc @ w) * inv_temp`` (float32), then in two passes over z
    (max; then the sums of ``e = exp(z - m)`` and ``e * z`` together) ``lse``, the softmax mean
    ``mu = sum(p * z)`` and ``z[target]``. Returns ``(lp, ent, lse, mu, m, e)``; all but e
    ``[B, c]`` float32, e ``[B, c, V]`` float32."""
    z = jnp.einsum("bce,ev->bcv", hc, w, preferred_element_type=jnp.float32) * inv_temp
    m = jnp.max(z, axis=-1, keepdims=True)
    e = jnp.exp(z - m)
    s = jnp.sum(e, axis=-1)
    mu = jnp.sum(e * z, axis=-1) / s
    lse = m[..., 0] + jnp.log(s)
    zy = jnp.take_along_axis(z, tc[..., None], axis=-1)[..., 0]
    return zy - lse, lse - mu, lse, mu, m[..., 0], e


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _head_logprobs(h, w, t, inv_temp, save_probs):
    """Chunked logprobs and entropies; ``h [n, B, c, E]``, ``w [E, V]`` (same dtype), ``t [n, B, c]``
    int32, ``inv_temp`` float32 scalar. Returns ``(lp, ent)`` float32 ``[n, B, c]``."""
    return _head_logprobs_fwd(h, w, t, inv_temp, save_probs)[0]


def _head_logprobs_fwd(h, w, t, inv_temp, save_probs):
    def chunk(_, xs):
        lp, ent, lse, mu, m, e = _chunk_stats(xs[0], w, xs[1], inv_temp)
        # save_probs: the unnormalized probabilities exp(z - max z), rounded to the compute dtype
        # (values in (0, 1]; bf16 keeps f32's exponent range and 8 significant bits).
        return None, (lp, ent, lse, mu, m, e.astype(h.dtype) if save_probs else None)

    _, (lp, ent, lse, mu, m, e) = jax.lax.scan(chunk, None, (h, t))
    return (lp, ent), (h, w, t, inv_temp, lp, lse, mu, m, e)


def _head_logprobs_bwd(save_probs, res, g):
    """Per chunk, the logits cotangent in one elementwise pass (``p = exp(z - lse)``,
    ``z = logits * inv_temp``, ``mu = sum(p z)``)::

        d lp / dz  = onehot(target) - p
        d ent / dz = -p * (z - mu)                   (ent = lse - sum(p z))
        d logits   = inv_temp * (g_lp * (onehot - p) - g_ent * p * (z - mu))

    rounded once to the compute dtype for the two matmuls ``dh = dlogits @ w.T`` and
    ``dw += h.T @ dlogits``; dw is accumulated over chunks in float32 and rounded once.

    ``p`` and ``z`` come from the logits recomputed by one matmul, or (``save_probs``) from the
    saved ``e = exp(z - m)``, ``m`` the row's max: ``p = e · exp(m - lse)``, ``z = m + log e``.
    Each entry then carries e's rounding (relative 2^-9 in bf16) besides the final rounding of the
    cotangent; the row's largest entry has e = 1 exactly, so a nearly certain target's
    ``1 - p_y`` keeps float32 precision.

    The temperature's cotangent uses ``d lp / d inv_temp = (z_y - mu) / inv_temp`` and
    ``d ent / d inv_temp = -(sum(p z^2) - mu^2) / inv_temp`` (XLA drops it when unused).
    """
    h, w, t, inv_temp, lp, lse, mu, m, e = res
    g_lp, g_ent = g

    def chunk(dw, xs):
        hc, tc, lpc, lsec, muc, mc, ec, glc, gec = xs
        onehot = jax.lax.broadcasted_iota(jnp.int32, hc.shape[:2] + (w.shape[1],), 2) == tc[..., None]
        if save_probs:
            ef = ec.astype(jnp.float32)
            p = ef * jnp.exp(mc - lsec)[..., None]
            z = jnp.where(ef > 0, mc[..., None] + jnp.log(ef), 0.0)   # p = 0 where e underflowed
        else:
            z = jnp.einsum("bce,ev->bcv", hc, w, preferred_element_type=jnp.float32) * inv_temp
            p = jnp.exp(z - lsec[..., None])
        dz = -p * (glc[..., None] + gec[..., None] * (z - muc[..., None]))
        dz = jnp.where(onehot, glc[..., None] + dz, dz)
        dl = (dz * inv_temp).astype(hc.dtype)
        dh = jnp.einsum("bcv,ev->bce", dl, w, preferred_element_type=jnp.float32).astype(hc.dtype)
        dw = dw + jnp.einsum("bce,bcv->ev", hc, dl, preferred_element_type=jnp.float32)
        var = jnp.sum(p * z * z, axis=-1) - muc * muc
        dinv = jnp.sum(glc * (lpc + lsec - muc) - gec * var)
        return dw, (dh, dinv)

    xs = (h, t, lp, lse, mu, m, e if save_probs else jnp.zeros(t.shape[:1], h.dtype), g_lp, g_ent)
    dw, (dh, dinv) = jax.lax.scan(chunk, jnp.zeros(w.shape, jnp.float32), xs)
    d_inv_temp = (jnp.sum(dinv) / inv_temp).astype(inv_temp.dtype)
    return dh, dw.astype(w.dtype), np.zeros(t.shape, jax.dtypes.float0), d_inv_temp


_head_logprobs.defvjp(_head_logprobs_fwd, _head_logprobs_bwd)


def chunk_positions(hidden, targets, chunk_size: int):
    """The sequence positions of ``hidden [B, T, E]`` and ``targets [B, T]`` in chunks, chunk-major.

    ``c = min(chunk_size, T)`` positions per chunk, ``n = ceil(T / c)`` chunks; the tail is padded
    with zeros (hidden) and id 0 (targets). Returns ``(h [n, B, c, E], t [n, B, c] int32)``;
    :func:`unchunk_positions` undoes the layout of a per-position result.
    """
    B, T, E = hidden.shape
    c = min(chunk_size, T)
    n = -(-T // c)
    pad = n * c - T
    h = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0))).reshape(B, n, c, E).swapaxes(0, 1)
    t = jnp.pad(targets.astype(jnp.int32), ((0, 0), (0, pad))).reshape(B, n, c).swapaxes(0, 1)
    return h, t


def unchunk_positions(x, T: int):
    """``x [n, B, c]`` (per position, chunk-major, :func:`chunk_positions`) -> ``[B, T]`` without the padding."""
    n, B, c = x.shape
    return x.swapaxes(0, 1).reshape(B, n * c)[:, :T]


def logprobs_from_hidden(hidden, head_w, targets, temperature: float = 1.0, chunk_size: int = 512,
                         save_probs: bool = False):
    """Log-probabilities of ``targets`` and entropies under ``softmax(logits / temperature)``.

    ``logits = hidden @ head_w`` (float32 accumulation). Computed over chunks of ``chunk_size``
    sequence positions, so the forward pass holds one ``[B, chunk_size, V]`` float32 logits chunk
    at a time. A custom VJP (:func:`_head_logprobs_bwd`) turns each chunk into the logits
    cotangent in one elementwise pass (no softmax, scatter or float32 cotangent materialized),
    rounded to hidden's dtype for the two matmuls (bf16 GEMMs with f32 accumulation in bf16
    compute; exact in float32); the head gradient is accumulated over chunks in float32.

    Args:
      hidden: ``[B, T, E]``; head_w: ``[E, V]`` (cast to hidden's dtype); targets: ``[B, T]`` int
        in ``[0, V)``.
      temperature: > 0 (python float or scalar array; differentiable).
      chunk_size: positions per chunk; need not divide T (the tail is padded).
      save_probs: what the backward pass starts from. False (default): each chunk's logits are
        recomputed (one ``[B·c, E] x [E, V]`` matmul per chunk, a third of the head's FLOPs
        again). True: the forward pass keeps ``exp(z - max z)`` of every position in hidden's
        dtype (``B·T·V`` values: 4.6 GiB in bf16 for 16k tokens of a 151,936-token vocabulary)
        and the backward pass reads it instead; the logits cotangent then carries one more
        rounding of hidden's dtype (none in float32). Values are the same either way.
    Returns:
      ``(logprobs [B, T] float32, entropy [B, T] float32)`` with
      ``logprob = z_y - logsumexp(z)``, ``entropy = logsumexp(z) - Σ softmax(z)·z``, ``z = logits / T``.
    Raises:
      ValueError: for a non-positive chunk size.
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    T = hidden.shape[1]
    h, t = chunk_positions(hidden, targets, chunk_size)
    inv_temp = 1.0 / jnp.asarray(temperature, jnp.float32)
    lp, ent = _head_logprobs(h, head_w.astype(hidden.dtype), t, inv_temp, bool(save_probs))
    return unchunk_positions(lp, T), unchunk_positions(ent, T)


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


# --------------------------------------------------------------------------------------------
# KV-cache path (rollout sampler)
# --------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------
# Rollout-engine path: per-layer weights, a prompt KV cache shared by the samples of a prompt
# --------------------------------------------------------------------------------------------

ENGINE_LAYOUTS = ("in_out", "out_in", "panels")

# Rows up to which a CPU engine runs the "panels" layout (the CPU kernel) or, without it, the
# "out_in" one (a decode-step projection as a fused multiply-reduce, `_project`); measured on a
# 2-core x86 CPU, bench/sampler_step.py and bench/sampler_throughput.py.
SKINNY_MAX_ROWS = 16


def panels_fit(cfg: Qwen3Config) -> bool:
    """Whether `cfg` can run the "panels" layout: float32 compute and every projection's output
    width a multiple of 16 (:mod:`jaxrl.models.cpu_kernel`; every Qwen3 size is)."""
    outs = ((cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim, cfg.hidden_size,
            2 * cfg.intermediate_size, cfg.vocab_size)
    return jnp.dtype(cfg.compute_dtype) == jnp.float32 and all(n % cpu_kernel.PANEL == 0 for n in outs)


def engine_layout(platform: str, max_rows: int, cfg: Optional[Qwen3Config] = None) -> str:
    """The weight layout of :func:`engine_params` for an engine on `platform` ("cpu", "gpu", "tpu")
    whose programs run at most `max_rows` rows.

    On CPU with at most `SKINNY_MAX_ROWS` rows: "panels" (every matmul in
    :mod:`jaxrl.models.cpu_kernel`'s kernel) for a float32 `cfg` that fits it (:func:`panels_fit`)
    when the kernel is available; otherwise "out_in" for 2 or more rows (decode-step projections
    as an XLA multiply-reduce, :func:`_project`). Else "in_out" (one XLA GEMM per projection).

    Measured on a 2-core x86 CPU (bench/sampler_step.py, docs/rollout_engine.md): "out_in" makes
    the 8-row decode step 1.3-1.4x faster than "in_out", the 1-row step about 1.4x slower, and
    shows no gain at 64 rows; "panels" reads the weights at about twice the speed of either at
    1-16 rows.

    Raises:
      cpu_kernel.KernelBuildError / ValueError: a CPU engine with a bad ``JAXRL_CPU_KERNEL``, or
        one that requires the kernel where it cannot be built
        (:func:`jaxrl.models.cpu_kernel.available`).
    """
    if platform != "cpu":
        return "in_out"
    cpu_kernel.mode()  # a bad JAXRL_CPU_KERNEL is refused by every CPU engine, not only small ones
    if not 1 <= max_rows <= SKINNY_MAX_ROWS:
        return "in_out"
    if cfg is not None and panels_fit(cfg) and cpu_kernel.available():
        return "panels"
    return "out_in" if max_rows >= 2 else "in_out"


def engine_params(params: dict, cfg: Qwen3Config, layout: str = "in_out") -> dict:
    """The weights of :func:`prefill` and :func:`decode_step`, in the compute dtype.

    The stacked tree (module docstring) is split into one dict per layer, and the projections
    that read the same input are concatenated along the output axis. Shapes (E hidden, D head_dim,
    Nq/Nkv heads, I intermediate, V vocab) in the "in_out" layout::

        {'embed_tokens': [V, E], 'norm': [E], 'lm_head': [E, V] (untied models only),
         'layers': tuple of L dicts {
            'input_layernorm': [E], 'qkv_proj': [E, (Nq + 2 Nkv) D]   (q | k | v, head-major),
            'q_norm': [D], 'k_norm': [D], 'o_proj': [Nq D, E],
            'post_attention_layernorm': [E], 'gate_up_proj': [E, 2 I]  (gate | up),
            'down_proj': [I, E]}}

    The "out_in" layout (:func:`engine_layout`: CPU engines of a few rows) stores each projection and the untied head
    transposed, ``[out, in]``, under the key with ``_t`` appended (``qkv_proj_t`` ``[(Nq + 2 Nkv) D,
    E]``, ..., ``lm_head_t`` ``[V, E]``), so that a decode step can read each weight row once for
    all rows of the batch (:func:`_project`).

    The "panels" layout (CPU, float32, :mod:`jaxrl.models.cpu_kernel`) stores each projection as
    column panels ``[out / 16, in, 16]`` under the key with ``_p`` appended (``qkv_proj_p``, ...,
    ``lm_head_p``); a tied head adds ``head_p`` ``[V / 16, E, 16]``, a panel copy of the embedding
    table (E V more floats held).

    Why: a decode step is bound by reading the weights once. Weights sliced out of a stacked
    ``[L, ...]`` array inside the step (``lax.scan``) can be copied before each matmul, and one
    matmul per fused projection is one kernel instead of three (q, k, v) or two (gate, up).
    The fused matmuls compute the same dot products as :func:`forward` (same inputs and
    contraction; the accumulation order may differ in the last bit).

    Raises:
      ValueError: an unknown `layout`, or "panels" for a `cfg` that does not fit it
        (:func:`panels_fit`).
    """
    if layout not in ENGINE_LAYOUTS:
        raise ValueError(f"layout: {layout!r} is not one of {ENGINE_LAYOUTS}")
    if layout == "panels" and not panels_fit(cfg):
        raise ValueError("layout 'panels' needs float32 compute and projection widths that are multiples of 16; "
                         "use 'out_in' or 'in_out' for this model")
    dt = cfg.compute_dtype
    Nq, Nkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    E = cfg.hidden_size
    lp = params["layers"]

    def proj(name, w):  # w: [in, out]
        if layout == "panels":
            return name + "_p", cpu_kernel.to_panels(w)
        return (name, w) if layout == "in_out" else (name + "_t", w.T)

    layers = []
    for i in range(cfg.num_hidden_layers):
        get = lambda name: jnp.asarray(lp[name][i]).astype(dt)  # noqa: E731
        layers.append(dict([
            ("input_layernorm", jnp.asarray(lp["input_layernorm"]["scale"][i]).astype(dt)),
            proj("qkv_proj", jnp.concatenate([get("q_proj").reshape(E, Nq * D), get("k_proj").reshape(E, Nkv * D),
                                              get("v_proj").reshape(E, Nkv * D)], axis=1)),
            ("q_norm", jnp.asarray(lp["q_norm"]["scale"][i]).astype(dt)),
            ("k_norm", jnp.asarray(lp["k_norm"]["scale"][i]).astype(dt)),
            proj("o_proj", get("o_proj").reshape(Nq * D, E)),
            ("post_attention_layernorm", jnp.asarray(lp["post_attention_layernorm"]["scale"][i]).astype(dt)),
            proj("gate_up_proj", jnp.concatenate([get("gate_proj"), get("up_proj")], axis=1)),
            proj("down_proj", get("down_proj")),
        ]))
    out = {"embed_tokens": jnp.asarray(params["embed_tokens"]).astype(dt),
           "norm": jnp.asarray(params["norm"]["scale"]).astype(dt), "layers": tuple(layers)}
    if not cfg.tie_word_embeddings:
        out.update([proj("lm_head", jnp.asarray(params["lm_head"]).astype(dt))])
    elif layout == "panels":
        out["head_p"] = cpu_kernel.to_panels(out["embed_tokens"].T)
    return out


def _project(x, p: dict, name: str, out_dtype=None):
    """``x [..., in] @ w [in, out]`` for the engine's projection `name` of `p` (either layout of
    :func:`engine_params`), returned in `out_dtype` (default: x's dtype; the "in_out" layout
    computes exactly the dot it always did, the "out_in" one accumulates in float32).

    In the "panels" layout (float32) up to ``cpu_kernel.KERNEL_MAX_ROWS`` rows (a decode step, a
    short prefill) run :func:`jaxrl.models.cpu_kernel.panel_matmul`, more rows one XLA dot on the
    panels.

    In the "out_in" layout, a decode step's ``x [B, in]`` with 2 <= B <= `SKINNY_MAX_ROWS` is
    multiplied as one fused multiply-reduce, ``y[b, n] = sum_k w[n, k] x[b, k]`` over an
    ``[out, B, in]`` product that is never stored: each weight row is read once and used for all
    B rows while it is in cache. On a 2-core CPU whose weights do not stay in cache between
    steps, XLA's GEMM reads them at a third to a half of that speed at these row counts
    (bench/sampler_step.py). Other shapes use a dot (a GEMM for the prefill, a GEMV for B = 1).
    """
    if name + "_p" in p:  # "panels": float32 in and out
        w = p[name + "_p"]
        x2 = x.reshape(-1, x.shape[-1]).astype(jnp.float32)
        if x2.shape[0] <= cpu_kernel.KERNEL_MAX_ROWS:
            y = cpu_kernel.panel_matmul(x2, w, w.shape[0] * cpu_kernel.PANEL)
        else:  # a long prefill: XLA's dot on the panels is faster there
            y = jnp.einsum("mk,pkc->mpc", x2, w).reshape(x2.shape[0], -1)
        return y.reshape(x.shape[:-1] + (y.shape[-1],)).astype(out_dtype or x.dtype)
    if name in p:  # "in_out"
        if out_dtype is None:
            return x @ p[name]
        return jnp.einsum("...k,kn->...n", x, p[name], preferred_element_type=out_dtype)
    out_dtype = out_dtype or x.dtype
    w = p[name + "_t"]
    f32 = jnp.float32
    if x.ndim == 2 and 2 <= x.shape[0] <= SKINNY_MAX_ROWS:
        return jnp.sum(w[:, None, :].astype(f32) * x[None, :, :].astype(f32), axis=-1).T.astype(out_dtype)
    return jnp.einsum("...k,nk->...n", x, w, preferred_element_type=jnp.float32).astype(out_dtype)


def _engine_head_logits(ep: dict, cfg: Qwen3Config, h):
    """Logits ``[..., V]`` float32 of the final hidden states ``h [..., E]`` (tied: the embedding
    table, already ``[V, E]``)."""
    if not cfg.tie_word_embeddings:
        return _project(h, ep, "lm_head", jnp.float32)
    if "head_p" in ep:  # "panels"
        return _project(h, ep, "head", jnp.float32)
    if "qkv_proj" in ep["layers"][0]:  # "in_out"
        return jnp.einsum("...e,ve->...v", h, ep["embed_tokens"], preferred_element_type=jnp.float32)
    return _project(h, {"head_t": ep["embed_tokens"]}, "head", jnp.float32)


def _engine_qkv(cfg: Qwen3Config, p: dict, x, cos, sin):
    """Pre-attention half of a layer on ``x [..., E]``: q ``[..., Nq, D]``, k/v ``[..., Nkv, D]``
    (q/k normed and rotated; cos/sin broadcast against ``[..., D]``)."""
    Nq, Nkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    eps = cfg.rms_norm_eps
    h = rms_norm(x, p["input_layernorm"], eps)
    qkv = _project(h, p, "qkv_proj")
    lead = qkv.shape[:-1]
    q = qkv[..., :Nq * D].reshape(lead + (Nq, D))
    k = qkv[..., Nq * D:(Nq + Nkv) * D].reshape(lead + (Nkv, D))
    v = qkv[..., (Nq + Nkv) * D:].reshape(lead + (Nkv, D))

    def rope(t):
        d = D // 2
        return t * cos + jnp.concatenate([-t[..., d:], t[..., :d]], axis=-1) * sin

    q = rope(rms_norm(q, p["q_norm"], eps))
    k = rope(rms_norm(k, p["k_norm"], eps))
    return q, k, v


def _engine_out(cfg: Qwen3Config, p: dict, x, attn):
    """Post-attention half of a layer: ``x + o_proj(attn)``, then the SwiGLU MLP block."""
    I = cfg.intermediate_size
    x = x + _project(attn, p, "o_proj")
    h = rms_norm(x, p["post_attention_layernorm"], cfg.rms_norm_eps)
    gu = _project(h, p, "gate_up_proj")
    return x + _project(jax.nn.silu(gu[..., :I]) * gu[..., I:], p, "down_proj")


def prefill(ep: dict, cfg: Qwen3Config, tokens, token_mask):
    """Runs padded prompts once and returns their KV cache and last-token logits.

    Args:
      ep: :func:`engine_params`.
      tokens: ``[G, P]`` int32, one prompt per row, its tokens contiguous (the engine pads on the
        right, so that the cache slot of a token is its position; left padding works too).
      token_mask: ``[G, P]`` bool, True on prompt tokens (at least one per row for a meaningful
        result; an empty row gives finite garbage).
    Returns:
      ``(logits [G, V] float32, kv)``: the logits after each row's last prompt token, and ``kv``
      a tuple over layers of ``(k, v)`` in the compute dtype, keys ``[G, Nkv, D, P]`` (slots
      minor, :data:`KV_LAYOUT`) and values ``[G, Nkv, P, D]`` (keys after q/k-norm and RoPE at
      positions ``cumsum(token_mask) - 1``, so a prompt's cache does not depend on its padding).
      Pad slots hold values that :func:`decode_step` masks out.

    Attention is causal over the prompt's own tokens, by the kernel ``cfg.attention``
    (:func:`jaxrl.models.attention.causal_segment_attention`: memory linear in P; right-padded rows
    take cuDNN's fast path), except in the last layer, where only the last token attends.
    """
    G, P = tokens.shape
    dt = cfg.compute_dtype
    token_mask = token_mask.astype(bool)
    positions = jnp.maximum(jnp.cumsum(token_mask, axis=1) - 1, 0).astype(jnp.int32)
    cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, dt, cfg.rope_scaling)      # [G, P, D]
    cos, sin = cos[:, :, None], sin[:, :, None]
    segment_ids = token_mask.astype(jnp.int32)  # causal within the prompt, never to padding
    last = (P - 1 - jnp.argmax(token_mask[:, ::-1], axis=1))[:, None]           # last prompt token
    x = jnp.take(ep["embed_tokens"], tokens, axis=0)
    kv = []
    for i, p in enumerate(ep["layers"]):
        q, k, v = _engine_qkv(cfg, p, x, cos, sin)
        kv.append((k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)))
        if i < len(ep["layers"]) - 1:
            a = attention_lib.causal_segment_attention(q, k, v, segment_ids, cfg.attention, cfg.attention_block)
            x = _engine_out(cfg, p, x, a.reshape(G, P, -1))
        else:  # only the last token's output is used after the last layer's K/V
            q = jnp.take_along_axis(q, last[:, :, None, None], axis=1)          # [G, 1, Nq, D]
            a = attention(q, k, v, token_mask[:, None, :])                      # keys <= last: all
            x = _engine_out(cfg, p, jnp.take_along_axis(x, last[:, :, None], axis=1), a.reshape(G, 1, -1))
    h = rms_norm(x[:, 0], ep["norm"], cfg.rms_norm_eps)
    logits = _engine_head_logits(ep, cfg, h)
    return logits, tuple(kv)


# The engine's KV caches (prefill, init_decode_cache, row_cache, decode_step) keep keys with the
# slots minor, ``[..., Nkv, D, slots]``, and values with the head dim minor, ``[..., Nkv, slots,
# D]``: both attention matmuls of a decode step then contract over the second-minor axis of the
# cache they read (scores ``q [.., D] x k [D, C]``, output ``p [.., C] x v [C, D]``). Measured on a
# 2-core x86 CPU (bench/sampler_step.py, the bench model, one cache per row): the decode step
# takes 0.78x the time of keys stored ``[..., slots, D]`` at 64 rows and 0.93x at 8 rows, the
# same at 1 row.
KV_LAYOUT = "keys [..., Nkv, D, slots], values [..., Nkv, slots, D]"


def init_decode_cache(cfg: Qwen3Config, rows: int, max_new: int) -> tuple:
    """Zeroed per-row cache of generated tokens for :func:`decode_step`: a tuple over layers of
    ``(k, v)`` in the compute dtype, k ``[rows, Nkv, D, max_new]``, v ``[rows, Nkv, max_new, D]``
    (:data:`KV_LAYOUT`)."""
    Nkv, D = cfg.num_key_value_heads, cfg.head_dim
    return tuple((jnp.zeros((rows, Nkv, D, max_new), cfg.compute_dtype),
                  jnp.zeros((rows, Nkv, max_new, D), cfg.compute_dtype))
                 for _ in range(cfg.num_hidden_layers))


def _decode_attention(q, kp, vp, prompt_valid, kg, vg, gen_valid):
    """Softmax attention of one new token per row over its group's prompt cache and its own
    generated-token cache, as one softmax over both (Vaswani et al. 2017, eq. 1; GQA).

    q ``[B, Nq, D]``; kp ``[G, Nkv, D, P]``, vp ``[G, Nkv, P, D]``; prompt_valid ``[G, P]``; kg
    ``[B, Nkv, D, N]``, vg ``[B, Nkv, N, D]``; gen_valid ``[N]``; B = G·R, row b reads group b // R. Scores and softmax in float32; the
    probabilities are cast to the cache dtype for the value matmul (as :func:`attention`).
    Returns ``[B, Nq·D]`` in q's dtype.
    """
    B, Nq, D = q.shape
    G, Nkv, _, P = kp.shape
    R, Gq = B // G, Nq // Nkv
    f32 = jnp.float32
    neg = jnp.finfo(f32).min
    scale = D ** -0.5
    # The cache's batch axes (group or row, kv head) lead, so each matmul is one batched GEMM
    # that reads the cache in place; only the small query/score tensors are rearranged.
    sp = jnp.einsum("grkqd,gkdp->grkqp", q.reshape(G, R, Nkv, Gq, D), kp, preferred_element_type=f32) * scale
    sp = jnp.where(prompt_valid[:, None, None, None, :], sp, neg).reshape(B, Nkv, Gq, P)
    sg = jnp.einsum("bkqd,bkdn->bkqn", q.reshape(B, Nkv, Gq, D), kg, preferred_element_type=f32) * scale
    sg = jnp.where(gen_valid, sg, neg)
    m = jnp.maximum(jnp.max(sp, axis=-1), jnp.max(sg, axis=-1))[..., None]
    ep_, eg = jnp.exp(sp - m), jnp.exp(sg - m)
    denom = (jnp.sum(ep_, axis=-1) + jnp.sum(eg, axis=-1))[..., None]
    pp = (ep_ / denom).astype(vp.dtype).reshape(G, R, Nkv, Gq, P)
    pg = (eg / denom).astype(vg.dtype)
    o = (jnp.einsum("grkqp,gkpd->grkqd", pp, vp, preferred_element_type=f32).reshape(B, Nkv, Gq, D)
         + jnp.einsum("bkqn,bknd->bkqd", pg, vg, preferred_element_type=f32))
    return o.astype(q.dtype).reshape(B, Nq * D)


def row_cache(prompt_kv: tuple, max_new: int) -> tuple:
    """One cache per row, prompt and generated tokens together (for groups of one row): per layer
    ``(k, v)``, k ``[B, Nkv, D, P + max_new]``, v ``[B, Nkv, P + max_new, D]``
    (:data:`KV_LAYOUT`), slots ``[0, P)`` from :func:`prefill` (B = G), the rest zero. Pass it as
    ``gen_kv`` to :func:`decode_step` with ``prompt_kv=None``."""
    def grow(x, axis):
        pad = list(x.shape)
        pad[axis] = max_new
        return jnp.concatenate([x, jnp.zeros(pad, x.dtype)], axis=axis)

    return tuple((grow(k, 3), grow(v, 2)) for k, v in prompt_kv)


def _decode_attention_rows(q, k, v, valid):
    """Softmax attention of one new token per row over the row's own cache (GQA; Vaswani et al.
    2017, eq. 1): q ``[B, Nq, D]``, k ``[B, Nkv, D, C]``, v ``[B, Nkv, C, D]``, valid ``[B, C]``.
    Scores and softmax in float32, probabilities cast to the cache dtype for the value matmul.
    Returns ``[B, Nq·D]``."""
    B, Nq, D = q.shape
    Nkv = k.shape[1]
    s = jnp.einsum("bkqd,bkdc->bkqc", q.reshape(B, Nkv, Nq // Nkv, D), k, preferred_element_type=jnp.float32)
    s = jnp.where(valid[:, None, None, :], s * D ** -0.5, jnp.finfo(jnp.float32).min)
    p = jax.nn.softmax(s, axis=-1).astype(v.dtype)
    o = jnp.einsum("bkqc,bkcd->bkqd", p, v, preferred_element_type=jnp.float32)
    return o.astype(q.dtype).reshape(B, Nq * D)


def decode_step(ep: dict, cfg: Qwen3Config, tokens, positions, prompt_kv, prompt_valid, gen_kv: tuple, step):
    """One new token per row against the KV cache; two cache layouts.

    Args:
      ep: :func:`engine_params`.
      tokens: ``[B]`` int32, the token fed at this step; positions: ``[B]`` int32, its RoPE position.
      prompt_kv: shared layout: from :func:`prefill`, per layer ``(k, v)`` (k ``[G, Nkv, D, P]``,
        v ``[G, Nkv, P, D]``); B must be a multiple of G, and rows ``[g·R, (g+1)·R)`` (R = B // G) continue prompt g, so a
        prompt's cache is stored and read once for its R samples. None: row layout (below).
      prompt_valid: ``[G, P]`` bool, the prompt's slots (the prefill's ``token_mask``; G = B in
        the row layout).
      gen_kv: shared layout: per layer ``(k, v)`` (k ``[B, Nkv, D, N]``, v ``[B, Nkv, N, D]``)
        from :func:`init_decode_cache` or the previous step; the token goes to slot ``step``.
        Row layout: k ``[B, Nkv, D, P + N]``, v ``[B, Nkv, P + N, D]`` from :func:`row_cache`;
        the token goes to slot ``P + step``.
      step: int32 scalar in ``[0, N)``, the number of tokens generated before this one: the token
        attends to its prompt and to the generated slots up to its own.
    Returns:
      ``(logits [B, V] float32, gen_kv)`` with this token's K/V written (an in-place update when
      the caches are loop state or donated). Both layouts give the same values (one softmax over
      prompt and generated slots).
    """
    dt = cfg.compute_dtype
    P = prompt_valid.shape[1]
    C = gen_kv[0][1].shape[2]
    step = jnp.asarray(step, jnp.int32)
    offset = 0 if prompt_kv is not None else P
    gen_valid = jnp.arange(C - offset) <= step
    if prompt_kv is None:
        valid = jnp.concatenate([prompt_valid.astype(bool), jnp.broadcast_to(gen_valid, (len(tokens), C - P))], 1)
    cos, sin = rope_cos_sin(positions[:, None], cfg.head_dim, cfg.rope_theta, dt, cfg.rope_scaling)   # [B, 1, D]
    x = jnp.take(ep["embed_tokens"], tokens, axis=0)                                 # [B, E]
    new_kv = []
    for i, p in enumerate(ep["layers"]):
        kg, vg = gen_kv[i]
        q, k, v = _engine_qkv(cfg, p, x, cos, sin)                                  # [B, N*, D]
        kg = jax.lax.dynamic_update_slice(kg, k[:, :, :, None].astype(kg.dtype), (0, 0, 0, offset + step))
        vg = jax.lax.dynamic_update_slice(vg, v[:, :, None].astype(vg.dtype), (0, 0, offset + step, 0))
        if prompt_kv is None:
            a = _decode_attention_rows(q, kg, vg, valid)
        else:
            a = _decode_attention(q, prompt_kv[i][0], prompt_kv[i][1], prompt_valid, kg, vg, gen_valid)
        x = _engine_out(cfg, p, x, a)
        new_kv.append((kg, vg))
    h = rms_norm(x, ep["norm"], cfg.rms_norm_eps)
    logits = _engine_head_logits(ep, cfg, h)
    return logits, tuple(new_kv)
