"""Batched KV-cache generation for Qwen3 in JAX (the built-in rollout engine, DESIGN.md §6).

One jitted program per shape bucket does the whole generation: prefill of the left-padded prompts
(:func:`jaxrl.models.qwen3.forward_with_cache`, last position only), then a ``lax.while_loop``
that samples one token per row, feeds it back, and exits as soon as every row is done.

Sampling per row: temperature, top-p (nucleus, Holtzman et al. 2020 §3.1: keep the smallest
prefix of the sorted distribution whose mass reaches p), top-k, greedy, several stop ids,
``max_tokens``. The returned logprob of a token is ``log_softmax(logits / temperature)[token]``
in float32 **without** top-p/top-k renormalisation (DESIGN.md §3), whatever filter sampled it.

Randomness: the key of a row is ``fold_in(fold_in(PRNGKey(seed), prompt_index), sample_index)``
(indices within its request) and the key of step t is ``fold_in(row_key, t)``; the sampled token
is ``argmax(masked_logits / T + Gumbel(key))`` over the full vocabulary. So a row's tokens depend
on its request only, never on the other rows of the batch.

Shapes are bucketed (rows, prompt length, new tokens; see `Sampler`), so a run compiles at most
``len(batch_buckets) * len(prompt_buckets) * len(new_token_buckets)`` programs; `num_compiled`
counts them.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import secrets
import threading
import time
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.buckets import pow2_buckets, round_up
from jaxrl.models import qwen3
from jaxrl.rollout import weight_sync
from jaxrl.rollout.types import Completion, EngineRequest, SamplingParams

# ---------------------------------------------------------------------------------------------
# Token selection
# ---------------------------------------------------------------------------------------------

def filter_mask(scaled, top_p, top_k):
    """Tokens kept by top-k and top-p, per row.

    Args:
      scaled: ``[B, V]`` float32 logits / temperature.
      top_p: ``[B]`` float32 in (0, 1]; 1 keeps everything.
      top_k: ``[B]`` int32; <= 0 keeps everything.
    Returns:
      ``[B, V]`` bool. A token is kept iff its logit is >= the smallest logit of the kept prefix of
      the descending order, the prefix holding the k largest tokens and the tokens whose preceding
      probability mass is < top_p (so the most likely token is always kept; ties at the threshold
      are all kept).
    """
    V = scaled.shape[-1]
    desc = -jnp.sort(-scaled, axis=-1)
    probs = jax.nn.softmax(desc, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    rank = jnp.arange(V)[None]
    keep = (mass_before < top_p[:, None]) & ((top_k[:, None] <= 0) | (rank < top_k[:, None]))
    count = jnp.maximum(jnp.sum(keep, axis=-1), 1)
    threshold = jnp.take_along_axis(desc, (count - 1)[:, None], axis=-1)
    return scaled >= threshold


def select_tokens(logits, step_keys, temperature, top_p, top_k, greedy):
    """Samples one token per row and returns it with its logprob.

    Args:
      logits: ``[B, V]`` float32.
      step_keys: ``[B, 2]`` uint32 PRNG keys (one per row for this step).
      temperature, top_p: ``[B]`` float32; top_k: ``[B]`` int32; greedy: ``[B]`` bool.
    Returns:
      (tokens ``[B]`` int32, logprobs ``[B]`` float32) with
      ``logprob = log_softmax(logits / temperature)[token]`` (no filter renormalisation).
    """
    scaled = logits / temperature[:, None]
    logp = jax.nn.log_softmax(scaled, axis=-1)
    needs_filter = jnp.any((top_p < 1.0) | (top_k > 0))
    keep = jax.lax.cond(needs_filter, filter_mask, lambda s, p, k: jnp.ones(s.shape, bool), scaled, top_p, top_k)
    masked = jnp.where(keep, scaled, -jnp.inf)
    sampled = jax.vmap(jax.random.categorical)(step_keys, masked)
    tokens = jnp.where(greedy, jnp.argmax(logits, axis=-1), sampled).astype(jnp.int32)
    return tokens, jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]


# ---------------------------------------------------------------------------------------------
# The compiled generation program
# ---------------------------------------------------------------------------------------------

def _generate(params, tokens, token_mask, seeds, prompt_index, sample_index, temperature, top_p, top_k, greedy,
              stop_ids, max_new, *, cfg: qwen3.Qwen3Config, num_new: int, on_trace=None):
    """Prefill + decode loop. Shapes: tokens/token_mask ``[B, P]`` (left-padded), per-row ``[B]``
    arrays, stop_ids ``[B, S]`` (-1 = unused). Returns tokens ``[B, N]`` int32, logprobs ``[B, N]``
    float32, lengths ``[B]`` int32, stopped ``[B]`` bool (N = num_new)."""
    if on_trace is not None:
        on_trace()
    B, P = tokens.shape
    N = num_new
    row_keys = jax.vmap(lambda s, i, j: jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(s), i), j))(
        seeds, prompt_index, sample_index)
    cache = qwen3.init_cache(cfg, B, P + N)
    cache_mask = jnp.zeros((B, P + N), bool)
    positions = jnp.maximum(jnp.cumsum(token_mask, axis=1) - 1, 0).astype(jnp.int32)
    prompt_len = jnp.sum(token_mask, axis=1).astype(jnp.int32)
    out = qwen3.forward_with_cache(params, cfg, tokens, positions, token_mask, cache, cache_mask,
                                   jnp.int32(0), last_only=True)

    init = dict(step=jnp.int32(0), logits=out.logits[:, 0], cache=out.cache, cache_mask=out.cache_mask,
                out_tokens=jnp.zeros((B, N), jnp.int32), out_logprobs=jnp.zeros((B, N), jnp.float32),
                lengths=jnp.zeros((B,), jnp.int32), stopped=jnp.zeros((B,), bool), done=max_new <= 0)

    def cond(s):
        return (s["step"] < N) & ~jnp.all(s["done"])

    def body(s):
        step = s["step"]
        keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(row_keys, step)
        tok, lp = select_tokens(s["logits"], keys, temperature, top_p, top_k, greedy)
        active = ~s["done"]
        tok = jnp.where(active, tok, 0)
        out_tokens = jax.lax.dynamic_update_slice(s["out_tokens"], tok[:, None], (0, step))
        out_logprobs = jax.lax.dynamic_update_slice(s["out_logprobs"], jnp.where(active, lp, 0.0)[:, None], (0, step))
        lengths = s["lengths"] + active.astype(jnp.int32)
        hit_stop = active & jnp.any(tok[:, None] == stop_ids, axis=-1)
        done = s["done"] | hit_stop | (lengths >= max_new)
        nxt = qwen3.forward_with_cache(params, cfg, tok[:, None], (prompt_len + step)[:, None], active[:, None],
                                       s["cache"], s["cache_mask"], P + step, last_only=True)
        return dict(step=step + 1, logits=nxt.logits[:, 0], cache=nxt.cache, cache_mask=nxt.cache_mask,
                    out_tokens=out_tokens, out_logprobs=out_logprobs, lengths=lengths,
                    stopped=s["stopped"] | hit_stop, done=done)

    s = jax.lax.while_loop(cond, body, init)
    return s["out_tokens"], s["out_logprobs"], s["lengths"], s["stopped"]


@dataclasses.dataclass
class _Row:
    prompt: Sequence[int]
    params: SamplingParams
    seed: int
    prompt_index: int
    sample_index: int


class Sampler:
    """The JAX generation engine: `types.Generator` in-process, and the sidecar's `Engine`.

    Args:
      params: Qwen3 param tree (`jaxrl.models.qwen3` layout); cast to ``cfg.compute_dtype``.
      cfg: the model config; ``cfg.dtype`` is the compute dtype.
      max_seq_len: prompt + max_tokens limit per row (tokens); also the largest prompt bucket.
      batch_buckets: allowed row counts per program (a call with more rows is split). Default
        powers of two up to `max_batch_rows`.
      prompt_buckets / new_token_buckets: allowed prompt lengths / generation lengths. Defaults:
        powers of two from 16 (prompt) / 16 (new tokens) up to `max_seq_len`.
      max_stop_ids: stop ids per row (a fixed shape; requests with more are refused).
      eos_token_ids: ids the sidecar adds to the stop ids of requests without ``ignore_eos``.
      policy_version: version of `params`.
    """

    def __init__(self, params: Any, cfg: qwen3.Qwen3Config, *, max_seq_len: int = 4096, max_batch_rows: int = 64,
                 batch_buckets: Optional[Sequence[int]] = None, prompt_buckets: Optional[Sequence[int]] = None,
                 new_token_buckets: Optional[Sequence[int]] = None, max_stop_ids: int = 8,
                 eos_token_ids: Sequence[int] = (), policy_version: int = 0):
        self.cfg = cfg
        self.max_seq_len = int(max_seq_len)
        self.batch_buckets = tuple(sorted(batch_buckets or pow2_buckets(1, max_batch_rows)))
        self.prompt_buckets = tuple(sorted(prompt_buckets or pow2_buckets(min(16, max_seq_len), max_seq_len)))
        self.new_token_buckets = tuple(sorted(new_token_buckets or pow2_buckets(min(16, max_seq_len), max_seq_len)))
        self.max_stop_ids = int(max_stop_ids)
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.policy_version = int(policy_version)
        self.params = self._cast(params)
        self.num_compiled = 0
        self._lock = threading.Lock()
        self._fn = jax.jit(functools.partial(_generate, cfg=cfg, on_trace=self._on_trace), static_argnames=("num_new",))

    def _on_trace(self):
        self.num_compiled += 1

    def _cast(self, params):
        dt = self.cfg.compute_dtype
        return jax.tree.map(lambda x: jnp.asarray(x).astype(dt) if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)
                            else jnp.asarray(x), params)

    @property
    def max_num_programs(self) -> int:
        """Upper bound on `num_compiled`: the number of shape buckets."""
        return len(self.batch_buckets) * len(self.prompt_buckets) * len(self.new_token_buckets)

    # -- weights ------------------------------------------------------------------------------
    def set_params(self, params: Any, policy_version: int) -> None:
        """Replaces the weights (same tree structure and shapes; cast to the compute dtype)."""
        new = self._cast(params)
        old_struct = jax.tree.structure(self.params)
        if jax.tree.structure(new) != old_struct:
            raise ValueError(f"set_params: new params tree {jax.tree.structure(new)} differs from {old_struct}")
        for a, b in zip(jax.tree.leaves(self.params), jax.tree.leaves(new)):
            if a.shape != b.shape:
                raise ValueError(f"set_params: shape {b.shape} where the model has {a.shape}")
        with self._lock:
            self.params = new
            self.policy_version = int(policy_version)

    def load_version(self, version_dir: str, version: int) -> weight_sync.SyncStats:
        """Loads a published version (weight_sync layout) into this engine (sidecar `Engine`)."""
        t0 = time.perf_counter()
        sync_dir, name = os.path.split(os.path.normpath(version_dir))
        if int(name) != int(version):
            raise ValueError(f"load_version: directory {version_dir} holds version {name}, not {version}")
        target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), self.params)
        tree, stats = weight_sync.load(sync_dir, int(version), target=target)
        self.set_params(tree, version)
        return dataclasses.replace(stats, seconds=time.perf_counter() - t0)

    # -- generation ---------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Completion]]:
        """For each prompt, `params.n` completions (`types.Generator`)."""
        return self.generate_requests([(prompts, params)])[0]

    def generate_requests(self, requests: Sequence[EngineRequest]) -> list[list[list[Completion]]]:
        """Generates several requests in shared batches.

        Returns:
          per request, per prompt, `n` Completions (tokens include the stop token; logprobs
          float32 at the request's temperature; finish_reason "stop" or "length").
        Raises:
          ValueError: an empty prompt, a token id outside the vocabulary, prompt + max_tokens above
            `max_seq_len`, or more stop ids than `max_stop_ids` (message names the field).
        """
        rows: list[_Row] = []
        for prompts, sp in requests:
            self._validate(prompts, sp)
            seed = sp.seed if sp.seed is not None else secrets.randbits(32)
            for i, p in enumerate(prompts):
                for j in range(sp.n):
                    rows.append(_Row(p, sp, seed & 0xFFFFFFFF, i, j))
        results: list[Optional[Completion]] = [None] * len(rows)
        # Rows of similar length share a program; chunks hold at most the largest batch bucket.
        order = sorted(range(len(rows)), key=lambda r: (len(rows[r].prompt), rows[r].params.max_tokens))
        cap = self.batch_buckets[-1]
        for start in range(0, len(order), cap):
            idx = order[start:start + cap]
            for r, c in zip(idx, self._run([rows[r] for r in idx])):
                results[r] = c
        out, k = [], 0
        for prompts, sp in requests:
            per_prompt = []
            for _ in prompts:
                per_prompt.append(results[k:k + sp.n])
                k += sp.n
            out.append(per_prompt)
        return out

    def _validate(self, prompts, sp: SamplingParams) -> None:
        if len(sp.stop_token_ids) > self.max_stop_ids:
            raise ValueError(f"stop_token_ids: {len(sp.stop_token_ids)} ids; this engine takes at most "
                             f"{self.max_stop_ids} (raise max_stop_ids)")
        V = self.cfg.vocab_size
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
            if len(p) + sp.max_tokens > self.max_seq_len:
                raise ValueError(f"prompt {i}: {len(p)} prompt tokens + max_tokens {sp.max_tokens} exceed the "
                                 f"engine's max_seq_len {self.max_seq_len}; lower max_tokens or raise max_seq_len")
            if min(p) < 0 or max(p) >= V:
                raise ValueError(f"prompt {i}: token ids must be in [0, {V}), got min {min(p)} max {max(p)}")

    def _run(self, rows: list[_Row]) -> list[Completion]:
        B = round_up(len(rows), self.batch_buckets, "rows")
        P = round_up(max(len(r.prompt) for r in rows), self.prompt_buckets, "prompt length")
        N = round_up(max(r.params.max_tokens for r in rows), self.new_token_buckets, "max_tokens")
        tokens = np.zeros((B, P), np.int32)
        mask = np.zeros((B, P), bool)
        stop = np.full((B, self.max_stop_ids), -1, np.int32)
        seeds = np.zeros(B, np.uint32)
        pidx = np.zeros(B, np.int32)
        sidx = np.zeros(B, np.int32)
        temp = np.ones(B, np.float32)
        top_p = np.ones(B, np.float32)
        top_k = np.zeros(B, np.int32)
        greedy = np.zeros(B, bool)
        max_new = np.zeros(B, np.int32)  # pad rows: 0 = done before the first step
        for b, r in enumerate(rows):
            L = len(r.prompt)
            tokens[b, P - L:] = r.prompt
            mask[b, P - L:] = True
            sp = r.params
            stop[b, :len(sp.stop_token_ids)] = sp.stop_token_ids
            seeds[b], pidx[b], sidx[b] = r.seed, r.prompt_index, r.sample_index
            temp[b], top_p[b], top_k[b], greedy[b] = sp.temperature, sp.top_p, max(sp.top_k, 0), sp.greedy
            max_new[b] = sp.max_tokens
        with self._lock:
            params, version = self.params, self.policy_version
        out = self._fn(params, tokens, mask, seeds, pidx, sidx, temp, top_p, top_k, greedy, stop, max_new, num_new=N)
        toks, lps, lengths, stopped = jax.device_get(out)
        return [Completion(token_ids=toks[b, :lengths[b]].tolist(), logprobs=lps[b, :lengths[b]].tolist(),
                           finish_reason="stop" if stopped[b] else "length", policy_version=version)
                for b in range(len(rows))]


def sampler_from_hf(checkpoint: str, *, dtype: str = "bfloat16", **kwargs) -> Sampler:
    """A `Sampler` for an HF Qwen3 checkpoint directory (config.json + safetensors).

    `kwargs` go to `Sampler`; ``eos_token_ids`` defaults to the config's ``eos_token_id``.
    """
    from jaxrl.models import hf_io

    cfg = qwen3.Qwen3Config.from_pretrained(checkpoint, dtype=dtype, remat="none")
    cfg, params = hf_io.load_hf_checkpoint(checkpoint, cfg)
    if "eos_token_ids" not in kwargs:
        eos = cfg.eos_token_id
        kwargs["eos_token_ids"] = () if eos is None else (tuple(eos) if isinstance(eos, tuple) else (eos,))
    return Sampler(params, cfg, **kwargs)


def engine_from_args(args) -> Sampler:
    """Sidecar engine factory (``--engine jaxrl.rollout.sampler:engine_from_args``): a `Sampler` for
    ``args.checkpoint`` with ``args.dtype``, ``args.max_seq_len`` and ``args.max_batch_rows``."""
    return sampler_from_hf(args.checkpoint, dtype=args.dtype, max_seq_len=args.max_seq_len,
                           max_batch_rows=args.max_batch_rows)
