"""Trajectories -> the fixed-shape, target-aligned arrays of one training batch (docs/architecture.md §3).

Rows are right-padded to a length bucket (`trainer.seq_len_buckets`) so the train step compiles
a bounded number of times. Trajectories that ended with an `EXCLUDED_STOP_REASONS` stop reason
keep their row (the batch shape is fixed) but leave the loss and the advantage baselines.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from jaxrl.buckets import round_up
from jaxrl.envs import Trajectory

# Trajectories that end with these stop reasons leave the loss: `env_error` (the environment
# failed, the reward says nothing about the policy) and `invalid_output` (the engine returned
# non-finite logprobs, out-of-vocabulary ids or a wrong length). They get loss mask 0, do not
# count as sequences in the loss reduction, are not in the advantage baselines, and are counted
# in `generate/num_excluded_<reason>`.
EXCLUDED_STOP_REASONS = ("env_error", "invalid_output")


def bucket_length(n: int, buckets) -> int:
    """The smallest bucket >= n. Raises ValueError when n exceeds the largest bucket."""
    return round_up(n, buckets, "trajectory length (tokens)",
                    fix="add a larger trainer.seq_len_buckets entry or lower the generator limits")


def is_excluded(t: Trajectory) -> bool:
    """True when trajectory `t` must not be trained on: `EXCLUDED_STOP_REASONS`, or a Harbor trial
    whose error class the run's error policy masks (`info["error_treatment"] == "mask"`,
    jaxrl/train/error_policy.py)."""
    return t.stop_reason in EXCLUDED_STOP_REASONS or t.info.get("error_treatment") == "mask"


def excluded_detail(t: Trajectory) -> str:
    """What went wrong in an excluded trajectory (its `info`), in one short line."""
    if t.info.get("error_treatment") == "mask" and t.stop_reason not in EXCLUDED_STOP_REASONS:
        return f"masked by harbor.error_policy: {t.info.get('error_class')}"
    for key in ("error", "invalid_output", "reason"):
        if t.info.get(key):
            return " ".join(str(t.info[key]).split())[:200]
    return "no detail recorded"


def pack_trajectories(trajs: list[Trajectory], advantages: Optional[np.ndarray], buckets) -> dict[str, np.ndarray]:
    """Right-padded rows `[N, T]` (T bucketed) with target-aligned `[N, T-1]` arrays (docs/architecture.md §3).

    Row i holds prompt_ids + response_ids; response token j sits at position P + j and is
    predicted at target index P + j - 1, which is where its loss_mask, rollout logprob and the
    trajectory's advantage go (`advantages [N]`, or None for zeros: the step's advantage stage
    computes them after the forward passes, `rl_step.RLStages.compute_advantages`). The advantage estimators' inputs: `token_rewards` (the
    trajectory's reward on its last generated token), `response_mask` (1 on every response token,
    generated or observation) and `group_ids [N]`.

    An excluded trajectory (`is_excluded`) keeps only its prompt: its response (possibly holding
    out-of-vocabulary ids or non-finite logprobs) never reaches the model, its loss mask, rollout
    logprobs, rewards and advantages are 0, and `sequence_mask [N]` (bool) is False for it so it
    does not count as a sequence in the loss reduction nor in any advantage statistic.
    """
    n = len(trajs)
    excluded = [is_excluded(t) for t in trajs]
    lengths = [len(t.prompt_ids) + (0 if x else len(t.response_ids)) for t, x in zip(trajs, excluded)]
    T = bucket_length(max(lengths), buckets)
    tokens = np.zeros((n, T), np.int32)
    seg = np.zeros((n, T), np.int32)
    pos = np.zeros((n, T), np.int32)
    loss_mask = np.zeros((n, T - 1), np.int32)
    response_mask = np.zeros((n, T - 1), np.int32)
    rollout_lp = np.zeros((n, T - 1), np.float32)
    token_rewards = np.zeros((n, T - 1), np.float32)
    adv = np.zeros((n, T - 1), np.float32)
    for i, (t, L) in enumerate(zip(trajs, lengths)):
        P = len(t.prompt_ids)
        seg[i, :L] = 1
        pos[i, :L] = np.arange(L)
        if excluded[i]:
            tokens[i, :L] = t.prompt_ids
            continue
        tokens[i, :L] = np.concatenate([t.prompt_ids, t.response_ids])
        R = len(t.response_ids)
        loss_mask[i, P - 1:P - 1 + R] = t.loss_mask
        response_mask[i, P - 1:P - 1 + R] = 1
        rollout_lp[i, P - 1:P - 1 + R] = np.where(t.loss_mask > 0, t.rollout_logprobs, 0.0)
        if advantages is not None:
            adv[i, P - 1:P - 1 + R] = np.where(t.loss_mask > 0, advantages[i], 0.0)
        generated = np.flatnonzero(t.loss_mask)  # an included trajectory has >= 1 generated token
        token_rewards[i, P - 1 + (generated[-1] if generated.size else R - 1)] = t.reward
    is_truncated = np.array([t.stop_reason != "stop" for t in trajs])
    return dict(tokens=tokens, positions=pos, segment_ids=seg, loss_mask=loss_mask,
                rollout_logprobs=rollout_lp, advantages=adv, is_truncated=is_truncated,
                sequence_mask=~np.array(excluded, bool), token_rewards=token_rewards, response_mask=response_mask,
                group_ids=np.array([t.group_id for t in trajs], np.int32))
