"""Advantages and returns of one RL step, for every estimator (`trainer.algorithm.*`).

Runs after the step's forward passes (old logprobs, reference logprobs, critic values), because
those may enter it: the KL-in-reward penalty uses π_old and π_ref, and GAE uses the critic's
V_old. It works on the whole step's packed batch (host arrays, identical on every process), so
group baselines and batch whitening see every trajectory, whatever the mini-batching:

1. token rewards: each trajectory's scalar reward on its last generated token (target-aligned,
   `token_rewards` of the packed batch); with `use_kl_in_reward`, minus β·kl_t on the loss tokens
   (`jaxrl.rl.kl_penalized_rewards`, β the controller's current value);
2. `jaxrl.rl.compute_advantages_and_returns` over the batch, excluded trajectories (env_error,
   invalid_output) out of every statistic;
3. the run-log metrics of this stage.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from jaxrl.rl import advantages as adv_lib
from jaxrl.rl import kl_control, value


def step_advantages(batch: dict, adv_cfg: adv_lib.AdvantageConfig, *, values: Optional[np.ndarray] = None,
                    old_logprobs: Optional[np.ndarray] = None, ref_logprobs: Optional[np.ndarray] = None,
                    kl_coef: Optional[float] = None, kl_estimator: str = "k3"):
    """Advantages and returns of one step's packed batch.

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
    """The KL-in-reward β for the next step (`trainer.algorithm.kl_ctrl`; `rl.update_kl_coef`),
    from this step's `loss/avg_kl` and the number of trajectories trained on."""
    k = c.trainer.algorithm.kl_ctrl
    return kl_control.update_kl_coef(kl_coef, metrics["loss/avg_kl"], num_trajectories, k.type,
                                     kl_target=k.kl_target, horizon=k.horizon)


__all__ = ["next_kl_coef", "step_advantages"]
