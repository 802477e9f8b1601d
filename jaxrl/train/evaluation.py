"""Held-out evaluation: one definition shared by the trainer (before, during and after training)
and `python -m jaxrl.evaluate`, so both give the same number for the same weights.

The held-out tasks come from `prompts.PromptSource.eval_batch`; each is rolled out once (n = 1)
with `generator.eval_sampling_params` (greedy by default; top-p / top-k of the training rollouts)
and the seed `derive_seed(seed, 11)`, under the training rollout limits (`rollout_config`). A
prompt is a success when its reward >= `trainer.success_threshold`.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from jaxrl import config as config_lib
from jaxrl.envs import RolloutConfig, Trajectory
from jaxrl.rollout.types import SamplingParams
from jaxrl.train.prompts import derive_seed


def rollout_config(c, n: int | None = None) -> RolloutConfig:
    """The rollout loop's limits (generator.*; `n` samples per prompt, default the run's)."""
    g = c.generator
    return RolloutConfig(n_samples_per_prompt=n or g.n_samples_per_prompt, max_turns=g.max_turns,
                         max_tokens_per_turn=g.sampling_params.max_generate_length,
                         max_seq_len=config_lib.rollout_max_seq_len(c),
                         max_input_tokens=int(g.max_input_tokens) or None,
                         execute_truncated_turns=g.execute_truncated_turns)


def engine_batch_rows(c) -> int:
    """Rows (prompts x samples) per engine batch of the run's JAX sidecars (`--max-batch-rows`)."""
    return min(512, c.trainer.train_batch_size * c.generator.n_samples_per_prompt)


def eval_sampling(c) -> SamplingParams:
    """Sampling of held-out evaluation: `eval_sampling_params` (temperature, greedy) with the
    training top-p / top-k, seed `derive_seed(seed, 11)`, the run's logprobs mode."""
    es, sp = c.generator.eval_sampling_params, c.generator.sampling_params
    return SamplingParams(temperature=es.temperature, greedy=bool(es.greedy), top_p=sp.top_p, top_k=max(sp.top_k, 0),
                          seed=derive_seed(c.seed, 11), logprobs_mode=c.generator.logprobs_mode)


def score(trajs: Sequence[Trajectory], success_threshold: float) -> dict[str, float]:
    """The held-out metrics of `trajs` (one per episode: `episodes_per_prompt(c)`
    episodes per prompt at a temperature, one when greedy).

    `eval/success_rate` p (share of rewards >= threshold), its binomial standard error
    `eval/success_rate_stderr` = sqrt(p(1 − p)/n) over the n scored episodes (samples of one task
    counted as independent: the spread to expect from another draw of as many prompts, or of the
    samples at a temperature > 0), `eval/avg_reward`, and `eval/num_excluded`: trajectories that
    failed for infrastructure reasons (env_error, invalid_output) are not scored (they say nothing
    about the policy), as in training."""
    from jaxrl.train.batching import is_excluded

    kept = [t for t in trajs if not is_excluded(t)]
    rewards = np.array([t.reward for t in kept], np.float64)
    n = len(rewards)
    p = float(np.mean(rewards >= success_threshold)) if n else 0.0
    return {"eval/success_rate": p, "eval/success_rate_stderr": float(np.sqrt(p * (1 - p) / n)) if n else 0.0,
            "eval/avg_reward": float(rewards.mean()) if n else 0.0, "eval/num_excluded": len(trajs) - n}


def episodes_per_prompt(c) -> int:
    """Episodes one held-out prompt is rolled out for: 1 when the evaluation is greedy, else
    `generator.eval_sampling_params.episodes_per_prompt` (the one reading of that key: `evaluate`,
    the held-out description and the report's ± count all use it)."""
    es = c.generator.eval_sampling_params
    return 1 if es.greedy else int(es.get("episodes_per_prompt", 1))


def evaluate(c, tasks, generate: Callable[[Any, SamplingParams, int], list[Trajectory]]):
    """Rolls out `tasks` `generator.eval_sampling_params.episodes_per_prompt` times each (1 when
    greedy) with `generate(tasks, sampling, n)` and scores every episode.

    Returns (metrics dict of `score`, the trajectories); ({}, []) for no tasks.
    """
    if not tasks:
        return {}, []
    trajs = generate(tasks, eval_sampling(c), episodes_per_prompt(c))
    return score(trajs, c.trainer.success_threshold), trajs


def generation_config(c, chat) -> dict:
    """generation_config.json entries of an exported policy: the held-out evaluation's decoding
    (greedy: `do_sample` false, sampling keys removed; else the evaluation temperature with the
    training top-p / top-k), `max_new_tokens` = generator.sampling_params.max_generate_length,
    and the chat template's end-of-turn ids as `eos_token_id` (`chat`: a `ChatTemplate`)."""
    es, sp = c.generator.eval_sampling_params, c.generator.sampling_params
    if es.greedy:
        out: dict = {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    else:
        out = {"do_sample": True, "temperature": float(es.temperature), "top_p": float(sp.top_p),
               "top_k": max(int(sp.top_k), 0)}
    out["max_new_tokens"] = int(sp.max_generate_length)
    out["eos_token_id"] = list(chat.stop_token_ids)
    return out


def describe(c, source) -> str:
    """What the held-out number is measured on, e.g. "200 prompts of the eval split of the
    arithmetic task, greedy, success = reward >= 1" ("" when there is no held-out set)."""
    if not source.heldout_kind or c.data.num_eval_prompts == 0:
        return ""
    n = len(source.eval_batch())
    es = c.generator.eval_sampling_params
    decoding = "greedy" if es.greedy else f"temperature {es.temperature:g}"
    if episodes_per_prompt(c) > 1:
        decoding += f", {episodes_per_prompt(c)} episodes per prompt"
    return (f"{n} prompt{'s' if n != 1 else ''} of {source.heldout_kind}, {decoding}, success = reward >= "
            f"{c.trainer.success_threshold:g}")
