"""Causal, segment-aware attention for the training / logprob forward, without a ``[T, T]`` mask.

Every kernel here computes, for queries ``q [B, T, Nq, D]`` and keys/values ``k, v [B, T, Nkv, D]``
(grouped-query attention, Ainslie et al. 2023: query head ``h`` reads kv head ``h // (Nq / Nkv)``)::

    out[b, s] = softmax_c( q[b, s] . k[b, c] * D**-0.5  over allowed c ) @ v[b, c]
    allowed(s, c) = c <= s  and  segment_ids[b, c] == segment_ids[b, s]  and  segment_ids[b, c] != 0

(Vaswani et al. 2017, eq. 1), which is causal attention within each packed sequence of a row;
right-padded, left-padded and packed rows all fit. A query with no allowed key (a padding token)
gets a finite, meaningless output (zeros for ``xla``); such rows are never used.

Implementations (``Qwen3Config.attention``):

* ``'xla'`` — :func:`blocked_attention`: FlashAttention-2 (Dao 2023, arXiv:2307.08691, Alg. 1
  forward, Alg. 2 backward) in plain JAX: the sequence is cut into blocks, the mask of a
  (query block, key block) pair is built from indices and segment ids inside the loop, key blocks
  above the diagonal are skipped, and the backward pass recomputes probabilities from the saved
  log-sum-exp. Memory grows linearly in T (one ``[B, Nq, block, block]`` score tile at a time);
  exact (float32 softmax statistics), any backend. The CPU path of the tests and of ``jaxrl.plan``.
* ``'cudnn'`` — :func:`cudnn_attention`: the cuDNN flash kernel via
  ``jax.nn.dot_product_attention(is_causal=True, query_seq_lengths=..., key_value_seq_lengths=...)``
  (mask type padding+causal; no mask tensor). It expresses rows holding one sequence starting at
  index 0 followed by padding (what the trainer builds, docs/architecture.md §3); a batch with any other row
  layout (left padding, packing) is computed by the exact ``'xla'`` kernel through ``lax.cond``.
  NVIDIA GPUs (Ampere or newer), bfloat16/float16.
* ``'splash'`` — :func:`splash_attention`: the Pallas TPU splash-attention kernel with a causal
  mask and ``SegmentIds`` (``jax.experimental.pallas.ops.tpu.splash_attention``), one kernel per
  kv head (grouped queries as MQA), under ``shard_map`` when a mesh is active. Runs on CPU in
  Pallas interpret mode (slow; used by the tests).

The KV-cache (decode) path keeps its explicit ``[B, S, C]`` mask: there S is 1 or a prompt bucket.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

DEFAULT_BLOCK = 512
# checkpoint_name of the attention output and its log-sum-exp (see jaxrl.models.qwen3._remat).
ATTENTION_OUT = "attention_out"
ATTENTION_LSE = "attention_lse"
_NEG_INF = -jnp.inf


# --------------------------------------------------------------------------------------------
# Blocked (flash) attention in plain JAX
# --------------------------------------------------------------------------------------------

def _block_mask(i, j, seg_q, seg_k, c):
    """``[B, c, c]`` allowed-mask of query block i vs key block j (indices from the block numbers)."""
    qi = i * c + jnp.arange(c)
    kj = j * c + jnp.arange(c)
    causal = qi[:, None] >= kj[None, :]
    return causal[None] & (seg_q[:, :, None] == seg_k[:, None, :]) & (seg_k != 0)[:, None, :]


def _scores(qb, kb, scale):
    """``qb [B, c, K, G, D]``, ``kb [B, c, K, D]`` -> float32 ``[B, K, G, c_q, c_k]``."""
    return jnp.einsum("bqkgd,bckd->bkgqc", qb, kb, preferred_element_type=jnp.float32) * scale


def _flash_fwd_impl(q, k, v, seg, scale):
    """q ``[B, n, c, K, G, D]``; k, v ``[B, n, c, K, D]``; seg ``[B, n, c]``.

    Returns ``(out [B, n, c, K, G, D] in q.dtype, lse [B, n, K, G, c] float32)``.
    """
    B, n, c, K, G, D = q.shape

    def q_block(i):
        qb = jax.lax.dynamic_index_in_dim(q, i, 1, keepdims=False)
        sq = jax.lax.dynamic_index_in_dim(seg, i, 1, keepdims=False)

        def kv_step(j, carry):
            m, l, acc = carry
            kb = jax.lax.dynamic_index_in_dim(k, j, 1, keepdims=False)
            vb = jax.lax.dynamic_index_in_dim(v, j, 1, keepdims=False)
            sk = jax.lax.dynamic_index_in_dim(seg, j, 1, keepdims=False)
            mask = _block_mask(i, j, sq, sk, c)[:, None, None]
            s = jnp.where(mask, _scores(qb, kb, scale), _NEG_INF)
            m_new = jnp.maximum(m, s.max(-1))
            m_ref = jnp.where(jnp.isfinite(m_new), m_new, 0.0)     # rows with no allowed key yet
            p = jnp.exp(s - m_ref[..., None])                      # masked entries: exp(-inf) = 0
            alpha = jnp.exp(m - m_ref)
            l = alpha * l + p.sum(-1)
            acc = alpha[..., None] * acc + jnp.einsum("bkgqc,bckd->bkgqd", p.astype(v.dtype), vb,
                                                      preferred_element_type=jnp.float32)
            return m_new, l, acc

        init = (jnp.full((B, K, G, c), _NEG_INF, jnp.float32), jnp.zeros((B, K, G, c), jnp.float32),
                jnp.zeros((B, K, G, c, D), jnp.float32))
        m, l, acc = jax.lax.fori_loop(0, i + 1, kv_step, init)     # key blocks j <= i only
        ok = l > 0
        out = acc / jnp.where(ok, l, 1.0)[..., None]
        lse = jnp.where(ok, m + jnp.log(jnp.where(ok, l, 1.0)), 0.0)
        return out.transpose(0, 3, 1, 2, 4).astype(q.dtype), lse   # [B, c, K, G, D], [B, K, G, c]

    out, lse = jax.lax.map(q_block, jnp.arange(n))                 # [n, ...]
    return jnp.moveaxis(out, 0, 1), jnp.moveaxis(lse, 0, 1)


def _flash_bwd_impl(q, k, v, seg, out, lse, dout, scale):
    """FlashAttention-2 backward (Dao 2023, Alg. 2): per key block j, loop over query blocks i >= j,
    recompute ``P = exp(S - lse)``; ``dV += Pᵀ dO``, ``dS = P ∘ (dO Vᵀ - rowsum(dO ∘ O))``,
    ``dK += dSᵀ Q · scale``, ``dQ_i += dS K · scale`` (dQ accumulated in a float32 carry)."""
    B, n, c, K, G, D = q.shape
    delta = jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), -1)   # [B, n, c, K, G]
    delta = delta.transpose(0, 1, 3, 4, 2)                                      # [B, n, K, G, c]
    dt = q.dtype

    def kv_block(dq, j):
        kb = jax.lax.dynamic_index_in_dim(k, j, 1, keepdims=False)
        vb = jax.lax.dynamic_index_in_dim(v, j, 1, keepdims=False)
        sk = jax.lax.dynamic_index_in_dim(seg, j, 1, keepdims=False)

        def q_step(i, carry):
            dq, dk, dv = carry
            idx = lambda x: jax.lax.dynamic_index_in_dim(x, i, 1, keepdims=False)
            qb, dob, sq, lb, db = idx(q), idx(dout), idx(seg), idx(lse), idx(delta)
            mask = _block_mask(i, j, sq, sk, c)[:, None, None]
            p = jnp.where(mask, jnp.exp(_scores(qb, kb, scale) - lb[..., None]), 0.0)  # [B,K,G,q,c]
            dv = dv + jnp.einsum("bkgqc,bqkgd->bckd", p.astype(dt), dob, preferred_element_type=jnp.float32)
            dp = jnp.einsum("bqkgd,bckd->bkgqc", dob, vb, preferred_element_type=jnp.float32)
            ds = (p * (dp - db[..., None])).astype(dt)
            dk = dk + jnp.einsum("bkgqc,bqkgd->bckd", ds, qb, preferred_element_type=jnp.float32) * scale
            dqb = jnp.einsum("bkgqc,bckd->bqkgd", ds, kb, preferred_element_type=jnp.float32) * scale
            dq = jax.lax.dynamic_update_index_in_dim(dq, idx(dq) + dqb, i, 1)
            return dq, dk, dv

        zeros = jnp.zeros((B, c, K, D), jnp.float32)
        dq, dk, dv = jax.lax.fori_loop(j, n, q_step, (dq, zeros, zeros))       # query blocks i >= j
        return dq, (dk, dv)

    dq, (dk, dv) = jax.lax.scan(kv_block, jnp.zeros(q.shape, jnp.float32), jnp.arange(n))
    dk, dv = jnp.moveaxis(dk, 0, 1), jnp.moveaxis(dv, 0, 1)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _flash(q, k, v, seg, scale):
    return _flash_fwd_impl(q, k, v, seg, scale)[0]


def _flash_fwd(q, k, v, seg, scale):
    out, lse = _flash_fwd_impl(q, k, v, seg, scale)
    # Named so that a remat policy can keep them (remat='save_attention'): the backward pass then
    # does not rerun the attention forward loop.
    out = checkpoint_name(out, ATTENTION_OUT)
    lse = checkpoint_name(lse, ATTENTION_LSE)
    return out, (q, k, v, seg, out, lse)


def _flash_bwd(scale, res, dout):
    q, k, v, seg, out, lse = res
    dq, dk, dv = _flash_bwd_impl(q, k, v, seg, out, lse, dout, scale)
    return dq, dk, dv, np.zeros(seg.shape, jax.dtypes.float0)


_flash.defvjp(_flash_fwd, _flash_bwd)


def blocked_attention(q, k, v, segment_ids, block_size: int = DEFAULT_BLOCK):
    """Exact causal, segment-masked attention in blocks (FlashAttention-2 in plain JAX).

    Args:
      q: ``[B, T, Nq, D]``; k, v: ``[B, T, Nkv, D]`` (Nq a multiple of Nkv); one float dtype.
      segment_ids: ``[B, T]`` int; 0 = padding, equal ids = one sequence (contiguous).
      block_size: query/key positions per block (> 0); T need not be a multiple (the tail is
        padded with segment id 0, which no query attends to).
    Returns:
      ``[B, T, Nq, D]`` in q's dtype. Scores, softmax statistics and accumulators are float32;
      probabilities are cast to the input dtype for the value matmul (as in the dense path).
    Memory: O(B · T · Nq · D) plus one ``[B, Nq, block, block]`` float32 tile, forward and backward.
    Raises:
      ValueError: for a non-positive block size or mismatched shapes.
    """
    if block_size <= 0:
        raise ValueError(f"attention block_size must be positive, got {block_size}")
    B, T, Nq, D = q.shape
    Nkv = k.shape[2]
    if k.shape != (B, T, Nkv, D) or v.shape != k.shape or Nq % Nkv or segment_ids.shape != (B, T):
        raise ValueError(f"blocked_attention: q {q.shape}, k {k.shape}, v {v.shape}, segment_ids "
                         f"{segment_ids.shape} do not fit [B,T,Nq,D], [B,T,Nkv,D], [B,T] with Nkv | Nq")
    c = min(block_size, T)
    n = -(-T // c)
    pad = n * c - T
    padt = lambda x: jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)) if pad else x
    qb = padt(q).reshape(B, n, c, Nkv, Nq // Nkv, D)
    kb = padt(k).reshape(B, n, c, Nkv, D)
    vb = padt(v).reshape(B, n, c, Nkv, D)
    sb = padt(segment_ids.astype(jnp.int32)).reshape(B, n, c)
    out = _flash(qb, kb, vb, sb, float(D) ** -0.5)
    return out.reshape(B, n * c, Nq, D)[:, :T]


# --------------------------------------------------------------------------------------------
# cuDNN (GPU)
# --------------------------------------------------------------------------------------------

def single_sequence_lengths(segment_ids):
    """``(lengths [B] int32, fits scalar bool)`` for the cuDNN padding+causal layout.

    ``fits`` is True when every row is one sequence starting at index 0 (a single non-zero id)
    followed only by padding (id 0); ``lengths`` counts the non-padding tokens (at least 1, so an
    all-padding row stays finite).
    """
    seg = segment_ids.astype(jnp.int32)
    valid = seg != 0
    lengths = valid.sum(-1).astype(jnp.int32)
    prefix = jnp.arange(seg.shape[1])[None, :] < lengths[:, None]
    fits = jnp.all(valid == prefix) & jnp.all(jnp.where(valid, seg == seg[:, :1], True))
    return jnp.maximum(lengths, 1), fits


def cudnn_attention(q, k, v, segment_ids, block_size: int = DEFAULT_BLOCK, implementation: str = "cudnn",
                    fallback: bool = True):
    """Causal attention through the cuDNN flash kernel with sequence lengths (no mask tensor).

    Rows must hold one sequence from index 0 followed by padding (the trainer's layout); when any
    row of the batch does not (left padding, packing), the batch is computed by
    :func:`blocked_attention` instead (``lax.cond`` on a device-side check), which is exact.
    Shapes and dtypes as :func:`blocked_attention`; the cuDNN kernel needs an NVIDIA GPU and a
    16-bit dtype (jax raises otherwise). ``implementation='xla'`` runs the same
    ``jax.nn.dot_product_attention`` call with XLA on any backend (tests; it builds a mask).

    ``fallback=False`` (attention ``'cudnn_no_fallback'``) leaves out the check and the blocked
    branch: only for batches already checked with :func:`single_sequence_lengths`. The train step
    does that check once per micro-batch around the whole gradient computation
    (:func:`jaxrl.train.step.accumulate_gradients`), because differentiating through this
    per-layer ``lax.cond`` makes the cuDNN branch output zero-filled copies of the blocked
    branch's residuals (q, k, v in blocks, output, log-sum-exp) in every layer, and keeps them
    with the saved attention output under the ``save_*attention`` remat policies.
    """
    lengths, fits = single_sequence_lengths(segment_ids)

    def fused(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, query_seq_lengths=lengths,
                                            key_value_seq_lengths=lengths, implementation=implementation)

    if not fallback:
        return fused(q, k, v)

    def blocked(q, k, v):
        return blocked_attention(q, k, v, segment_ids, block_size)

    return jax.lax.cond(fits, fused, blocked, q, k, v)


# --------------------------------------------------------------------------------------------
# Splash attention (TPU)
# --------------------------------------------------------------------------------------------

def _splash_module():
    try:
        from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
        from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
    except ImportError as e:  # pragma: no cover - depends on the jax build
        raise RuntimeError(f"attention='splash' needs jax.experimental.pallas.ops.tpu.splash_attention, which "
                           f"this jax {jax.__version__} cannot import ({e}); use attention='xla'") from e
    return sk, sm


def splash_attention(q, k, v, segment_ids, block_size: int = DEFAULT_BLOCK, interpret: bool | None = None):
    """Causal, segment-masked attention with the Pallas TPU splash kernel.

    Each kv head runs the MQA form of the kernel over its ``Nq / Nkv`` query heads with a
    ``CausalMask`` and ``SegmentIds(q=segment_ids, kv=segment_ids)``. T is padded to a multiple of
    128 (padding id 0). Under an active mesh the call is wrapped in ``shard_map`` over the batch
    axes (rows) and ``tensor`` (kv heads), since a Pallas kernel cannot be auto-partitioned.

    Args as :func:`blocked_attention`; ``interpret`` runs the kernel in Pallas interpret mode
    (default: True when the default backend is not a TPU, i.e. a slow CPU emulation for tests).
    Raises:
      RuntimeError: when the splash module cannot be imported in this jax build.
    """
    sk, sm = _splash_module()
    if interpret is None:
        interpret = jax.default_backend() != "tpu"
    B, T, Nq, D = q.shape
    Nkv = k.shape[2]
    G = Nq // Nkv
    Tp = -(-T // 128) * 128
    blk = max(128, min(block_size, Tp) // 128 * 128)
    while Tp % blk:
        blk -= 128
    pad = Tp - T
    padt = lambda x: jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)) if pad else x
    qh = (padt(q) * jnp.asarray(D ** -0.5, q.dtype)).reshape(B, Tp, Nkv, G, D).transpose(0, 2, 3, 1, 4)
    kh = padt(k).transpose(0, 2, 1, 3)                                    # [B, Nkv, Tp, D]
    vh = padt(v).transpose(0, 2, 1, 3)
    seg = padt(segment_ids.astype(jnp.int32))
    sizes = sk.BlockSizes(block_q=blk, block_kv=blk, block_kv_compute=blk, block_q_dkv=blk, block_kv_dkv=blk,
                          block_kv_dkv_compute=blk, block_q_dq=blk, block_kv_dq=blk)
    kernel = sk.make_splash_mqa_single_device(sm.MultiHeadMask([sm.CausalMask((Tp, Tp))] * G),
                                              block_sizes=sizes, interpret=interpret,
                                              residual_checkpoint_name=ATTENTION_OUT)

    def local(qh, kh, vh, seg):
        per_head = jax.vmap(lambda qg, kg, vg, s: kernel(qg, kg, vg, segment_ids=sk.SegmentIds(q=s, kv=s)),
                            in_axes=(0, 0, 0, None))
        return jax.vmap(per_head)(qh, kh, vh, seg)                        # [b, Nkv, G, Tp, D]

    from jaxrl import parallel

    mesh = jax.sharding.get_abstract_mesh()
    if mesh is not None and not getattr(mesh, "empty", True) and set(parallel.MESH_AXES) <= set(mesh.axis_names):
        from jax.sharding import PartitionSpec as P

        rows, heads = parallel.BATCH_AXES, "tensor"
        spec4 = P(rows, heads, None, None)
        local = jax.shard_map(local, in_specs=(P(rows, heads, None, None, None), spec4, spec4, P(rows, None)),
                              out_specs=P(rows, heads, None, None, None), check_vma=False)
    out = local(qh, kh, vh, seg)
    return out.transpose(0, 3, 1, 2, 4).reshape(B, Tp, Nq, D)[:, :T]


# --------------------------------------------------------------------------------------------

IMPLS = {"xla": blocked_attention, "cudnn": cudnn_attention, "splash": splash_attention,
         "cudnn_no_fallback": functools.partial(cudnn_attention, fallback=False)}


def causal_segment_attention(q, k, v, segment_ids, impl: str = "xla", block_size: int = DEFAULT_BLOCK):
    """Dispatches to the implementation named ``impl`` (``'xla'``, ``'cudnn'``, ``'splash'`` or the
    internal ``'cudnn_no_fallback'``, see :func:`cudnn_attention`).

    Raises:
      ValueError: for an unknown implementation name.
    """
    if impl not in IMPLS:
        raise ValueError(f"unknown attention implementation {impl!r}; use one of {sorted(IMPLS)}")
    return IMPLS[impl](q, k, v, segment_ids, block_size)
