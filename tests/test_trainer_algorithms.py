"""The trainer's side of the algorithm options: token rewards in the packed batch, the step's
advantage stage (KL in the reward, every estimator), and the critic learner (init, value
forward, update, checkpoint round trip). Values by hand or by float64 numpy written here."""
import numpy as np
import pytest

import jax

from jaxrl import config as config_lib
from jaxrl import parallel
from jaxrl import rl
from jaxrl.envs import DEFAULT_POLICY_DIR, Trajectory
from jaxrl.models import critic as critic_model
from jaxrl.models import hf_io, qwen3
from jaxrl.train import advantage_stage, trainer
from jaxrl.train.checkpoint import CheckpointStore
from jaxrl.train.critic_learner import CriticLearner


def _traj(prompt, response, reward, group_id, loss_mask=None, stop_reason="stop"):
    r = len(response)
    t = Trajectory(prompt_ids=np.asarray(prompt, np.int32), response_ids=np.asarray(response, np.int32),
                   loss_mask=np.ones(r, np.int32) if loss_mask is None else np.asarray(loss_mask, np.int32),
                   rollout_logprobs=np.full(r, -1.0, np.float32), reward=reward, stop_reason="stop",
                   group_id=group_id, policy_version=0, num_turns=1)
    t.stop_reason = stop_reason
    return t


def test_pack_places_the_reward_on_the_last_generated_token():
    # prompt of 3; a two-turn response [gen gen obs obs gen obs]: the last generated token is index 4
    trajs = [_traj([1, 2, 3], [10, 11, 12, 13, 14, 15], 1.0, 0, loss_mask=[1, 1, 0, 0, 1, 0]),
             _traj([1, 2], [20, 21], 0.5, 0), _traj([1, 2], [30, 31, 32], 9.0, 1, stop_reason="env_error")]
    b = trainer.pack_trajectories(trajs, None, (16,))
    # target index of response token j is P - 1 + j
    expected = np.zeros((3, 15), np.float32)
    expected[0, 2 + 4] = 1.0
    expected[1, 1 + 1] = 0.5
    np.testing.assert_array_equal(b["token_rewards"], expected)  # the excluded row holds nothing
    np.testing.assert_array_equal(b["response_mask"][0], [0, 0] + [1] * 6 + [0] * 7)
    np.testing.assert_array_equal(b["response_mask"][2], np.zeros(15))
    np.testing.assert_array_equal(b["group_ids"], [0, 0, 1])
    np.testing.assert_array_equal(b["advantages"], np.zeros((3, 15)))


def test_step_advantages_with_kl_in_reward_and_gae():
    trajs = [_traj([1, 2], [5, 6, 7], 1.0, 0), _traj([1, 2], [5, 6], 0.0, 0), _traj([1, 2], [8], 1.0, 1),
             _traj([1, 2], [9, 9], 0.0, 1)]
    b = trainer.pack_trajectories(trajs, None, (8,))
    m = b["loss_mask"] > 0
    rng = np.random.default_rng(0)
    old = np.where(m, -rng.uniform(0.1, 2, m.shape), 0).astype(np.float32)
    ref = np.where(m, old + rng.normal(size=m.shape) * 0.3, 0).astype(np.float32)
    values = rng.normal(size=m.shape).astype(np.float32)
    cfg = rl.AdvantageConfig(advantage_estimator="gae", gamma=0.9, lambd=0.8)
    adv, ret, per_traj, metrics = advantage_stage.step_advantages(b, cfg, values=values, old_logprobs=old,
                                                                  ref_logprobs=ref, kl_coef=0.5, kl_estimator="k1")
    # float64 by hand: r_t = reward at the last token − 0.5·(old − ref) on loss tokens; GAE by a loop
    r = b["token_rewards"].astype(np.float64) - 0.5 * np.where(m, old - ref, 0.0)
    raw = np.zeros_like(r)
    for i in range(4):
        idx = np.flatnonzero(b["response_mask"][i])
        last, nv = 0.0, 0.0
        for t in idx[::-1]:
            last = r[i, t] + 0.9 * nv - values[i, t] + 0.9 * 0.8 * last
            raw[i, t], nv = last, values[i, t]
    white = (raw[m] - raw[m].mean()) / np.sqrt(raw[m].var(ddof=1) + 1e-8)
    np.testing.assert_allclose(adv[m], white, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ret, np.where(b["response_mask"] > 0, raw + values, 0), rtol=1e-5, atol=1e-5)
    kl = np.where(m, old - ref, 0.0)
    np.testing.assert_allclose(metrics["loss/avg_kl"], np.mean(kl.sum(1) / m.sum(1)), rtol=1e-5)
    assert metrics["loss/kl_loss_coef"] == 0.5
    ev = 1 - np.var(ret[m] - values[m]) / np.var(ret[m])
    np.testing.assert_allclose(metrics["critic/explained_variance"], ev, rtol=1e-4)
    np.testing.assert_allclose(per_traj, [adv[i][m[i]].mean() for i in range(4)], rtol=1e-6)
    # the adaptive controller moves beta by the step's KL (Ziegler et al.)
    c = config_lib.base_config()
    c.trainer.algorithm.kl_ctrl.type = "adaptive"
    c.trainer.algorithm.kl_ctrl.kl_target, c.trainer.algorithm.kl_ctrl.horizon = 0.01, 100
    err = np.clip(metrics["loss/avg_kl"] / 0.01 - 1, -0.2, 0.2)
    np.testing.assert_allclose(advantage_stage.next_kl_coef(c, 0.5, metrics, 4), 0.5 * (1 + err * 4 / 100))
    # without a critic or KL: the metrics of those options are absent (docs/recipes.md "Metrics")
    _, _, _, plain = advantage_stage.step_advantages(b, rl.AdvantageConfig())
    assert not [k for k in plain if k.startswith(("critic/", "loss/avg_kl", "loss/kl_loss_coef"))]


