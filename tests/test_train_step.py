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


def _abstract_inputs(B: int, T: int):
    """(batch, loss weights) of a [B, T] train step as ShapeDtypeStructs (for tracing / AOT compiles)."""
    i32 = jax.ShapeDtypeStruct((B, T), jnp.int32)
    f32 = jax.ShapeDtypeStruct((B, T - 1), jnp.float32)
    batch = dict(tokens=i32, positions=i32, segment_ids=i32, loss_mask=jax.ShapeDtypeStruct((B, T - 1), jnp.int32),
                 advantages=f32, old_logprobs=f32)
    weights = losses.LossWeights(policy=f32, token=f32, sequence_token=f32,
                                 sequence=jax.ShapeDtypeStruct((B,), jnp.float32))
    return batch, weights


def _step_fn(cfg, scfg, tx, sched):
    """`(params, opt_state, batch, weights) -> step_lib.train_step(...)` for `cfg` and `scfg`."""
    return lambda p, o, b, w: step_lib.train_step(p, o, b, w, model_cfg=cfg, step_cfg=scfg, tx=tx, schedule=sched)


def _step_jaxpr(cfg, scfg, B: int, T: int):
    """The jaxpr of one train step (lr 1e-3, 10 steps) of `cfg` on abstract [B, T] inputs."""
    params = qwen3.abstract_params(cfg)
    tx, sched = step_lib.make_optimizer(1e-3, 10)
    batch, weights = _abstract_inputs(B, T)
    return jax.make_jaxpr(_step_fn(cfg, scfg, tx, sched))(params, jax.eval_shape(tx.init, params), batch,
                                                          weights).jaxpr


# One compiled program (op-by-op dispatch of the chunked forward took longer); the same [8, 12]
# shapes in every test that uses it, so it compiles once per session.
_old_logprobs = jax.jit(lambda p, tokens, positions, segment_ids: step_lib.sequence_logprobs(
    p, CFG, tokens, positions, segment_ids, temperature=1.0, chunk_size=5)[0])


def _with_old_logprobs(params, batch):
    lp = _old_logprobs(params, batch["tokens"], batch["positions"], batch["segment_ids"])
    return dict(batch, old_logprobs=np.asarray(lp))


def test_gradient_is_invariant_to_micro_batching_and_save_probs_and_equals_reinforce():
    """For each loss reduction (weights checked by hand): the accumulated gradient is the same for
    1, 4 and 2 micro-batches, the last with model.logprobs_save_probs on (loss and entropy too),
    float32 rounding only; and, independently, it equals jax.grad of the REINFORCE objective
    -sum_t w_t A_t log pi(t) with a full-vocabulary log_softmax of the model's logits (on-policy
    PPO: ratio 1). (One test: the compiled steps serve every reduction; three variants, one compile
    each, cover 1 / 2 / 4 micro-batches and save_probs.)"""
    params = qwen3.init_params(CFG, seed=1)
    batch = _with_old_logprobs(params, _batch())
    # The reduction only enters through the mini-batch weights, so one compiled step per
    # (K, save_probs) serves all three reductions.
    scfg_loss = losses.LossConfig(eps_clip_low=0.2, eps_clip_high=0.05)
    variants = ((1, False), (4, False), (2, True))
    fns = {(k, save): jax.jit(lambda p, b, w, k=k, save=save: step_lib.accumulate_gradients(
        p, b, w, CFG, step_lib.StepConfig(loss=scfg_loss, num_micro_batches=k, chunk_size=5, save_probs=save)))
        for k, save in variants}
    m = batch["loss_mask"].astype(np.float64)
    hand_weights = {
        "token_mean": m / m.sum(),
        "sequence_mean": m / (m.shape[0] * np.maximum(m.sum(1, keepdims=True), 1)),
        "seq_mean_token_sum_norm": m / (m.shape[0] * 40),
    }

    def reinforce(p, w):
        z = qwen3.forward(p, CFG, batch["tokens"], batch["positions"], batch["segment_ids"])[:, :-1]
        lp = jnp.take_along_axis(jax.nn.log_softmax(z), batch["tokens"][:, 1:, None], -1)[..., 0]
        return -jnp.sum(w * batch["advantages"] * lp)

    reinforce_grad = jax.jit(jax.grad(reinforce))
    for reduction, w in hand_weights.items():
        lcfg = losses.LossConfig(loss_reduction=reduction, max_seq_len=40)
        weights = losses.compute_loss_weights(batch["loss_mask"], lcfg)
        np.testing.assert_allclose(np.asarray(weights.policy), w, rtol=1e-6)
        out = {v: fns[v](params, batch, weights) for v in variants}
        for v in variants[1:]:
            for a, b in zip(jax.tree.leaves(out[1, False][0]), jax.tree.leaves(out[v][0])):
                np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-7)
        for name in ("loss", "entropy"):
            np.testing.assert_allclose(float(out[2, True][1][name]), float(out[1, False][1][name]), rtol=1e-5)
        expected = jax.tree.leaves(reinforce_grad(params, jnp.asarray(w, jnp.float32)))
        for v in ((1, False), (2, True)):
            for a, b in zip(expected, jax.tree.leaves(out[v][0])):
                np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-7)


