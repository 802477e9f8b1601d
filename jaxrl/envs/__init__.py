"""jaxrl.envs: environments, chat templates, verifiable tasks and the multi-turn rollout loop.

Public API:
  Task, Trajectory, Env, StepResult, RolloutConfig, run_rollouts   (base.py)
  ChatTemplate, load_tokenizer, split_thinking, DEFAULT_POLICY_DIR  (chat.py)
  Tool, ToolCall, ToolCallError, parse_tool_calls, run_tool_calls, BUILTIN_TOOLS  (tools.py)
  compute_reward, validate_reward_spec, extract_answer             (rewards.py)
  SingleTurnEnv, ToolEnv, make_env, register_env, ENV_REGISTRY     (verifiable.py)
  get_task_suite, register_task, TASK_REGISTRY                     (tasks/)
  load_tasks, DatasetError                                         (datasets.py)
"""
from jaxrl.envs.base import STOP_REASONS, Env, RolloutConfig, StepResult, Task, Trajectory, run_rollouts
from jaxrl.envs.chat import DEFAULT_POLICY_DIR, ChatTemplate, load_tokenizer, split_thinking
from jaxrl.envs.datasets import DatasetError, load_tasks
from jaxrl.envs.rewards import compute_reward, extract_answer, validate_reward_spec
from jaxrl.envs.tasks import TASK_REGISTRY, get_task_suite, register_task
from jaxrl.envs.tools import BUILTIN_TOOLS, Tool, ToolCall, ToolCallError, parse_tool_calls, run_tool_calls
from jaxrl.envs.verifiable import ENV_REGISTRY, SingleTurnEnv, ToolEnv, make_env, register_env

__all__ = [
    "STOP_REASONS", "Env", "RolloutConfig", "StepResult", "Task", "Trajectory", "run_rollouts",
    "DEFAULT_POLICY_DIR", "ChatTemplate", "load_tokenizer", "split_thinking",
    "DatasetError", "load_tasks",
    "compute_reward", "extract_answer", "validate_reward_spec",
    "TASK_REGISTRY", "get_task_suite", "register_task",
    "BUILTIN_TOOLS", "Tool", "ToolCall", "ToolCallError", "parse_tool_calls", "run_tool_calls",
    "ENV_REGISTRY", "SingleTurnEnv", "ToolEnv", "make_env", "register_env",
]
