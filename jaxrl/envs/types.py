"""The environment contract: `Task` (one prompt), `Env` (what `reset` / `step` an environment
offers) and `StepResult` (what `step` returns); docs/architecture.md §1, §3.

These are the types that environments (`jaxrl.envs.verifiable`, `jaxrl.envs.harbor.agent`),
datasets (`jaxrl.envs.datasets`) and task suites (`jaxrl.envs.tasks`) share with the rollout loop
(`jaxrl.envs.base.run_rollouts`, which re-exports them). This module imports only the chat message
type, so each of those can import it without importing the loop.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional, Protocol

from jaxrl.envs.chat import Message


@dataclasses.dataclass
class Task:
    """One prompt of a dataset: what `Env.reset` starts from.

    Attributes:
      messages: the initial conversation (chat messages with `role` and `content`).
      reward_spec: how the final answer is scored (see `jaxrl.envs.rewards`).
      env: name of the environment in `jaxrl.envs.verifiable.ENV_REGISTRY` ("single_turn", "tool").
      tools: names of tools in `jaxrl.envs.tools.BUILTIN_TOOLS` the env exposes (tool envs).
      task_id: a stable identifier (for logs and split checks).
      metadata: free-form extra data.
    """

    messages: list[Message]
    reward_spec: dict
    env: str = "single_turn"
    tools: tuple[str, ...] = ()
    task_id: str = ""
    metadata: dict = dataclasses.field(default_factory=dict)


# A key of `StepResult.info`: True when the episode continues only to let the model confirm (e.g. the
# terminal agent's first `task_complete: true`); on the last allowed turn it then ends as "stop", not
# "max_turns" (there is no turn left to confirm in). It is not kept in the trajectory's info.
DONE_IF_LAST_TURN = "done_if_last_turn"


class StepResult(NamedTuple):
    """What `Env.step` returns; unpacks as `(observations, reward, done, info)`."""

    observations: list[Message]
    reward: float
    done: bool
    info: dict


class Env(Protocol):
    """A (possibly multi-turn) environment. One instance serves one trajectory.

    Attributes:
      tools: JSON schemas of the tools the model may call (rendered by the chat template into the
        system prompt), or None; valid after `reset`.
    """

    tools: Optional[list[dict]]

    def reset(self, task: Task) -> list[Message]:
        """Starts an episode; returns the initial messages (the prompt)."""
        ...

    def step(self, assistant_text: str) -> StepResult:
        """Consumes one assistant turn (final content, thinking removed)."""
        ...

    # Optional: `step_truncated(assistant_text) -> StepResult`. Scores a turn that a token limit cut
    # (the episode then ends) WITHOUT executing anything it asks for; only its reward and info are
    # used. Envs without it give a cut turn reward 0 (see `run_rollouts`).
    # Optional: `finish(stop_reason, info) -> (reward, info)`, called once when the episode ended
    # (module docstring); `close()`, called last, releases resources (sandboxes, files).
