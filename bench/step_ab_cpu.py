"""Old vs new train step on CPU, side by side in one process: the CPU-side evidence for the
train-step speed changes 5-8 of docs/scaling.md ("Changes after run 1").

Each pair compiles the full `jaxrl.train.step.train_step` (one micro-batch, PPO-clip token_mean,
AdamW with clipping, bf16 compute / fp32 master, random weights, `save_dots_attention` remat) of
a small Qwen3 (default: vocabulary 32,768, hidden 256, 4 layers, tied head; B2 x S512) twice,
once with the old code path and once with the new, and prints for each:

  temp MiB      XLA's temporary memory (`compiled.memory_analysis().temp_size_in_bytes`)
  HLO ops       top-level instructions executed per step (while bodies times their trip count;
                fusions counted once; parameters, tuples, bitcasts not); of a conditional only the
                last branch, lax.cond's true branch: the path of a batch whose rows fit cuDNN's
                layout (the only conditionals of these programs are that layout check)
  HLO GiB       bytes read + written by those instructions (`bench/step_flops.py:hlo_bytes`), a
                proxy for memory traffic on a backend that materializes every top-level result
  conds         conditionals executed per step
  static        top-level instructions with every branch of every conditional (program size)
  step ms       median wall time of --steps steps, old and new alternating (CPU: indicative
                only; the GPU number is what bench/mfu_sweep.sh measures)
  d|g|          relative difference of the gradient's global norm between the two paths (one step
                from the same state; they compute the same gradient up to rounding)

Pairs (old -> new):
  head        the log-softmax head by autodiff through a rematerialized chunk -> its custom VJP (5)
  save_probs  the custom VJP recomputing each chunk's logits -> reading the saved exp(z - max z) (6)
  cudnn_cond  the cuDNN layout check as a lax.cond in every layer -> once per micro-batch around
              the gradient (7). cuDNN needs a GPU: jax.nn's XLA implementation of the same call
              stands in for the kernel, as in the tests. The old program exactly: the model's
              attention is 'cudnn_no_fallback' (the train step then adds no check of its own)
              with that name bound, by the `cond=layer` switch, to the per-layer-checked kernel.
  zero_grads  a zeroed copy of the gradients passed to the optimizer -> the gradients as they are (8)

  python bench/step_ab_cpu.py                      # all pairs, default small model
  python bench/step_ab_cpu.py --pairs head --vocab 151936 --seq 256
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PAIRS = {
    "head": (dict(head="legacy"), dict()),
    "save_probs": (dict(), dict(probs="save")),
    "cudnn_cond": (dict(attention="cudnn_no_fallback", cond="layer"), dict(attention="cudnn")),
    "zero_grads": (dict(zero_grads=True), dict()),
}


def hlo_ops(text: str, branches: str = "last") -> collections.Counter:
    """{op kind: executions per step} of the top-level instructions of an optimized HLO module
    (while bodies times their known trip count, the last branch of a conditional or all of them,
    see `step_flops.called_branches`; fusions once, kinds as in `step_flops.hlo_bytes`; the walk is
    `step_flops.hlo_instructions`)."""
    from step_flops import hlo_instructions

    acc = collections.Counter()
    for _, mult, kind, _, _ in hlo_instructions(text, branches):
        acc[kind] += mult
    return acc


def _zeroing(tx):
    """The old step's optimizer input: gradients zeroed when their global norm is not finite."""
    import jax
    import jax.numpy as jnp
    import optax

    def update(g, state, params=None):
        finite = jnp.isfinite(optax.global_norm(g))
        return tx.update(jax.tree.map(lambda x: jnp.where(finite, x, 0.0), g), state, params)

    return optax.GradientTransformation(tx.init, update)


@contextlib.contextmanager
def _cudnn_stand_in():
    """attention 'cudnn' / 'cudnn_no_fallback' through jax.nn's XLA implementation (CPU)."""
    from jaxrl.models import attention

    saved = dict(attention.IMPLS)
    attention.IMPLS["cudnn"] = functools.partial(attention.cudnn_attention, implementation="xla")
    attention.IMPLS["cudnn_no_fallback"] = functools.partial(attention.cudnn_attention, implementation="xla",
                                                             fallback=False)
    try:
        yield
    finally:
        attention.IMPLS.clear()
        attention.IMPLS.update(saved)


