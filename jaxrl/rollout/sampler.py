"""Batched KV-cache generation for Qwen3 in JAX (the built-in rollout engine, docs/sidecar.md).

One jitted program per shape bucket does the whole generation on the device, with no host work
per token:

1. Prefill (:func:`jaxrl.models.qwen3_engine.prefill`): each distinct prompt of the batch runs once.
   The ``n`` samples of a prompt form a *group* of R rows that share the prompt's KV cache;
   generated tokens go to a per-row cache (:func:`jaxrl.models.qwen3_engine.decode_step` attends
   to both with one softmax). RL asks for ``n_samples_per_prompt`` samples of every prompt, so the
   prompt is prefilled, stored and read once per group instead of once per sample.
2. A ``lax.while_loop`` that selects one token per row (:func:`select_tokens`), feeds it back and
   exits as soon as every row is done (stop id or ``max_tokens``).

Weights are held per layer (:func:`jaxrl.models.qwen3_engine.engine_params`) so that a decode step
reads each weight once, in place; caches are in the compute dtype (bf16 at scale) and written
in place in the loop state.

Token selection per row: temperature, top-p (nucleus, Holtzman et al. 2020 §3.1: keep the
smallest prefix of the sorted distribution whose mass reaches p), top-k, greedy, several stop
ids, ``max_tokens``. Logprobs (float32), per request (`SamplingParams.logprobs_mode`):

* ``"full"`` (default, docs/architecture.md §3): ``log_softmax(logits / temperature)[token]`` over the full
  vocabulary, without top-p/top-k renormalisation, whatever filter sampled the token;
* ``"sampled"``: the log-probability under the distribution the token was drawn from: after
  temperature, top-k and top-p, renormalised over the kept set (vLLM's ``processed_logprobs``).
  Without top-p/top-k it equals ``"full"``;
* ``"raw"``: ``log_softmax(logits)[token]`` at temperature 1 over the full vocabulary, whatever
  temperature / top-p / top-k drew the token (vLLM's default ``raw_logprobs``: what the seed runs'
  vLLM returned).

Randomness: the key of a row is ``fold_in(fold_in(PRNGKey(seed), prompt_index), sample_index)``
(indices within its request) and the key of step t is ``fold_in(row_key, t)``; the sampled token
is ``argmax(masked_logits / T + Gumbel(key))`` over the full vocabulary (the Gumbel-max trick,
the draw of ``jax.random.categorical``). So a row's tokens depend on its request only, never on
the other rows of the batch nor on how rows are grouped.

Shapes are bucketed (rows, samples per group, prompt length, new tokens; see `Sampler`) and two
static switches (any row sampling, any row filtering) pick a program variant, so a run compiles
at most `Sampler.max_num_programs` programs; `num_compiled` counts them.
"""
from __future__ import annotations

import collections
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
from jaxrl.models import qwen3_engine
from jaxrl.models.qwen3_config import Qwen3Config
from jaxrl.rollout import weight_sync
from jaxrl.rollout.types import LOGPROBS_MODES, Completion, EngineRequest, SamplingParams

# ---------------------------------------------------------------------------------------------
# Token selection
# ---------------------------------------------------------------------------------------------

def _first_argmax(x):
    """Index of the first maximum of each row, ``[B, V] -> [B]`` int32 (``jnp.argmax`` for rows
    without NaN). Written as two plain reductions: XLA:CPU runs argmax's variadic reduce about 4x
    slower, and on GPU both are one pass over the row."""
    V = x.shape[-1]
    m = jnp.max(x, axis=-1, keepdims=True)
    first = jnp.min(jnp.where(x == m, jnp.arange(V, dtype=jnp.int32), V), axis=-1)
    return jnp.minimum(first, V - 1)


def _sortable_bits(x):
    """float32 -> uint32 with the same order (the radix-sort key: flip every bit of a negative
    number, the sign bit of a non-negative one). -0.0 is mapped like +0.0."""
    b = jax.lax.bitcast_convert_type(x + 0.0, jnp.uint32)
    return jnp.where(b >> 31 == 1, ~b, b | jnp.uint32(0x80000000))