def test_non_finite_gradient_skips_update_and_counts_it():
    params = qwen3.init_params(CFG, seed=2)
    batch = _with_old_logprobs(params, _batch(seed=3))
    lcfg = losses.LossConfig()
    weights = losses.compute_loss_weights(batch["loss_mask"], lcfg)
    tx, sched = step_lib.make_optimizer(1e-3, 10, max_grad_norm=1.0)
    opt_state = tx.init(params)
    scfg = step_lib.StepConfig(loss=lcfg, num_micro_batches=2, chunk_size=8)
    fn = jax.jit(_step_fn(CFG, scfg, tx, sched))

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


def _traj(prompt, response, reward, stop_reason, group_id, logprobs=None, info=None):
    from jaxrl.envs import Trajectory

    r = len(response)
    lp = np.full(r, -1.0, np.float32) if logprobs is None else np.asarray(logprobs, np.float32)
    t = Trajectory(prompt_ids=np.asarray(prompt, np.int32), response_ids=np.asarray(response, np.int64),
                   loss_mask=np.ones(r, np.int32), rollout_logprobs=lp, reward=reward, stop_reason="stop",
                   group_id=group_id, policy_version=0, num_turns=1, info=dict(info or {}))
    t.stop_reason = stop_reason  # "invalid_output" is set by the rollout loop (envs), not validated here
    return t


def test_env_error_and_invalid_output_trajectories_leave_the_loss_and_the_baselines():
    """Regression (issue 9 §3/§7): env_error trajectories kept loss mask 1 and counted in the
    reduction denominators; an engine's invalid output (NaN logprob, out-of-vocabulary id) went
    into the batch. Excluded trajectories must have loss mask 0, not count as sequences, not be in
    any advantage baseline, and their response must never reach the model."""
    from jaxrl.rl import advantages as adv_lib
    from jaxrl.train import trainer

    p = [5, 6, 7]
    trajs = [
        _traj(p, [10, 11, 12], 1.0, "stop", 0),
        _traj(p, [13, 14], 0.0, "stop", 0),
        _traj(p, [15, 16, 17, 18], 0.7, "env_error", 0, info={"error": "ValueError: sandbox gone"}),
        _traj(p, [19, 10 ** 6], 1.0, "invalid_output", 0, logprobs=[-1.0, np.nan]),
        _traj(p, [20, 21], 0.0, "stop", 1), _traj(p, [22], 1.0, "length", 1),
        _traj(p, [23, 24, 25], 0.0, "stop", 1), _traj(p, [26, 27], 1.0, "stop", 1),
    ]
    rewards, adv, batch = trainer.training_batch(trajs, adv_lib.AdvantageConfig(advantage_estimator="rloo_n"),
                                                 (16,))
    # RLOO by hand over the eligible members only: group 0 = {1.0, 0.0}, group 1 = {0, 1, 0, 1}.
    np.testing.assert_allclose(adv, [1.0, -1.0, 0.0, 0.0, -2 / 3, 2 / 3, -2 / 3, 2 / 3], rtol=1e-6)
    np.testing.assert_array_equal(batch["sequence_mask"], [1, 1, 0, 0, 1, 1, 1, 1])
    tokens_per_row = batch["loss_mask"].sum(axis=1)
    np.testing.assert_array_equal(tokens_per_row, [3, 2, 0, 0, 2, 1, 3, 2])
    for i in (2, 3):  # only the prompt is fed to the model; nothing of the response
        np.testing.assert_array_equal(batch["tokens"][i], p + [0] * 13)
        assert batch["segment_ids"][i].sum() == 3
        assert not batch["advantages"][i].any() and not batch["rollout_logprobs"][i].any()
    assert np.isfinite(batch["rollout_logprobs"]).all() and batch["tokens"].max() < 10 ** 6
    # Denominators: 6 sequences, 13 tokens (not 8 and 19).
    m = batch["loss_mask"].astype(np.float64)
    s = batch["sequence_mask"].astype(np.float64)
    want = {"token_mean": m / 13.0,
            "sequence_mean": m * s[:, None] / (6 * np.maximum(m.sum(1, keepdims=True), 1))}
    for reduction, w in want.items():
        got = losses.compute_loss_weights(batch["loss_mask"], losses.LossConfig(loss_reduction=reduction),
                                          sequence_mask=batch["sequence_mask"])
        np.testing.assert_allclose(np.asarray(got.policy), w, rtol=1e-6)


