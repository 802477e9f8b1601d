"""Train-step MFU of jaxrl on one accelerator, per variant, plus GPU checks and a kernel-time profile.

Runs `jaxrl.train.step.train_step` (one micro-batch, PPO-clip token_mean, AdamW, bf16 compute /
fp32 master, random weights) at Qwen3-1.7B dims (tied, 28 layers) or Qwen3-8B widths with few
layers, B x S tokens, and prints for each variant the step time, tokens/s and

    MFU = tokens/s x (6 x N_nonembed + 12 x L x H x head_dim x S) / peak

(the formula of the project's GPU probe and PyTorch anchor; peak 989 TFLOP/s, H100/H200 dense
bf16 datasheet; the lm_head matmuls of a tied model are real work that this formula does not
credit).

A variant is ``attention:remat`` followed by optional ``:key=value`` items:

  shape=1.7b|8b_w   model dims (default: --shape)     batch=B, seq=S   tokens (default: --batch/--seq)
  chunk=N           positions per chunk of the chunked log-softmax (default 1024)
  probs=save        StepConfig.save_probs (model.logprobs_save_probs): the backward pass reads the
                    saved exp(logits - max) instead of recomputing the logits
  head=legacy       the log-softmax as before the custom VJP (autodiff through a rematerialized
                    chunk: softmax, scatter and float32 cotangent materialized), for an A/B
  cond=layer        the cuDNN layout check as a lax.cond in every layer (as before), instead of
                    once around the gradient computation, for an A/B

Checks (``--checks [attention,offload]``): cuDNN vs XLA (blocked) attention on right-padded, left-padded and packed
rows (GPU only), and one train step per optimizer-offload mode (`trainer.optimizer.offload`)
against device-resident state: XLA's memory analysis, step time, and the largest differences of
params, optimizer state and metrics from offload='none'. ``--profile VARIANT`` traces 3 steps
of one variant and prints where the device time goes (kernel-name categories, top kernels).

  python bench/train_step_mfu.py                       # 1.7B dims, B8 x S2048, default variants
  python bench/train_step_mfu.py --variants cudnn:full:shape=8b_w:batch=4:seq=4096
  python bench/train_step_mfu.py --tiny --checks --profile xla:full   # CPU smoke run
  bash bench/mfu_sweep.sh OUT_DIR                      # the one-call GPU sweep (see that file)
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import tempfile
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
DEFAULT_VARIANTS = ("cudnn:save_dots_attention,cudnn:save_dots,cudnn:full,cudnn:save_dots_attention:head=legacy,"
                    "xla:save_dots_attention")
# Rough seconds per variant (init + compile + steps) on an H200, for --deadline-s.
VARIANT_COST_S = 15.0


def _peak_gib(dev) -> float:
    try:
        return (dev.memory_stats() or {}).get("peak_bytes_in_use", 0) / 2**30
    except Exception:  # noqa: BLE001 - backends without memory stats
        return 0.0


def parse_variant(spec: str, defaults: dict) -> dict:
    """``attention:remat[:key=value...]`` -> dict(attention, remat, shape, batch, seq, chunk, probs, head, cond).

    Raises:
      ValueError: for a malformed spec or an unknown key.
    """
    parts = spec.split(":")
    if len(parts) < 2:
        raise ValueError(f"variant {spec!r}: expected attention:remat[:key=value...]")
    v = dict(defaults, attention=parts[0], remat=parts[1], spec=spec)
    for item in parts[2:]:
        key, sep, val = item.partition("=")
        if not sep or key not in ("shape", "batch", "seq", "chunk", "probs", "head", "cond"):
            raise ValueError(f"variant {spec!r}: unknown item {item!r}; use shape=, batch=, seq=, chunk=, probs=save, "
                             f"head=legacy, cond=layer")
        v[key] = int(val) if key in ("batch", "seq", "chunk") else val
    return v


# --- the log-softmax before the custom VJP (A/B only): autodiff through a rematerialized chunk ---

def _legacy_logprobs_from_hidden(hidden, head_w, targets, temperature=1.0, chunk_size=512, save_probs=False):
    import jax
    import jax.numpy as jnp

    from jaxrl.models import qwen3

    if save_probs:
        raise ValueError("head=legacy recomputes the logits; it cannot be combined with probs=save")

    @jax.custom_vjp
    def head_logits(h, w):
        return jnp.einsum("bce,ev->bcv", h, w, preferred_element_type=jnp.float32)

    def fwd(h, w):
        return head_logits(h, w), (h, w)

    def bwd(res, g):
        h, w = res
        g = g.astype(h.dtype)
        return (jnp.einsum("bcv,ev->bce", g, w, preferred_element_type=jnp.float32).astype(h.dtype),
                jnp.einsum("bce,bcv->ev", h, g, preferred_element_type=jnp.float32).astype(w.dtype))

    head_logits.defvjp(fwd, bwd)
    T = hidden.shape[1]
    w = head_w.astype(hidden.dtype)
    h, t = qwen3.chunk_positions(hidden, targets, chunk_size)

    def chunk(_, xs):
        hc, tc = xs
        z = head_logits(hc, w) / temperature
        lse = jax.nn.logsumexp(z, axis=-1)
        zy = jnp.take_along_axis(z, tc[..., None], axis=-1)[..., 0]
        ent = lse - jnp.sum(jax.nn.softmax(z, axis=-1) * z, axis=-1)
        return None, (zy - lse, ent)

    _, (lp, ent) = jax.lax.scan(jax.checkpoint(chunk, prevent_cse=False), None, (h, t))
    return qwen3.unchunk_positions(lp, T), qwen3.unchunk_positions(ent, T)


@contextlib.contextmanager
def _patched(v: dict):
    """Applies a variant's A/B switches (head=legacy, cond=layer) for the duration of a run."""
    from jaxrl.models import attention, qwen3

    saved_head, saved_impl = qwen3.logprobs_from_hidden, attention.IMPLS["cudnn_no_fallback"]
    try:
        if v.get("head") == "legacy":
            qwen3.logprobs_from_hidden = _legacy_logprobs_from_hidden
        elif v.get("head") not in (None, "", "new"):
            raise ValueError(f"head={v['head']!r}: use head=legacy")
        if v.get("cond") == "layer":
            attention.IMPLS["cudnn_no_fallback"] = attention.IMPLS["cudnn"]
        elif v.get("cond") not in (None, "", "step"):
            raise ValueError(f"cond={v['cond']!r}: use cond=layer")
        yield
    finally:
        qwen3.logprobs_from_hidden, attention.IMPLS["cudnn_no_fallback"] = saved_head, saved_impl


