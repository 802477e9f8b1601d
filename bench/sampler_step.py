"""Where a decode step of the JAX engine goes, next to the memory floor (random weights).

Measures, in one run on the default JAX device:

* ``read``: device memory read bandwidth, a jitted sum over a large array (each byte read once;
  ``copy``, a jitted ``x + 1`` counted read + write, is printed too: on CPU it also pays the page
  faults of a new output array, so it understates what a step can read);
* ``floor``: bytes a decode step must read at least, the weights it reads (all but the embedding
  table of an untied model, of which a step gathers one row per row) + KV cache at the mean
  context of the run (prompt cache once per group, generated tokens per row), divided by the
  read bandwidth (and by ``--bandwidth`` when given, e.g. 4.3e12 for an H200);
* ``forward``: :func:`jaxrl.models.qwen3_engine.decode_step` alone, ``--steps`` steps inside one jitted
  loop (no dispatch per step), per step;
* ``select``: :func:`jaxrl.rollout.sampler.select_tokens` alone on ``[B, V]`` logits, the same
  way, for greedy, temperature 1, and top-p 0.95 + top-k 20;
* ``engine``: `Sampler.generate` end to end (T = 1 sampling, no stop), tokens/s and its
  per-step time ``(generate of N - generate of N/2 tokens) / (N/2)`` (the same compiled
  program; prefill and fixed costs cancel), and the prefill as ``generate of N/2 - N/2 steps``.

Usage::

    python bench/sampler_step.py                       # CPU default: bench/sampler_throughput's model
    python bench/sampler_step.py --dims qwen3-0.6b --dtype bfloat16 --bandwidth 4.3e12 \\
        --batch 64 --prompt-len 128 --new-tokens 256   # the H200 probe's shape
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import numpy as np

DIMS = {
    # bench/sampler_throughput.py's default model
    "bench": dict(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=32, tie_word_embeddings=False),
    "qwen3-0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, tie_word_embeddings=True),
}


def _time(fn, *args, repeats: int):
    """Best wall time of ``fn(*args)`` (blocked) over `repeats` calls after one warm-up."""
    import jax

    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t)
    return best


def read_bandwidth(nbytes: int, repeats: int) -> float:
    """Bytes/s of a jitted sum over a float32 array of `nbytes` (each byte read once)."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((nbytes // 4,), jnp.float32)
    t = _time(jax.jit(jnp.sum), x, repeats=repeats)
    return nbytes / t


def step_weight_bytes(ep, cfg) -> int:
    """Bytes of the engine weights `ep` a decode step reads: all, less the embedding table when the
    head is another array (a step gathers one row of the table per batch row; a tied model's
    table is the head)."""
    import jax

    total = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(ep))
    table = ep["embed_tokens"]
    head_is_table = cfg.tie_word_embeddings
    return total - (0 if head_is_table else table.size * table.dtype.itemsize)