def filter_mask(scaled, top_p, top_k):
    """Tokens kept by top-k and top-p, per row, without sorting the vocabulary.

    Args:
      scaled: ``[B, V]`` float32 logits / temperature.
      top_p: ``[B]`` float32 in (0, 1]; >= 1 keeps everything.
      top_k: ``[B]`` int32; <= 0 keeps everything.
    Returns:
      ``[B, V]`` bool. Token i is kept iff the probability mass of the tokens with a strictly
      larger logit is < top_p and their number is < top_k. This is the sort-based rule (keep the
      k largest and the prefix of the descending order whose preceding mass is < top_p; Holtzman
      et al. 2020 §3.1): the most likely token is always kept and ties at the threshold are all
      kept. The kept set is ``{i : scaled_i >= t}``; the threshold t is found by bisection on
      the 32-bit order of float32 values (32 passes of a masked sum over the row), which is
      exact, keeps shapes static and costs less than sorting 151,936 logits per row.
    """
    B, V = scaled.shape
    u = _sortable_bits(scaled)
    p = jax.nn.softmax(scaled, axis=-1)
    k = jnp.where(top_k > 0, top_k, V + 1).astype(jnp.int32)
    no_p = top_p >= 1.0

    def body(_, c):
        lo, hi = c  # invariant: the answer is in [lo, hi]; Q(hi) holds (nothing is above the max)
        mid = lo + (hi - lo) // 2
        above = u > mid[:, None]
        mass = jnp.sum(jnp.where(above, p, 0.0), axis=-1)
        count = jnp.sum(above, axis=-1, dtype=jnp.int32)
        ok = (no_p | (mass < top_p)) & (count < k)
        return jnp.where(ok, lo, mid + 1), jnp.where(ok, mid, hi)

    lo, _ = jax.lax.fori_loop(0, 32, body, (jnp.min(u, axis=-1), jnp.max(u, axis=-1)))
    return u >= lo[:, None]


def select_tokens(logits, step_keys, temperature, top_p, top_k, greedy, logprobs_sampled=None, *,
                  filtered: bool = True, sampling: bool = True, logprobs_raw=None):
    """Selects one token per row and returns it with its logprob.

    Args:
      logits: ``[B, V]`` float32.
      step_keys: ``[B, 2]`` uint32 PRNG keys (one per row for this step).
      temperature, top_p: ``[B]`` float32; top_k: ``[B]`` int32 (<= 0: off); greedy: ``[B]`` bool.
      logprobs_sampled: ``[B]`` bool or None (all False): True where the row's logprob is the
        ``"sampled"`` one (renormalised over the top-p/top-k kept set), False for ``"full"``.
      filtered: static; False promises that no row uses top-p or top-k (skips the filter).
      sampling: static; False promises that every row is greedy (skips the random draw).
      logprobs_raw: ``[B]`` bool or None: True where the row's logprob is the ``"raw"`` one,
        ``log_softmax(logits)[token]`` at temperature 1 over the full vocabulary (vLLM's default
        ``raw_logprobs``), whatever temperature and filter sampled the token.
    Returns:
      (tokens ``[B]`` int32, logprobs ``[B]`` float32): greedy rows take the argmax of the logits,
      others ``argmax(where(kept, logits / T, -inf) + Gumbel(key))``; the logprob is
      ``z_tok - logsumexp(z)`` with ``z = logits / T`` (``"full"``) or
      ``z_tok - logsumexp(z over the kept set)`` (``"sampled"``).
    """
    V = logits.shape[-1]
    scaled = logits / temperature[:, None]
    masked = jnp.where(filter_mask(scaled, top_p, top_k), scaled, -jnp.inf) if filtered else scaled
    top = _first_argmax(logits)
    if sampling:
        noise = jax.vmap(lambda k: jax.random.gumbel(k, (V,), jnp.float32))(step_keys)
        tokens = jnp.where(greedy, top, _first_argmax(masked + noise))
    else:
        tokens = top
    z_tok = jnp.take_along_axis(scaled, tokens[:, None], axis=-1)[:, 0]
    logprobs = z_tok - jax.nn.logsumexp(scaled, axis=-1)
    if filtered and logprobs_sampled is not None:
        logprobs = jnp.where(logprobs_sampled, z_tok - jax.nn.logsumexp(masked, axis=-1), logprobs)
    if logprobs_raw is not None:
        raw_tok = jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0]
        logprobs = jnp.where(logprobs_raw, raw_tok - jax.nn.logsumexp(logits, axis=-1), logprobs)
    return tokens, logprobs


