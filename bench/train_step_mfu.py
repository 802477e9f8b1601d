"""Train-step MFU of jaxrl on one accelerator, per (attention, remat) variant, plus GPU checks.

Runs `jaxrl.train.step.train_step` (one micro-batch, PPO-clip token_mean, AdamW, bf16 compute /
fp32 master, random weights) at Qwen3-1.7B dims (tied, 28 layers) or Qwen3-8B widths with few
layers, B x S tokens, and prints for each variant the step time, tokens/s and

    MFU = tokens/s x (6 x N_nonembed + 12 x L x H x head_dim x S) / peak

(the formula of the project's GPU probe and PyTorch anchor; peak 989 TFLOP/s, H100/H200 dense
bf16 datasheet; the lm_head matmuls are real work that this formula does not credit).

Checks run first (``--checks``, GPU only): cuDNN vs XLA (blocked) attention on right-padded,
left-padded and packed rows (outputs and gradients, bf16), and one step with the optimizer
state in pinned host memory (`trainer.optimizer.offload`) against device-resident state, with
the peak device memory of each.

  python bench/train_step_mfu.py                       # 1.7B dims, B8 x S2048, default variants
  python bench/train_step_mfu.py --shape 8b_w --batch 4 --seq 4096 --variants cudnn:full
  python bench/train_step_mfu.py --tiny                # CPU smoke run (xla variants only)
"""
from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

SHAPES = {
    "1.7b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "8b_w": dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=6,
                 num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
    "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True),
}
DEFAULT_VARIANTS = "cudnn:full,cudnn:save_dots,cudnn:save_dots_attention,cudnn:none,xla:save_dots_attention"


def _peak_gib(dev) -> float:
    try:
        return (dev.memory_stats() or {}).get("peak_bytes_in_use", 0) / 2**30
    except Exception:  # noqa: BLE001 - backends without memory stats
        return 0.0


def _setup(cfg, B, S, offload="none", chunk=1024, seed=0):
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxrl import parallel
    from jaxrl.models import qwen3
    from jaxrl.rl import losses
    from jaxrl.train import step as step_lib

    mesh = parallel.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    abstract = qwen3.abstract_params(cfg)
    psh = parallel.param_shardings(qwen3.param_logical_axes(cfg), mesh, shapes=abstract)
    moments_host, master_host = step_lib.offloaded(offload)
    state_psh = parallel.with_memory_kind(psh, "pinned_host" if master_host else None)
    params = qwen3.init_params(cfg, seed, psh)
    if master_host:
        params = jax.device_put(params, state_psh)
    tx, sched = step_lib.make_optimizer(1e-6, 1000, max_grad_norm=1.0)
    osh = parallel.opt_state_shardings(jax.eval_shape(tx.init, abstract), abstract, psh, mesh,
                                       "pinned_host" if moments_host else None)
    opt = jax.jit(tx.init, out_shardings=osh)(params)
    rng = np.random.default_rng(seed)
    batch = dict(tokens=jnp.asarray(rng.integers(0, cfg.vocab_size, (B, S)), jnp.int32),
                 positions=jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32), (B, S)),
                 segment_ids=jnp.ones((B, S), jnp.int32), loss_mask=jnp.ones((B, S - 1), jnp.int32),
                 advantages=jnp.asarray(rng.standard_normal((B, S - 1)), jnp.float32),
                 old_logprobs=jnp.full((B, S - 1), -11.9, jnp.float32))
    lc = losses.LossConfig(policy_loss_type="regular", loss_reduction="token_mean", eps_clip_low=0.2,
                           eps_clip_high=0.05)
    w = losses.compute_loss_weights(batch["loss_mask"], lc)
    sc = step_lib.StepConfig(loss=lc, temperature=1.0, num_micro_batches=1, chunk_size=chunk, offload=offload)
    fn = jax.jit(lambda p, o, b, ww: step_lib.train_step(p, o, b, ww, model_cfg=cfg, step_cfg=sc, tx=tx,
                                                         schedule=sched),
                 out_shardings=(state_psh, osh, None), donate_argnums=(0, 1))
    return mesh, fn, params, opt, batch, w