def _compiled_train_step(T: int, attention: str = "xla"):
    """AOT-compiled train step of a 1-layer model (remat full) on one [1, T] row; no execution."""
    import re

    cfg = qwen3.Qwen3Config.preset("tiny", num_hidden_layers=1, dtype="float32", remat="full", attention=attention)
    params = qwen3.abstract_params(cfg)
    tx, sched = step_lib.make_optimizer(1e-3, 10)
    scfg = step_lib.StepConfig(loss=losses.LossConfig(), num_micro_batches=1, chunk_size=1024)
    batch, weights = _abstract_inputs(1, T)
    fn = jax.jit(_step_fn(cfg, scfg, tx, sched))
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
        fn = jax.jit(_step_fn(CFG, scfg, tx, sched), out_shardings=(state_psh, osh, None), donate_argnums=(0, 1))
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


def _eqns_with_scans(jaxpr, lengths=()):
    """(equation, lengths of the scans around it) of every equation of a jaxpr, recursively."""
    for eqn in jaxpr.eqns:
        yield eqn, lengths
        inner = lengths + (eqn.params["length"],) if eqn.primitive.name == "scan" else lengths
        for v in eqn.params.values():
            for x in (v if isinstance(v, (tuple, list)) else [v]):
                j = getattr(x, "jaxpr", x)
                if hasattr(j, "eqns"):
                    yield from _eqns_with_scans(j, inner)


def _eqns(jaxpr):
    """Every equation of a jaxpr, recursively."""
    return (eqn for eqn, _ in _eqns_with_scans(jaxpr))


def _conds_under_scans(jaxpr):
    """(enclosing scan lengths, output avals) of every cond in a jaxpr, recursively."""
    return [(lengths, [str(v.aval) for v in eqn.outvars]) for eqn, lengths in _eqns_with_scans(jaxpr)
            if eqn.primitive.name == "cond"]