def run(v: dict, args) -> dict:
    """Compiles, analyzes and times one variant; returns its row."""
    import jax
    import numpy as np

    from jaxrl.models import qwen3
    from jaxrl.rl import losses
    from jaxrl.train import step as step_lib
    from step_flops import hlo_bytes, step_batch, train_step_fn
    from train_step_mfu import _patched

    cfg = qwen3.Qwen3Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                            num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=args.hidden // 4, tie_word_embeddings=True, dtype="bfloat16",
                            remat=args.remat, attention=v.get("attention", "xla"))
    batch = step_batch(args.batch, args.seq, cfg.vocab_size, rng=np.random.default_rng(0))
    lc = losses.LossConfig(policy_loss_type="regular", loss_reduction="token_mean", eps_clip_low=0.2,
                           eps_clip_high=0.05)
    w = losses.compute_loss_weights(batch["loss_mask"], lc)
    sc = step_lib.StepConfig(loss=lc, num_micro_batches=1, chunk_size=args.chunk, save_probs=v.get("probs") == "save")
    tx, sched = step_lib.make_optimizer(1e-4, 1000, max_grad_norm=1.0)
    if v.get("zero_grads"):
        tx = _zeroing(tx)
    with _cudnn_stand_in(), _patched(v):
        fn = jax.jit(train_step_fn(cfg, sc, tx, sched))
        params = qwen3.init_params(cfg, 0)
        opt = tx.init(params)
        compiled = fn.lower(params, opt, batch, w).compile()
    text = compiled.as_text()
    ops = hlo_ops(text, "last")
    _, _, m = compiled(params, opt, batch, w)

    def step_s():
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(params, opt, batch, w))
        return time.perf_counter() - t0

    return dict(temp=compiled.memory_analysis().temp_size_in_bytes, ops=sum(ops.values()), by_kind=ops,
                bytes=hlo_bytes(text, "last")["total"],
                static_ops=sum(hlo_ops(text, "all").values()), conds=ops.get("conditional", 0), grad_norm=float(m["grad_norm"]),
                step_s=step_s)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", default=",".join(PAIRS), help=f"comma list of {', '.join(PAIRS)}")
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=256, help="positions per log-softmax chunk")
    ap.add_argument("--remat", default="save_dots_attention")
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args(argv)
    import jax

    unknown = [p for p in args.pairs.split(",") if p not in PAIRS]
    if unknown:
        raise SystemExit(f"--pairs: unknown {unknown}; use a comma list of {', '.join(PAIRS)}")
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; Qwen3 vocab {args.vocab}, hidden {args.hidden}, "
          f"{args.layers} layers, tied, bf16 compute; B{args.batch} x S{args.seq}, chunk {args.chunk}, remat "
          f"{args.remat}; {args.steps} timed steps", flush=True)
    print(f"{'pair':11s} {'path':4s} {'temp MiB':>9s} {'HLO ops':>8s} {'HLO GiB':>8s} {'conds':>5s} {'static':>6s} "
          f"{'step ms':>8s} "
          f"{'d|g|':>8s}  op kinds that differ (old -> new)", flush=True)
    cache = {}
    for name in args.pairs.split(","):
        rows = []
        for v in PAIRS[name]:
            key = tuple(sorted(v.items()))
            if key not in cache:
                cache[key] = run(v, args)
            rows.append(cache[key])
        old, new = rows
        ts = {"old": [], "new": []}
        for _ in range(args.steps):   # alternating, so that both see the same machine load
            for label, r in (("old", old), ("new", new)):
                ts[label].append(r["step_s"]())
        old["step"], new["step"] = (sorted(ts[k])[len(ts[k]) // 2] for k in ("old", "new"))
        kinds = sorted(set(old["by_kind"]) | set(new["by_kind"]),
                       key=lambda k: -abs(old["by_kind"].get(k, 0) - new["by_kind"].get(k, 0)))
        diff = ", ".join(f"{k} {old['by_kind'].get(k, 0)}->{new['by_kind'].get(k, 0)}" for k in kinds[:4]
                         if old["by_kind"].get(k, 0) != new["by_kind"].get(k, 0))
        dg = abs(old["grad_norm"] / new["grad_norm"] - 1)
        for label, r, d, note in (("old", old, 0.0, ""), ("new", new, dg, diff)):
            print(f"{name:11s} {label:4s} {r['temp'] / 2**20:9.1f} {r['ops']:8d} {r['bytes'] / 2**30:8.2f} "
                  f"{r['conds']:5d} {r['static_ops']:6d} {r['step'] * 1e3:8.1f} {d:8.1e}  {note}", flush=True)


if __name__ == "__main__":
    main()