@pytest.fixture(scope="module")
def critic_learner():
    c = config_lib.base_config()
    c.trainer.algorithm.advantage_estimator = "gae"
    c.trainer.train_batch_size = c.trainer.mini_batch_size = 2
    c.generator.n_samples_per_prompt = 4
    c.trainer.micro_batch_size = 4
    c.trainer.critic.optimizer.lr = 1e-2
    learner = CriticLearner(c, parallel.make_mesh(1, 1, 1, devices=jax.devices()[:1]), DEFAULT_POLICY_DIR, 10)
    learner.init()
    return learner


def test_critic_learner_init_update_and_checkpoint(critic_learner, tmp_path):
    cl = critic_learner
    # the trunk is the policy checkpoint's, the head 0 -> V = 0
    _, policy = hf_io.load_hf_checkpoint(DEFAULT_POLICY_DIR, cl.model_cfg)
    np.testing.assert_array_equal(np.asarray(cl.params["embed_tokens"]), np.asarray(policy["embed_tokens"]))
    assert set(cl.params) == {"embed_tokens", "layers", "norm", critic_model.VALUE_HEAD}
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 100, (8, 12)).astype(np.int32)
    pos = np.tile(np.arange(12, dtype=np.int32), (8, 1))
    seg = np.ones_like(tokens)
    with jax.set_mesh(cl.mesh):
        v0 = np.asarray(cl.values(tokens, pos, seg))
    np.testing.assert_array_equal(v0, np.zeros((8, 11)))
    mask = np.zeros((8, 11), np.float32)
    mask[:, 4:] = 1
    returns = np.where(mask > 0, 1.0, 0.0).astype(np.float32)  # regress towards 1
    batch = dict(tokens=tokens, positions=pos, segment_ids=seg, loss_mask=mask, old_values=v0, returns=returns)
    weights = rl.compute_loss_weights(mask, rl.LossConfig())
    losses_seen = []
    with jax.set_mesh(cl.mesh):
        for _ in range(3):
            met = jax.device_get(cl.update(batch, weights))
            losses_seen.append(float(met["critic_loss"]))
    # step 1 at V = 0: ½·mean(1²) = 0.5 exactly; later steps: lower (V moves towards 1, clip 0.2)
    np.testing.assert_allclose(losses_seen[0], 0.5, rtol=1e-6)
    assert losses_seen[2] < losses_seen[1] < losses_seen[0]
    assert met["update_skipped"] == 0.0 and met["values_clipfrac"] >= 0.0
    # checkpoint round trip of the critic state as an extra item
    store = CheckpointStore(str(tmp_path), max_to_keep=2, async_save=False, extra_items=("critic",))
    saved = jax.device_get(cl.state())
    store.save(1, {"w": np.zeros(2, np.float32)}, {"m": np.zeros(2, np.float32)}, {"step": 1}, extras={"critic": cl.state()})
    store.wait()
    restored = store.restore_extra(1, "critic", cl.abstract_state())
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), restored, saved)
    with pytest.raises(ValueError, match="extra_items"):
        store.save(2, {"w": np.zeros(2, np.float32)}, {"m": np.zeros(2, np.float32)}, {"step": 2})
    store.close()