# ---------------------------------------------------------------------------------------------
# The compiled generation program
# ---------------------------------------------------------------------------------------------

# Programs traced so far, per model config (all Samplers of one config share the compiled programs).
_NUM_COMPILED: collections.Counter = collections.Counter()


def _generate(ep, tokens, token_mask, seeds, prompt_index, sample_index, temperature, top_p, top_k, greedy,
              logprobs_sampled, logprobs_raw, stop_ids, max_new, *, cfg: Qwen3Config, rows_per_group: int,
              num_new: int, filtered: bool, sampling: bool, raw: bool = False):
    """Prefill + decode loop.

    Shapes: tokens/token_mask ``[G, P]`` (one right-padded prompt per group); per-row ``[B]``
    arrays with B = G * rows_per_group (row b continues prompt b // rows_per_group); stop_ids
    ``[B, S]`` (-1 = unused); max_new ``[B]`` (0 = padding row). Returns tokens ``[B, N]`` int32,
    logprobs ``[B, N]`` float32, lengths ``[B]`` int32, stopped ``[B]`` bool (N = num_new).
    """
    _NUM_COMPILED[cfg] += 1  # runs once per trace, i.e. per compiled program
    R, N = rows_per_group, num_new
    B = tokens.shape[0] * R
    row_keys = jax.vmap(lambda s, i, j: jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(s), i), j))(
        seeds, prompt_index, sample_index)
    token_mask = token_mask.astype(bool)
    logits, prompt_kv = qwen3_engine.prefill(ep, cfg, tokens, token_mask)
    logits = jnp.repeat(logits, R, axis=0)
    prompt_len = jnp.repeat(jnp.sum(token_mask, axis=1, dtype=jnp.int32), R)
    select = functools.partial(select_tokens, temperature=temperature, top_p=top_p, top_k=top_k, greedy=greedy,
                               logprobs_sampled=logprobs_sampled, filtered=filtered, sampling=sampling,
                               logprobs_raw=logprobs_raw if raw else None)

    def cond(s):
        return (s["step"] < N) & ~jnp.all(s["done"])

    def body(s):
        # Select token `step` of every row from the carried logits, record it, and run it through
        # the model (position prompt_len + step, generated-cache slot step). After a row's last
        # token that forward is wasted: one step per call, which costs less than compiling the
        # selection twice (once before the loop) would.
        step = s["step"]
        keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(row_keys, step)
        tok, lp = select(s["logits"], keys)
        active = ~s["done"]
        tok = jnp.where(active, tok, 0)
        lengths = s["lengths"] + active.astype(jnp.int32)
        hit_stop = active & jnp.any(tok[:, None] == stop_ids, axis=-1)
        logits, gen_kv = qwen3_engine.decode_step(ep, cfg, tok, prompt_len + step, shared_kv, token_mask,
                                                  s["gen_kv"], step)
        return dict(step=step + 1, logits=logits, gen_kv=gen_kv,
                    out_tokens=jax.lax.dynamic_update_slice(s["out_tokens"], tok[:, None], (0, step)),
                    out_logprobs=jax.lax.dynamic_update_slice(s["out_logprobs"], jnp.where(active, lp, 0.0)[:, None],
                                                              (0, step)),
                    lengths=lengths, stopped=s["stopped"] | hit_stop,
                    done=s["done"] | hit_stop | (lengths >= max_new))

    # Groups of one row keep prompt and generated tokens in one cache per row (one attention
    # matmul instead of two); larger groups read their prompt's cache once for all R rows.
    shared_kv = prompt_kv if R > 1 else None
    gen_kv = qwen3_engine.init_decode_cache(cfg, B, N) if R > 1 else qwen3_engine.row_cache(prompt_kv, N)
    state = dict(step=jnp.int32(0), logits=logits, gen_kv=gen_kv,
                 out_tokens=jnp.zeros((B, N), jnp.int32), out_logprobs=jnp.zeros((B, N), jnp.float32),
                 lengths=jnp.zeros((B,), jnp.int32), stopped=jnp.zeros((B,), bool), done=max_new <= 0)
    # The stop test of a while loop is read by the host on GPU (a device-to-host copy and a wait
    # before the next iteration's kernels are launched). Steps run in chunks of K in a loop of
    # fixed trip count (no host read), so the host syncs once per K tokens; after the last row
    # finishes at most K - 1 steps run idle.
    K = next(k for k in (8, 4, 2, 1) if N % k == 0)
    s = jax.lax.while_loop(cond, lambda s: jax.lax.fori_loop(0, K, lambda _, s: body(s), s), state)
    return s["out_tokens"], s["out_logprobs"], s["lengths"], s["stopped"]


