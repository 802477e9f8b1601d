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
  python bench/step_flops.py --head     # the log-softmax head alone: legacy vs custom VJP

``--head`` compiles the chunked log-softmax alone at the same shape (forward and backward of
``sum(a * logprobs + b * entropy)``, B x S positions, hidden 2048, vocab 151,936, bf16) in three
forms: ``legacy`` (autodiff through a rematerialized chunk, the code before the custom VJP),
``recompute`` (the custom VJP, logits recomputed) and ``save_probs``; for each it prints the
matmul FLOPs of its jaxpr, XLA's temporary memory, and the bytes read + written by the top-level
ops of the CPU-compiled HLO (:func:`hlo_bytes`; a proxy for memory traffic, since a GPU fuses
at least as much as the CPU backend).
"""
from __future__ import annotations

import argparse
import collections
import math
import os
import re

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


def step_batch(B: int, S: int, vocab_size: int, rng=None) -> dict:
    """One micro-batch of `jaxrl.train.step.train_step` at B x S: `tokens`, `positions`,
    `segment_ids` [B, S] int32, `loss_mask` [B, S-1] int32, `advantages` and `old_logprobs`
    [B, S-1] float32. With a numpy Generator `rng`: random tokens and advantages, positions
    0..S-1, one segment, every target trained, old log-probs those of a uniform policy; without,
    `jax.ShapeDtypeStruct`s (for tracing)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    if rng is None:
        i32, f32 = jax.ShapeDtypeStruct((B, S), jnp.int32), jax.ShapeDtypeStruct((B, S - 1), jnp.float32)
        return dict(tokens=i32, positions=i32, segment_ids=i32, loss_mask=jax.ShapeDtypeStruct((B, S - 1), jnp.int32),
                    advantages=f32, old_logprobs=f32)
    return dict(tokens=jnp.asarray(rng.integers(0, vocab_size, (B, S)), jnp.int32),
                positions=jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32), (B, S)),
                segment_ids=jnp.ones((B, S), jnp.int32), loss_mask=jnp.ones((B, S - 1), jnp.int32),
                advantages=jnp.asarray(rng.standard_normal((B, S - 1)), jnp.float32),
                old_logprobs=jnp.full((B, S - 1), -np.log(vocab_size), jnp.float32))


def train_step_fn(cfg, sc, tx, schedule):
    """`(params, opt_state, batch, weights) -> train_step(...)` with the model, step config and
    optimizer bound (what both benches trace or compile)."""
    from jaxrl.train import step as step_lib

    return lambda p, o, b, ww: step_lib.train_step(p, o, b, ww, model_cfg=cfg, step_cfg=sc, tx=tx, schedule=schedule)


def analyze(remat: str, B: int, S: int, shape: dict = SHAPE_1P7B, dtype: str = "bfloat16",
            save_probs: bool = False) -> dict:
    """FLOPs by (phase, dtypes) of one train step; phases split forward / rest by linearization."""
    import jax
    import jax.numpy as jnp

    from jaxrl.models import qwen3
    from jaxrl.rl import losses
    from jaxrl.train import step as step_lib

    cfg = qwen3.Qwen3Config(**shape, dtype=dtype, remat=remat, attention="xla")
    params = qwen3.abstract_params(cfg)
    tx, sched = step_lib.make_optimizer(1e-6, 10)
    sc = step_lib.StepConfig(loss=losses.LossConfig(), num_micro_batches=1, chunk_size=1024, save_probs=save_probs)
    batch = step_batch(B, S, cfg.vocab_size)
    f32 = batch["advantages"]
    w = losses.LossWeights(policy=f32, token=f32, sequence_token=f32, sequence=jax.ShapeDtypeStruct((B,), jnp.float32))
    # Forward = the jvp-free primal computation: trace the loss alone for the forward FLOPs.
    cparams = jax.eval_shape(lambda p: step_lib.cast_params(p, cfg.compute_dtype), params)
    fwd = jax.make_jaxpr(lambda p, b, ww: step_lib._micro_loss(p, b, ww, cfg, sc))(cparams, batch, w)
    full = jax.make_jaxpr(train_step_fn(cfg, sc, tx, sched))(params, jax.eval_shape(tx.init, params), batch, w)
    acc_f, acc_t = collections.Counter(), collections.Counter()
    _walk(fwd.jaxpr, 1, acc_f, "forward")
    _walk(full.jaxpr, 1, acc_t, "step")
    n_total = sum(int(x.size) for x in jax.tree.leaves(params))
    nonembed = n_total - cfg.vocab_size * cfg.hidden_size
    formula = (6 * nonembed + 12 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * S) * B * S
    return dict(forward=acc_f, step=acc_t, formula=formula, cfg=cfg)


