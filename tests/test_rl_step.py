"""The RL step as a sequence of named stages (`jaxrl.train.rl_step`): the order of the stages
and what flows between them, and that replacing one stage (a subclass of `RLStages`) changes
exactly that stage's output. Expected values are computed here with float64 numpy."""
import types

import numpy as np

import jax

from jaxrl import config as config_lib
from jaxrl import parallel
from jaxrl.envs import DEFAULT_POLICY_DIR, Trajectory
from jaxrl.models import hf_io, qwen3
from jaxrl.train import rl_step
from jaxrl.train.batching import pack_trajectories
from jaxrl.train.rundir import TrainerState

STAGE_ORDER = ["collect_rollouts", "compute_logprobs", "compute_advantages", "update_kl_controller", "optimize",
               "publish_weights", "compute_metrics", "evaluate", "log_metrics", "save_checkpoint"]


class _Recording(rl_step.RLStages):
    """Every stage replaced by one that records its call and returns a marker object."""

    def __init__(self, trainer):
        super().__init__(trainer)
        self.calls = []

    def _rec(self, name, *args):
        self.calls.append((name, args))
        return types.SimpleNamespace(stage=name)

    def collect_rollouts(self, step):
        return self._rec("collect_rollouts", step)

    def compute_logprobs(self, params, rollouts):
        return self._rec("compute_logprobs", params, rollouts)

    def compute_advantages(self, rollouts, fwd):
        return self._rec("compute_advantages", rollouts, fwd)

    def update_kl_controller(self, rollouts, advantages):
        self._rec("update_kl_controller", rollouts, advantages)

    def optimize(self, step, params, opt_state, fwd, advantages):
        out = self._rec("optimize", step, params, opt_state, fwd, advantages)
        out.params, out.opt_state = "params_after", "opt_after"
        return out

    def publish_weights(self, params, version, steps_done=None):
        self._rec("publish_weights", params, version, steps_done)

    def compute_metrics(self, step, rollouts, fwd, advantages, update):
        self._rec("compute_metrics", step, rollouts, fwd, advantages, update)
        return rl_step.StepMetrics(values={"reward/avg_raw_reward": 0.5}, trials=[], is_best=True)

    def evaluate(self, step):
        self._rec("evaluate", step)
        return {"eval/success_rate": 0.25}

    def log_metrics(self, step, metrics):
        self._rec("log_metrics", step, metrics)

    def save_checkpoint(self, step, params, opt_state, is_best):
        self._rec("save_checkpoint", step, params, opt_state, is_best)


def test_rl_step_runs_the_stages_in_order_and_passes_each_output_on():
    trainer = types.SimpleNamespace(timings={}, state=types.SimpleNamespace(policy_version=7))
    stages = _Recording(trainer)
    result = rl_step.rl_step(stages, 3, "params", "opt")
    assert [name for name, _ in stages.calls] == STAGE_ORDER
    args = dict(stages.calls)
    rollouts = args["compute_logprobs"][1]
    fwd = args["compute_advantages"][1]
    adv = args["update_kl_controller"][1]
    assert (rollouts.stage, fwd.stage, adv.stage) == ("collect_rollouts", "compute_logprobs", "compute_advantages")
    assert args["collect_rollouts"] == (3,)
    assert args["compute_logprobs"][0] == "params"
    assert args["optimize"] == (3, "params", "opt", fwd, adv)
    update = args["compute_metrics"][4]
    assert args["publish_weights"] == ("params_after", 8, 3)  # the next policy version, after step 3
    assert args["compute_metrics"][:4] == (3, rollouts, fwd, adv)
    assert args["save_checkpoint"] == (3, "params_after", "opt_after", True)
    # the held-out metrics join the step's row before it is logged
    logged = args["log_metrics"][1]
    assert logged.values == {"reward/avg_raw_reward": 0.5, "eval/success_rate": 0.25}
    assert (result.params, result.opt_state, result.metrics) == ("params_after", "opt_after", logged)
    assert update.stage == "optimize" and trainer.timings["step"] >= 0


def _traj(prompt, response, reward, group_id):
    r = len(response)
    return Trajectory(prompt_ids=np.asarray(prompt, np.int32), response_ids=np.asarray(response, np.int32),
                      loss_mask=np.ones(r, np.int32), rollout_logprobs=np.full(r, -1.0, np.float32), reward=reward,
                      stop_reason="stop", group_id=group_id, policy_version=0, num_turns=1)


class _ConstantBaseline(rl_step.RLStages):
    """A researcher's advantage stage: A_i = r_i - 0.5 on every loss token (no group baseline)."""

    def compute_advantages(self, rollouts, fwd):
        lm = rollouts.batch["loss_mask"] > 0
        adv = np.where(lm, (rollouts.rewards - 0.5)[:, None], 0.0).astype(np.float32)
        per_traj = ((adv * lm).sum(1) / np.maximum(lm.sum(1), 1)).astype(np.float32)
        return rl_step.Advantages(advantages=adv, returns=np.zeros_like(adv), per_trajectory=per_traj, metrics={})


