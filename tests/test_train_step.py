"""The compiled train step: micro-batch accumulation, REINFORCE gradient, skipped non-finite updates."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxrl.models import qwen3
from jaxrl.rl import losses
from jaxrl.train import step as step_lib

CFG = qwen3.Qwen3Config.preset("tiny")


def _batch(n=8, t=12, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, CFG.vocab_size, size=(n, t)).astype(np.int32)
    lengths = rng.integers(5, t + 1, size=n)
    seg = (np.arange(t)[None, :] < lengths[:, None]).astype(np.int32)
    pos = np.maximum(np.cumsum(seg, axis=1) - 1, 0).astype(np.int32)
    prompt = 3
    loss_mask = np.zeros((n, t - 1), np.int32)
    for i, L in enumerate(lengths):
        loss_mask[i, prompt - 1:L - 1] = 1  # predict tokens prompt..L-1
    adv = np.repeat(rng.normal(size=(n, 1)), t - 1, axis=1).astype(np.float32) * loss_mask
    return dict(tokens=tokens, positions=pos, segment_ids=seg, loss_mask=loss_mask, advantages=adv)


def _with_old_logprobs(params, batch):
    lp, _ = step_lib.sequence_logprobs(params, CFG, batch["tokens"], batch["positions"], batch["segment_ids"],
                                       temperature=1.0, chunk_size=5)
    return dict(batch, old_logprobs=np.asarray(lp))


def test_gradient_is_invariant_to_micro_batching_and_equals_reinforce():
    params = qwen3.init_params(CFG, seed=1)
    batch = _with_old_logprobs(params, _batch())
    # The reduction only enters through the mini-batch weights, so one compiled step per K serves
    # all three reductions.
    scfg_loss = losses.LossConfig(eps_clip_low=0.2, eps_clip_high=0.05)
    fns = {k: jax.jit(lambda p, b, w, k=k: step_lib.accumulate_gradients(
        p, b, w, CFG, step_lib.StepConfig(loss=scfg_loss, num_micro_batches=k, chunk_size=5))) for k in (1, 2, 4)}
    m = batch["loss_mask"].astype(np.float64)
    hand_weights = {
        "token_mean": m / m.sum(),
        "sequence_mean": m / (m.shape[0] * np.maximum(m.sum(1, keepdims=True), 1)),
        "seq_mean_token_sum_norm": m / (m.shape[0] * 40),
    }

    def reinforce(p, w):
        lp, _ = step_lib.sequence_logprobs(p, CFG, batch["tokens"], batch["positions"], batch["segment_ids"],
                                           temperature=1.0, chunk_size=5)
        return -jnp.sum(w * batch["advantages"] * lp)

    reinforce_grad = jax.jit(jax.grad(reinforce))
    for reduction, w in hand_weights.items():
        lcfg = losses.LossConfig(loss_reduction=reduction, max_seq_len=40)
        weights = losses.compute_loss_weights(batch["loss_mask"], lcfg)
        np.testing.assert_allclose(np.asarray(weights.policy), w, rtol=1e-6)
        grads = {k: fns[k](params, batch, weights)[0] for k in (1, 2, 4)}
        for k in (2, 4):
            for a, b in zip(jax.tree.leaves(grads[1]), jax.tree.leaves(grads[k])):
                np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-7)
        # On-policy (ratio 1) PPO gradient = REINFORCE gradient of -sum_t w_t A_t log pi(t).
        expected = reinforce_grad(params, jnp.asarray(w, jnp.float32))
        for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(grads[1])):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-7)


def test_non_finite_gradient_skips_update_and_counts_it():
    params = qwen3.init_params(CFG, seed=2)
    batch = _with_old_logprobs(params, _batch(seed=3))
    lcfg = losses.LossConfig()
    weights = losses.compute_loss_weights(batch["loss_mask"], lcfg)
    tx, sched = step_lib.make_optimizer(1e-3, 10, max_grad_norm=1.0)
    opt_state = tx.init(params)
    scfg = step_lib.StepConfig(loss=lcfg, num_micro_batches=2, chunk_size=8)
    fn = jax.jit(lambda p, o, b, w: step_lib.train_step(p, o, b, w, model_cfg=CFG, step_cfg=scfg, tx=tx, schedule=sched))

    p1, o1, met = fn(params, opt_state, batch, weights)
    assert float(met["update_skipped"]) == 0.0 and np.isfinite(float(met["grad_norm"]))
    assert float(met["lr"]) == pytest.approx(1e-3)
    changed = [not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(params))]
    assert all(changed)

    bad = dict(batch)
    adv = batch["advantages"].copy()
    i, j = np.argwhere(batch["loss_mask"] == 1)[0]
    adv[i, j] = np.inf  # a corrupt advantage on a trained token: the gradient is not finite
    bad["advantages"] = adv
    p2, o2, met2 = fn(p1, o1, bad, weights)
    assert float(met2["update_skipped"]) == 1.0 and not np.isfinite(float(met2["grad_norm"]))
    for a, b in zip(jax.tree.leaves((p2, o2)), jax.tree.leaves((p1, o1))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # Training continues: the next finite step updates again.
    p3, _, met3 = fn(p2, o2, batch, weights)
    assert float(met3["update_skipped"]) == 0.0
    assert not np.array_equal(np.asarray(p3["embed_tokens"]), np.asarray(p2["embed_tokens"]))


def test_schedule_warmup_then_cosine():
    s = step_lib.make_schedule(1.0, total_steps=12, warmup_steps=2, kind="cosine")
    assert float(s(0)) == 0.0 and float(s(1)) == pytest.approx(0.5)
    assert float(s(2)) == pytest.approx(1.0)
    # cosine over the remaining 10 steps: 0.5 * (1 + cos(pi * 5 / 10)) = 0.5 at step 7
    assert float(s(7)) == pytest.approx(0.5, abs=1e-6)
    with pytest.raises(ValueError, match="schedule"):
        step_lib.make_schedule(1.0, 10, kind="linear")


def _compiled_train_step(T: int, attention: str = "xla"):
    """AOT-compiled train step of a 1-layer model (remat full) on one [1, T] row; no execution."""
    import re

    cfg = qwen3.Qwen3Config.preset("tiny", num_hidden_layers=1, dtype="float32", remat="full", attention=attention)
    params = qwen3.abstract_params(cfg)
    tx, sched = step_lib.make_optimizer(1e-3, 10)
    scfg = step_lib.StepConfig(loss=losses.LossConfig(), num_micro_batches=1, chunk_size=1024)
    i32 = jax.ShapeDtypeStruct((1, T), jnp.int32)
    f32 = jax.ShapeDtypeStruct((1, T - 1), jnp.float32)
    batch = dict(tokens=i32, positions=i32, segment_ids=i32, loss_mask=jax.ShapeDtypeStruct((1, T - 1), jnp.int32),
                 advantages=f32, old_logprobs=f32)
    weights = losses.LossWeights(policy=f32, token=f32, sequence_token=f32,
                                 sequence=jax.ShapeDtypeStruct((1,), jnp.float32))
    fn = jax.jit(lambda p, o, b, w: step_lib.train_step(p, o, b, w, model_cfg=cfg, step_cfg=scfg, tx=tx, schedule=sched))
    compiled = fn.lower(params, jax.eval_shape(tx.init, params), batch, weights).compile()
    # Every array shape in the optimized HLO with at least two dimensions >= T (a [T, T] buffer).
    shapes = set(re.findall(r"\b(?:f32|bf16|f16|pred|s32|u8)\[[0-9,]+\]", compiled.as_text()))
    quadratic = sorted(s for s in shapes if sum(int(d) >= T for d in s[s.index("[") + 1:-1].split(",")) >= 2)
    return compiled.memory_analysis().temp_size_in_bytes, quadratic


def test_attention_memory_is_linear_in_sequence_length():
    """Regression: the training forward built a dense [B, T, T] mask and [B, H, T, T] scores
    (65.7 GiB of temporaries at T = 32k for this 1-layer model, 16x the 8k figure)."""
    temp_8k, quad_8k = _compiled_train_step(8192)
    temp_32k, quad_32k = _compiled_train_step(32768)
    assert quad_8k == [] and quad_32k == [], (quad_8k, quad_32k)
    # 4x the tokens: linear growth gives a ratio <= 4 (fixed costs make it smaller); T^2 gives 16.
    assert 2.0 <= temp_32k / temp_8k <= 4.5, (temp_8k, temp_32k)
    assert temp_32k < 512 * 2**20  # measured 253 MiB; the dense mask alone would be 1 GiB


def test_optimizer_offload_to_pinned_host_gives_identical_steps():
    """trainer.optimizer.offload: Adam moments (and the fp32 master) kept in pinned host memory
    between steps, streamed to the device for the update; same numbers as device-resident state."""
    from jaxrl import parallel

    mesh = parallel.make_mesh(1, 2, 1, devices=jax.devices()[:2])
    psh = parallel.param_shardings(qwen3.param_logical_axes(CFG), mesh)
    params0 = qwen3.init_params(CFG, seed=4, shardings=psh)
    batch = _with_old_logprobs(params0, _batch(seed=5))
    lcfg = losses.LossConfig()
    weights = losses.compute_loss_weights(batch["loss_mask"], lcfg)
    tx, sched = step_lib.make_optimizer(1e-3, 10)
    results = {}
    for offload in ("none", "moments_and_master"):  # the latter runs both the moments and the master path
        moments_host, master_host = step_lib.offloaded(offload)
        osh = parallel.opt_state_shardings(jax.eval_shape(tx.init, params0), params0, psh, mesh,
                                           "pinned_host" if moments_host else None)
        state_psh = parallel.with_memory_kind(psh, "pinned_host" if master_host else None)
        p = jax.tree.map(lambda x, s: jax.device_put(np.asarray(x), s), params0, state_psh)
        o = jax.jit(tx.init, out_shardings=osh)(p)
        scfg = step_lib.StepConfig(loss=lcfg, num_micro_batches=2, chunk_size=8, offload=offload)
        fn = jax.jit(lambda p, o, b, w: step_lib.train_step(p, o, b, w, model_cfg=CFG, step_cfg=scfg, tx=tx,
                                                            schedule=sched),
                     out_shardings=(state_psh, osh, None), donate_argnums=(0, 1))
        with jax.set_mesh(mesh):
            b = parallel.shard_batch(batch, mesh)
            for _ in range(2):
                p, o, met = fn(p, o, b, weights)
        assert {x.sharding.memory_kind for x in jax.tree.leaves(p)} == {"pinned_host" if master_host else "device"}
        mu = optax.tree_utils.tree_get(o, "mu")
        assert {x.sharding.memory_kind for x in jax.tree.leaves(mu)} == {"pinned_host" if moments_host else "device"}
        results[offload] = (p, o)
    for a, b in zip(jax.tree.leaves(results["moments_and_master"]), jax.tree.leaves(results["none"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="offload"):
        step_lib.StepConfig(loss=lcfg, offload="gpu")


def _dot_operand_dtypes(jaxpr, out):
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            out.add((str(eqn.invars[0].aval.dtype), str(eqn.invars[1].aval.dtype)))
        for v in eqn.params.values():
            for x in (v if isinstance(v, (tuple, list)) else [v]):
                j = getattr(x, "jaxpr", x)
                if hasattr(j, "eqns"):
                    _dot_operand_dtypes(j, out)
    return out


def test_bf16_train_step_has_only_bf16_matmuls():
    """Regression: the lm-head backward multiplied the float32 logits cotangent with the bf16 head
    (a mixed float32 x bfloat16 matmul, which XLA runs as a float32 GEMM)."""
    cfg = qwen3.Qwen3Config.preset("tiny", dtype="bfloat16", remat="full")
    params = qwen3.abstract_params(cfg)
    tx, sched = step_lib.make_optimizer(1e-3, 10)
    scfg = step_lib.StepConfig(loss=losses.LossConfig(), num_micro_batches=2, chunk_size=8)
    i32 = jax.ShapeDtypeStruct((4, 24), jnp.int32)
    f32 = jax.ShapeDtypeStruct((4, 23), jnp.float32)
    batch = dict(tokens=i32, positions=i32, segment_ids=i32, loss_mask=jax.ShapeDtypeStruct((4, 23), jnp.int32),
                 advantages=f32, old_logprobs=f32)
    weights = losses.LossWeights(policy=f32, token=f32, sequence_token=f32,
                                 sequence=jax.ShapeDtypeStruct((4,), jnp.float32))
    jaxpr = jax.make_jaxpr(lambda p, o, b, w: step_lib.train_step(p, o, b, w, model_cfg=cfg, step_cfg=scfg, tx=tx,
                                                                  schedule=sched))(
        params, jax.eval_shape(tx.init, params), batch, weights)
    assert _dot_operand_dtypes(jaxpr.jaxpr, set()) == {("bfloat16", "bfloat16")}