def copy_bandwidth(nbytes: int, repeats: int) -> float:
    """Bytes/s of a jitted elementwise pass (read + write counted) over a float32 array."""
    import jax
    import jax.numpy as jnp

    x = jnp.zeros((nbytes // 4,), jnp.float32)
    t = _time(jax.jit(lambda a: a + 1.0), x, repeats=repeats)
    return 2 * nbytes / t


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dims", default="bench", choices=sorted(DIMS))
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--batch", type=int, default=8, help="rows (prompts x samples)")
    p.add_argument("--n", type=int, default=1, help="samples per prompt (rows sharing a prompt cache)")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--steps", type=int, default=32, help="decode steps per timed loop")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--layout", default=None, choices=["in_out", "out_in"],
                   help="the engine's weight layout (default: qwen3_engine.engine_layout's choice)")
    p.add_argument("--bandwidth", type=float, default=None, help="nominal bytes/s for a second floor (H200: 4.3e12)")
    p.add_argument("--copy-mb", type=int, default=None,  # the read and copy tests' array
                   help="array size of the bandwidth test (default 256 CPU, 2048 GPU)")
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp

    from jaxrl.models import qwen3, qwen3_engine
    from jaxrl.rollout.sampler import Sampler, select_tokens
    from jaxrl.rollout.types import SamplingParams

    if args.batch % args.n:
        p.error(f"--batch {args.batch} must be a multiple of --n {args.n}")
    cfg = qwen3.Qwen3Config(**DIMS[args.dims], dtype=args.dtype, remat="none", attention="xla")
    B, R, P, N, K = args.batch, args.n, args.prompt_len, args.new_tokens, args.steps
    G = B // R
    V, L = cfg.vocab_size, cfg.num_hidden_layers
    dev = jax.devices()[0]
    print(f"device {dev.platform} ({dev.device_kind}); jax {jax.__version__}; model {args.dims} {args.dtype}; "
          f"{G} prompts x {R} samples = {B} rows, prompt {P}, new {N}")

    params = qwen3.init_params(cfg, 0)
    smp = Sampler(params, cfg, max_seq_len=P + N, batch_buckets=(B,), prompt_buckets=(P,), new_token_buckets=(N,),
                  eos_token_ids=(), layout=args.layout)
    del params
    ep = smp.params
    print(f"weight layout {smp.layout}")

    # -- the floor ------------------------------------------------------------------------
    itemsize = jnp.dtype(cfg.compute_dtype).itemsize
    wbytes = step_weight_bytes(ep, cfg)
    kv_token = 2 * L * cfg.num_key_value_heads * cfg.head_dim * itemsize  # K and V, all layers, one token
    kv_mean = kv_token * (G * P + B * N / 2)
    mb = args.copy_mb or (2048 if dev.platform == "gpu" else 256)
    bw = read_bandwidth(mb << 20, args.repeats)
    floor = (wbytes + kv_mean) / bw
    print(f"read bandwidth {bw / 1e9:.1f} GB/s ({mb} MB array); copy bandwidth "
          f"{copy_bandwidth(mb << 20, args.repeats) / 1e9:.1f} GB/s (read + write)")
    print(f"floor: weights read {wbytes / 1e6:.1f} MB + KV at mean context {kv_mean / 1e6:.1f} MB per step "
          f"-> {floor * 1e3:.3f} ms/step at the measured read bandwidth"
          + (f", {(wbytes + kv_mean) / args.bandwidth * 1e3:.3f} ms/step at {args.bandwidth / 1e12:.2f} TB/s"
             if args.bandwidth else ""))

    rng = np.random.default_rng(0)
    prompts = rng.integers(1, V, size=(G, P)).astype(np.int32)
    mask = np.ones((G, P), bool)
    # The step's cost does not depend on the cache's values: a random prompt cache stands in for
    # the prefill's (whose time is in the engine line below), saving a compile of the prefill.
    k_shape = (G, cfg.num_key_value_heads, cfg.head_dim, P)  # qwen3_engine.KV_LAYOUT
    v_shape = (G, cfg.num_key_value_heads, P, cfg.head_dim)
    prompt_kv = tuple((jax.random.normal(jax.random.PRNGKey(2 * i), k_shape, cfg.compute_dtype),
                       jax.random.normal(jax.random.PRNGKey(2 * i + 1), v_shape, cfg.compute_dtype))
                      for i in range(L))

    # -- forward alone: K decode steps in one program, in the engine's cache layout ----------
    @jax.jit
    def forward_loop(ep, prompt_kv, tok):
        pos0 = jnp.full((B,), P, jnp.int32)
        # The engine's layouts: a prompt cache shared by R > 1 rows, or one cache per row.
        shared, gen = ((prompt_kv, qwen3_engine.init_decode_cache(cfg, B, N)) if R > 1
                       else (None, qwen3_engine.row_cache(prompt_kv, N)))

        def body(i, c):
            gen, tok, acc = c
            logits, gen = qwen3_engine.decode_step(ep, cfg, tok, pos0 + i, shared, mask, gen, i)
            return gen, (tok + 1) % V, acc + jnp.sum(logits)  # the sum keeps the logits live

        return jax.lax.fori_loop(0, K, body, (gen, tok, jnp.float32(0)))[2]

    t_fwd = _time(forward_loop, ep, prompt_kv, jnp.ones((B,), jnp.int32), repeats=args.repeats) / K
    print(f"forward  {t_fwd * 1e3:9.3f} ms/step  (decode_step, {'shared' if R > 1 else 'row'} cache layout, "
          f"{K} steps in one loop)")

    # -- selection alone ---------------------------------------------------------------------
    logits = jax.random.normal(jax.random.PRNGKey(0), (B, V), jnp.float32) * 3
    row_keys = jax.random.split(jax.random.PRNGKey(1), B)

    def select_loop(top_p, top_k, greedy, filtered, sampling):
        @jax.jit
        def run(logits, row_keys):
            def body(i, acc):
                keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(row_keys, i)
                # A different input every step, or XLA hoists a greedy selection out of the loop.
                tok, lp = select_tokens(logits + i.astype(jnp.float32) * 1e-3, keys, jnp.ones((B,), jnp.float32),
                                        jnp.full((B,), top_p, jnp.float32), jnp.full((B,), top_k, jnp.int32),
                                        jnp.full((B,), greedy), jnp.ones((B,), bool), filtered=filtered,
                                        sampling=sampling)
                return acc + jnp.sum(tok) + jnp.sum(lp)

            return jax.lax.fori_loop(0, K, body, jnp.float32(0))

        return _time(run, logits, row_keys, repeats=args.repeats) / K

    t_sel = {}
    for name, a in [("greedy", (1.0, 0, True, False, False)), ("T=1", (1.0, 0, False, False, True)),
                    ("top_p=0.95,top_k=20", (0.95, 20, False, True, True))]:
        t_sel[name] = select_loop(*a)
        print(f"select   {t_sel[name] * 1e3:9.3f} ms/step  ({name}, [{B}, {V}] float32 logits)")

    # -- the engine end to end ---------------------------------------------------------------
    # max_tokens N/2 runs the same program (one bucket) with whole chunks of steps: the
    # difference to N is N/2 decode steps, prefill and fixed costs cancel.
    sp = SamplingParams(max_tokens=N, temperature=1.0, n=R, seed=1)
    half = dataclasses.replace(sp, max_tokens=N // 2)
    plist = prompts.tolist()
    t0 = time.perf_counter()
    smp.generate(plist, sp)
    first = time.perf_counter() - t0
    best, best_half = float("inf"), float("inf")
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        out = smp.generate(plist, sp)
        best = min(best, time.perf_counter() - t0)
        t0 = time.perf_counter()
        smp.generate(plist, half)
        best_half = min(best_half, time.perf_counter() - t0)
    ntok = sum(len(c.token_ids) for g in out for c in g)
    step = (best - best_half) / (N - N // 2)
    print(f"engine   {best * 1e3:9.1f} ms per generate ({ntok} tokens, {ntok / best:.0f} tok/s; first call "
          f"{first:.1f} s with compile); {step * 1e3:.3f} ms/step = (generate of {N} - of {N // 2} tokens) "
          f"/ {N - N // 2}")
    print(f"prefill  {(best_half - (N // 2) * step) * 1e3:9.1f} ms  (generate of {N // 2} tokens - {N // 2} steps; "
          f"{G} x {P} tokens, with the call's fixed costs)")
    print(f"ratio engine step / floor = {step / floor:.2f}  (forward {t_fwd / floor:.2f}, "
          f"T=1 select {t_sel['T=1'] / floor:.2f})"
          + (f"; vs the {args.bandwidth / 1e12:.2f} TB/s floor {step / ((wbytes + kv_mean) / args.bandwidth):.2f}"
             if args.bandwidth else ""))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