_DT_BYTES = {"f32": 4, "s32": 4, "u32": 4, "bf16": 2, "f16": 2, "pred": 1, "s8": 1, "u8": 1, "s64": 8, "f64": 8,
             "u64": 8}
_ARRAY = re.compile(r"\b(f32|s32|u32|bf16|f16|pred|s8|u8|s64|f64|u64)\[([0-9,]*)\]")
_NO_TRAFFIC = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all", "partition-id",
               "replica-id", "opt-barrier"}


def _shape_bytes(text: str) -> int:
    return sum(_DT_BYTES[dt] * math.prod(int(d) for d in dims.split(",") if d) for dt, dims in _ARRAY.findall(text))


def _parse_hlo(text: str):
    """Optimized HLO text -> ({computation: [instruction dicts]}, entry name)."""
    comps, cur, entry = {}, None, None
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.rstrip().endswith("{"):
            is_entry = line.startswith("ENTRY")
            name = (line.split()[1] if is_entry else line.split()[0]).lstrip("%")
            cur = comps.setdefault(name, [])
            entry = name if is_entry else entry
            continue
        m = re.match(r"\s*(ROOT\s+)?%(\S+)\s*=\s*(.*)$", line) if cur is not None else None
        if not m:
            continue
        rest = m.group(3)
        op = re.search(r"\s([a-z][a-z0-9\-_.]*)\(", rest)
        if not op:
            continue
        args, depth, i = rest[op.end():], 1, 0
        while i < len(args) and depth:
            depth += {"(": 1, ")": -1}.get(args[i], 0)
            i += 1
        cur.append(dict(name=m.group(2), root=bool(m.group(1)), shape=rest[:op.start()], op=op.group(1),
                        operands=re.findall(r"%([\w.\-]+)", args[:i - 1]), attrs=args[i:]))
    return comps, entry


def called_branches(x: dict, branches: str = "all") -> list:
    """Computations a parsed ``conditional`` / ``call`` instruction runs: all of them, or
    (``branches='last'``) only the last branch of a conditional: ``lax.cond``'s true branch."""
    if x["op"] == "conditional" and branches == "last":
        m = re.search(r"true_computation=%([\w.\-]+)", x["attrs"])
        if m:
            return [m.group(1)]
        m = re.search(r"branch_computations=\{([^}]*)\}", x["attrs"])
        return re.findall(r"%([\w.\-]+)", m.group(1))[-1:] if m else []
    return re.findall(r"%([\w.\-]+)", x["attrs"])


def hlo_instructions(text: str, branches: str = "all"):
    """The top-level instructions an optimized HLO module executes, with how often.

    Yields ``(instruction, times, kind, computation, body)`` for every instruction of the entry
    computation and of what it runs: while bodies (``times`` multiplied by their known trip count;
    the while itself is not yielded), the computations of a ``conditional`` / ``call`` (every
    branch, or with ``branches='last'`` only the last, see :func:`called_branches`; the
    conditional / call itself is yielded first, kind its op). Parameters, constants, tuples,
    bitcasts and the like (``_NO_TRAFFIC``) are skipped. ``kind`` is the op, ``fusion:<root op>``
    for a fusion; ``computation`` is the list of instructions the instruction belongs to and
    ``body`` that of the fusion's called computation (empty for other ops).
    """
    comps, entry = _parse_hlo(text)

    def walk(name, mult):
        insts = comps.get(name, [])
        for x in insts:
            if x["op"] in _NO_TRAFFIC:
                continue
            if x["op"] == "while":
                body = re.search(r"body=%([\w.\-]+)", x["attrs"]).group(1)
                n = re.search(r'known_trip_count":\{"n":"(\d+)"', x["attrs"])
                yield from walk(body, mult * (int(n.group(1)) if n else 1))
                continue
            if x["op"] in ("conditional", "call"):
                yield x, mult, x["op"], insts, []
                for c in called_branches(x, branches):
                    yield from walk(c, mult)
                continue
            kind, body = x["op"], []
            if x["op"] == "fusion":
                called = re.search(r"calls=%([\w.\-]+)", x["attrs"])
                body = comps.get(called.group(1), []) if called else []
                root = next((b for b in body if b["root"]), None)
                kind = "fusion:" + (root["op"] if root else "?")
            yield x, mult, kind, insts, body

    yield from walk(entry, 1)