def test_replacing_the_advantage_stage_changes_exactly_its_output():
    """The default stages and a subclass that replaces only `compute_advantages`, on the same
    trajectories and weights (no sidecars): the rollouts and the logprobs are identical, the
    advantages are each stage's own (RLOO-n and r - 0.5, by hand), and the optimizer trains on
    what the replaced stage returned (equal to calling the learner with those advantages)."""
    from jaxrl.train.learner import Learner

    c = config_lib.base_config()
    c.trainer.train_batch_size, c.trainer.mini_batch_size, c.generator.n_samples_per_prompt = 4, 2, 2
    c.trainer.micro_batch_size = 2
    config_lib.validate(c)
    mesh = parallel.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    model_cfg = qwen3.Qwen3Config.from_pretrained(DEFAULT_POLICY_DIR)
    sh = parallel.param_shardings(qwen3.param_logical_axes(model_cfg), mesh, shapes=qwen3.abstract_params(model_cfg))
    learner = Learner(c, model_cfg, mesh, sh, sh, config_lib.loss_config(c))
    learner.build(1.0)
    rng = np.random.default_rng(1)
    rewards = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.25, 1.0]
    trajs = [_traj(list(rng.integers(5, 200, 6)), list(rng.integers(5, 200, int(rng.integers(2, 7)))), r, i // 2)
             for i, r in enumerate(rewards)]

    def fake_trainer():
        src = types.SimpleNamespace(get=lambda step, version: (
            trajs, [{"staleness": 0, "prompt_index": t.group_id} for t in trajs], {}, {"generate": 0.0}))
        return types.SimpleNamespace(c=c, is_main=True, is_async=False, rollouts=src, state=TrainerState(),
                                     learner=learner, ref_params=None, mesh=mesh, timings={})

    def load():
        with jax.set_mesh(mesh):
            _, params = hf_io.load_hf_checkpoint(DEFAULT_POLICY_DIR, model_cfg, shardings=sh)
            return params, learner.init_opt(params)

    out = {}
    for name, cls in (("default", rl_step.RLStages), ("custom", _ConstantBaseline)):
        stages = cls(fake_trainer())
        params, opt = load()
        rollouts = stages.collect_rollouts(1)
        fwd = stages.compute_logprobs(params, rollouts)
        adv = stages.compute_advantages(rollouts, fwd)
        old_logprobs = fwd.gather("old_logprobs")
        update = stages.optimize(1, params, opt, fwd, adv)
        out[name] = (rollouts, old_logprobs, adv, update)

    (r0, lp0, a0, u0), (r1, lp1, a1, u1) = out["default"], out["custom"]
    # the stages before the replaced one: identical outputs
    packed = pack_trajectories(trajs, None, c.trainer.seq_len_buckets)
    for key in packed:
        np.testing.assert_array_equal(r0.batch[key], packed[key])
        np.testing.assert_array_equal(r1.batch[key], packed[key])
    np.testing.assert_array_equal(r0.rewards, np.asarray(rewards, np.float32))
    np.testing.assert_array_equal(lp0, lp1)
    # the advantage stage: RLOO-n by the default, r - 0.5 by the replacement (float64, by hand)
    r = np.asarray(rewards, np.float64).reshape(-1, 2)
    rloo = (r - (r.sum(1, keepdims=True) - r) / 1.0).reshape(-1)
    np.testing.assert_allclose(a0.per_trajectory, rloo, atol=1e-6)
    np.testing.assert_allclose(a1.per_trajectory, np.asarray(rewards) - 0.5, atol=1e-7)
    assert not np.allclose(a0.per_trajectory, a1.per_trajectory)
    # the optimizer consumed the replacement's advantages: the same as the learner called with them
    params, opt = load()
    fwd = learner.forward(params, r1.batch)
    direct = learner.optimize(params, opt, fwd, a1.advantages, a1.returns, step=1)
    for got, want in zip(u1.step_metrics, direct.step_metrics):
        assert {k: float(v) for k, v in got.items()} == {k: float(v) for k, v in want.items()}
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), u1.params, direct.params)
    assert float(u0.step_metrics[0]["policy_loss"]) != float(u1.step_metrics[0]["policy_loss"])


def test_the_architecture_walk_follows_rl_step_through_at_most_15_files():
    """docs/architecture.md §1 "The walk": its table lists the stages in the order `rl_step` calls
    them (read from the source), and every file its table names is one of the at most 15 files
    the walk says it touches."""
    import ast
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[1]
    src = (root / "jaxrl/train/rl_step.py").read_text()
    fn = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "rl_step")
    calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and isinstance(n.func.value, ast.Name) and n.func.value.id == "stages"]
    called = [n.func.attr for n in sorted(calls, key=lambda n: (n.lineno, n.col_offset))]
    assert called == STAGE_ORDER
    doc = (root / "docs/architecture.md").read_text()
    walk = doc[doc.index("### The walk"):doc.index("Beneath the walk")]
    table = [line for line in walk.splitlines() if line.startswith("| `")]
    assert [re.match(r"\| `(\w+)`", line).group(1) for line in table] == STAGE_ORDER
    declared_text = walk[:walk.index("| stage |")]
    declared = set(re.findall(r"`(jaxrl/[\w/]+\.py)`", declared_text))
    named = set(re.findall(r"`(jaxrl/[\w/]+\.py):[\w.]+`", "\n".join(table)))
    assert len(declared) <= 15 and "15 files" in declared_text
    assert named <= declared, named - declared
    assert named == declared, declared - named  # the list says no more than the table shows
