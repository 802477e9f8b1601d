"""`jaxrl.plan`: ahead-of-time compile of the real train step on 8 fake devices, no weights."""
import os
import subprocess
import sys

import numpy as np

from jaxrl.models import qwen3
from jaxrl.plan import plan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tiny_config():
    sys.path.insert(0, os.path.join(ROOT, "configs"))
    import rloo

    c = rloo.get_config()
    c.model.preset = "tiny"
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 2, 4, 1
    c.trainer.train_batch_size = 8
    c.trainer.mini_batch_size = 4
    c.trainer.micro_batch_size = 16
    return c


def test_plan_compiles_train_step_and_reports_fsdp_sharded_arguments():
    c = _tiny_config()
    cfg = qwen3.Qwen3Config.preset("tiny")
    n_params = sum(int(np.prod(x.shape)) for x in __import__("jax").tree.leaves(qwen3.abstract_params(cfg)))
    r = plan(c, num_devices=8, seq_len=64)
    assert r["mesh"] == {"data": 2, "fsdp": 4, "tensor": 1}
    assert r["rows"] == 32 and r["micro_batches"] == 2 and r["params"] == n_params
    # Params + Adam mu + nu in fp32, sharded over fsdp=4 (a few small norm scales are replicated),
    # plus this device's slice of the batch (32 rows / 8 devices x 64 tokens x 8 arrays x 4 B).
    state_bytes = 3 * 4 * n_params / 4
    batch_bytes = 4 * 64 * 8 * 4
    assert state_bytes <= r["argument_bytes"] <= 1.2 * state_bytes + 2 * batch_bytes
    assert r["alias_bytes"] > 0.9 * state_bytes  # params and optimizer state are donated
    assert r["temp_bytes"] > 0 and r["total_bytes"] >= r["argument_bytes"]


def test_plan_cli_prints_memory_and_rejects_a_non_dividing_mesh():
    # The CLI sets the fake device count itself. The rest of this process's XLA flags (tests/conftest.py)
    # and `_tiny_config`'s batch make its program the one the test above compiled: loaded from the
    # session's compile cache, not compiled again.
    flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f)
    env = {**os.environ, "XLA_FLAGS": flags}
    cmd = [sys.executable, "-m", "jaxrl.plan", f"--config={ROOT}/configs/rloo.py", "--config.model.preset=tiny",
           "--config.mesh.data=2", "--config.mesh.fsdp=4", "--num_devices=8", "--seq_len=64",
           "--config.trainer.train_batch_size=8", "--config.trainer.mini_batch_size=4",
           "--config.trainer.micro_batch_size=16"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "per device: arguments" in out.stdout and "compile time" in out.stdout
    # tiny has 4 attention heads: tensor=8 cannot shard them.
    bad = cmd[:5] + ["--config.mesh.data=1", "--config.mesh.fsdp=1", "--config.mesh.tensor=8", "--num_devices=8",
                     "--seq_len=64", "--config.trainer.micro_batch_size=64"]
    out = subprocess.run(bad, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 2
    assert "cannot shard params" in out.stderr and "tensor=8" in out.stderr


def test_plan_with_optimizer_offload_drops_the_moments_from_device_memory():
    c = _tiny_config()
    n_params = sum(int(np.prod(x.shape)) for x in __import__("jax").tree.leaves(
        qwen3.abstract_params(qwen3.Qwen3Config.preset("tiny"))))
    base = plan(c, num_devices=8, seq_len=64)
    c.trainer.optimizer.offload = "moments"
    off = plan(c, num_devices=8, seq_len=64)
    # Adam mu + nu in fp32, sharded over fsdp=4 (norm scales replicated: slightly more).
    moments = 2 * 4 * n_params / 4
    assert off["host_bytes"] >= moments and base["host_bytes"] == 0
    assert base["total_bytes"] - off["total_bytes"] >= moments
    assert off["temp_bytes"] <= base["temp_bytes"] * 1.05