def hlo_bytes(text: str, branches: str = "all") -> dict:
    """Bytes read + written by the top-level instructions of an optimized HLO module (each fusion
    counted once with its operands and result; while bodies times their known trip count; a fusion
    whose root is a dynamic-update-slice counted as twice its update; every branch of a
    conditional, or with ``branches='last'`` only the last, see :func:`called_branches`). A proxy
    for memory traffic on a backend that materializes every top-level result; returns {op kind:
    bytes} plus 'total'."""
    acc = collections.Counter()
    for x, mult, kind, insts, body in hlo_instructions(text, branches):
        if x["op"] in ("conditional", "call"):
            continue
        shapes = {y["name"]: y["shape"] for y in insts}
        out_b, in_b = _shape_bytes(x["shape"]), [_shape_bytes(shapes.get(o, "")) for o in x["operands"]]
        root = next((b for b in body if b["root"]), None)
        if root is not None and root["op"] == "dynamic-update-slice":
            upd = next((b["shape"] for b in body if b["name"] == root["operands"][1]), "")
            out_b, in_b = _shape_bytes(upd), [min(v, _shape_bytes(upd)) for v in in_b]
        acc[kind] += mult * (out_b + sum(in_b))
    acc["total"] = sum(acc.values())
    return dict(acc)


def analyze_head(B: int, S: int, chunk: int = 1024, E: int = 2048, V: int = 151936) -> dict:
    """{form: (matmul FLOPs, temp bytes, hlo_bytes dict)} of the log-softmax head's forward+backward."""
    import functools
    import sys

    import jax
    import jax.numpy as jnp

    from jaxrl.models import logprob_head

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from train_step_mfu import _legacy_logprobs_from_hidden

    forms = {"legacy": _legacy_logprobs_from_hidden,
             "recompute": functools.partial(logprob_head.logprobs_from_hidden, save_probs=False),
             "save_probs": functools.partial(logprob_head.logprobs_from_hidden, save_probs=True)}
    h = jax.ShapeDtypeStruct((B, S, E), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((E, V), jnp.bfloat16)
    t = jax.ShapeDtypeStruct((B, S), jnp.int32)
    ab = jax.ShapeDtypeStruct((B, S), jnp.float32)
    out = {}
    for name, f in forms.items():
        def loss(h, w, t, a, b, f=f):
            lp, ent = f(h, w, t, 1.0, chunk)
            return jnp.sum(a * lp + b * ent)

        g = jax.grad(loss, argnums=(0, 1))
        acc = collections.Counter()
        _walk(jax.make_jaxpr(g)(h, w, t, ab, ab).jaxpr, 1, acc, "step")
        compiled = jax.jit(g).lower(h, w, t, ab, ab).compile()
        out[name] = (sum(acc.values()), compiled.memory_analysis().temp_size_in_bytes, hlo_bytes(compiled.as_text()))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--remat", default="full,save_dots,save_attention,save_dots_attention,none")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--head", action="store_true", help="analyze the log-softmax head alone (see above)")
    ap.add_argument("--save-probs", action="store_true", help="StepConfig.save_probs=True (no logits recompute)")
    args = ap.parse_args(argv)
    T = 1e12
    if args.head:
        print(f"log-softmax head alone, B{args.batch} x S{args.seq}, hidden 2048, vocab 151936, bf16, chunk 1024; "
              f"forward + backward")
        print(f"{'form':12s} {'matmul TFLOP':>12s} {'temp GiB':>9s} {'HLO GiB moved':>13s}  largest op kinds (GiB)")
        for name, (flops, temp, by) in analyze_head(args.batch, args.seq).items():
            kinds = sorted(((v, k) for k, v in by.items() if k != "total"), reverse=True)[:4]
            print(f"{name:12s} {flops / T:12.2f} {temp / 2**30:9.2f} {by['total'] / 2**30:13.1f}  "
                  + ", ".join(f"{k} {v / 2**30:.1f}" for v, k in kinds))
        return
    print(f"Qwen3-1.7B dims, B{args.batch} x S{args.seq}, bf16 compute, save_probs={args.save_probs}; "
          f"matmul TFLOP per train step")
    print(f"{'remat':22s} {'fwd':>7s} {'step':>7s} {'step/fwd':>8s} {'attn-loop':>9s} {'f32 GEMM':>8s} "
          f"{'formula':>8s} {'step/formula':>12s}")
    for remat in args.remat.split(","):
        r = analyze(remat, args.batch, args.seq, save_probs=args.save_probs)
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
