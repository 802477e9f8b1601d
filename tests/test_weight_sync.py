"""Publishing policy weights as Orbax versions in a sync directory, and reading them back."""
import json
import os
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxrl.rollout import weight_sync as ws


def _tree(scale=1.0):
    rng = np.random.default_rng(0)
    return {"embed": jnp.asarray(rng.normal(size=(16, 8)) * scale, jnp.float32),
            "layers": {"q": jnp.asarray(rng.normal(size=(2, 8, 4)) * scale, jnp.float32)},
            "stack": [np.asarray(rng.normal(size=(3,)), np.float32)],
            "count": np.int32(7)}


def _bf16(x):
    return np.asarray(x).astype(ml_dtypes.bfloat16)


def test_publish_then_load_roundtrip_bf16(tmp_path):
    tree = _tree()
    stats = ws.publish(tree, str(tmp_path), 1, dtype="bfloat16")
    assert stats.version == 1 and stats.path == str(tmp_path / "1")
    assert stats.bytes == 2 * (16 * 8 + 2 * 8 * 4 + 3) + 4  # bf16 floats + one int32
    assert stats.seconds > 0 and stats.disk_bytes > 0
    assert ws.latest_version(str(tmp_path)) == 1
    loaded, lstats = ws.load(str(tmp_path))
    assert lstats.version == 1
    assert loaded["embed"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(loaded["embed"].view(np.uint16), _bf16(tree["embed"]).view(np.uint16))
    np.testing.assert_array_equal(loaded["layers"]["q"].view(np.uint16), _bf16(tree["layers"]["q"]).view(np.uint16))
    np.testing.assert_array_equal(loaded["stack"][0].view(np.uint16), _bf16(tree["stack"][0]).view(np.uint16))
    assert loaded["count"] == 7 and loaded["count"].dtype == np.int32


def test_load_into_target_sharding_and_dtype(tmp_path):
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("fsdp", "tensor"))
    sh = NamedSharding(mesh, P("fsdp", "tensor"))
    tree = _tree()
    tree["embed"] = jax.device_put(tree["embed"], sh)  # a sharded source is written shard by shard
    ws.publish(tree, str(tmp_path), 3, dtype="bfloat16")
    target = jax.tree.map(lambda x: x, _tree(scale=0.0))
    target["embed"] = jax.ShapeDtypeStruct((16, 8), jnp.float32, sharding=sh)
    loaded, _ = ws.load(str(tmp_path), 3, target=target)
    assert loaded["embed"].sharding == sh and loaded["embed"].dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(loaded["embed"]), _bf16(tree["embed"]).astype(np.float32))
    assert loaded["layers"]["q"].dtype == np.float32


def test_versions_keep_and_refusals(tmp_path):
    d = str(tmp_path)
    assert ws.latest_version(d) is None
    for v in (1, 2, 5):
        ws.publish(_tree(), d, v, keep=2)
    assert ws.committed_versions(d) == [2, 5]
    assert not os.path.exists(tmp_path / "1")
    with pytest.raises(ValueError, match="already exists"):
        ws.publish(_tree(), d, 5)
    with pytest.raises(ValueError, match="version"):
        ws.publish(_tree(), d, -1)
    # An uncommitted directory (no sync.json) and hidden temp dirs are never reported.
    os.makedirs(tmp_path / "9" / "params")
    os.makedirs(tmp_path / ".tmp-10")
    assert ws.latest_version(d) == 5
    with pytest.raises(FileNotFoundError, match="not committed"):
        ws.resolve_version_dir(d, str(tmp_path / "9"))


def test_resolve_refuses_paths_outside_sync_dir(tmp_path):
    sync = tmp_path / "sync"
    ws.publish(_tree(), str(sync), 1)
    other = tmp_path / "other"
    ws.publish(_tree(), str(other), 1)
    assert ws.resolve_version_dir(str(sync), str(sync / "1")) == (os.path.realpath(sync / "1"), 1)
    assert ws.resolve_version_dir(str(sync), "1")[1] == 1  # relative to the sync dir
    for bad in (str(sync / ".." / "other" / "1"), str(other / "1"), "/etc", str(sync), str(sync / "1" / "params")):
        with pytest.raises(PermissionError):
            ws.resolve_version_dir(str(sync), bad)
    os.symlink(other / "1", sync / "7")  # looks like a version inside, points outside
    with pytest.raises(PermissionError):
        ws.resolve_version_dir(str(sync), str(sync / "7"))