def run_variant(shape: str, attention: str, remat: str, B: int, S: int, steps: int, dtype: str) -> dict:
    """Compiles and times the train step; returns a result row."""
    import jax

    from jaxrl.models import qwen3

    d = SHAPES[shape]
    cfg = qwen3.Qwen3Config(**d, dtype=dtype, remat=remat, attention=attention)
    mesh, fn, params, opt, batch, w = _setup(cfg, B, S)
    tot = sum(x.size for x in jax.tree.leaves(params))
    # As the probe / anchor: one vocab x hidden matrix (the embedding) is not counted.
    nonembed = tot - cfg.vocab_size * cfg.hidden_size
    with jax.set_mesh(mesh):
        t0 = time.perf_counter()
        params, opt, m = fn(params, opt, batch, w)
        jax.block_until_ready(m)
        compile_s = time.perf_counter() - t0
        ts = []
        for _ in range(steps):
            t0 = time.perf_counter()
            params, opt, m = fn(params, opt, batch, w)
            jax.block_until_ready(m)
            ts.append(time.perf_counter() - t0)
    st = sorted(ts)[len(ts) // 2]
    fpt = 6.0 * nonembed + 12.0 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * S
    tps = B * S / st
    return dict(shape=shape, attention=attention, remat=remat, B=B, S=S, step_s=st, steps=[round(t, 4) for t in ts],
                tokens_per_s=tps, mfu=tps * fpt / 989e12, flops_per_token=fpt, compile_s=compile_s,
                peak_gib=_peak_gib(jax.devices()[0]), grad_norm=float(m["grad_norm"]))


def check_attention(B=3, S=1024, dtype="bfloat16") -> dict:
    """cuDNN vs blocked XLA attention on right-padded / left-padded / packed rows (GPU)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxrl.models import attention

    rng = np.random.default_rng(0)
    dt = jnp.dtype(dtype)
    q = jnp.asarray(rng.standard_normal((B, S, 16, 128)), dt)
    k = jnp.asarray(rng.standard_normal((B, S, 8, 128)), dt)
    v = jnp.asarray(rng.standard_normal((B, S, 8, 128)), dt)
    out = {}
    layouts = {"right_padded": np.array([[1] * (S - 100 * i) + [0] * (100 * i) for i in range(B)], np.int32)}
    left = np.zeros((B, S), np.int32)
    left[0, :], left[1, 300:], left[2, 17:] = 1, 1, 1
    layouts["left_padded"] = left
    packed = np.zeros((B, S), np.int32)
    packed[:, :400], packed[:, 400:900], packed[:, 900:S - 20] = 1, 2, 3
    layouts["packed"] = packed
    for name, seg in layouts.items():
        valid = jnp.asarray(seg != 0)[..., None, None]
        wt = jnp.asarray(rng.standard_normal((B, S, 16, 128)), jnp.float32)

        def loss(q, k, v, impl):
            o = attention.causal_segment_attention(q, k, v, jnp.asarray(seg), impl)
            return jnp.sum(jnp.where(valid, o.astype(jnp.float32) * wt, 0.0)), o

        res = {}
        for impl in ("xla", "cudnn"):
            (_, o), g = jax.jit(jax.value_and_grad(lambda q, k, v: loss(q, k, v, impl), argnums=(0, 1, 2),
                                                   has_aux=True))(q, k, v)
            res[impl] = (np.asarray(o, np.float32), [np.asarray(x, np.float32) for x in g])
        m = np.asarray(valid)
        d_out = float(np.abs(np.where(m, res["xla"][0] - res["cudnn"][0], 0)).max())
        d_grad = max(float(np.abs(a - b).max() / max(np.abs(a).max(), 1e-6))
                     for a, b in zip(res["xla"][1], res["cudnn"][1]))
        out[name] = dict(max_abs_out_diff=d_out, max_rel_grad_diff=d_grad)
    return out


def check_offload(shape: str, B: int, S: int, dtype: str) -> dict:
    """Two train steps per offload mode from the same initial state: params equal to offload='none';
    XLA's memory analysis of each compiled step (device vs host bytes) and the step time."""
    import gc

    import jax
    import numpy as np

    from jaxrl.models import qwen3
    from jaxrl.train import step as step_lib

    cfg = qwen3.Qwen3Config(**SHAPES[shape], dtype=dtype, remat="full", attention="cudnn"
                            if jax.default_backend() == "gpu" else "xla")
    out, ref = {}, None
    for offload in step_lib.OFFLOAD_MODES:
        gc.collect()
        try:
            jax.devices()[0].memory_stats()  # noqa: B018
        except Exception:  # noqa: BLE001
            pass
        mesh, fn, params, opt, batch, w = _setup(cfg, B, S, offload=offload)
        with jax.set_mesh(mesh):
            ma = fn.lower(params, opt, batch, w).compile().memory_analysis()
        mem = {k: round(getattr(ma, k) / 2**30, 3) for k in dir(ma) if k.endswith("size_in_bytes")}
        with jax.set_mesh(mesh):
            t0 = time.perf_counter()
            params, opt, m = fn(params, opt, batch, w)
            jax.block_until_ready(m)
            first = time.perf_counter() - t0
            t0 = time.perf_counter()
            params, opt, m = fn(params, opt, batch, w)
            jax.block_until_ready(m)
            second = time.perf_counter() - t0
        leaf = np.asarray(jax.tree.leaves(params)[-1], np.float32)
        if ref is None:
            ref = leaf
        out[offload] = dict(step_s=second, compile_and_first_s=first, memory_analysis_gib=mem,
                            peak_gib_so_far=_peak_gib(jax.devices()[0]), equal_to_none=bool(np.array_equal(leaf, ref)),
                            memory_kind=jax.tree.leaves(opt)[1].sharding.memory_kind)
        del params, opt
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="1.7b", choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--variants", default=DEFAULT_VARIANTS, help="comma list of attention:remat")
    ap.add_argument("--checks", action="store_true", help="run the cuDNN attention and offload checks first")
    ap.add_argument("--tiny", action="store_true", help="tiny dims, float32, CPU; cuDNN variants skipped")
    ap.add_argument("--out", default="", help="write the results as JSON here")
    args = ap.parse_args(argv)
    if args.tiny:
        os.environ["JAX_PLATFORMS"] = "cpu"
        args.shape, args.batch, args.seq = "tiny", 2, 64
    import jax

    print(f"jax {jax.__version__} devices {jax.devices()}", flush=True)
    dtype = "float32" if args.tiny else "bfloat16"
    results = {"variants": []}
    on_gpu = jax.default_backend() == "gpu"
    if args.checks:
        if on_gpu:
            results["attention_check"] = check_attention()
            print("attention cudnn vs xla:", json.dumps(results["attention_check"]), flush=True)
        results["offload_check"] = check_offload(args.shape, args.batch, args.seq, dtype)
        print("offload:", json.dumps(results["offload_check"]), flush=True)
    for v in args.variants.split(","):
        attention, remat = v.split(":")
        if attention == "cudnn" and not on_gpu:
            print(f"skip {v}: cuDNN needs a GPU", flush=True)
            continue
        try:
            r = run_variant(args.shape, attention, remat, args.batch, args.seq, args.steps, dtype)
        except Exception as e:  # noqa: BLE001 - report and continue with the next variant
            r = dict(attention=attention, remat=remat, error=f"{type(e).__name__}: {str(e)[:300]}")
        results["variants"].append(r)
        if "error" in r:
            print(f"{v:32s} FAILED {r['error']}", flush=True)
        else:
            print(f"{v:32s} step {r['step_s']:.3f} s  {r['tokens_per_s']:,.0f} tok/s  MFU {r['mfu']:.1%}  "
                  f"peak {r['peak_gib']:.1f} GiB  compile {r['compile_s']:.1f} s", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
