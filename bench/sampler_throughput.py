"""Rollout benchmarks, each against a reference measured in the same run.

1. Generation: tokens/s of our JAX KV-cache engine vs HF transformers ``generate`` (greedy, KV
   cache; ``--sample``: temperature 1 sampling) on the same random Qwen3 model, batch and
   lengths; prints ours / HF, and the engine's decode-step time next to the step's memory floor
   (weights read + KV cache at the mean context, at the read bandwidth measured in the same run;
   ``bench/sampler_step.py`` splits the step into forward and token selection).
2. Weight sync: publish + load (Orbax, bf16) of the model's params vs ``shutil.copytree`` of a
   directory holding the same bf16 bytes as .npy files; prints (publish+load GB/s) / (copy GB/s),
   both counted as tensor bytes moved once out and once in.

Usage: python bench/sampler_throughput.py [--batch 8 --prompt-len 64 --new-tokens 128 ...]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np


def make_hf_model(path: str, args):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.heads // 2,
                      head_dim=args.hidden // args.heads, max_position_embeddings=4096, tie_word_embeddings=False)
    model = Qwen3ForCausalLM(cfg).eval()
    model.save_pretrained(path)
    return model


def bench_generation(args, ckpt: str, hf_model) -> tuple[float, float]:
    """Best tokens/s of the engine and of HF ``generate``, measured in alternation (one call of
    each per round), so that a load change on a shared machine hits both sides alike."""
    import torch

    from jaxrl.rollout.sampler import sampler_from_hf
    from jaxrl.rollout.types import SamplingParams

    rng = np.random.default_rng(0)
    prompts = rng.integers(1, args.vocab, size=(args.batch, args.prompt_len)).tolist()
    B, N = args.batch, args.new_tokens

    # One new-token bucket (the one max_tokens = N uses anyway), so that step_report's
    # max_tokens = N / 2 call runs the same program.
    sampler = sampler_from_hf(ckpt, dtype=args.dtype, max_seq_len=args.prompt_len + N, max_batch_rows=B,
                              eos_token_ids=(), new_token_buckets=(N,), layout=args.layout)
    params = SamplingParams(max_tokens=N, greedy=not args.sample, temperature=1.0, seed=0)
    sampler.generate(prompts, params)  # compile

    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    hf_model = hf_model.to(dtype)
    ids = torch.tensor(prompts)
    kw = dict(max_new_tokens=N, min_new_tokens=N, do_sample=args.sample, pad_token_id=0, use_cache=True)
    if args.sample:
        kw.update(temperature=1.0, top_p=1.0, top_k=0)
    # The reference gets its best thread count: on a loaded machine torch's multi-threaded kernels
    # can be an order of magnitude slower than one thread.
    thread_counts = sorted({1, os.cpu_count() or 1})
    with torch.no_grad():
        for threads in thread_counts:  # warm-up
            torch.set_num_threads(threads)
            hf_model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
    ours_t, hf_t = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        out = sampler.generate(prompts, params)
        ours_t.append(time.perf_counter() - t)
        for threads in thread_counts:
            torch.set_num_threads(threads)
            with torch.no_grad():
                t = time.perf_counter()
                gen = hf_model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
                hf_t.append(time.perf_counter() - t)
    assert all(len(g[0].token_ids) == N for g in out)
    assert gen.shape == (B, args.prompt_len + N)
    ours, hf = B * N / min(ours_t), B * N / min(hf_t)
    step_report(args, sampler, prompts, params, min(ours_t))
    if not args.sample:
        agree = np.mean([g[0].token_ids == gen[i, args.prompt_len:].tolist() for i, g in enumerate(out)])
        print(f"greedy outputs identical to HF for {agree:.0%} of rows")
    return ours, hf


def step_report(args, sampler, prompts, params, generate_s: float) -> None:
    """Prints the engine's decode-step time, ``(generate of N - generate of N/2) / (N/2)`` (one
    compiled program, whole chunks of steps in both: prefill and fixed costs cancel), next to the
    step's memory floor: (weights read + KV cache at the mean context) / the read bandwidth measured
    here (`sampler_step.read_bandwidth`, `sampler_step.step_weight_bytes`)."""
    import dataclasses

    import jax
    import jax.numpy as jnp

    from sampler_step import read_bandwidth, step_weight_bytes

    cfg, N = sampler.cfg, args.new_tokens
    half = dataclasses.replace(params, max_tokens=N // 2)
    sampler.generate(prompts, half)
    half_s = float("inf")
    for _ in range(args.repeats):
        t = time.perf_counter()
        sampler.generate(prompts, half)
        half_s = min(half_s, time.perf_counter() - t)
    step = (generate_s - half_s) / (N - N // 2)
    wbytes = step_weight_bytes(sampler.params, cfg)
    kv = (2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * jnp.dtype(cfg.compute_dtype).itemsize
          * len(prompts) * (args.prompt_len + N / 2))
    bw = read_bandwidth(256 << 20, args.repeats)
    floor = (wbytes + kv) / bw
    print(f"decode step {step * 1e3:.3f} ms (generate of {N} tokens {generate_s * 1e3:.1f} ms - of {N // 2} tokens "
          f"{half_s * 1e3:.1f} ms, / {N - N // 2}); floor {floor * 1e3:.3f} ms = (weights read {wbytes / 1e6:.1f} MB + "
          f"KV {kv / 1e6:.1f} MB) / read bandwidth {bw / 1e9:.1f} GB/s; step / floor = {step / floor:.2f}; "
          f"weight layout {sampler.layout}")


def bench_sync(ckpt: str, workdir: str, args_repeats: int = 3) -> tuple[float, float, int]:
    import jax
    import ml_dtypes

    from jaxrl.models import hf_io
    from jaxrl.rollout import weight_sync

    _, params = hf_io.load_hf_checkpoint(ckpt)
    sync = os.path.join(workdir, "sync")
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), params)
    best = float("inf")
    for v in range(1, 1 + args_repeats):
        pub = weight_sync.publish(params, sync, v, keep=1)
        _, load = weight_sync.load(sync, v, target=target)
        best = min(best, pub.seconds + load.seconds)
    nbytes = pub.bytes

    src = os.path.join(workdir, "plain")
    os.makedirs(src)
    for i, x in enumerate(jax.tree.leaves(params)):
        np.save(os.path.join(src, f"{i}.npy"), np.asarray(x).astype(ml_dtypes.bfloat16).view(np.uint16))
    best_copy = float("inf")
    for k in range(args_repeats):
        dst = os.path.join(workdir, f"copy{k}")
        t = time.perf_counter()
        shutil.copytree(src, dst)
        best_copy = min(best_copy, time.perf_counter() - t)
    return nbytes / best / 1e9, nbytes / best_copy / 1e9, nbytes


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--layout", default=None, choices=["in_out", "out_in"],
                   help="the engine's weight layout (default: qwen3_engine.engine_layout's choice)")
    p.add_argument("--sample", action="store_true", help="temperature-1 sampling instead of greedy, both sides")
    p.add_argument("--skip-generation", action="store_true", help="only the weight-sync benchmark")
    p.add_argument("--skip-sync", action="store_true", help="only the generation benchmark")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = os.path.join(tmp, "model")
        hf_model = make_hf_model(ckpt, args)
        if not args.skip_generation:
            ours, hf = bench_generation(args, ckpt, hf_model)
            print(f"generation  B={args.batch} prompt={args.prompt_len} new={args.new_tokens} dtype={args.dtype}: "
                  f"{'sample T=1' if args.sample else 'greedy'}: "
                  f"jaxrl {ours:.1f} tok/s, HF generate {hf:.1f} tok/s, ratio jaxrl/HF = {ours / hf:.2f}")
        del hf_model
        if args.skip_sync:
            return
        sync_gbs, copy_gbs, nbytes = bench_sync(ckpt, tmp, max(args.repeats, 2))
        print(f"weight sync {nbytes / 1e6:.1f} MB bf16: publish+load {sync_gbs:.3f} GB/s, copytree {copy_gbs:.3f} GB/s, "
              f"ratio sync/copy = {sync_gbs / copy_gbs:.2f}")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