def test_learner_update_with_critic_kl_in_reward_and_a_covariance_loss():
    """One RL step of the learner (no sidecars): GAE from the critic's values, the KL penalty in
    the rewards, clip_cov's mini-batch selection; 2 mini-batches x 2 micro-batches. The stage's
    advantages equal a float64 recomputation from what the learner saw, both models move, and the
    metrics of the enabled options are there."""
    from jaxrl.train.learner import Learner

    c = config_lib.base_config()
    a = c.trainer.algorithm
    a.advantage_estimator, a.policy_loss_type = "gae", "clip_cov"
    a.clip_cov.clip_ratio, a.clip_cov.clip_cov_lb = 0.05, -10.0
    a.use_kl_loss, a.use_kl_in_reward, a.kl_loss_coef = False, True, 0.1
    c.trainer.train_batch_size, c.trainer.mini_batch_size, c.generator.n_samples_per_prompt = 4, 2, 2
    c.trainer.micro_batch_size = 2
    c.trainer.critic.optimizer.lr = 1e-3
    config_lib.validate(c)
    mesh = parallel.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    model_cfg = qwen3.Qwen3Config.from_pretrained(DEFAULT_POLICY_DIR)
    sh = parallel.param_shardings(qwen3.param_logical_axes(model_cfg), mesh, shapes=qwen3.abstract_params(model_cfg))
    learner = Learner(c, model_cfg, mesh, sh, sh, config_lib.loss_config(c))
    learner.build(1.0)
    learner.critic.init()
    with jax.set_mesh(mesh):
        _, params = hf_io.load_hf_checkpoint(DEFAULT_POLICY_DIR, model_cfg, shardings=sh)
        _, ref = hf_io.load_hf_checkpoint(DEFAULT_POLICY_DIR, model_cfg, shardings=sh)
        opt = learner.init_opt(params)
    rng = np.random.default_rng(0)
    trajs = [_traj(list(rng.integers(5, 200, 6)), list(rng.integers(5, 200, int(rng.integers(2, 7)))),
                   float(i % 3 == 0), i // 2) for i in range(8)]
    batch = trainer.pack_trajectories(trajs, None, (16,))
    embed0 = np.asarray(params["embed_tokens"]).copy()
    head0 = np.asarray(learner.critic.params[critic_model.VALUE_HEAD]["kernel"]).copy()
    # the RL step's three learner-side stages, in order (rl_step.RLStages: compute_logprobs,
    # compute_advantages, optimize)
    fwd = learner.forward(params, batch, ref, row_diffs=True)
    with jax.set_mesh(mesh):
        adv, ret, per_traj, m = advantage_stage.step_advantages(
            batch, learner.adv_cfg, values=fwd.gather("old_values"), old_logprobs=fwd.gather("old_logprobs"),
            ref_logprobs=fwd.gather("ref_logprobs"), kl_coef=0.1, kl_estimator=a.kl_estimator_type)
    update = learner.optimize(params, opt, fwd, adv, ret, step=1)
    params, step_metrics, diffs, rows = update.params, update.step_metrics, fwd.diffs, fwd.row_diffs
    timings = {**fwd.timings, **update.timings}
    stage = {"per_trajectory": per_traj}
    m = {**m, **update.critic_metrics}
    # the async modes' per-row trainer-vs-engine gap, next to the critic and the advantage stage:
    # one entry per packed row, its loss tokens counted by hand, its gaps summing to the mini-batch totals
    np.testing.assert_array_equal(rows[1], batch["loss_mask"].sum(1))
    np.testing.assert_allclose(rows[0].sum(), sum(float(d[0]) for d in diffs), rtol=1e-5)
    assert len(step_metrics) == 2 and {"fwd_values", "critic_train", "policy_train"} <= set(timings)
    # π_old = π_ref at the start: the KL penalty is 0 (k3 of equal logprobs), so the rewards are the outcomes
    assert m["loss/avg_kl"] < 1e-6 and m["loss/kl_loss_coef"] == 0.1
    # V_old = 0 (zero head): GAE with γ = λ = 1 gives raw A_t = reward-to-go = the outcome on every
    # response token; advantages are its whitening over the loss tokens (by hand, float64)
    lm = batch["loss_mask"] > 0
    outcome = np.array([t.reward for t in trajs])[:, None] * np.ones_like(lm)
    white = (outcome[lm] - outcome[lm].mean()) / np.sqrt(outcome[lm].var(ddof=1) + 1e-8)
    np.testing.assert_allclose(stage["per_trajectory"], [white[np.cumsum(lm.sum(1)) - 1][i] for i in range(8)],
                               rtol=1e-5)
    np.testing.assert_allclose(m["critic/values_mean_old"], 0.0, atol=1e-7)
    assert 0 < float(step_metrics[0]["clip_ratio"]) <= 0.2  # clip_cov's selection is active
    assert {"critic/critic_loss", "critic/values_clipfrac", "critic/grad_norm", "critic/critic_lr"} <= set(m)
    assert not np.array_equal(np.asarray(params["embed_tokens"]), embed0)
    assert not np.array_equal(np.asarray(learner.critic.params[critic_model.VALUE_HEAD]["kernel"]), head0)


# configs/ppo_gae.py end to end: tests/test_async.py's sync-vs-fully_async run (the critic trained and
# checkpointed, its metrics logged, the held-out evaluation); its kill -9 resume (slow): tests/test_trainer.py.
