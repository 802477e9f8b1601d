"""Rollout throughput of the real vLLM next to the built-in JAX engine, side by side: the same model,
prompts and sampling settings, each engine behind its sidecar (the path a training run takes), the
requests sent the same way through `SidecarClient`; prints generated tokens/s of each and vLLM / JAX.

Shapes: "main" = the main job's 64 prompts x 8 samples (configs/rloo.py; 16 new tokens per turn
there, --main-tokens), and "long" = a long decode (8 prompts x 1 sample, up to --long-tokens new
tokens; a row ends at EOS, each engine's rate counts the tokens it generated). Temperature 1, float32 (the CPU scale). One warm-up call per engine and shape first
(the JAX engine compiles its buckets), then --repeats timed calls, interleaved JAX / vLLM.

  python bench/vllm_vs_jax.py --engine-env ~/.cache/jaxrl/engine-env [--model DIR]

The vLLM sidecar runs from the engine environment (launch/install_engine_env.sh) through
launch/vllm_sidecar.sh; the JAX sidecar is `python -m jaxrl.rollout.sidecar`. Report `uptime`'s load
average with the numbers (other jobs on the machine change both).
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

import httpx
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _wait(url: str, proc: subprocess.Popen, log: str, timeout_s: float = 1800.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the sidecar at {url} exited ({proc.returncode}); its log: {log}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"the sidecar at {url} did not come up in {timeout_s:.0f} s; its log: {log}")
        time.sleep(1.0)


def main() -> None:
    from jaxrl.envs import DEFAULT_POLICY_DIR
    from jaxrl.rollout.client import SidecarClient
    from jaxrl.rollout.process import free_port
    from jaxrl.rollout.types import SamplingParams

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine-env", default=os.path.expanduser("~/.cache/jaxrl/engine-env"))
    p.add_argument("--model", default=DEFAULT_POLICY_DIR)
    p.add_argument("--main-tokens", type=int, default=16)
    p.add_argument("--long-tokens", type=int, default=512)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()

    tmp = tempfile.mkdtemp(prefix="bench-vllm-jax-")
    token = os.path.join(tmp, "token")
    with open(token, "w") as f:
        f.write("bench-token\n")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    jport, vport = free_port(), free_port()
    jlog, vlog = os.path.join(tmp, "jax.log"), os.path.join(tmp, "vllm.log")
    jax_proc = subprocess.Popen([sys.executable, "-m", "jaxrl.rollout.sidecar", "--checkpoint", args.model,
                                 "--port", str(jport), "--sync-dir", os.path.join(tmp, "sync_jax"),
                                 "--token-file", token, "--dtype", "float32", "--max-batch-rows", "512",
                                 "--log-level", "warning"], env={**env, "JAX_PLATFORMS": "cpu"},
                                stdout=open(jlog, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    venv = {**env, "PATH": f"{args.engine_env}/bin:{env['PATH']}", "JAXRL_PYTHON": sys.executable,
            "JAXRL_TOKEN_FILE": token}
    vllm_proc = subprocess.Popen(["bash", os.path.join(ROOT, "launch", "vllm_sidecar.sh"), args.model, str(vport),
                                  os.path.join(tmp, "sync_vllm"), "--dtype", "float32"], env=venv,
                                 stdout=open(vlog, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    urls = {"jax": f"http://127.0.0.1:{jport}", "vllm": f"http://127.0.0.1:{vport}"}
    try:
        _wait(urls["jax"], jax_proc, jlog)
        _wait(urls["vllm"], vllm_proc, vlog)
        clients = {k: SidecarClient([u], token_file=token, max_retries=0, timeout_s=3600) for k, u in urls.items()}
        rng = np.random.default_rng(0)
        from jaxrl.models import hf_io

        cfg, _ = hf_io.load_hf_checkpoint(args.model)
        shapes = {
            "main (64 x 8)": ([rng.integers(0, cfg.vocab_size, size=int(rng.integers(16, 48))).tolist()
                               for _ in range(64)], SamplingParams(max_tokens=args.main_tokens, n=8, seed=1)),
            "long (8 x 1)": ([rng.integers(0, cfg.vocab_size, size=32).tolist() for _ in range(8)],
                             SamplingParams(max_tokens=args.long_tokens, n=1, seed=2)),
        }
        load = os.getloadavg()
        print(f"model {args.model}; load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        for name, (prompts, sp) in shapes.items():
            for c in clients.values():  # warm-up (compiles the JAX engine's buckets)
                c.generate(prompts, sp)
            rate = {"jax": [], "vllm": []}
            for _ in range(args.repeats):
                for k, c in clients.items():
                    t0 = time.perf_counter()
                    groups = c.generate(prompts, sp)
                    dt = time.perf_counter() - t0
                    rate[k].append(sum(len(x.token_ids) for g in groups for x in g) / dt)
            j, v = float(np.median(rate["jax"])), float(np.median(rate["vllm"]))
            print(f"{name:14s} max_tokens {sp.max_tokens:4d}: JAX engine {j:9.1f} tok/s   vLLM {v:9.1f} tok/s   "
                  f"vLLM / JAX = {v / j:.2f}")
        load = os.getloadavg()
        print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    finally:
        for proc in (jax_proc, vllm_proc):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(60)


if __name__ == "__main__":
    main()