def _setup(cfg, B, S, offload="none", chunk=1024, seed=0, save_probs=False):
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
    sc = step_lib.StepConfig(loss=lc, temperature=1.0, num_micro_batches=1, chunk_size=chunk, offload=offload,
                             save_probs=save_probs)
    fn = jax.jit(lambda p, o, b, ww: step_lib.train_step(p, o, b, ww, model_cfg=cfg, step_cfg=sc, tx=tx,
                                                         schedule=sched),
                 out_shardings=(state_psh, osh, None), donate_argnums=(0, 1))
    return mesh, fn, params, opt, batch, w


def _model_cfg(v: dict, dtype: str):
    from jaxrl.models import qwen3

    return qwen3.Qwen3Config(**SHAPES[v["shape"]], dtype=dtype, remat=v["remat"], attention=v["attention"])


def run_variant(v: dict, steps: int, dtype: str, profile_dir: str | None = None) -> dict:
    """Compiles and times the train step of variant ``v`` (see :func:`parse_variant`); returns a row."""
    import jax

    cfg = _model_cfg(v, dtype)
    B, S = v["batch"], v["seq"]
    with _patched(v):
        if v.get("probs") not in (None, "", "save", "recompute"):
            raise ValueError(f"probs={v['probs']!r}: use probs=save")
        mesh, fn, params, opt, batch, w = _setup(cfg, B, S, chunk=v["chunk"], save_probs=v.get("probs") == "save")
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
            loss, grad_norm = float(m["loss"]), float(m["grad_norm"])
            profile_error = None
            if profile_dir:
                try:   # the timing above stands even if tracing fails
                    jax.profiler.start_trace(profile_dir)
                    for _ in range(3):
                        params, opt, m = fn(params, opt, batch, w)
                    jax.block_until_ready(m)
                    jax.profiler.stop_trace()
                except Exception as e:  # noqa: BLE001
                    profile_error = f"{type(e).__name__}: {str(e)[:200]}"
    st = sorted(ts)[len(ts) // 2]
    fpt = 6.0 * nonembed + 12.0 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * S
    tps = B * S / st
    return dict(variant=v["spec"], shape=v["shape"], attention=v["attention"], remat=v["remat"], B=B, S=S,
                chunk=v["chunk"], save_probs=v.get("probs") == "save", head=v.get("head") or "new",
                cond=v.get("cond") or "step",
                xla_flags=os.environ.get("XLA_FLAGS", ""), step_s=st, steps=[round(t, 4) for t in ts],
                tokens_per_s=tps, mfu=tps * fpt / 989e12, flops_per_token=fpt, compile_s=compile_s,
                peak_gib=_peak_gib(jax.devices()[0]), loss=loss, grad_norm=grad_norm,
                **({"profile_error": profile_error} if profile_error else {}))


# --- profile summary ---

_CATEGORIES = (  # (category, substrings of a lower-cased kernel / op name), first match wins
    ("attention (cuDNN/flash)", ("fmha", "flash", "cudnn", "dot_product_attention", "sdpa")),
    ("matmul (cuBLAS/Triton GEMM)", ("gemm", "xmma", "cutlass", "nvjet", "matmul", "dot", "ynn", "sm90_", "sm80_")),
    ("memcpy / host transfer", ("memcpy", "memset", "copy_device", "transfer", "h2d", "d2h")),
    ("reduction fusion", ("reduce", "reduction")),
    ("other fusion / elementwise", ("fusion", "loop", "convert", "select", "add", "multiply", "broadcast", "scatter",
                                    "gather", "dynamic", "concatenate", "transpose", "copy")),
)


def _category(name: str) -> str:
    low = name.lower()
    for cat, keys in _CATEGORIES:
        if any(k in low for k in keys):
            return cat
    return "other"


def summarize_profile(trace_dir: str, n_steps: int = 3, top: int = 15) -> dict:
    """Device time by kernel category and the top kernels of a ``jax.profiler`` trace.

    Reads the ``*.xplane.pb`` with ``jax.profiler.ProfileData``. On a GPU the events of the
    ``/device:GPU:*`` planes' stream lines are kernels (their time is summed, so overlapping
    streams count twice); without a device plane (CPU) the host threads' XLA events are used.
    Times are per step (divided by ``n_steps``), in milliseconds.
    """
    import collections

    from jax.profiler import ProfileData

    files = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    if not files:
        return dict(error=f"no .xplane.pb under {trace_dir}")
    pd = ProfileData.from_file(sorted(files)[-1])
    planes = list(pd.planes)
    dev = [p for p in planes if p.name.startswith(("/device:GPU", "/device:TPU"))]
    kernels, hlo_ops, lines_used = collections.Counter(), collections.Counter(), []
    for plane in dev or [p for p in planes if p.name.startswith("/host:CPU")]:
        for line in plane.lines:
            lname = (line.name or "").lower()
            if dev and lname == "xla ops":           # HLO instruction names (annotations)
                for e in line.events:
                    hlo_ops[e.name] += e.duration_ns
                continue
            if (dev and not lname.startswith("stream")) or (not dev and "python" in lname):
                continue
            lines_used.append(f"{plane.name}|{line.name}")
            for e in line.events:
                kernels[e.name] += e.duration_ns
    cats = collections.Counter()
    for name, ns in kernels.items():
        cats[_category(name)] += ns
    ms = lambda ns: round(ns / 1e6 / n_steps, 3)
    return dict(total_ms_per_step=ms(sum(cats.values())), categories={k: ms(v) for k, v in cats.most_common()},
                top_kernels=[(k[:120], ms(v)) for k, v in kernels.most_common(top)],
                top_hlo_ops=[(k[:120], ms(v)) for k, v in hlo_ops.most_common(top)], lines=lines_used[:20],
                source="device stream kernels" if dev else "host XLA events (no device plane)")


# --- checks ---

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


def _tree_diff(a, b) -> dict:
    """Largest |a - b| over all leaves, and the largest per-leaf max|a - b| / max|b|, plus the
    fraction of elements that differ at all (float64 comparison of the host copies)."""
    import jax
    import numpy as np

    max_abs, max_rel, n_diff, n = 0.0, 0.0, 0, 0
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        d = np.abs(x - y)
        max_abs = max(max_abs, float(d.max(initial=0.0)))
        max_rel = max(max_rel, float(d.max(initial=0.0) / max(np.abs(y).max(initial=0.0), 1e-30)))
        n_diff += int((d > 0).sum())
        n += d.size
    return dict(max_abs=max_abs, max_rel=max_rel, frac_elements_differing=n_diff / max(n, 1))


def check_offload(shape: str, B: int, S: int, dtype: str, attention: str, modes=None, on_row=None) -> dict:
    """Two train steps per offload mode from the same initial state: XLA's memory analysis of each
    compiled step (device vs host bytes), the time of the second step, and the largest
    differences of params, optimizer state and metrics (loss, grad_norm of both steps) from
    offload='none'. ``on_row(out)`` is called after each mode (to save partial results)."""
    import gc

    import jax
    import numpy as np

    from jaxrl.train import step as step_lib

    v = dict(shape=shape, remat="full", attention=attention)
    cfg = _model_cfg(v, dtype)
    out, ref = {}, None
    for offload in modes or step_lib.OFFLOAD_MODES:
        gc.collect()
        mesh, fn, params, opt, batch, w = _setup(cfg, B, S, offload=offload)
        with jax.set_mesh(mesh):
            ma = fn.lower(params, opt, batch, w).compile().memory_analysis()
        mem = {k: round(getattr(ma, k) / 2**30, 3) for k in dir(ma) if k.endswith("size_in_bytes")}
        metrics = []
        with jax.set_mesh(mesh):
            t0 = time.perf_counter()
            params, opt, m = fn(params, opt, batch, w)
            jax.block_until_ready(m)
            first = time.perf_counter() - t0
            metrics.append({k: float(x) for k, x in m.items()})
            t0 = time.perf_counter()
            params, opt, m = fn(params, opt, batch, w)
            jax.block_until_ready(m)
            second = time.perf_counter() - t0
            metrics.append({k: float(x) for k, x in m.items()})
        host = jax.tree.map(np.asarray, (params, opt))
        row = dict(step_s=second, compile_and_first_s=first, memory_analysis_gib=mem,
                   peak_gib_so_far=_peak_gib(jax.devices()[0]),
                   memory_kind=jax.tree.leaves(opt)[1].sharding.memory_kind,
                   loss=[mm["loss"] for mm in metrics], grad_norm=[mm["grad_norm"] for mm in metrics])
        if ref is None:
            ref = (host, metrics)
        else:
            row["params_vs_none"] = _tree_diff(host[0], ref[0][0])
            row["opt_state_vs_none"] = _tree_diff(host[1], ref[0][1])
            row["metrics_max_abs_diff_vs_none"] = max(abs(a[k] - b[k]) for a, b in zip(metrics, ref[1]) for k in a)
            row["equal_to_none"] = row["params_vs_none"]["max_abs"] == 0 and row["opt_state_vs_none"]["max_abs"] == 0
        out[offload] = row
        del params, opt, host
        if on_row:
            on_row(out)
    return out


def summarize_dir(path: str) -> None:
    """Prints every variant row of ``path/*.json`` (bench outputs) as one table, best MFU per shape first."""
    rows = []
    for f in sorted(glob.glob(os.path.join(path, "*.json"))):
        with open(f) as fh:
            res = json.load(fh)
        for r in res.get("variants", []):
            rows.append((os.path.basename(f)[:-5], res.get("xla_flags", ""), r))
    print(f"{'group':9s} {'shape B x S':18s} {'variant':52s} {'step s':>7s} {'MFU':>6s} {'peak GiB':>8s}  xla_flags")
    ok = sorted((x for x in rows if "mfu" in x[2]), key=lambda x: (x[2]["shape"], x[2]["S"], -x[2]["mfu"]))
    for g, fl, r in ok:
        shp = f"{r['shape']} {r['B']}x{r['S']}"
        print(f"{g:9s} {shp:18s} {r['variant'][:52]:52s} {r['step_s']:7.3f} {r['mfu']:6.1%} {r['peak_gib']:8.1f}  {fl}")
    for g, fl, r in rows:
        if "mfu" not in r:
            print(f"{g:9s} {'':18s} {r.get('variant', '')[:52]:52s} FAILED {r.get('error', '')[:150]}  {fl}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="1.7b", choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--chunk", type=int, default=1024, help="default positions per log-softmax chunk")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--variants", default=DEFAULT_VARIANTS, help="comma list of attention:remat[:key=value...]; "
                    "'' for none")
    ap.add_argument("--checks", nargs="?", const="attention,offload", default="",
                    help="checks to run: attention (GPU only), offload; bare --checks runs both")
    ap.add_argument("--offload-modes", default="", help="comma list for the offload check (default: all)")
    ap.add_argument("--checks-first", action="store_true", help="run the checks before the variants")
    ap.add_argument("--profile", default="", help="a variant to trace (3 steps) and summarize by kernel")
    ap.add_argument("--deadline-s", type=float, default=0.0,
                    help="skip what would start later than this many seconds after start (0: no limit)")
    ap.add_argument("--tiny", action="store_true", help="tiny dims, float32, CPU; 'cudnn' runs as 'xla'")
    ap.add_argument("--out", default="", help="write the results as JSON here (rewritten after each item)")
    ap.add_argument("--summarize", default="", help="print one table of the variants in DIR/*.json and exit")
    args = ap.parse_args(argv)
    if args.summarize:
        return summarize_dir(args.summarize)
    t_start = time.perf_counter()
    if args.tiny:
        os.environ["JAX_PLATFORMS"] = "cpu"
        args.shape, args.batch, args.seq, args.chunk = "tiny", 2, 64, 16
    import jax

    print(f"jax {jax.__version__} devices {jax.devices()} XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}", flush=True)
    dtype = "float32" if args.tiny else "bfloat16"
    on_gpu = jax.default_backend() == "gpu"
    results = {"variants": [], "xla_flags": os.environ.get("XLA_FLAGS", ""), "jax": jax.__version__,
               "device": str(jax.devices()[0].device_kind)}
    defaults = dict(shape=args.shape, batch=args.batch, seq=args.seq, chunk=args.chunk, probs=None, head=None,
                    cond=None)

    def save():
        if args.out:
            tmp = args.out + ".tmp"
            with open(tmp, "w") as f:
                json.dump(results, f, indent=1)
            os.replace(tmp, args.out)

    last_cost = [VARIANT_COST_S]   # wall time of the last variant: the estimate for the next one

    def time_left(cost=None) -> bool:
        cost = last_cost[0] if cost is None else cost
        return not args.deadline_s or time.perf_counter() - t_start + cost <= args.deadline_s

    def resolve(spec):
        v = parse_variant(spec, defaults)
        if args.tiny:
            v["shape"], v["batch"], v["seq"] = "tiny", min(v["batch"], 2), min(v["seq"], 64)
            v["chunk"] = min(v["chunk"], 16)
            if v["attention"] == "cudnn":
                v["attention"] = "xla"   # CPU: the cuDNN kernel needs a GPU
        return v

    def checks():
        if not time_left(5.0):
            print("skip checks: deadline", flush=True)
            return
        if on_gpu and "attention" in args.checks:
            results["attention_check"] = check_attention()
            print("attention cudnn vs xla:", json.dumps(results["attention_check"]), flush=True)
        if "offload" not in args.checks:
            save()
            return
        modes = [m for m in args.offload_modes.split(",") if m] or None

        def partial(out):
            results["offload_check"] = dict(out)
            save()

        results["offload_check"] = check_offload(args.shape, args.batch, args.seq, dtype,
                                                 "cudnn" if on_gpu else "xla", modes, on_row=partial)
        for mode, r in results["offload_check"].items():
            diff = "" if "params_vs_none" not in r else (
                f" | vs none: params max_abs {r['params_vs_none']['max_abs']:.3g} max_rel "
                f"{r['params_vs_none']['max_rel']:.3g} ({r['params_vs_none']['frac_elements_differing']:.2%} differ), "
                f"opt max_rel {r['opt_state_vs_none']['max_rel']:.3g}, metrics {r['metrics_max_abs_diff_vs_none']:.3g}")
            mem = r["memory_analysis_gib"]
            print(f"offload {mode:20s} step {r['step_s']:.3f} s  device args {mem.get('argument_size_in_bytes', 0):.2f} "
                  f"temp {mem.get('temp_size_in_bytes', 0):.2f} host args {mem.get('host_argument_size_in_bytes', 0):.2f}"
                  f" GiB  kind {r['memory_kind']}  loss {r['loss']}{diff}", flush=True)
        save()

    def print_profile(spec, prof):
        print(f"profile of {spec} ({prof.get('source', '')}): {prof.get('total_ms_per_step', 0):.1f} ms of kernels "
              f"per step", flush=True)
        for cat, ms in prof.get("categories", {}).items():
            print(f"  {cat:32s} {ms:9.2f} ms", flush=True)
        for name, ms in prof.get("top_kernels", [])[:12]:
            print(f"  {ms:9.2f} ms  {name[:100]}", flush=True)
        if "error" in prof:
            print(f"  {prof['error']}", flush=True)

    if args.checks and args.checks_first:
        checks()
    specs = [s for s in args.variants.split(",") if s]
    for spec in specs:
        v = resolve(spec)
        if v["attention"] == "cudnn" and not on_gpu:
            print(f"skip {spec}: cuDNN needs a GPU", flush=True)
            continue
        if not time_left():
            print(f"skip {spec}: deadline", flush=True)
            continue
        t_variant = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="jaxrl_profile") as d:
            try:
                r = run_variant(v, args.steps, dtype, profile_dir=d if spec == args.profile else None)
                if spec == args.profile:
                    r["profile"] = (dict(error=r["profile_error"]) if "profile_error" in r else summarize_profile(d))
            except Exception as e:  # noqa: BLE001 - report and continue with the next variant
                r = dict(variant=spec, error=f"{type(e).__name__}: {str(e)[:300]}")
        last_cost[0] = max(5.0, time.perf_counter() - t_variant)
        results["variants"].append(r)
        if "error" in r:
            print(f"{spec:56s} FAILED {r['error']}", flush=True)
        else:
            print(f"{spec:56s} step {r['step_s']:.3f} s  {r['tokens_per_s']:,.0f} tok/s  MFU {r['mfu']:.1%}  "
                  f"peak {r['peak_gib']:.1f} GiB  compile {r['compile_s']:.1f} s  loss {r['loss']:.4f}", flush=True)
            if "profile" in r:
                print_profile(spec, r["profile"])
        save()
    if args.checks and not args.checks_first:
        checks()
    if args.profile and args.profile not in specs:
        if time_left():
            v = resolve(args.profile)
            with tempfile.TemporaryDirectory(prefix="jaxrl_profile") as d:
                try:
                    r = run_variant(v, 1, dtype, profile_dir=d)
                    r["profile"] = (dict(error=r["profile_error"]) if "profile_error" in r else summarize_profile(d))
                except Exception as e:  # noqa: BLE001
                    r = dict(variant=args.profile, error=f"{type(e).__name__}: {str(e)[:300]}")
            results["profile"] = r
            print_profile(args.profile, r.get("profile", r))
            save()
        else:
            print("skip profile: deadline", flush=True)
    print(f"total {time.perf_counter() - t_start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
