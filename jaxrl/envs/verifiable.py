"""Environments with verifiable rewards: single-turn answer checking and a tool-use loop.

`make_env(task)` builds the environment named by `task.env` from `ENV_REGISTRY`:

* `single_turn` (`SingleTurnEnv`): one assistant turn, scored with `task.reward_spec`.
* `tool` (`ToolEnv`): the assistant may call the tools named in `task.tools`; every turn that
  contains `<tool_call>` blocks gets the results (or error observations) back as `tool`
  messages and reward 0; the first turn without a tool call is the final answer, scored with
  `task.reward_spec`, and ends the episode.

Both define `step_truncated` (the rollout loop calls it for a turn cut by a token limit): it
scores the turn like `step` would but never runs a tool; a cut turn with tool calls gets 0.
"""
from __future__ import annotations

from typing import Callable, Optional

from jaxrl.envs.types import Env, StepResult, Task
from jaxrl.envs.chat import Message
from jaxrl.envs.rewards import compute_reward, extract_answer, validate_reward_spec
from jaxrl.envs.tools import BUILTIN_TOOLS, Tool, parse_tool_calls, run_tool_calls


class SingleTurnEnv:
    """One question, one answer, reward from the task's reward spec."""

    tools: Optional[list[dict]] = None

    def __init__(self):
        self._spec: Optional[dict] = None

    def reset(self, task: Task) -> list[Message]:
        validate_reward_spec(task.reward_spec, where=f"task {task.task_id!r}: reward_spec")
        self._spec = dict(task.reward_spec)
        return [dict(m) for m in task.messages]

    def step(self, assistant_text: str) -> StepResult:
        if self._spec is None:
            raise RuntimeError("SingleTurnEnv.step called before reset")
        reward = compute_reward(self._spec, assistant_text)
        return StepResult([], reward, True, {"extracted_answer": extract_answer(assistant_text)})

    def step_truncated(self, assistant_text: str) -> StepResult:
        """A cut answer is scored like a finished one (scoring has no side effects)."""
        return self.step(assistant_text)


class ToolEnv:
    """Multi-turn tool use: run the calls of each turn, score the first turn without calls.

    Args:
      tools: the tools by name; default `BUILTIN_TOOLS` restricted to `task.tools` at reset.
    """

    def __init__(self, tools: Optional[dict[str, Tool]] = None):
        self._registry = dict(BUILTIN_TOOLS if tools is None else tools)
        self._tools: dict[str, Tool] = {}
        self.tools: Optional[list[dict]] = None
        self._spec: Optional[dict] = None
        self._num_calls = 0
        self._num_errors = 0

    def reset(self, task: Task) -> list[Message]:
        validate_reward_spec(task.reward_spec, where=f"task {task.task_id!r}: reward_spec")
        if not task.tools:
            raise ValueError(f"task {task.task_id!r}: env 'tool' needs a non-empty tools list; "
                             f"available tools: {', '.join(sorted(self._registry))}")
        unknown = [name for name in task.tools if name not in self._registry]
        if unknown:
            raise ValueError(f"task {task.task_id!r}: tools: unknown tool(s) {unknown}; "
                             f"available: {', '.join(sorted(self._registry))}")
        self._tools = {name: self._registry[name] for name in task.tools}
        self.tools = [t.schema() for t in self._tools.values()]
        self._spec = dict(task.reward_spec)
        self._num_calls = self._num_errors = 0
        return [dict(m) for m in task.messages]

    def step(self, assistant_text: str) -> StepResult:
        if self._spec is None:
            raise RuntimeError("ToolEnv.step called before reset")
        calls = parse_tool_calls(assistant_text)
        if calls:
            observations = run_tool_calls(calls, self._tools)
            self._num_calls += len(calls)
            self._num_errors += sum(o["content"].startswith("Error: ") for o in observations)
            return StepResult(observations, 0.0, False, self._info(None))
        reward = compute_reward(self._spec, assistant_text)
        return StepResult([], reward, True, self._info(extract_answer(assistant_text)))

    def step_truncated(self, assistant_text: str) -> StepResult:
        """A turn cut by a token limit: its tool calls are NOT run (reward 0, their count in
        `info["unexecuted_tool_calls"]`); a cut turn without calls is scored as the final answer."""
        if self._spec is None:
            raise RuntimeError("ToolEnv.step_truncated called before reset")
        calls = parse_tool_calls(assistant_text)
        if calls:
            return StepResult([], 0.0, True, {**self._info(None), "unexecuted_tool_calls": len(calls)})
        reward = compute_reward(self._spec, assistant_text)
        return StepResult([], reward, True, self._info(extract_answer(assistant_text)))

    def _info(self, answer) -> dict:
        return {"num_tool_calls": self._num_calls, "num_tool_errors": self._num_errors, "extracted_answer": answer}


ENV_REGISTRY: dict[str, Callable[[], Env]] = {"single_turn": SingleTurnEnv, "tool": ToolEnv}


def register_env(name: str, factory: Callable[[], Env]) -> None:
    """Adds an environment constructor under `name` (tasks select it with `Task.env`)."""
    if name in ENV_REGISTRY:
        raise ValueError(f"environment {name!r} is already registered")
    ENV_REGISTRY[name] = factory


def make_env(task: Task) -> Env:
    """A fresh environment for `task` (call `reset(task)` next).

    Raises:
      ValueError: `task.env` is not registered (the message lists the registered names).
    """
    if task.env not in ENV_REGISTRY:
        raise ValueError(f"task {task.task_id!r}: env {task.env!r} is not registered; "
                         f"registered: {', '.join(sorted(ENV_REGISTRY))}")
    return ENV_REGISTRY[task.env]()
