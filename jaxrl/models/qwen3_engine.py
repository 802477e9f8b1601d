"""The rollout engine's Qwen3 path: per-layer weights in a layout chosen for the platform
(:func:`engine_layout`, :func:`engine_params`; "in_out" or "out_in"),
the prompt prefill (:func:`prefill`) and the decode step (:func:`decode_step`) over a prompt KV
cache shared by the samples of a prompt (:data:`KV_LAYOUT`). Used by
:mod:`jaxrl.rollout.sampler`; re-exported by :mod:`jaxrl.models.qwen3`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl.models import attention as attention_lib
from jaxrl.models.qwen3_config import Qwen3Config
from jaxrl.models.qwen3_core import attention, rms_norm, rope_cos_sin


ENGINE_LAYOUTS = ("in_out", "out_in")

# Rows up to which a CPU engine runs the "out_in" layout (a decode-step projection as a fused
# multiply-reduce, `_project`); measured on a 2-core x86 CPU, bench/sampler_step.py and
# bench/sampler_throughput.py.
SKINNY_MAX_ROWS = 16


def engine_layout(platform: str, max_rows: int) -> str:
    """The weight layout of :func:`engine_params` for an engine on `platform` ("cpu", "gpu", "tpu")
    whose programs run at most `max_rows` rows.

    On CPU with 2 to `SKINNY_MAX_ROWS` rows: "out_in" (decode-step projections as an XLA
    multiply-reduce, :func:`_project`). Else "in_out" (one XLA GEMM per projection).

    Measured on a 2-core x86 CPU (bench/sampler_step.py, docs/rollout_engine.md): "out_in" makes
    the 8-row decode step 1.3-1.4x faster than "in_out", the 1-row step about 1.4x slower, and
    shows no gain at 64 rows.
    """
    if platform != "cpu":
        return "in_out"
    if not 1 <= max_rows <= SKINNY_MAX_ROWS:
        return "in_out"
    return "out_in" if max_rows >= 2 else "in_out"


def engine_params(params: dict, cfg: Qwen3Config, layout: str = "in_out") -> dict:
    """The weights of :func:`prefill` and :func:`decode_step`, in the compute dtype.

    The stacked tree (:mod:`jaxrl.models.qwen3` docstring) is split into one dict per layer, and
    the projections that read the same input are concatenated along the output axis. Shapes (E hidden, D head_dim,
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

    Why: a decode step is bound by reading the weights once. Weights sliced out of a stacked
    ``[L, ...]`` array inside the step (``lax.scan``) can be copied before each matmul, and one
    matmul per fused projection is one kernel instead of three (q, k, v) or two (gate, up).
    The fused matmuls compute the same dot products as :func:`jaxrl.models.qwen3.forward` (same
    inputs and contraction; the accumulation order may differ in the last bit).

    Raises:
      ValueError: an unknown `layout`.
    """
    if layout not in ENGINE_LAYOUTS:
        raise ValueError(f"layout: {layout!r} is not one of {ENGINE_LAYOUTS}")
    dt = cfg.compute_dtype
    Nq, Nkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    E = cfg.hidden_size
    lp = params["layers"]

    def proj(name, w):  # w: [in, out]
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
    return out


def _project(x, p: dict, name: str, out_dtype=None):
    """``x [..., in] @ w [in, out]`` for the engine's projection `name` of `p` (either layout of
    :func:`engine_params`), returned in `out_dtype` (default: x's dtype; the "in_out" layout
    computes exactly the dot it always did, the "out_in" one accumulates in float32).

    In the "out_in" layout, a decode step's ``x [B, in]`` with 2 <= B <= `SKINNY_MAX_ROWS` is
    multiplied as one fused multiply-reduce, ``y[b, n] = sum_k w[n, k] x[b, k]`` over an
    ``[out, B, in]`` product that is never stored: each weight row is read once and used for all
    B rows while it is in cache. On a 2-core CPU whose weights do not stay in cache between
    steps, XLA's GEMM reads them at a third to a half of that speed at these row counts
    (bench/sampler_step.py). Other shapes use a dot (a GEMM for the prefill, a GEMV for B = 1).
    """
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
