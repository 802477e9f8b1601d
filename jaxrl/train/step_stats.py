"""The run-log metrics of one RL step's batch (rewards, tokens, excluded trajectories, the
trainer-vs-engine logprob gap) and its per-trajectory rows (SkyRL names where the concept is the
same; docs/usage.md, 'What a run produces')."""
from __future__ import annotations

import sys
from typing import Any, Callable, Optional

import numpy as np

from jaxrl import config as config_lib
from jaxrl.envs import Trajectory
from jaxrl.train.batching import EXCLUDED_STOP_REASONS, excluded_detail, is_excluded


def batch_metrics(c, step: int, trajs, rewards: np.ndarray, advantages: np.ndarray, batch: dict, diffs,
                  is_main: bool) -> dict[str, Any]:
    """`reward/*`, `rollout/logprob_diff_*`, `generate/*` and `loss/avg_raw_advantages*` of a step.

    Args:
      trajs: the step's trajectories (process 0; None elsewhere); rewards, advantages: `[N]`
        float32; batch: the packed batch (`batching.pack_trajectories`); diffs: one
        `learner.logprob_diff` triple per mini-batch. Warnings (logprob gap over
      `trainer.logprob_diff_warn_threshold`, excluded trajectories) go to stderr on process 0.
    """
    n = c.generator.n_samples_per_prompt
    m: dict[str, Any] = {}
    # Excluded trajectories (env_error, invalid_output: `sequence_mask` False) are not trained on;
    # no metric of the batch counts them (their reward, advantage and tokens are 0 placeholders).
    kept = np.asarray(batch["sequence_mask"], bool)
    grouped, kept_g = rewards.reshape(-1, n), kept.reshape(-1, n)
    success = c.trainer.success_threshold
    m["reward/avg_raw_reward"] = _mean(rewards[kept])
    alive = kept_g.any(axis=1)  # a group with every member excluded says nothing about pass@n
    m[f"reward/avg_pass_at_{n}"] = _mean((np.where(kept_g, grouped, -np.inf).max(axis=1) >= success)[alive])
    m["reward/success_rate"] = _mean(rewards[kept] >= success)
    # Trainer (pi_old) vs engine (mu) logprobs on the loss tokens: ~1e-6 when both hold the
    # same float32 weights; larger in bf16 (see docs/numerics.md).
    total, count = sum(float(d[0]) for d in diffs), sum(float(d[1]) for d in diffs)
    m["rollout/logprob_diff_mean"] = total / max(count, 1.0)
    m["rollout/logprob_diff_max"] = max(float(d[2]) for d in diffs)
    bound = config_lib.logprob_diff_warn_threshold(c)
    if is_main and bound > 0 and m["rollout/logprob_diff_max"] > bound:
        print(f"jaxrl: warning: step {step}: trainer and rollout engine logprobs differ by up to "
              f"{m['rollout/logprob_diff_max']:.3g} (mean {m['rollout/logprob_diff_mean']:.3g}) on the loss "
              f"tokens, above trainer.logprob_diff_warn_threshold={bound:g}; the engine does not sample from "
              "the policy the trainer optimizes (see docs/numerics.md)", file=sys.stderr)
    if is_main:
        excluded = [t for t in trajs if is_excluded(t)]
        for reason in EXCLUDED_STOP_REASONS:
            m[f"generate/num_excluded_{reason}"] = sum(t.stop_reason == reason for t in excluded)
        if excluded:
            shown = "; ".join(f"{t.stop_reason} task {t.info.get('task_id') or '?'} group {t.group_id} sample "
                              f"{t.info.get('sample_index', 0)}: {excluded_detail(t)}" for t in excluded[:4])
            more = f"; ... {len(excluded) - 4} more in trial_stats.csv" if len(excluded) > 4 else ""
            print(f"jaxrl: step {step}: {len(excluded)} of {len(trajs)} trajectories excluded from the loss "
                  f"({shown}{more})", file=sys.stderr)
    m["loss/avg_raw_advantages"] = _mean(advantages[kept])
    m["loss/avg_raw_advantages_abs"] = _mean(np.abs(advantages[kept]))
    ntok = batch["loss_mask"].sum(axis=1)[kept]
    m["generate/avg_num_tokens"] = _mean(ntok)
    m["generate/max_num_tokens"] = float(ntok.max()) if ntok.size else 0.0
    m["generate/min_num_tokens"] = float(ntok.min()) if ntok.size else 0.0
    m["generate/truncated_ratio"] = _mean(np.asarray(batch["is_truncated"], bool)[kept])
    m["generate/batch_padded_seq_len"] = float(batch["tokens"].shape[1])
    return m


def _mean(x) -> float:
    """Mean of `x`, 0.0 for an empty selection (every trajectory of the step excluded)."""
    x = np.asarray(x, np.float64)
    return float(x.mean()) if x.size else 0.0


def decode_for_log(tokenizer, ids) -> str:
    """Text of token ids for the rollout logs; ids the tokenizer cannot decode (an engine's
    invalid output) are shown as numbers instead of failing the step."""
    try:
        return tokenizer.decode([int(i) for i in ids])
    except Exception:  # out-of-vocabulary ids from a faulty engine
        return f"<undecodable token ids {[int(i) for i in ids][:64]}>"


def trial_rows(trajs: list[Trajectory], advantages: np.ndarray, decode: Callable,
               extra: Optional[list[dict]] = None) -> list[dict[str, Any]]:
    """One `trial_stats.csv` / `rollouts/step_*.jsonl` row per trajectory; `extra` adds fields
    per trajectory (the rollout source's `prompt_index` and `staleness`)."""
    return [{"group_id": t.group_id, "sample_index": t.info.get("sample_index", 0), "reward": t.reward,
             "advantage": float(a), "num_tokens": int(t.loss_mask.sum()), "num_turns": t.num_turns,
             "stop_reason": t.stop_reason, "policy_version": t.policy_version,
             "policy_version_last": t.last_policy_version if t.last_policy_version is not None else "",
             **(extra[i] if extra else {}),
             "task_id": t.info.get("task_id", ""), "excluded": int(is_excluded(t)),
             "error": excluded_detail(t) if is_excluded(t) else "",
             "prompt": decode(t.prompt_ids), "response": decode(t.response_ids)}
            for i, (t, a) in enumerate(zip(trajs or [], advantages))]