def test_reader_polling_during_publication_never_sees_a_partial_version(tmp_path):
    d = str(tmp_path)
    big = {"a": np.zeros((256, 1024), np.float32), "b": {"c": np.zeros((64, 512), np.float32)}}
    versions = list(range(1, 7))
    errors, seen = [], set()

    def writer():
        try:
            for v in versions:
                ws.publish(jax.tree.map(lambda x: x + v, big), d, v, keep=100)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    t = threading.Thread(target=writer)
    t.start()
    while t.is_alive():
        v = ws.latest_version(d)
        if v is not None:
            arrays = ws.read_numpy(ws.version_path(d, v))  # jax-free reader
            assert set(arrays) == {"a", "b.c"}
            for a in arrays.values():
                assert np.all(a.astype(np.float32) == v), f"version {v} read back partially written"
            seen.add(v)
        time.sleep(0.005)
    t.join()
    assert not errors, errors
    assert ws.latest_version(d) == versions[-1]
    assert len(seen) >= 2, f"the reader saw only versions {seen}; the test did not overlap the writer"


def test_tensorstore_reader_runs_without_jax(tmp_path):
    tree = _tree()
    ws.publish(tree, str(tmp_path), 4, dtype="bfloat16")
    code = (
        "import json, sys\n"
        "import numpy as np\n"
        "from jaxrl.rollout import weight_sync as ws\n"
        f"p = ws.version_path({str(tmp_path)!r}, ws.latest_version({str(tmp_path)!r}))\n"
        "arrs = ws.read_numpy(p)\n"
        "tree = ws.read_tree(p)\n"
        "assert tree['layers']['q'].shape == (2, 8, 4) and tree['stack'][0].shape == (3,)\n"
        "out = {k: [str(v.dtype), list(v.shape), v.astype(np.float64).ravel().tolist()] for k, v in arrs.items()}\n"
        "out['__jax__'] = 'jax' in sys.modules\n"
        "print(json.dumps(out))\n")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out.pop("__jax__") is False
    assert sorted(out) == ["count", "embed", "layers.q", "stack.0"]
    assert out["embed"][0] == "bfloat16"
    np.testing.assert_array_equal(np.asarray(out["embed"][2]), _bf16(tree["embed"]).astype(np.float64).ravel())
    np.testing.assert_array_equal(np.asarray(out["layers.q"][2]),
                                  _bf16(tree["layers"]["q"]).astype(np.float64).ravel())
    assert out["count"] == ["int32", [], [7.0]]


def test_wait_for_version(tmp_path):
    d = str(tmp_path)
    with pytest.raises(TimeoutError, match="version 1"):
        ws.wait_for_version(d, 1, timeout_s=0.2)
    threading.Timer(0.3, lambda: ws.publish(_tree(), d, 1)).start()
    assert ws.wait_for_version(d, 1, timeout_s=30) == ws.version_path(d, 1)


def test_publish_float32_roundtrip_is_bit_exact_and_records_dtype(tmp_path):
    tree = _tree()
    stats = ws.publish(tree, str(tmp_path), 1, dtype="float32")
    assert stats.bytes == 4 * (16 * 8 + 2 * 8 * 4 + 3) + 4  # float32 floats + one int32
    loaded, _ = ws.load(str(tmp_path))
    for got, want in ((loaded["embed"], tree["embed"]), (loaded["layers"]["q"], tree["layers"]["q"])):
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got.view(np.uint32), np.asarray(want).view(np.uint32))
    assert json.load(open(tmp_path / "1" / ws.SYNC_FILE))["dtype"] == "float32"
    with pytest.raises(ValueError, match="dtype"):
        ws.publish(tree, str(tmp_path), 2, dtype="float16")


