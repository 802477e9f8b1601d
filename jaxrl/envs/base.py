"""Environments, the Trajectory contract and the multi-turn rollout loop (docs/architecture.md §1, §3).

An environment is a conversation partner with a verifiable reward (SkyRL-Gym style):
`reset(task) -> messages`, then `step(assistant_text) -> (observations, reward, done, info)`.

`run_rollouts` turns tasks into `Trajectory`s, token-in / token-out:

* the prompt is rendered once with the checkpoint's chat template (`ChatTemplate.encode_prompt`);
* every turn, all live conversations are sent to the `Generator` in batched `generate` calls
  (turn 0 sends each distinct prompt once with `n = n_samples_per_prompt`);
* the sampled ids are appended exactly as returned (stop token included): `loss_mask` 1 and
  `rollout_logprobs` = the engine's logprobs (μ) on them;
* the text handed to the environment is the decoded turn with special tokens and any
  `<think>...</think>` reasoning removed (`chat.split_thinking`);
* observations are appended as the template tokens that close the assistant turn, render the new
  messages and open the next assistant turn (`ChatTemplate.encode_observation`): `loss_mask` 0,
  `rollout_logprobs` 0. Earlier tokens are never re-rendered or re-tokenized.

So at every turn the tokens sent to the engine are exactly `prompt_ids + response_ids` so far,
and the final trajectory is the last request plus the last completion (the prefix property).

Boundaries (what the loop refuses to pass on):

* engine output is validated where it enters: a completion with no tokens, more tokens than
  requested, a logprob count that differs from its token count, a token id outside
  `[0, vocab_size)`, a non-finite logprob (NaN, ±inf) or an unknown finish_reason is NOT
  appended; its trajectory ends with `stop_reason="invalid_output"`, reward 0, and
  `info["invalid_output"]` naming the problem, the turn, the task id and the sample index;
* a turn cut by a token limit (finish_reason "length") is by default never passed to `env.step`:
  nothing it asks for (a complete `<tool_call>` written before the cut, a shell command) is
  executed, and the episode ends with `length`. An env that defines `step_truncated(text)` (a
  scoring-only step, e.g. `SingleTurnEnv`, `ToolEnv`) still scores the cut turn
  (`info["truncated_turn"] = "scored"`); otherwise it gets reward 0 (`"not_executed"`).
  `RolloutConfig.execute_truncated_turns=True` passes it to `env.step` instead (`"executed"`).
  An env that defines `reprompt_truncated(text)` (the terminal agent: Harbor's output-length
  re-prompt) gets a turn cut by `max_tokens_per_turn` there instead, before the last turn: nothing
  of it runs, its observations are appended and the episode goes on;
* an `env.step` that raises, returns a non-finite reward, or returns observations the chat
  template cannot render ends that trajectory with `env_error`;
* `RolloutConfig.max_input_tokens` bounds the tokens sent to the engine for one turn (the model's
  context): an observation that would make the next turn's input longer ends the episode with
  `length` (`info["truncated_by"] = "max_input_tokens"`), as `max_seq_len` does.

Episode end. An env may define `finish(stop_reason, info) -> (reward, info)`: it is called once per
trajectory after its episode ended, whatever the reason, before `close()`. It scores a final state
the loop cannot see (the terminal env runs the task's verifier there, also after `max_turns` or an
agent timeout, and records why an unverified episode ended); its reward is added to the step
rewards (a trajectory ending in `env_error` / `invalid_output` keeps reward 0) and its info is merged.

Concurrency. `env.reset`, `env.step`, `env.finish` and `env.close` of the live trajectories run on
`RolloutConfig.env_workers` threads, so environments that wait (a sandboxed command waits for its
`duration`) wait together: a turn over 64 terminal trials costs about one wait, not 64. Generation
stays turn-synchronous (every live trajectory's request of turn t is batched before any of turn
t+1), so the batches and their seeds do not depend on thread timing.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import os
from typing import Any, Callable, Optional, Sequence

import numpy as np

from jaxrl.envs.chat import ChatTemplate, split_thinking
# The environment contract lives in jaxrl/envs/types.py (envs, datasets and task suites import it from there,
# below this module); these names stay importable from here.
from jaxrl.envs.types import DONE_IF_LAST_TURN, Env, StepResult, Task  # noqa: F401
from jaxrl.rollout.types import Completion, Generator, SamplingParams

STOP_REASONS = ("stop", "length", "max_turns", "env_error", "invalid_output")
"""`stop`: the environment ended the episode after a turn that ended on a stop token.
`length`: a token limit cut the episode (`info["truncated_by"]` is `max_tokens_per_turn` or
`max_seq_len`; `info["truncated_turn"]` says what became of a cut turn: "scored" by the env's
`step_truncated`, "not_executed" (reward 0), or "executed" by `env.step` under
`execute_truncated_turns`). `max_turns`: the turn limit
was reached with the episode still open. `env_error`: `env.step` raised, returned a non-finite
reward or unrenderable observations (`info["error"]` holds the message); reward 0.
`invalid_output`: the engine returned an invalid completion (module docstring), which was not
appended (`info["invalid_output"]` says what, with the task id); reward 0. The trainer leaves
`env_error` / `invalid_output` trajectories out of the loss."""


@dataclasses.dataclass
class Trajectory:
    """One rollout (docs/architecture.md §3). Host-side numpy arrays.

    Attributes:
      prompt_ids: [P] int32, the rendered initial conversation incl. the generation prompt.
      response_ids: [R] int32, every token after the prompt: generated tokens and observation /
        template tokens, in order.
      loss_mask: [R] int32, 1 exactly on generated tokens, 0 on observation / template tokens.
      rollout_logprobs: [R] float32, the engine's logprob μ of each generated token, 0 elsewhere.
      reward: float, the sum of the environment's step rewards (0 on `env_error`).
      stop_reason: one of `STOP_REASONS`.
      group_id: id shared by the `n_samples_per_prompt` samples of one task.
      policy_version: oldest weights version among the turns' completions (the version of the
        first generated token: sidecars only move to newer versions); 0 when no turn was generated.
      num_turns: number of assistant turns generated.
      info: the environment's step infos merged (later steps override), plus `task_id`,
        `sample_index`, and `truncated_by` / `error` where relevant.
      last_policy_version: newest weights version among the turns' completions (the version of
        the last generated token); above `policy_version` when the episode spanned a weight update
        (asynchronous RL: a sidecar loads new weights between requests). None when no turn was
        generated.
    """

    prompt_ids: np.ndarray
    response_ids: np.ndarray
    loss_mask: np.ndarray
    rollout_logprobs: np.ndarray
    reward: float
    stop_reason: str
    group_id: int
    policy_version: int
    num_turns: int
    info: dict = dataclasses.field(default_factory=dict)
    last_policy_version: Optional[int] = None

    def __post_init__(self):
        r = len(self.response_ids)
        if len(self.loss_mask) != r or len(self.rollout_logprobs) != r:
            raise ValueError(f"Trajectory: response_ids [{r}], loss_mask [{len(self.loss_mask)}] and "
                             f"rollout_logprobs [{len(self.rollout_logprobs)}] must have the same length")
        if self.stop_reason not in STOP_REASONS:
            raise ValueError(f"Trajectory.stop_reason must be one of {STOP_REASONS}, got {self.stop_reason!r}")


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """Limits of the rollout loop.

    Attributes:
      n_samples_per_prompt: trajectories per task (one group).
      max_turns: assistant turns per trajectory (1 = single-turn).
      max_tokens_per_turn: generation budget of one turn (stop token included).
      max_seq_len: budget of prompt + response tokens; a turn never generates past it and an
        observation that would leave no room for one more generated token ends the episode.
      max_input_tokens: longest input (prompt + response so far) one turn may be sent with, e.g. the
        agent's context limit (Terminus's `max_input_tokens`); None = only `max_seq_len` applies.
      env_workers: threads running the `env.reset` / `step` / `finish` / `close` calls of the live
        trajectories concurrently (1 = in order).
      execute_truncated_turns: pass a turn cut by `max_tokens_per_turn` / `max_seq_len` to
        `env.step` (its tool calls run and it is scored) before ending the episode with `length`.
        Default False: a cut turn is never executed (it may hold a complete `<tool_call>` written
        before the cut, and tools may have side effects); the env's `step_truncated`, if any,
        scores it.
      vocab_size: sampled token ids must be in [0, vocab_size); None = the tokenizer's size
        (`len(chat.tokenizer)`, ids it can decode). Set the model's embedding size to also accept
        its padding rows.
    """

    n_samples_per_prompt: int = 1
    max_turns: int = 1
    max_tokens_per_turn: int = 256
    max_seq_len: int = 1024
    max_input_tokens: Optional[int] = None
    env_workers: int = 1
    execute_truncated_turns: bool = False
    vocab_size: Optional[int] = None

    def __post_init__(self):
        for name in ("n_samples_per_prompt", "max_turns", "max_tokens_per_turn", "max_seq_len", "env_workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"RolloutConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_input_tokens is not None and (isinstance(self.max_input_tokens, bool) or not isinstance(
                self.max_input_tokens, int) or self.max_input_tokens < 1):
            raise ValueError(f"RolloutConfig.max_input_tokens must be None or a positive int, got "
                             f"{self.max_input_tokens!r}")
        if not isinstance(self.execute_truncated_turns, bool):
            raise ValueError(f"RolloutConfig.execute_truncated_turns must be True or False, got "
                             f"{self.execute_truncated_turns!r}")
        if self.vocab_size is not None and (isinstance(self.vocab_size, bool) or not isinstance(self.vocab_size, int)
                                            or self.vocab_size < 1):
            raise ValueError(f"RolloutConfig.vocab_size must be None or a positive int, got {self.vocab_size!r}")


@dataclasses.dataclass
class _Conversation:
    env: Any
    tools: Optional[list[dict]]
    prompt_ids: list[int]
    group_id: int
    info: dict
    response_ids: list[int] = dataclasses.field(default_factory=list)
    loss_mask: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    reward: float = 0.0
    num_turns: int = 0
    versions: list[int] = dataclasses.field(default_factory=list)
    stop_reason: Optional[str] = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def finish(self, reason: str, **info) -> None:
        self.stop_reason = reason
        self.info.update(info)

    def to_trajectory(self) -> Trajectory:
        return Trajectory(
            prompt_ids=np.asarray(self.prompt_ids, np.int32),
            response_ids=np.asarray(self.response_ids, np.int32),
            loss_mask=np.asarray(self.loss_mask, np.int32),
            rollout_logprobs=np.asarray(self.logprobs, np.float32),
            reward=float(self.reward),
            stop_reason=self.stop_reason,
            group_id=self.group_id,
            policy_version=min(self.versions) if self.versions else 0,
            num_turns=self.num_turns,
            info=self.info,
            last_policy_version=max(self.versions) if self.versions else None,
        )


def run_rollouts(
    generator: Generator,
    chat: ChatTemplate,
    tasks: Sequence[Task],
    sampling: SamplingParams,
    config: RolloutConfig,
    make_env: Optional[Callable[[Task], Env]] = None,
    group_ids: Optional[Sequence[int]] = None,
) -> list[Trajectory]:
    """Rolls out `n_samples_per_prompt` trajectories per task, all conversations concurrently.

    Args:
      generator: the rollout backend (sidecar client or in-process engine).
      chat: tokenizer + chat template of the policy checkpoint.
      tasks: the prompts; each sample gets its own env from `make_env(task)`.
      sampling: temperature / top-p / top-k / seed of every request. `max_tokens` and `n` are set
        per call by the loop (from `config`); `stop_token_ids` is extended with the template's
        stop ids. With a `seed`, call k of turn t uses seed `(seed * 1_000_003 + 1009 * t + k) % 2**31`.
      config: limits (see `RolloutConfig`).
      make_env: builds the env of a task; default `jaxrl.envs.verifiable.make_env`.
      group_ids: one id per task (default 0..len(tasks)-1).
    Returns:
      `len(tasks) * n_samples_per_prompt` trajectories, task-major (the samples of task i are
      entries i*n .. i*n+n-1).
    Raises:
      ValueError: a prompt leaves no room to generate within `max_seq_len` / `max_input_tokens`,
        bad `group_ids`.
      RuntimeError: the generator returned the wrong number of results or completions.
      Errors from `make_env` / `env.reset` (bad task data) propagate (every env created so far is
      closed first).
    Errors raised by `env.step` / `env.finish` do not propagate: that trajectory ends with
    `env_error`. An invalid completion ends its trajectory with `invalid_output` (module docstring).
    """
    if make_env is None:
        from jaxrl.envs.verifiable import make_env as default_make_env
        make_env = default_make_env
    if group_ids is None:
        group_ids = list(range(len(tasks)))
    if len(group_ids) != len(tasks):
        raise ValueError(f"run_rollouts: group_ids has {len(group_ids)} entries for {len(tasks)} tasks")
    stop_ids = tuple(dict.fromkeys(tuple(sampling.stop_token_ids) + chat.stop_token_ids))
    n = config.n_samples_per_prompt
    vocab_size = config.vocab_size if config.vocab_size is not None else len(chat.tokenizer)
    input_limit = min(config.max_seq_len - 1, config.max_input_tokens or config.max_seq_len)

    pool = concurrent.futures.ThreadPoolExecutor(config.env_workers, thread_name_prefix="jaxrl-env") \
        if config.env_workers > 1 else None

    def pmap(fn, items):
        return list(pool.map(fn, items) if pool is not None else map(fn, items))

    envs: list[Any] = []
    convs: list[_Conversation] = []
    try:
        slots = [(i, task, s) for i, task in enumerate(tasks) for s in range(n)]
        for task in tasks:  # make_env first (cheap; bad task data fails here before any reset)
            envs.extend(make_env(task) for _ in range(n))

        def reset(k):
            i, task, s = slots[k]
            env = envs[k]
            messages = env.reset(task)
            tools = getattr(env, "tools", None)
            return messages, tools, chat.encode_prompt(messages, tools)

        for (i, task, s), env, (messages, tools, prompt_ids) in zip(slots, envs, pmap(reset, range(len(slots)))):
            if len(prompt_ids) > input_limit:
                raise ValueError(f"run_rollouts: task {i} ({task.task_id or 'no id'}) has a {len(prompt_ids)}-token "
                                 f"prompt, which leaves no room to generate within max_seq_len={config.max_seq_len}"
                                 + (f" / max_input_tokens={config.max_input_tokens}" if config.max_input_tokens else "")
                                 + "; raise the limit or drop long prompts from the dataset")
            convs.append(_Conversation(env=env, tools=tools, prompt_ids=prompt_ids, group_id=int(group_ids[i]),
                                       info={"task_id": task.task_id, "sample_index": s}))

        for turn in range(config.max_turns):
            live = [c for c in convs if c.stop_reason is None]
            if not live:
                break
            budgets = {id(c): min(config.max_tokens_per_turn, config.max_seq_len - c.num_tokens) for c in live}
            completions = _generate_turn(generator, live, budgets, sampling, stop_ids, turn, first_turn=turn == 0)
            stepping, texts = [], []
            for c in live:
                comp = completions[id(c)]
                problem = _completion_problem(comp, budgets[id(c)], vocab_size)
                if problem is not None:
                    c.reward = 0.0
                    c.finish("invalid_output", invalid_output=(
                        f"turn {turn}: {problem} (task {c.info['task_id'] or 'no id'!r}, "
                        f"sample {c.info['sample_index']}); the completion was not appended"))
                    continue
                c.response_ids.extend(int(x) for x in comp.token_ids)
                c.loss_mask.extend([1] * len(comp.token_ids))
                c.logprobs.extend(float(x) for x in comp.logprobs)
                c.versions.append(int(comp.policy_version))
                c.num_turns += 1
                method = "step"
                if comp.finish_reason == "length" and not config.execute_truncated_turns:
                    # An unfinished turn is not an action: run none of its tool calls (issue 9 §6).
                    if _truncated_by(budgets[id(c)], config) == "max_tokens_per_turn" \
                            and callable(getattr(c.env, "reprompt_truncated", None)):
                        method = "reprompt_truncated"  # the env answers the cut turn and the episode goes on
                    elif not callable(getattr(c.env, "step_truncated", None)):
                        c.finish("length", truncated_by=_truncated_by(budgets[id(c)], config),
                                 truncated_turn="not_executed")
                        continue
                    else:
                        method = "step_truncated"
                stepping.append((c, method))
                texts.append(split_thinking(chat.decode(comp.token_ids))[1])
            steps = pmap(lambda k: _safe_step(stepping[k][0], texts[k], stepping[k][1]), range(len(stepping)))
            for (c, method), step in zip(stepping, steps):
                comp = completions[id(c)]
                if isinstance(step, Exception):
                    c.reward = 0.0
                    c.finish("env_error", error=f"{type(step).__name__}: {step}")
                    continue
                observations, reward, done, info = step
                info = dict(info or {})
                done_if_last = bool(info.pop(DONE_IF_LAST_TURN, False))
                c.reward += float(reward)
                c.info.update(info)
                if comp.finish_reason == "length" and method != "reprompt_truncated":
                    c.finish("length", truncated_by=_truncated_by(budgets[id(c)], config),
                             truncated_turn="scored" if method == "step_truncated" else "executed")
                elif done:
                    c.finish("stop")
                elif turn + 1 >= config.max_turns:  # the env's "done, unless another turn follows" ends it as done
                    c.finish("stop" if done_if_last else "max_turns")
                elif not observations:
                    c.reward = 0.0
                    c.finish("env_error", error="env.step returned done=False with no observation messages")
                else:
                    try:
                        obs_ids = chat.encode_observation(observations, comp.token_ids[-1], c.tools)
                    except Exception as e:  # noqa: BLE001 -- a bad observation ends that trajectory only
                        c.reward = 0.0
                        c.finish("env_error", error=f"env.step returned observations the chat template cannot "
                                                    f"render ({type(e).__name__}: {e})")
                        continue
                    if c.num_tokens + len(obs_ids) >= config.max_seq_len:
                        c.finish("length", truncated_by="max_seq_len")
                    elif c.num_tokens + len(obs_ids) > input_limit:
                        c.finish("length", truncated_by="max_input_tokens")
                    else:
                        c.response_ids.extend(obs_ids)
                        c.loss_mask.extend([0] * len(obs_ids))
                        c.logprobs.extend([0.0] * len(obs_ids))

        # Episode end: the env scores the final state (e.g. runs the verifier), in parallel.
        finishing = [c for c in convs if callable(getattr(c.env, "finish", None))]
        for c, result in zip(finishing, pmap(_safe_finish, finishing)):
            if isinstance(result, Exception):
                c.reward = 0.0
                if c.stop_reason not in EXCLUDED_STOP_REASONS:
                    c.finish("env_error", error=f"env.finish raised {type(result).__name__}: {result}")
                continue
            reward, info = result
            c.info.update(info)
            c.reward = 0.0 if c.stop_reason in EXCLUDED_STOP_REASONS else c.reward + reward
    finally:
        closing = [e for e in envs if callable(getattr(e, "close", None))]
        close_errors = [r for r in pmap(_safe_close, closing) if r is not None]
        if pool is not None:
            pool.shutdown()
        if close_errors:
            import logging

            logging.getLogger(__name__).warning("run_rollouts: %d env.close() calls raised; first: %s",
                                                len(close_errors), close_errors[0])
    return [c.to_trajectory() for c in convs]


EXCLUDED_STOP_REASONS = ("env_error", "invalid_output")
"""Stop reasons whose trajectories carry no reward signal (the trainer leaves them out of the loss)."""


def _safe_finish(conv: _Conversation):
    """`env.finish(stop_reason, info)` -> (finite reward, info dict), or the exception it raised."""
    try:
        reward, info = conv.env.finish(conv.stop_reason, dict(conv.info))
        reward = float(reward)
        if not math.isfinite(reward):
            raise ValueError(f"env.finish returned a non-finite reward {reward}; rewards must be finite numbers")
        return reward, dict(info or {})
    except Exception as e:  # noqa: BLE001 -- a failing env ends that trajectory, not the batch
        _raise_if_disk_full(e)
        return e


def _raise_if_disk_full(e: BaseException) -> None:
    """A full disk (ENOSPC / EDQUOT while an env writes its trial folder, logs, ...) is no env
    failure of one trajectory: it stops the run (`jaxrl.main` reports it in one line) instead of
    turning every later trajectory into an excluded env_error."""
    from jaxrl.fileio import disk_full_path

    if disk_full_path(e, os.sep) is not None:
        raise e


def _safe_close(env) -> Optional[Exception]:
    try:
        env.close()
    except Exception as e:  # noqa: BLE001 -- cleanup of one env must not stop the others
        return e
    return None


def _truncated_by(budget: int, config: RolloutConfig) -> str:
    return "max_seq_len" if budget < config.max_tokens_per_turn else "max_tokens_per_turn"


def _safe_step(conv: _Conversation, text: str, method: str = "step"):
    try:
        result = getattr(conv.env, method)(text)
        observations, reward, done, info = result
        reward = float(reward)
        if not math.isfinite(reward):
            raise ValueError(f"env.step returned a non-finite reward {reward}; rewards must be finite numbers")
        return StepResult(list(observations or []), reward, bool(done), dict(info or {}))
    except Exception as e:  # noqa: BLE001 -- an env failure ends that trajectory, not the batch
        _raise_if_disk_full(e)
        return e


def _generate_turn(generator: Generator, live: list[_Conversation], budgets: dict, sampling: SamplingParams,
                   stop_ids: tuple[int, ...], turn: int, first_turn: bool) -> dict[int, Completion]:
    """One turn: batched `generate` calls; returns the completion of each conversation by id()."""
    # Requests: (prompt ids, conversations). Turn 0 shares a request among samples of one prompt.
    requests: dict[Any, tuple[list[int], list[_Conversation]]] = {}
    for c in live:
        ids = c.prompt_ids + c.response_ids
        key = (c.group_id, tuple(ids)) if first_turn else id(c)
        requests.setdefault(key, (ids, []))[1].append(c)
    # One call per (max_tokens, n): SamplingParams is per call.
    calls: dict[tuple[int, int], list[tuple[list[int], list[_Conversation]]]] = {}
    for ids, members in requests.values():
        calls.setdefault((budgets[id(members[0])], len(members)), []).append((ids, members))
    out: dict[int, Completion] = {}
    for k, ((max_tokens, n), reqs) in enumerate(sorted(calls.items(), key=lambda kv: kv[0])):
        seed = None if sampling.seed is None else (sampling.seed * 1_000_003 + 1009 * turn + k) % 2**31
        params = dataclasses.replace(sampling, max_tokens=max_tokens, n=n, stop_token_ids=stop_ids, seed=seed)
        prompts = [ids for ids, _ in reqs]
        results = generator.generate(prompts, params)
        if len(results) != len(prompts):
            raise RuntimeError(f"generator returned {len(results)} results for {len(prompts)} prompts")
        for (ids, members), comps in zip(reqs, results):
            if len(comps) != n:
                raise RuntimeError(f"generator returned {len(comps)} completions for a prompt with n={n}")
            for c, comp in zip(members, comps):
                out[id(c)] = comp
    return out


def _completion_problem(comp: Any, max_tokens: int, vocab_size: int) -> Optional[str]:
    """What is wrong with an engine completion (None if it is valid); module docstring for the rules."""
    if not isinstance(comp, Completion):
        return f"the engine returned {type(comp).__name__}, not a Completion"
    if comp.finish_reason not in ("stop", "length"):
        return f"finish_reason {comp.finish_reason!r} (expected 'stop' or 'length')"
    if isinstance(comp.policy_version, bool) or not isinstance(comp.policy_version, (int, np.integer)):
        return f"policy_version {comp.policy_version!r} (expected an integer)"
    try:
        ids = np.asarray(comp.token_ids)
        logprobs = np.asarray(comp.logprobs, np.float64)
    except (TypeError, ValueError) as e:
        return f"token ids / logprobs are not arrays of numbers ({e})"
    t = ids.size
    if ids.ndim != 1 or t == 0 or t > max_tokens:
        return f"{t} generated tokens (expected 1..{max_tokens})"
    if ids.dtype.kind not in "iu":
        return f"token ids of dtype {ids.dtype} (expected integers)"
    if logprobs.shape != ids.shape:
        return f"{logprobs.size} logprobs for {t} token ids"
    bad = np.flatnonzero((ids < 0) | (ids >= vocab_size))
    if bad.size:
        i = int(bad[0])
        return f"token id {int(ids[i])} at generated position {i} is outside the vocabulary [0, {vocab_size})"
    bad = np.flatnonzero(~np.isfinite(logprobs))
    if bad.size:
        i = int(bad[0])
        return (f"logprob {logprobs[i]} at generated position {i} (token id {int(ids[i])}) is not finite "
                f"({bad.size} non-finite)")
    return None
