"""Where the train step's matmul work goes, read from its jaxpr on CPU (no accelerator, no weights).

Traces `jaxrl.train.step.train_step` at a shape (default: the GPU probe's Qwen3-1.7B dims, B8 x
S2048, bf16 compute) for each remat policy and sums the FLOPs of every `dot_general` (2·M·N·K,
multiplied by the enclosing scan lengths), split by operand dtypes and by phase:

  forward    the first forward pass (layers, lm head)
  recompute  forwards rerun inside rematerialized code (remat policy, chunked log-softmax)
  backward   the gradient matmuls
  attention  the score / value matmuls inside the attention kernels' block loops, counted once
             per loop body (their trip counts are data-dependent; see the analytic row)

and prints the executed matmul FLOPs against the MFU formula of the GPU probe
(6·N_nonembed + 12·L·H·head_dim·S per token). Mixed float32 x bfloat16 matmuls are reported
separately: XLA runs them as float32 GEMMs.

  python bench/step_flops.py [--remat full,save_dots,save_attention,save_dots_attention,none]
"""
from __future__ import annotations

import argparse
import collections
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

SHAPE_1P7B = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True)


def _dot_flops(eqn) -> int:
    import numpy as np

    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    ls, rs = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
    prod = lambda xs: int(np.prod(xs, dtype=np.int64))
    batch = prod([ls[i] for i in lb])
    contract = prod([ls[i] for i in lc])
    lfree = prod([ls[i] for i in range(len(ls)) if i not in lc and i not in lb])
    rfree = prod([rs[i] for i in range(len(rs)) if i not in rc and i not in rb])
    return 2 * batch * contract * lfree * rfree


def _walk(jaxpr, mult, acc, phase, in_loop=False):
    import jax.extend as jex

    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            dts = f"{eqn.invars[0].aval.dtype}x{eqn.invars[1].aval.dtype}"
            acc[("attention" if in_loop else phase, dts)] += mult * _dot_flops(eqn)
            continue
        sub_mult = mult * eqn.params["length"] if name == "scan" else mult
        sub_phase = phase
        if name in ("remat2", "checkpoint"):
            sub_phase = "recompute+backward" if phase != "forward" else "forward"
        for v in eqn.params.values():
            for x in (v if isinstance(v, (tuple, list)) else [v]):
                j = getattr(x, "jaxpr", x)
                if isinstance(j, jex.core.Jaxpr):
                    _walk(j, sub_mult, acc, sub_phase, in_loop or name == "while")


def analyze(remat: str, B: int, S: int, shape: dict = SHAPE_1P7B, dtype: str = "bfloat16") -> dict:
    """FLOPs by (phase, dtypes) of one train step; phases split forward / rest by linearization."""
    import jax
    import jax.numpy as jnp

    from jaxrl.models import qwen3
    from jaxrl.rl import losses
    from jaxrl.train import step as step_lib

    cfg = qwen3.Qwen3Config(**shape, dtype=dtype, remat=remat, attention="xla")
    params = qwen3.abstract_params(cfg)
    tx, sched = step_lib.make_optimizer(1e-6, 10)
    sc = step_lib.StepConfig(loss=losses.LossConfig(), num_micro_batches=1, chunk_size=1024)
    i32 = jax.ShapeDtypeStruct((B, S), jnp.int32)
    f32 = jax.ShapeDtypeStruct((B, S - 1), jnp.float32)
    batch = dict(tokens=i32, positions=i32, segment_ids=i32, loss_mask=jax.ShapeDtypeStruct((B, S - 1), jnp.int32),
                 advantages=f32, old_logprobs=f32)
    w = losses.LossWeights(policy=f32, token=f32, sequence_token=f32, sequence=jax.ShapeDtypeStruct((B,), jnp.float32))
    # Forward = the jvp-free primal computation: trace the loss alone for the forward FLOPs.
    cparams = jax.eval_shape(lambda p: step_lib.cast_params(p, cfg.compute_dtype), params)
    fwd = jax.make_jaxpr(lambda p, b, ww: step_lib._micro_loss(p, b, ww, cfg, sc))(cparams, batch, w)
    full = jax.make_jaxpr(lambda p, o, b, ww: step_lib.train_step(p, o, b, ww, model_cfg=cfg, step_cfg=sc, tx=tx,
                                                                  schedule=sched))(
        params, jax.eval_shape(tx.init, params), batch, w)
    acc_f, acc_t = collections.Counter(), collections.Counter()
    _walk(fwd.jaxpr, 1, acc_f, "forward")
    _walk(full.jaxpr, 1, acc_t, "step")
    n_total = sum(int(x.size) for x in jax.tree.leaves(params))
    nonembed = n_total - cfg.vocab_size * cfg.hidden_size
    formula = (6 * nonembed + 12 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * S) * B * S
    return dict(forward=acc_f, step=acc_t, formula=formula, cfg=cfg)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--remat", default="full,save_dots,save_attention,save_dots_attention,none")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    args = ap.parse_args(argv)
    T = 1e12
    print(f"Qwen3-1.7B dims, B{args.batch} x S{args.seq}, bf16 compute; matmul TFLOP per train step")
    print(f"{'remat':22s} {'fwd':>7s} {'step':>7s} {'step/fwd':>8s} {'attn-loop':>9s} {'f32 GEMM':>8s} "
          f"{'formula':>8s} {'step/formula':>12s}")
    for remat in args.remat.split(","):
        r = analyze(remat, args.batch, args.seq)
        fwd = sum(v for (ph, _), v in r["forward"].items() if ph != "attention")
        step = sum(v for (ph, _), v in r["step"].items() if ph != "attention")
        attn = sum(v for (ph, _), v in r["step"].items() if ph == "attention")
        f32 = sum(v for (_, dts), v in r["step"].items() if "float32" in dts)
        print(f"{remat:22s} {fwd / T:7.1f} {step / T:7.1f} {step / fwd:8.2f} {attn / T:9.2f} {f32 / T:8.1f} "
              f"{r['formula'] / T:8.1f} {step / r['formula']:12.2f}")
    print("attn-loop: attention matmuls per loop body (one block pair each); a policy that keeps the attention "
          "output runs one attention forward loop fewer.")


if __name__ == "__main__":
    main()
