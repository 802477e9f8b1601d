"""Mesh construction, logical-axis shardings, and sharded loss/grad parity on 8 fake CPU devices."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxrl import parallel
from jaxrl.models import qwen3
from jaxrl.models.qwen3 import Qwen3Config

# Tiny dims that divide every tested mesh axis (fsdp up to 8, tensor up to 2).
CFG = Qwen3Config.preset("tiny", num_attention_heads=4, num_key_value_heads=2, head_dim=16)


def test_make_mesh_resolves_minus_one_and_rejects_bad_shapes():
    assert jax.device_count() == 8
    m = parallel.make_mesh(data=2, fsdp=-1, tensor=2)
    assert m.axis_names == ("data", "fsdp", "tensor") and dict(m.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert parallel.resolve_mesh_shape(7, -1, 1, 56) == (7, 8, 1)
    with pytest.raises(ValueError, match="16 devices, but 8"):
        parallel.make_mesh(2, 4, 2)
    with pytest.raises(ValueError, match="at most one"):
        parallel.make_mesh(-1, -1, 1)
    with pytest.raises(ValueError, match="does not divide"):
        parallel.make_mesh(3, -1, 1)


def test_non_dividing_mesh_error_names_param_axis_and_suggests_shapes():
    axes, shapes = qwen3.param_logical_axes(CFG), qwen3.abstract_params(CFG)
    mesh = parallel.make_mesh(1, 1, 8)  # 4 query heads / 2 kv heads cannot split 8 ways
    with pytest.raises(parallel.ShardingError) as e:
        parallel.param_shardings(axes, mesh, shapes)
    msg = str(e.value)
    assert "layers.q_proj dim 2" in msg and "'heads'" in msg and "size 4" in msg and "'tensor'" in msg
    assert "layers.k_proj" in msg and "'kv_heads'" in msg
    assert "data=1 x fsdp=8 x tensor=1" in msg  # a valid alternative over the same 8 devices


def test_qwen3_8b_on_56_devices_needs_hsdp():
    cfg = Qwen3Config.preset("8B")
    axes, shapes = qwen3.param_logical_axes(cfg), qwen3.abstract_params(cfg)
    good = parallel.suggest_mesh_shapes(shapes, axes, 56, limit=100)
    # 56 = 7 * 8 and no Qwen3-8B dimension is divisible by 7: the 7 must go to data.
    assert good[0] == (7, 8, 1)
    assert all(d % 7 == 0 for d, _, _ in good)
    assert (1, 56, 1) not in good and (1, 7, 8) not in good


def _loss(params, cfg, batch):
    lp, _ = qwen3.logprobs(params, cfg, batch["tokens"], batch["positions"], batch["segment_ids"], chunk_size=8)
    m = batch["loss_mask"]
    return -jnp.sum(jnp.where(m, lp, 0.0)) / jnp.sum(m)


def _batch():
    rng = np.random.default_rng(0)
    B, T = 8, 16
    lens = rng.integers(5, T + 1, B)
    seg = (np.arange(T)[None] < lens[:, None]).astype(np.int32)
    return {"tokens": (rng.integers(0, CFG.vocab_size, (B, T)) * seg).astype(np.int32),
            "positions": np.tile(np.arange(T, dtype=np.int32), (B, 1)),
            "segment_ids": seg, "loss_mask": seg[:, 1:] * seg[:, :-1] > 0}


def _params():
    rng = np.random.default_rng(1)
    return jax.tree.map(lambda s: (0.1 * rng.standard_normal(s.shape)).astype(np.float32),
                        qwen3.abstract_params(CFG))


@pytest.fixture(scope="module")
def reference():
    params = _params()
    loss, grads = jax.jit(jax.value_and_grad(_loss), static_argnums=1)(params, CFG, _batch())
    return params, loss, grads


@pytest.mark.parametrize("shape", [(8, 1, 1), (1, 8, 1), (2, 2, 2), (1, 4, 2)])
def test_sharded_loss_and_grads_match_single_device(reference, shape):
    params, ref_loss, ref_grads = reference
    mesh = parallel.make_mesh(*shape)
    cfg = CFG.replace(remat="full")
    psh = parallel.param_shardings(qwen3.param_logical_axes(cfg), mesh, params)
    sharded = jax.device_put(params, psh)
    batch = parallel.shard_batch(_batch(), mesh)
    assert batch["tokens"].sharding.spec == P(("data", "fsdp"), None)
    fn = jax.jit(jax.value_and_grad(_loss), static_argnums=1, out_shardings=(NamedSharding(mesh, P()), psh))
    with jax.set_mesh(mesh):
        loss, grads = fn(sharded, cfg, batch)
    assert abs(float(loss) - float(ref_loss)) <= 1e-5 * abs(float(ref_loss))
    for path, g, r in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        g, r = np.asarray(g), np.asarray(r)
        assert np.abs(g - r).max() <= 1e-5 * np.abs(r).max(), path[0]


def test_opt_state_shardings_follow_params():
    mesh = parallel.make_mesh(1, 4, 2)
    abs_params = qwen3.abstract_params(CFG)
    psh = parallel.param_shardings(qwen3.param_logical_axes(CFG), mesh, abs_params)
    tx = optax.adamw(1e-3)
    abs_opt = jax.eval_shape(tx.init, abs_params)
    osh = parallel.opt_state_shardings(abs_opt, abs_params, psh, mesh)
    adam = osh[0]
    assert adam.mu == psh and adam.nu == psh
    assert adam.count == NamedSharding(mesh, P())
    params = qwen3.init_params(CFG, seed=0, shardings=psh)  # created sharded
    assert params["layers"]["o_proj"].sharding == psh["layers"]["o_proj"]
    assert abs(float(np.std(np.asarray(params["layers"]["gate_proj"]))) - 0.02) < 2e-3  # N(0, 0.02^2)
    np.testing.assert_array_equal(np.asarray(params["norm"]["scale"]), 1.0)
    opt = jax.jit(tx.init, out_shardings=osh)(params)
    assert opt[0].mu["layers"]["gate_proj"].sharding.spec == P(None, "fsdp", "tensor")


def test_shard_batch_rejects_non_dividing_batch():
    mesh = parallel.make_mesh(2, 4, 1)
    with pytest.raises(ValueError, match="'tokens' has 6 rows.*data x fsdp = 8"):
        parallel.shard_batch({"tokens": np.zeros((6, 4), np.int32)}, mesh)


def test_maybe_initialize_distributed_single_process_and_bad_env(monkeypatch):
    for k in ("JAXRL_COORDINATOR_ADDRESS", "JAXRL_NUM_PROCESSES", "JAXRL_PROCESS_ID", "SLURM_NTASKS"):
        monkeypatch.delenv(k, raising=False)
    assert parallel.maybe_initialize_distributed() is False
    monkeypatch.setenv("JAXRL_COORDINATOR_ADDRESS", "127.0.0.1:1234")
    with pytest.raises(ValueError, match="JAXRL_NUM_PROCESSES and JAXRL_PROCESS_ID"):
        parallel.maybe_initialize_distributed()
