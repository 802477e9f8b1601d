"""Chunked log-probabilities and entropies of an output head: the training objective's logprobs
without materialising ``[B, T, V]`` logits, with a custom VJP (:func:`logprobs_from_hidden`).

Model-agnostic (a hidden-state array and a head matrix); :func:`jaxrl.models.qwen3.logprobs`
runs it on the Qwen3 trunk. Re-exported by :mod:`jaxrl.models.qwen3`.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


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