def test_cudnn_layout_is_checked_once_around_the_gradient(monkeypatch):
    """attention='cudnn' in the train step: one layout check per micro-batch selects the cuDNN
    program or the exact blocked one for the whole forward/backward pass. Regression: the check was
    a lax.cond in every layer, which, differentiated, made the cuDNN branch output zero-filled
    copies of the blocked branch's residuals. cuDNN needs a GPU, so jax.nn's XLA implementation of
    the same call stands in for it."""
    from functools import partial

    from jaxrl.models import attention

    stand_in = partial(attention.cudnn_attention, implementation="xla")
    monkeypatch.setitem(attention.IMPLS, "cudnn", stand_in)
    monkeypatch.setitem(attention.IMPLS, "cudnn_no_fallback", partial(stand_in, fallback=False))
    cfg = CFG.replace(num_hidden_layers=5)
    params = qwen3.init_params(cfg, seed=6)
    right = _batch(seed=7)                      # right-padded rows: the cuDNN layout
    packed = dict(right, segment_ids=right["segment_ids"] * (1 + (np.arange(12) >= 4)))  # two sequences per row
    lcfg = losses.LossConfig()
    scfg = step_lib.StepConfig(loss=lcfg, num_micro_batches=1, chunk_size=16)
    batches = [dict(b, old_logprobs=np.zeros(b["loss_mask"].shape, np.float32)) for b in (right, packed)]
    weights = losses.compute_loss_weights(right["loss_mask"], lcfg)   # same loss mask in both

    def grads(attn):
        fn = jax.jit(lambda p, b: step_lib.accumulate_gradients(p, b, weights, cfg.replace(attention=attn), scfg)[0])
        return [jax.tree.leaves(fn(params, b)) for b in batches]

    g_xla, g_cudnn = grads("xla"), grads("cudnn")
    for gc, gx in zip(g_cudnn, g_xla):   # right-padded (the cuDNN branch) and packed (the blocked one)
        for x, y in zip(gc, gx):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-5, atol=1e-7)
    # No cond inside the scan over the 5 layers; one cond (one per micro-batch; here one) whose
    # outputs are the gradients and metrics only.
    acc = lambda c: (lambda p: step_lib.accumulate_gradients(p, batches[0], weights, c, scfg))
    cudnn_jaxpr = jax.make_jaxpr(acc(cfg.replace(attention="cudnn")))(params).jaxpr
    conds = _conds_under_scans(cudnn_jaxpr)
    assert [c for c in conds if 5 in c[0]] == []
    n_out = len(jax.tree.leaves(jax.eval_shape(acc(cfg), params)))
    assert len(conds) == 1 and len(conds[0][1]) == n_out
    # Branch 1 (taken when the layout fits) runs the cuDNN call, branch 0 the blocked kernel (its
    # block loops are while loops); `single_sequence_lengths` itself is tested in test_qwen3.py.
    cond = next(e for e in _eqns(cudnn_jaxpr) if e.primitive.name == "cond")
    loops = [sum(e.primitive.name == "while" for e in _eqns(b.jaxpr)) for b in cond.params["branches"]]
    assert loops[0] > 0 and loops[1] == 0, loops


def test_bf16_train_step_has_only_bf16_matmuls():
    """Regression: the lm-head backward multiplied the float32 logits cotangent with the bf16 head
    (a mixed float32 x bfloat16 matmul, which XLA runs as a float32 GEMM)."""
    cfg = qwen3.Qwen3Config.preset("tiny", dtype="bfloat16", remat="full")
    scfg = step_lib.StepConfig(loss=losses.LossConfig(), num_micro_batches=2, chunk_size=8)
    dtypes = {(str(e.invars[0].aval.dtype), str(e.invars[1].aval.dtype)) for e in _eqns(_step_jaxpr(cfg, scfg, 4, 24))
              if e.primitive.name == "dot_general"}
    assert dtypes == {("bfloat16", "bfloat16")}


def test_save_probs_drops_the_logits_recompute_from_the_train_step():
    """StepConfig.save_probs (model.logprobs_save_probs) reaches the loss: the step's jaxpr has the
    head's forward, dh and dw matmuls (dot_generals with a vocabulary-sized operand or output),
    without the recomputed logits."""
    cfg = qwen3.Qwen3Config.preset("tiny", vocab_size=997, dtype="bfloat16", remat="full")
    counts = {}
    for save in (False, True):
        scfg = step_lib.StepConfig(loss=losses.LossConfig(), chunk_size=8, save_probs=save)
        counts[save] = sum(e.primitive.name == "dot_general" and any(997 in v.aval.shape for v in [*e.invars, *e.outvars])
                           for e in _eqns(_step_jaxpr(cfg, scfg, 2, 16)))
    assert counts == {False: 4, True: 3}