def test_publish_default_writes_the_params_own_dtype(tmp_path):
    """A direct caller (no dtype) gets back exactly the weights it published: float32 stays float32
    bit for bit (main cast to bfloat16 by default, unlike the trainer, which passes its compute
    dtype), bfloat16 stays bfloat16, and the recorded dtype says which."""
    tree = _tree()
    stats = ws.publish(tree, str(tmp_path), 1)
    assert stats.bytes == 4 * (16 * 8 + 2 * 8 * 4 + 3) + 4
    loaded, _ = ws.load(str(tmp_path))
    for got, want in ((loaded["embed"], tree["embed"]), (loaded["stack"][0], tree["stack"][0])):
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got.view(np.uint32), np.asarray(want).view(np.uint32))
    assert loaded["count"] == 7
    assert json.load(open(tmp_path / "1" / ws.SYNC_FILE))["dtype"] == "float32"
    half = {"w": jnp.asarray([1.0, 2.5, -3.0], jnp.bfloat16)}
    ws.publish(half, str(tmp_path), 2)
    loaded, _ = ws.load(str(tmp_path), 2)
    assert loaded["w"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(np.asarray(loaded["w"], np.float32), [1.0, 2.5, -3.0])
    assert json.load(open(tmp_path / "2" / ws.SYNC_FILE))["dtype"] == "bfloat16"


def _engine_vs_trainer_logprob_gap(tmp_path, publish_dtype):
    """Issue 9 §1 input: the embedded default policy, 8 arithmetic prompts x 4 samples, T = 1,
    seed 0. The trainer's float32 params are published in `publish_dtype` and loaded into a
    float32 engine (the CPU scale's sidecar); returns max |log pi_old - log mu| over the sampled
    tokens, pi_old computed by the trainer's own code on the packed batch."""
    from jaxrl.envs import DEFAULT_POLICY_DIR, ChatTemplate, RolloutConfig, get_task_suite, run_rollouts
    from jaxrl.models import hf_io, qwen3
    from jaxrl.rollout.sampler import Sampler
    from jaxrl.rollout.types import SamplingParams
    from jaxrl.train import step as step_lib
    from jaxrl.train.trainer import pack_trajectories

    cfg = qwen3.Qwen3Config.from_pretrained(DEFAULT_POLICY_DIR, dtype="float32")
    _, params = hf_io.load_hf_checkpoint(DEFAULT_POLICY_DIR, cfg)
    engine = Sampler(params, cfg, max_seq_len=256, max_batch_rows=32)
    sync = str(tmp_path / f"sync_{publish_dtype}")
    ws.publish(params, sync, 0, dtype=publish_dtype)
    engine.load_version(ws.version_path(sync, 0), 0)
    chat = ChatTemplate.from_pretrained(DEFAULT_POLICY_DIR, enable_thinking=False)
    tasks = get_task_suite("arithmetic").dataset("train", num=8, seed=0)
    trajs = run_rollouts(engine, chat, tasks, SamplingParams(temperature=1.0, seed=0),
                         RolloutConfig(n_samples_per_prompt=4, max_turns=1, max_tokens_per_turn=16, max_seq_len=256))
    batch = pack_trajectories(trajs, np.zeros(len(trajs), np.float32), (64, 128, 256))
    lp, _ = step_lib.sequence_logprobs(params, cfg, batch["tokens"], batch["positions"], batch["segment_ids"],
                                       temperature=1.0, chunk_size=1024)
    mask = batch["loss_mask"] > 0
    assert mask.sum() >= 32 * 2
    return float(np.max(np.abs(np.asarray(lp) - batch["rollout_logprobs"])[mask]))


def test_engine_and_trainer_logprobs_agree_when_published_in_the_engine_dtype(tmp_path):
    """Regression (issue 9 §1): versions were always published as bf16, so the float32 engine
    sampled from rounded weights (gap 3.1e-2). Published in the engine's dtype the gap is float
    noise (measured 3.8e-6); bf16 publication keeps the old gap (> 1e-2), which shows the check
    can fail."""
    assert _engine_vs_trainer_logprob_gap(tmp_path, "float32") <= 1e-4
    assert _engine_vs_trainer_logprob_gap(tmp_path, "bfloat16") > 1e-2


def test_a_damaged_version_is_described_by_its_cause_without_tensorstore_specs(tmp_path):
    """Regression: a load error carried TensorStore's JSON specs (kilobytes per array) into the
    sidecar's one-line HTTP error and the trainer's warnings; the cause was cut off."""
    from jaxrl.fileio import without_tensorstore_noise
    from jaxrl.rollout.server import _describe

    ws.publish(_tree(), str(tmp_path), 1)
    data = [os.path.join(r, n) for r, _, ns in os.walk(tmp_path / "1") for n in ns if os.path.basename(r) == "d"]
    assert data
    for f in data:
        os.truncate(f, os.path.getsize(f) // 2)
    from jaxrl.train.checkpoint import collect_unraisable

    with collect_unraisable(), pytest.raises(Exception) as e:  # Orbax's per-array reports of the failed read
        ws.load(str(tmp_path), 1)
    raw = str(e.value)
    assert "tensorstore_spec" in raw  # what the library says (else this test checks nothing)
    for text in (without_tensorstore_noise(raw), _describe(e.value)):
        assert "tensorstore_spec" not in text and 'Error opening "' not in text, text
        assert "is not valid for value of size" in text and len(text) < 600, text
