"""Harbor / terminal-bench tasks on a laptop: task sets, a bubblewrap sandbox, trials and verifiers.

Task sets (`task.py`, `archive.py`)::

    from jaxrl.envs.harbor import load_task_set, SHIPPED_TASKS_DIR
    tasks = load_task_set(SHIPPED_TASKS_DIR)            # a task dir, a folder of tasks, or a DCAgent .parquet
    tasks[0].name, tasks[0].instruction, tasks[0].config.agent_timeout_sec, tasks[0].environment.profile

Environments (`profiles.py`): each task's Dockerfile is read (not built) and mapped to a host-side
profile (`shell`, or `python` = a read-only Python with pytest); unsupported instructions are refused
with the line named. `register_profile` adds profiles.

Trials (`trial.py`, `outcomes.py`, `sandbox.py`, `terminal.py`): one sandbox per trial (bwrap namespaces, no
network, read-only system, private /app /tmp /logs, cgroup or rlimit limits, every process killed at
the end)::

    from jaxrl.envs.harbor import Trial, TrialConfig, AgentTimeoutError
    trial = Trial(task, trial_dir, TrialConfig(agent_timeout_sec=900, verifier_timeout_sec=120)).start()
    first_screen = trial.terminal.read_new_output()     # the persistent shell (pty-backed bash)
    trial.send_keys("ls -la\\n", duration=1.0)           # Terminus keystrokes; waits <= duration (60 s cap)
    observation = trial.terminal.read_new_output()      # new output, <= 10 kB, head + tail kept
    r = trial.exec("python3 -m pytest -q", timeout=60)  # or a one-shot command: r.output, r.exit_code
    v = trial.verify()                                  # v.reward, v.outcome, v.details
    result = trial.close()                              # TrialResult; result.to_row() -> trial_stats.csv

`AgentTimeoutError` is raised by agent calls once the agent budget is spent; `trial.stop_agent(
Outcome.CONTEXT_LENGTH_EXCEEDED, msg)` ends a trial unverified. Outcomes: `Outcome` (ok,
agent_timeout, verifier_timeout, reward_missing, reward_empty, reward_unparsable, sandbox_error,
agent_error, context_length_exceeded).

Many at once (`runner.py`)::

    from jaxrl.envs.harbor import run_trials, check_tasks, oracle_agent
    results = run_trials([(t, my_agent) for t in tasks], concurrency=8)   # threads; arun_trials for asyncio
    checks = check_tasks(tasks)                                           # the oracle=1 / empty=0 gate

Task families (`families.py`): seeded generators with oracle transcripts (`make_task`,
`generate_tasks`, `load_transcript`), and the shipped set (`SHIPPED_TASKS_DIR`).

CLI: `python -m jaxrl.tasks {check,list,run-oracle} PATH`. Details: docs/terminal_tasks.md.
"""
from jaxrl.envs.harbor.archive import extract_parquet, pack_task, safe_extract_tar, write_parquet
from jaxrl.envs.harbor.errors import (AgentTimeoutError, HarborTaskError, SandboxError, SandboxUnavailableError,
                                      UnsupportedEnvironmentError)
from jaxrl.envs.harbor.families import (FAMILIES, SHIPPED_TASKS_DIR, TaskSpec, generate_tasks, load_transcript,
                                        make_task, write_shipped_tasks)
from jaxrl.envs.harbor.host import check_sandbox
from jaxrl.envs.harbor.outcomes import LIMIT_KINDS, AgentStop, Outcome, TrialResult, VerifierResult, parse_reward
from jaxrl.envs.harbor.profiles import EnvironmentSpec, Profile, register_profile, resolve_environment
from jaxrl.envs.harbor.python_runtime import find_python
from jaxrl.envs.harbor.runner import (TaskCheck, arun_trials, check_tasks, default_concurrency, empty_agent,
                                      format_check_table, oracle_agent, run_trial, run_trials)
from jaxrl.envs.harbor.sandbox import RunResult, Sandbox
from jaxrl.envs.harbor.sandbox_config import UNSAFE_HOST_BACKEND, Limits, SandboxConfig
from jaxrl.envs.harbor.task import HarborTask, TaskConfig, find_task_dirs, load_task, load_task_set, parse_task_toml
from jaxrl.envs.harbor.terminal import MAX_OUTPUT_BYTES, Terminal, keys_to_bytes, limit_output
from jaxrl.envs.harbor.trial import ExecResult, Trial, TrialConfig

__all__ = [
    "extract_parquet", "pack_task", "safe_extract_tar", "write_parquet",
    "AgentTimeoutError", "HarborTaskError", "SandboxError", "SandboxUnavailableError", "UnsupportedEnvironmentError",
    "FAMILIES", "SHIPPED_TASKS_DIR", "TaskSpec", "generate_tasks", "load_transcript", "make_task",
    "write_shipped_tasks",
    "EnvironmentSpec", "Profile", "find_python", "register_profile", "resolve_environment",
    "TaskCheck", "arun_trials", "check_tasks", "default_concurrency", "empty_agent", "format_check_table",
    "oracle_agent", "run_trial", "run_trials",
    "UNSAFE_HOST_BACKEND", "Limits", "RunResult", "Sandbox", "SandboxConfig", "check_sandbox",
    "HarborTask", "TaskConfig", "find_task_dirs", "load_task", "load_task_set", "parse_task_toml",
    "MAX_OUTPUT_BYTES", "Terminal", "keys_to_bytes", "limit_output",
    "LIMIT_KINDS", "AgentStop", "ExecResult", "Outcome", "Trial", "TrialConfig", "TrialResult", "VerifierResult",
    "parse_reward",
]
