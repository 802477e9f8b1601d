"""Built-in tasks with verifiable rewards, registered by name.

    suite = get_task_suite("arithmetic")          # or "arithmetic_partial", "calculator"
    train = suite.dataset("train")                # list[Task], fixed order
    held_out = suite.dataset("eval", num=200, seed=0)

Each suite enumerates its whole problem space, shuffles it once with `split_seed` and cuts it
into a train and an eval split, so the splits never overlap and do not depend on the sampling
seed.
"""
from __future__ import annotations

from typing import Callable

from jaxrl.envs.tasks.arithmetic import ArithmeticTask, CalculatorTask, TaskSuite

TASK_REGISTRY: dict[str, Callable[..., TaskSuite]] = {}


def register_task(name: str, factory: Callable[..., TaskSuite]) -> None:
    """Registers a task-suite constructor under `name`; raises ValueError if the name is taken."""
    if name in TASK_REGISTRY:
        raise ValueError(f"task {name!r} is already registered")
    TASK_REGISTRY[name] = factory


def get_task_suite(name: str, **kwargs) -> TaskSuite:
    """Builds the registered suite `name` with keyword overrides of its constructor.

    Raises:
      ValueError: unknown name (the message lists the registered tasks).
    """
    if name not in TASK_REGISTRY:
        raise ValueError(f"unknown task {name!r}; registered tasks: {', '.join(sorted(TASK_REGISTRY))}")
    return TASK_REGISTRY[name](**kwargs)


register_task("arithmetic", ArithmeticTask)
register_task("arithmetic_partial", lambda **kw: ArithmeticTask(**{"format_reward": 0.1, **kw}))
register_task("calculator", CalculatorTask)

__all__ = ["TASK_REGISTRY", "register_task", "get_task_suite", "TaskSuite", "ArithmeticTask", "CalculatorTask"]
