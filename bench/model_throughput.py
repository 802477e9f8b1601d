"""Training throughput of the jaxrl Qwen3 vs HF transformers (PyTorch) on the same config and batch.

Measures tokens/s of one forward + backward pass of the mean next-token cross-entropy
(jaxrl: jitted ``value_and_grad`` of the chunked ``qwen3.logprobs``; HF: ``Qwen3ForCausalLM``
with ``labels``, ``loss.backward()``), both in float32 on the default device (CPU here),
and prints both numbers and their ratio (jaxrl / HF). Compilation is excluded (one warm-up
step each). Both models hold the same weights (HF random init, converted via hf_io).

    python bench/model_throughput.py [--layers 2 --hidden 256 ... --batch 4 --seq 256 --steps 5]
"""
from __future__ import annotations

import argparse
import time


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--chunk-size", type=int, default=128, help="jaxrl logprob chunk (sequence positions)")
    ap.add_argument("--remat", default="none", choices=["none", "full", "save_dots"])
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps must be >= 1")

    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    from transformers import Qwen3Config as HFConfig, Qwen3ForCausalLM

    from jaxrl.models import hf_io, qwen3

    hf_cfg = HFConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
                      max_position_embeddings=max(args.seq, 512), tie_word_embeddings=False)
    torch.manual_seed(0)
    hf = Qwen3ForCausalLM(hf_cfg).float()
    cfg = qwen3.Qwen3Config.from_hf_dict(hf_cfg.to_dict(), dtype="float32", remat=args.remat)

    # Same weights on both sides.
    sd = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    params: dict = {}
    for m in hf_io.mapping_for(cfg):
        arrs = [hf_io.hf_to_ours(m, sd[n], cfg) for n in hf_io.hf_names(m, cfg)]
        d = params
        for k in m.path[:-1]:
            d = d.setdefault(k, {})
        d[m.path[-1]] = jnp.asarray(np.stack(arrs) if m.stacked else arrs[0])

    B, T = args.batch, args.seq
    toks_np = np.random.default_rng(0).integers(0, args.vocab, (B, T)).astype(np.int32)
    toks = jnp.asarray(toks_np)
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    seg = jnp.ones((B, T), jnp.int32)

    def loss_fn(p):
        lp, _ = qwen3.logprobs(p, cfg, toks, pos, seg, chunk_size=args.chunk_size)
        return -lp.mean()

    step = jax.jit(jax.value_and_grad(loss_fn))
    t0 = time.perf_counter()
    jax.block_until_ready(step(params))
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss_j, grads = step(params)
    jax.block_until_ready(grads)
    jax_s = (time.perf_counter() - t0) / args.steps

    tt = torch.tensor(toks_np, dtype=torch.long)

    def torch_step():
        hf.zero_grad(set_to_none=True)
        out = hf(input_ids=tt, labels=tt)
        out.loss.backward()
        return out.loss.detach()

    torch_step()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss_t = torch_step()
    torch_s = (time.perf_counter() - t0) / args.steps

    ntok = B * T
    print(f"config: layers={args.layers} hidden={args.hidden} heads={args.heads}/{args.kv_heads} "
          f"head_dim={args.head_dim} mlp={args.intermediate} vocab={args.vocab} batch={B}x{T} "
          f"steps={args.steps} device={jax.devices()[0].platform} torch_threads={torch.get_num_threads()}")
    print(f"loss: jaxrl {float(loss_j):.6f}  hf {float(loss_t):.6f}")
    print(f"jaxrl fwd+bwd: {ntok / jax_s:,.0f} tokens/s ({jax_s * 1e3:.1f} ms/step, compile {compile_s:.1f} s)")
    print(f"hf    fwd+bwd: {ntok / torch_s:,.0f} tokens/s ({torch_s * 1e3:.1f} ms/step)")
    print(f"ratio jaxrl/hf: {torch_s / jax_s:.2f}")


if __name__ == "__main__":
    main()
