"""One RL step, top to bottom (docs/architecture.md §1).

`rl_step` is the whole step as a flat sequence of named stages; each stage is a method of
`RLStages` with typed inputs and outputs (the dataclasses below), so that a researcher replaces
one stage by subclassing `RLStages` and passing the subclass to the trainer
(`jaxrl.train.trainer.Trainer(c, workdir, stages=MyStages)`, or `trainer.run(..., stages=...)`):

  collect_rollouts -> compute_logprobs -> compute_advantages -> update_kl_controller
  -> optimize -> publish_weights -> compute_metrics -> evaluate -> log_metrics -> save_checkpoint

The layout follows the field's usual trainer loop (e.g. SkyRL's `RayPPOTrainer`, whose step is a
sequence of methods a subclass overrides: generation, forward passes, advantages, training,
weight sync); the stage names say what each does in the field's words.

Multi-process runs: process 0 drives the rollouts (`collect_rollouts` broadcasts the packed batch
to every process); every other stage runs on every process with identical host inputs, so all
processes train, publish and checkpoint together; only process 0 writes the run logs.

The step's host/device traffic: the packed batch is host numpy; `compute_logprobs` places each
mini-batch on the mesh and keeps it there; `compute_advantages` gathers the logprobs / values it
needs to the host (the estimators are numpy over the whole step), and `optimize` places the
advantages back on the mesh. Collapse handling (stop or roll back) is the run loop's, after the
step (`Trainer.run`).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Optional

import jax
import numpy as np

from jaxrl.rl import advantages as adv_lib
from jaxrl.rl import kl_control, value
from jaxrl.train import harbor as harbor_run
from jaxrl.train.batching import pack_trajectories
from jaxrl.train.learner import ForwardPass, OptimizeResult, policy_metrics
from jaxrl.train.multihost import broadcast_from_main
from jaxrl.train.rollouts import logprob_gap_by_staleness
from jaxrl.train.rundir import maybe_kill
from jaxrl.train.step_stats import batch_metrics, decode_for_log, trial_rows


# -- the stages' data ------------------------------------------------------------------------
@dataclasses.dataclass
class Rollouts:
    """What `collect_rollouts` returns: the step's trajectories, packed.

    Fields:
      batch: the packed batch (`batching.pack_trajectories`: `tokens, positions, segment_ids [N, T]`,
        `loss_mask, rollout_logprobs, token_rewards, response_mask [N, T-1]`, `group_ids,
        sequence_mask, is_truncated [N]`), host numpy, identical on every process.
      rewards: `[N]` float32, each trajectory's scalar reward.
      staleness: `[N]` int64, policy versions between sampling and this step (0 in sync mode).
      trajectories, extra: the `Trajectory` objects and their per-trajectory log fields
        (`prompt_index`, `staleness`); process 0 only (None elsewhere).
      metrics: the rollout source's `async/*` metrics (process 0; {} in sync mode).
    """
    batch: dict[str, np.ndarray]
    rewards: np.ndarray
    staleness: np.ndarray
    trajectories: Optional[list] = None
    extra: Optional[list[dict]] = None
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Advantages:
    """What `compute_advantages` returns (host numpy, identical on every process).

    Fields:
      advantages, returns: `[N, T-1]` float32 (target-aligned like `loss_mask`).
      per_trajectory: `[N]` float32, each trajectory's mean advantage over its loss tokens (0
        without any); the `trial_stats.csv` column and `loss/avg_raw_advantages`.
      metrics: the stage's run-log metrics (`step_advantages`'s).
      kl_coef: β of the KL-in-reward penalty used this step; None when `use_kl_in_reward` is off.
    """
    advantages: np.ndarray
    returns: np.ndarray
    per_trajectory: np.ndarray
    metrics: dict[str, float]
    kl_coef: Optional[float] = None


@dataclasses.dataclass
class StepMetrics:
    """What `compute_metrics` returns: `values`, the step's `metrics.csv` row (no timings yet);
    `trials`, one `trial_stats.csv` row per trajectory (process 0; [] elsewhere); `is_best`,
    whether the reward EMA reached a new best this step."""
    values: dict[str, Any]
    trials: list[dict[str, Any]]
    is_best: bool


@dataclasses.dataclass
class StepResult:
    """What `rl_step` returns: the training state after the step and its metrics."""
    params: Any
    opt_state: Any
    metrics: StepMetrics


# -- the advantage stage's computation (pure numpy) ------------------------------------------
def step_advantages(batch: dict, adv_cfg: adv_lib.AdvantageConfig, *, values: Optional[np.ndarray] = None,
                    old_logprobs: Optional[np.ndarray] = None, ref_logprobs: Optional[np.ndarray] = None,
                    kl_coef: Optional[float] = None, kl_estimator: str = "k3"):
    """Advantages and returns of one step's packed batch, for every estimator.

    It runs on the whole step (not per mini-batch), so group baselines and batch whitening see
    every trajectory whatever the mini-batching: (1) token rewards, each trajectory's reward on
    its last generated token, minus β·kl_t on the loss tokens with `use_kl_in_reward`
    (`jaxrl.rl.kl_penalized_rewards`); (2) `jaxrl.rl.compute_advantages_and_returns`, excluded
    trajectories (env_error, invalid_output) out of every statistic; (3) the run-log metrics.

    Args:
      batch: the packed batch (`batching.pack_trajectories`): `token_rewards, response_mask,
        loss_mask [N, T-1]`, `group_ids [N]`, `sequence_mask [N]` (False = excluded trajectory).
      adv_cfg: the estimator and its options.
      values: V_old [N, T-1] of the critic (required iff the estimator needs values).
      old_logprobs, ref_logprobs, kl_coef: π_old, π_ref [N, T-1] and β of the KL-in-reward penalty
        (all three, or none).
      kl_estimator: `trainer.algorithm.kl_estimator_type`.
    Returns: (advantages [N, T-1] float32, returns [N, T-1] float32, per_trajectory [N] float32
      (the mean advantage over each trajectory's loss tokens, 0 without any; step_stats reports
      its mean as loss/avg_raw_advantages), metrics dict of floats: loss/avg_raw_returns
      (over trajectories of the mean return on their loss tokens), with the KL penalty
      loss/avg_kl, loss/avg_kl_max, loss/kl_loss_coef, and with a critic critic/explained_variance
      and critic/values_mean_old (token mean of V_old).
    Raises: ValueError for non-finite rewards of an included trajectory, missing values.
    """
    loss_mask = np.asarray(batch["loss_mask"]) > 0
    keep = np.asarray(batch["sequence_mask"], bool)
    rewards = np.asarray(batch["token_rewards"], np.float32)
    metrics: dict[str, float] = {}
    if kl_coef is not None:
        if old_logprobs is None or ref_logprobs is None:
            raise ValueError("the KL-in-reward penalty needs old_logprobs and ref_logprobs")
        rewards, kl_metrics = kl_control.kl_penalized_rewards(rewards, old_logprobs, ref_logprobs, loss_mask, kl_coef,
                                                              kl_estimator, sequence_mask=keep)
        metrics.update({f"loss/{k}": float(v) for k, v in kl_metrics.items()})
        metrics["loss/kl_loss_coef"] = float(kl_coef)
    adv, ret = adv_lib.compute_advantages_and_returns(
        rewards, batch["response_mask"], np.asarray(batch["group_ids"], np.int32), loss_mask=loss_mask,
        baseline_mask=keep, values=values, config=adv_cfg)
    adv, ret = np.asarray(adv, np.float32), np.asarray(ret, np.float32)
    count = np.maximum(loss_mask.sum(1), 1)
    per_traj = (adv * loss_mask).sum(1) / count
    metrics["loss/avg_raw_returns"] = float(((ret * loss_mask).sum(1) / count).mean())
    if values is not None:
        m = loss_mask & keep[:, None]
        metrics["critic/explained_variance"] = float(value.explained_variance(values, ret, m))
        metrics["critic/values_mean_old"] = float(np.where(m, values, 0.0).sum() / max(m.sum(), 1))
    return adv, ret, per_traj.astype(np.float32), metrics


def next_kl_coef(c, kl_coef: float, metrics: dict, num_trajectories: int) -> float:
    """The KL-in-reward β for the next step (`trainer.algorithm.kl_ctrl`; `rl.update_kl_coef`:
    fixed, or the adaptive controller of Ziegler et al. 2019, eq. 2), from this step's
    `loss/avg_kl` and the number of trajectories trained on."""
    k = c.trainer.algorithm.kl_ctrl
    return kl_control.update_kl_coef(kl_coef, metrics["loss/avg_kl"], num_trajectories, k.type,
                                     kl_target=k.kl_target, horizon=k.horizon)


def training_batch(trajs: list, adv_cfg: adv_lib.AdvantageConfig, buckets):
    """Rewards `[N]` float32, per-trajectory advantages `[N]` float32 (the mean over each one's
    loss tokens) and the packed batch (`batching.pack_trajectories`, its `advantages [N, T-1]`
    filled) of one step's trajectories, for an estimator that needs no critic
    (`step_advantages`; the trainer runs that stage after its forward passes). Excluded
    trajectories (`batching.is_excluded`) are left out of the advantage baselines and of the loss."""
    rewards = np.array([t.reward for t in trajs], np.float32)
    batch = pack_trajectories(trajs, None, buckets)
    batch["advantages"], _, per_traj, _ = step_advantages(batch, adv_cfg)
    return rewards, per_traj, batch


# -- the step --------------------------------------------------------------------------------
def rl_step(stages: "RLStages", step: int, params, opt_state) -> StepResult:
    """One RL step: every stage in order, nothing hidden in another's return value.

    Args: stages: the run's `RLStages` (or a subclass); step: the RL step (1-based); params,
      opt_state: the training state before the step (the optimizer donates their buffers).
    Returns: `StepResult` with the state after the step and the step's metrics (logged, and
      checkpointed when due, before this returns).
    """
    t_step = time.perf_counter()
    rollouts = stages.collect_rollouts(step)
    fwd = stages.compute_logprobs(params, rollouts)
    advantages = stages.compute_advantages(rollouts, fwd)
    stages.update_kl_controller(rollouts, advantages)
    update = stages.optimize(step, params, opt_state, fwd, advantages)
    stages.publish_weights(update.params, stages.version + 1, steps_done=step)
    metrics = stages.compute_metrics(step, rollouts, fwd, advantages, update)
    stages.timings["step"] = time.perf_counter() - t_step
    metrics.values.update(stages.evaluate(step))
    stages.log_metrics(step, metrics)
    stages.save_checkpoint(step, update.params, update.opt_state, metrics.is_best)
    return StepResult(update.params, update.opt_state, metrics)


class RLStages:
    """The stages of `rl_step` on one trainer (`jaxrl.train.trainer.Trainer`): subclass and
    override a method to replace that stage; every other stage stays as it is.

    Each stage reads the run's parts from `self.trainer` (config `c`, `learner`, `fleet`, `ckpt`,
    `state`, `ema`, `rollouts` (the rollout source), `logger`, `timings`) and records its
    wall time in `self.timings` (the `timing/*` columns).
    """

    def __init__(self, trainer):
        self.trainer = trainer

    @property
    def timings(self) -> dict[str, float]:
        return self.trainer.timings

    @property
    def version(self) -> int:
        """The policy version the engines serve now."""
        return self.trainer.state.policy_version

    def collect_rollouts(self, step: int) -> Rollouts:
        """The step's trajectories (process 0: the rollout source, `rollouts.SyncRollouts.get` or
        `rollouts.AsyncRollouts.get`), packed into fixed-shape arrays (`batching.pack_trajectories`)
        and broadcast to every process (`multihost.broadcast_from_main`)."""
        t, c = self.trainer, self.trainer.c
        trajs, extra, async_m = None, None, {}
        if t.is_main:
            trajs, extra, async_m, timings = t.rollouts.get(step, t.state.policy_version)
            self.timings.update(timings)
            rewards = np.array([x.reward for x in trajs], np.float32)
            batch = pack_trajectories(trajs, None, c.trainer.seq_len_buckets)
            host = dict(batch, rewards=rewards, staleness=np.array([e["staleness"] for e in extra], np.int64),
                        dropped=np.array([async_m.get("async/dropped_stale", 0)], np.int64))
        else:
            host = None
        host = broadcast_from_main(host)
        rewards, staleness = host.pop("rewards"), host.pop("staleness")
        t.state.dropped_stale_total += int(host.pop("dropped")[0])  # the same on every process
        return Rollouts(batch=host, rewards=rewards, staleness=staleness, trajectories=trajs, extra=extra,
                        metrics=async_m)

    def compute_logprobs(self, params, rollouts: Rollouts) -> ForwardPass:
        """Before any update: the trainer's logprobs π_old of the sampled tokens per mini-batch
        (and π_ref with a reference model, the critic's V_old with one), the trainer-vs-engine
        gap (`learner.Learner.forward`)."""
        t = self.trainer
        fwd = t.learner.forward(params, rollouts.batch, t.ref_params, row_diffs=t.is_async)
        self.timings.update(fwd.timings)
        return fwd

    def compute_advantages(self, rollouts: Rollouts, fwd: ForwardPass) -> Advantages:
        """Advantages and returns over the whole step (`step_advantages`), with the KL-in-reward
        penalty at the controller's current β (`kl_loss_coef` at the start) when it is on."""
        t0 = time.perf_counter()
        t, c = self.trainer, self.trainer.c
        a = c.trainer.algorithm
        kl_coef = None
        if a.use_kl_in_reward:
            kl_coef = a.kl_loss_coef if t.state.kl_coef is None else t.state.kl_coef
        with jax.set_mesh(t.mesh):  # the gathers are collective in a multi-process run
            adv, ret, per_traj, metrics = step_advantages(
                rollouts.batch, t.learner.adv_cfg,
                values=fwd.gather("old_values") if t.learner.critic is not None else None,
                old_logprobs=fwd.gather("old_logprobs") if kl_coef is not None else None,
                ref_logprobs=fwd.gather("ref_logprobs") if kl_coef is not None else None,
                kl_coef=kl_coef, kl_estimator=a.kl_estimator_type)
        self.timings["advantages"] = time.perf_counter() - t0
        return Advantages(advantages=adv, returns=ret, per_trajectory=per_traj, metrics=metrics, kl_coef=kl_coef)

    def update_kl_controller(self, rollouts: Rollouts, advantages: Advantages) -> None:
        """The KL-in-reward β of the next step (`next_kl_coef`) from this step's measured KL, into
        the trainer state (checkpointed with it); nothing when `use_kl_in_reward` is off."""
        if advantages.kl_coef is not None:
            self.trainer.state.kl_coef = next_kl_coef(self.trainer.c, advantages.kl_coef, advantages.metrics,
                                                      int(rollouts.batch["sequence_mask"].sum()))

    def optimize(self, step: int, params, opt_state, fwd: ForwardPass, advantages: Advantages) -> OptimizeResult:
        """The policy's optimizer steps, then the critic's, on the mini-batches of `fwd`
        (`learner.Learner.optimize`); the trainer state counts the step as trained."""
        t = self.trainer
        update = t.learner.optimize(params, opt_state, fwd, advantages.advantages, advantages.returns, step=step)
        self.timings.update(update.timings)
        maybe_kill("train", step)
        t.state.skipped_updates += int(sum(m["update_skipped"] for m in update.step_metrics))
        t.state.step = step
        return update

    def publish_weights(self, params, version: int, steps_done: Optional[int] = None) -> None:
        """Publishes `params` as policy `version` (every process; `fleet.Fleet.publish`) and has the
        sidecars load it; then tells the rollout source (async modes) that `steps_done` steps are
        trained (default: the trainer state's step). The run also calls this for its first
        version, after a rollback and for the final evaluation of the best checkpoint."""
        t = self.trainer
        t0 = time.perf_counter()
        if t.rollouts is not None:
            t.rollouts.before_load()
        t.fleet.publish(t.learner.publishable(params), version)
        t.state.policy_version = version
        if t.rollouts is not None:
            t.rollouts.after_load(version, t.state.step if steps_done is None else steps_done)
        self.timings["sync_weights"] = time.perf_counter() - t0

    def compute_metrics(self, step: int, rollouts: Rollouts, fwd: ForwardPass, advantages: Advantages,
                        update: OptimizeResult) -> StepMetrics:
        """The step's `metrics.csv` row: policy metrics over its optimizer steps
        (`learner.policy_metrics`), reward / token / logprob-gap metrics of the batch
        (`step_stats.batch_metrics`), the advantage stage's and the critic's metrics, the reward
        EMA (`metrics.RewardEMA.update`, which decides `is_best`); and the trial rows."""
        t, c = self.trainer, self.trainer.c
        trajs = rollouts.trajectories
        m: dict[str, Any] = policy_metrics(update.step_metrics)
        m["policy/num_skipped_updates_total"] = t.state.skipped_updates
        m.update(batch_metrics(c, step, trajs, rollouts.rewards, advantages.per_trajectory, rollouts.batch,
                               fwd.diffs, t.is_main))
        m.update(advantages.metrics)  # loss/avg_raw_returns; KL in reward (loss/avg_kl...); critic/* of V_old
        m.update(update.critic_metrics)
        m["trainer/policy_version"] = t.state.policy_version
        if t.is_async:
            m.update(rollouts.metrics)
            m["async/dropped_stale_total"] = t.state.dropped_stale_total
            m.update(logprob_gap_by_staleness(rollouts.staleness, *fwd.row_diffs))
        ema, is_best = t.ema.update(step, float(rollouts.rewards.mean()), drop=c.trainer.collapse.drop)
        m["reward/ema"] = ema
        if t.is_main and t.prompts.harbor is not None:
            m.update(harbor_run.outcome_metrics(trajs))
        trials = trial_rows(trajs, advantages.per_trajectory, lambda ids: decode_for_log(t.chat.tokenizer, ids),
                            rollouts.extra)
        if t.prompts.harbor is not None:  # the trial's outcome, durations, limits and its episode
            for row, traj in zip(trials, trajs or []):
                row.update(harbor_run.trial_fields(traj.info))
        return StepMetrics(values=m, trials=trials, is_best=is_best)

    def evaluate(self, step: int) -> dict[str, float]:
        """Held-out evaluation of the policy just published, every `trainer.eval_interval` steps
        and at the last step (`Trainer.evaluate`); {} when not due (and on processes other than 0)."""
        t, c = self.trainer, self.trainer.c
        if not (c.trainer.eval_interval and step % c.trainer.eval_interval == 0 or step == c.trainer.num_steps):
            return {}
        ev = dict(t.evaluate())
        ev["timing/eval"] = self.timings.get("eval", 0.0)
        t._eval_step = step
        return ev

    def log_metrics(self, step: int, metrics: StepMetrics) -> None:
        """Adds the `timing/*` columns and writes the step's row and trial rows (process 0;
        `metrics.RunLogger.log_step`, `log_trials`). Logs come before the checkpoint: a run killed
        in between resumes from the previous checkpoint and drops these rows, so the logs never
        miss a step that a checkpoint covers."""
        t = self.trainer
        m = metrics.values
        phases = ("generate", "fwd_logprobs", "advantages", "policy_train", "sync_weights", "step")
        phases += ("fwd_values", "critic_train") if t.learner.critic is not None else ()
        phases += ("trainer_idle", "generator_idle") if t.is_async else ()
        for k in phases:
            m[f"timing/{k}"] = self.timings.get(k, 0.0)
        m["timing/elapsed"] = time.perf_counter() - t.clock.t0  # since this process started the run
        t.logger.log_step(step, m)
        t.logger.log_trials(step, metrics.trials)
        if t.is_main:
            t.clock.save()

    def save_checkpoint(self, step: int, params, opt_state, is_best: bool) -> None:
        """Checkpoints the step when due: on a new best EMA (`trainer.save_on_new_best`), every
        `trainer.ckpt_interval` steps and at the last step (`checkpoint`)."""
        t, c = self.trainer, self.trainer.c
        if ((is_best and c.trainer.save_on_new_best) or step % c.trainer.ckpt_interval == 0
                or step == c.trainer.num_steps):
            self.checkpoint(step, params, opt_state)
            t.logger.update_step(step, {"timing/save_checkpoints": self.timings["save_checkpoints"]})

    def checkpoint(self, step: int, params, opt_state) -> None:
        """Saves `step` now (every process; `persistence.Checkpoints.save`) with the data position:
        in the async modes process 0's producer position, broadcast so that every process saves
        the same state."""
        t = self.trainer
        t0 = time.perf_counter()
        if t.is_async:
            snap = t.rollouts.snapshot(step) if t.rollouts is not None else (0, [])
            flat = broadcast_from_main({"pos": np.array([snap[0], *snap[1]], np.int64)} if t.is_main else None)
            t.state.async_next_prompt = int(flat["pos"][0])
            t.state.async_pending = [int(k) for k in flat["pos"][1:]]
            t.state.data_position = t.state.async_next_prompt - len(t.state.async_pending)
        else:
            t.state.data_position = step * t.c.trainer.train_batch_size
        t.ckpt.save(step, params, opt_state, t.state, t.ema)
        self.timings["save_checkpoints"] = time.perf_counter() - t0


__all__ = ["Advantages", "RLStages", "Rollouts", "StepMetrics", "StepResult", "next_kl_coef", "rl_step",
           "step_advantages", "training_batch"]