_generate_jit = jax.jit(_generate, static_argnames=("cfg", "rows_per_group", "num_new", "filtered", "sampling", "raw"))


@dataclasses.dataclass
class _Group:
    """Samples of one prompt that share its prefill (one group of rows in a program)."""

    prompt: Sequence[int]
    params: SamplingParams
    seed: int
    prompt_index: int
    sample_indices: list[int]  # within the request
    slots: list[int]           # positions in the flat result list


class Sampler:
    """The JAX generation engine: `types.Generator` in-process, and the sidecar's `Engine`.

    Args:
      params: Qwen3 param tree (`jaxrl.models.qwen3` layout, stacked layers); converted once to
        :func:`jaxrl.models.qwen3_engine.engine_params` in ``cfg.compute_dtype``.
      cfg: the model config; ``cfg.dtype`` is the compute dtype (weights, activations, KV caches).
      max_seq_len: prompt + max_tokens limit per row (tokens); also the largest prompt bucket.
      batch_buckets: allowed row counts per program (a call with more rows is split). Default
        powers of two up to `max_batch_rows`.
      prompt_buckets / new_token_buckets: allowed prompt lengths / generation lengths. Defaults:
        powers of two from 16 (prompt) / 16 (new tokens) up to `max_seq_len`.
      max_stop_ids: stop ids per row (a fixed shape; requests with more are refused).
      eos_token_ids: ids the sidecar adds to the stop ids of requests without ``ignore_eos``.
      policy_version: version of `params`.
      share_prefix: prefill each prompt once for its ``n`` samples (groups of R rows, R a power
        of two dividing a batch bucket; larger ``n`` is split into several groups). False
        prefills every sample on its own (R = 1); both give the same tokens for the same seeds.
      layout: the weight layout of :func:`jaxrl.models.qwen3_engine.engine_params` ("in_out"
        or "out_in"); default :func:`jaxrl.models.qwen3_engine.engine_layout` of the
        device's platform and the largest batch bucket. All give the same tokens (float32 round-off apart).
    """

    def __init__(self, params: Any, cfg: Qwen3Config, *, max_seq_len: int = 4096, max_batch_rows: int = 64,
                 batch_buckets: Optional[Sequence[int]] = None, prompt_buckets: Optional[Sequence[int]] = None,
                 new_token_buckets: Optional[Sequence[int]] = None, max_stop_ids: int = 8,
                 eos_token_ids: Sequence[int] = (), policy_version: int = 0, share_prefix: bool = True,
                 layout: Optional[str] = None):
        self.cfg = cfg
        self.max_seq_len = int(max_seq_len)
        self.batch_buckets = tuple(sorted(batch_buckets or pow2_buckets(1, max_batch_rows)))
        self.prompt_buckets = tuple(sorted(prompt_buckets or pow2_buckets(min(16, max_seq_len), max_seq_len)))
        self.new_token_buckets = tuple(sorted(new_token_buckets or pow2_buckets(min(16, max_seq_len), max_seq_len)))
        self.max_stop_ids = int(max_stop_ids)
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.share_prefix = bool(share_prefix)
        # Rows per group: powers of two that divide some batch bucket (1 always does).
        top = self.batch_buckets[-1]
        self.group_buckets = tuple(r for r in pow2_buckets(1, top) if r & (r - 1) == 0
                                   and any(b % r == 0 for b in self.batch_buckets)) if self.share_prefix else (1,)
        self._lock = threading.Lock()
        self.layout = layout or qwen3_engine.engine_layout(jax.devices()[0].platform, self.batch_buckets[-1])
        self._convert = jax.jit(functools.partial(qwen3_engine.engine_params, cfg=cfg, layout=self.layout))
        dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        dt = cfg.compute_dtype
        # The published (stacked) layout in the compute dtype: what set_params checks and
        # load_version reads into.
        self._target = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(np.shape(x), dt if jnp.issubdtype(x.dtype, jnp.floating) else x.dtype,
                                           sharding=dev), params)
        self._ep = self._convert(params)
        self.policy_version = int(policy_version)

    @property
    def num_compiled(self) -> int:
        """Generation programs compiled so far in this process for this model config (Samplers
        of one config share their compiled programs)."""
        return _NUM_COMPILED[self.cfg]

    @property
    def params(self) -> dict:
        """The weights the engine runs on (:func:`jaxrl.models.qwen3_engine.engine_params` layout)."""
        return self._ep

    @property
    def max_num_programs(self) -> int:
        """Upper bound on `num_compiled`: shape buckets x 2 switches (sampling, filtering)."""
        rows = sum(1 for r in self.group_buckets for b in self.batch_buckets if b % r == 0)
        return rows * len(self.prompt_buckets) * len(self.new_token_buckets) * 4

    # -- weights ------------------------------------------------------------------------------
    def set_params(self, params: Any, policy_version: int) -> None:
        """Replaces the weights (same tree structure and shapes as at construction, stacked
        layout; cast to the compute dtype).

        Raises:
          ValueError: a different tree structure or a leaf of a different shape.
        """
        old_struct = jax.tree.structure(self._target)
        if jax.tree.structure(params) != old_struct:
            raise ValueError(f"set_params: new params tree {jax.tree.structure(params)} differs from {old_struct}")
        for a, b in zip(jax.tree.leaves(self._target), jax.tree.leaves(params)):
            if a.shape != np.shape(b):
                raise ValueError(f"set_params: shape {np.shape(b)} where the model has {a.shape}")
        new = self._convert(params)
        with self._lock:
            self._ep = new
            self.policy_version = int(policy_version)

    def load_version(self, version_dir: str, version: int) -> weight_sync.SyncStats:
        """Loads a published version (weight_sync layout) into this engine (sidecar `Engine`)."""
        t0 = time.perf_counter()
        sync_dir, name = os.path.split(os.path.normpath(version_dir))
        if int(name) != int(version):
            raise ValueError(f"load_version: directory {version_dir} holds version {name}, not {version}")
        tree, stats = weight_sync.load(sync_dir, int(version), target=self._target)
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
          float32 at the request's temperature, in its ``logprobs_mode``; finish_reason "stop" or
          "length").
        Raises:
          ValueError: an empty prompt, a token id outside the vocabulary, prompt + max_tokens above
            `max_seq_len`, more stop ids than `max_stop_ids`, or an unknown logprobs_mode
            (message names the field).
        """
        groups: list[_Group] = []
        k = 0
        max_r = self.group_buckets[-1]
        for prompts, sp in requests:
            self._validate(prompts, sp)
            seed = (sp.seed if sp.seed is not None else secrets.randbits(32)) & 0xFFFFFFFF
            for i, p in enumerate(prompts):
                for s in range(0, sp.n, max_r):
                    j = list(range(s, min(s + max_r, sp.n)))
                    groups.append(_Group(p, sp, seed, i, j, [k + x for x in j]))
                k += sp.n
        results: list[Optional[Completion]] = [None] * k
        # Groups of one size share a program; similar lengths share a chunk.
        by_r: dict[int, list[_Group]] = {}
        for g in groups:
            by_r.setdefault(round_up(len(g.sample_indices), self.group_buckets, "samples per group"), []).append(g)
        for r, gs in sorted(by_r.items()):
            gs.sort(key=lambda g: (len(g.prompt), g.params.max_tokens))
            cap = max(b for b in self.batch_buckets if b % r == 0) // r
            for start in range(0, len(gs), cap):
                chunk = gs[start:start + cap]
                for slots, comps in zip((g.slots for g in chunk), self._run(chunk, r)):
                    for slot, c in zip(slots, comps):
                        results[slot] = c
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
        if sp.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode: {sp.logprobs_mode!r} is not one of {LOGPROBS_MODES}")
        V = self.cfg.vocab_size
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
            if len(p) + sp.max_tokens > self.max_seq_len:
                raise ValueError(f"prompt {i}: {len(p)} prompt tokens + max_tokens {sp.max_tokens} exceed the "
                                 f"engine's max_seq_len {self.max_seq_len}; lower max_tokens or raise max_seq_len")
            if min(p) < 0 or max(p) >= V:
                raise ValueError(f"prompt {i}: token ids must be in [0, {V}), got min {min(p)} max {max(p)}")

    def _run(self, groups: list[_Group], R: int) -> list[list[Completion]]:
        """One program call for `groups` (R rows each); per group, its completions."""
        B = round_up(len(groups) * R, [b for b in self.batch_buckets if b % R == 0], "rows")
        G = B // R
        P = round_up(max(len(g.prompt) for g in groups), self.prompt_buckets, "prompt length")
        N = round_up(max(g.params.max_tokens for g in groups), self.new_token_buckets, "max_tokens")
        tokens = np.zeros((G, P), np.int32)
        mask = np.zeros((G, P), bool)
        stop = np.full((B, self.max_stop_ids), -1, np.int32)
        seeds = np.zeros(B, np.uint32)
        pidx = np.zeros(B, np.int32)
        sidx = np.zeros(B, np.int32)
        temp = np.ones(B, np.float32)
        top_p = np.ones(B, np.float32)
        top_k = np.zeros(B, np.int32)
        greedy = np.ones(B, bool)
        lp_sampled = np.zeros(B, bool)
        lp_raw = np.zeros(B, bool)
        max_new = np.zeros(B, np.int32)  # pad rows: 0 = done before the first step
        for gi, g in enumerate(groups):
            L = len(g.prompt)
            tokens[gi, :L] = g.prompt  # right padding: a prompt token's cache slot is its position
            mask[gi, :L] = True
            sp = g.params
            for r, j in enumerate(g.sample_indices):
                b = gi * R + r
                stop[b, :len(sp.stop_token_ids)] = sp.stop_token_ids
                seeds[b], pidx[b], sidx[b] = g.seed, g.prompt_index, j
                temp[b], top_p[b], top_k[b], greedy[b] = sp.temperature, sp.top_p, max(sp.top_k, 0), sp.greedy
                lp_sampled[b] = sp.logprobs_mode == "sampled"
                lp_raw[b] = sp.logprobs_mode == "raw"
                max_new[b] = sp.max_tokens
        live = max_new > 0
        filtered = bool(np.any(live & ((top_p < 1.0) | (top_k > 0))))
        sampling = bool(np.any(live & ~greedy))
        with self._lock:
            ep, version = self._ep, self.policy_version
        raw = bool(np.any(live & lp_raw))
        out = _generate_jit(ep, tokens, mask, seeds, pidx, sidx, temp, top_p, top_k, greedy, lp_sampled, lp_raw, stop,
                            max_new, cfg=self.cfg, rows_per_group=R, num_new=N, filtered=filtered, sampling=sampling,
                            raw=raw)
        toks, lps, lengths, stopped = jax.device_get(out)
        comps = []
        for gi, g in enumerate(groups):
            rows = [gi * R + r for r in range(len(g.sample_indices))]
            comps.append([Completion(token_ids=toks[b, :lengths[b]].tolist(), logprobs=lps[b, :lengths[b]].tolist(),
                                     finish_reason="stop" if stopped[b] else "length", policy_version=version)
                          for b in rows])
        return comps


def sampler_from_hf(checkpoint: str, *, dtype: str = "bfloat16", **kwargs) -> Sampler:
    """A `Sampler` for an HF Qwen3 checkpoint directory (config.json + safetensors).

    `kwargs` go to `Sampler`; ``eos_token_ids`` defaults to the config's ``eos_token_id``.
    """
    from jaxrl.models import hf_io

    cfg = Qwen3Config.from_pretrained(checkpoint, dtype=dtype, remat="none")
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
