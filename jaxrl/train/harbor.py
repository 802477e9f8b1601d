"""Harbor terminal tasks in the trainer: the task sets and their splits, the verifier gate, the
Terminus env of the rollouts, and what the run logs get per trial.

A run trains on Harbor tasks when `data.task == "harbor"`, or `data.task == "dataset"` with a
`data.dataset_path` that is a Harbor task set (a directory, a DCAgent Parquet file with a
`task_binary` column, or a `family:` spec; `is_task_set`). Each trajectory is one trial: a sandbox,
the Terminus-style agent loop (`jaxrl.envs.harbor.agent`), then the task's verifier. The logs get:

* `trial_stats.csv`: the trainer's columns plus the trial's `TrialResult.to_row()` (outcome, verifier
  reward, durations, commands, limits hit, error) and the agent's `n_turns`, `n_parse_errors`,
  `agent_stop`;
* metrics `env/outcome_<outcome>` (trials per outcome in the step), `env/avg_num_turns`,
  `env/parse_error_rate` (parse errors per model turn);
* `rollouts/step_XXXXXX.jsonl` with each episode's turns, and `rollouts/step_XXXXXX.md`, the same
  episodes for a person (turns, commands, terminal output, reward).
"""
from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from typing import Any, Optional


from jaxrl import config as config_lib
from jaxrl.envs.harbor import HarborTaskError, Outcome, SandboxConfig, TrialConfig
from jaxrl.envs.harbor.agent import (INITIAL_SCREEN, AgentConfig, TerminusEnvFactory, episode_markdown,
                                     initial_prompt, prompt_style, rollout_tasks)
from jaxrl.envs.harbor.dataset import gate_tasks, is_task_set, split_tasks
from jaxrl.envs.harbor.runner import default_concurrency

__all__ = ["HarborTasks", "is_harbor_run", "is_task_set", "trial_fields", "outcome_metrics", "episodes_markdown"]


class HarborTasks:
    """The train and held-out Harbor tasks of a run (`data.*` keys), as rollout `Task`s.

    Family tasks are written and Parquet tasks unpacked into a temporary folder (removed at exit),
    so that a bad task set fails before the run directory is written.

    Raises:
      ConfigError: a task set that cannot be loaded (naming the task and the missing piece).
    """

    def __init__(self, c):
        self.c = c
        self.tasks_dir = tempfile.mkdtemp(prefix="jaxrl-tasks-")
        atexit.register(shutil.rmtree, self.tasks_dir, True)
        try:
            train, held = split_tasks(c.data.dataset_path, c.data.eval_dataset_path, c.data.eval_fraction,
                                      c.data.eval_split_seed, self.tasks_dir,
                                      environment_backend=str(c.harbor.environment_backend))
        except (HarborTaskError, FileNotFoundError) as e:
            key = "data.eval_dataset_path" if c.data.eval_dataset_path and c.data.eval_dataset_path in str(e) \
                else "data.dataset_path"
            raise config_lib.ConfigError(key, str(e), "fix or remove the task named above (`python -m jaxrl.tasks "
                                         "list PATH` lists every problem)") from None
        self.train_harbor, self.eval_harbor = train, held
        self.train_tasks = rollout_tasks(train)
        self.eval_tasks = rollout_tasks(held)
        self.excluded: list[tuple[str, str]] = []

    @property
    def error_policy(self):
        """The run's `ErrorPolicy` (`harbor.error_policy.*`)."""
        from jaxrl.train.error_policy import ErrorPolicy

        return ErrorPolicy.from_config(self.c.harbor.error_policy)

    @property
    def style(self):
        return prompt_style(self.c.harbor.prompt_style, str(self.c.harbor.harbor_wheel))

    def prompt_messages(self, task) -> list[dict]:
        """The first user message of `task` as the agent sends it (with the shell's usual first screen)."""
        ht = task.metadata["harbor_task"]
        style = self.style
        state = INITIAL_SCREEN if style.screen is None else style.screen.format(screen=INITIAL_SCREEN)
        return [{"role": "user", "content": initial_prompt(ht.instruction, state, style)}]

    def gate(self, workdir: str) -> list[str]:
        """Runs the verifier sanity gate over the train and held-out tasks (cached in
        `workdir/task_gate.json`), drops the failing ones, and returns one line per excluded task.

        Raises:
          ConfigError: every training task fails the gate.
        """
        trial = TrialConfig(keep="none", sandbox=SandboxConfig(pip_mirror=self.c.harbor.pip_mirror or None,
                                                          tool_mirror=self.c.harbor.tool_mirror or None),
                            images=config_lib.image_cache_config(self.c.harbor))
        kept_train, failed_train = gate_tasks(self.train_harbor, os.path.join(workdir, "task_gate.json"),
                                              config=trial, concurrency=self.concurrency(len(self.train_harbor)))
        kept_eval, failed_eval = gate_tasks(self.eval_harbor, os.path.join(workdir, "task_gate.json"),
                                            config=trial, concurrency=self.concurrency(len(self.eval_harbor)))
        if not kept_train:
            raise config_lib.ConfigError("data.verify_tasks", f"every one of the {len(self.train_harbor)} training "
                                         f"tasks fails the verifier sanity gate (e.g. {failed_train[0][0]}: "
                                         f"{failed_train[0][1]})", "fix the task set, or set data.verify_tasks=False")
        self.excluded = failed_train + failed_eval
        self.train_harbor, self.eval_harbor = kept_train, kept_eval
        self.train_tasks, self.eval_tasks = rollout_tasks(kept_train), rollout_tasks(kept_eval)
        return [f"task {name} excluded by the verifier sanity gate: {why}" for name, why in self.excluded]

    @property
    def heldout_kind(self) -> str:
        """What the held-out tasks are, for the report ("" when there are none)."""
        d = self.c.data
        if not self.eval_tasks:
            return ""
        if d.eval_dataset_path:
            return f"the Harbor tasks of data.eval_dataset_path ({d.eval_dataset_path})"
        return (f"{100 * d.eval_fraction:g}% of the Harbor tasks of data.dataset_path held out (split seed "
                f"{d.eval_split_seed})")

    def concurrency(self, num_trials: int) -> int:
        """Threads driving the trials of one call (`harbor.concurrency`; 0 = one per trial, up to
        max(16, 8 x `runner.default_concurrency()`))."""
        if self.c.harbor.concurrency:
            return int(self.c.harbor.concurrency)
        return max(1, min(num_trials, max(16, 8 * default_concurrency())))

    def make_env_factory(self, workdir: str) -> TerminusEnvFactory:
        """The `make_env` of this run's rollouts (trial directories under `workdir/trials/`; with
        `harbor.keep_trial_logs=False` each is removed when its trial ends, and `remove_empty_trials_dir`
        removes the folder at the end of the run). Every image of a task on the image backend is built
        first (`build_images`; a cache hit costs a context hash) and pinned for the rest of the process,
        so no rollout waits on a build and the cache's eviction never removes an image the run uses.

        Raises:
          ConfigError: a task's image does not build (only reachable with `data.verify_tasks=False`:
            the gate leaves such tasks out).
        """
        h = self.c.harbor
        trial = TrialConfig(agent_timeout_sec=h.agent_timeout_sec or None,
                            verifier_timeout_sec=h.verifier_timeout_sec or None,
                            command_timeout_sec=float(h.command_timeout_sec),
                            keep="logs" if h.keep_trial_logs else "none",
                            stop_agent_processes=bool(h.stop_agent_processes),
                            images=config_lib.image_cache_config(h),
                            sandbox=SandboxConfig(pip_mirror=h.pip_mirror or None, tool_mirror=h.tool_mirror or None),
                            # terminus-2 sees a real tmux pane, as in Harbor; the compact policy its pty shell
                            terminal="tmux" if h.prompt_style == "terminus-2" else "pty")
        self._build_images(trial)
        trials_dir = os.path.join(workdir, "trials")  # created by the first trial
        return TerminusEnvFactory(AgentConfig(prompt_style=h.prompt_style, harbor_wheel=str(h.harbor_wheel),
                                              strict_json_parser=bool(h.strict_json_parser),
                                              max_output_bytes=int(h.max_output_bytes),
                                              max_output_tokens=int(self.c.generator.sampling_params.max_generate_length),
                                              trial=trial, trials_dir=trials_dir))


    def _build_images(self, trial: TrialConfig) -> None:
        from jaxrl.envs.harbor.runner import build_images

        tasks = list(self.train_harbor) + list(self.eval_harbor)
        errors, _pinned = build_images(tasks, trial)  # pinned until the process ends
        if errors:
            path, why = next(iter(errors.items()))
            name = next((t.name for t in tasks if str(t.path) == path), path)
            more = f" ({len(errors) - 1} more tasks fail to build)" if len(errors) > 1 else ""
            raise config_lib.ConfigError("data.dataset_path", f"the image of task {name} does not build: {why}{more}",
                                         "fix its Dockerfile, or set data.verify_tasks=True so the verifier "
                                         "gate leaves tasks that do not build out")


def remove_stale_trials(workdir: str) -> int:
    """Removes the trial folders in `workdir/trials/` at the start of a launch that keeps no trial
    logs (`harbor.keep_trial_logs=False`): each trial removes its own folder when it ends, so the
    ones found here were left by a launch killed mid-trial (kill -9, a node failure), and the
    workdir lock rules out a live run using them. Returns how many were removed.

    Raises:
      OSError: a folder could not be removed (`fsutil.remove_tree`).
    """
    from jaxrl.envs.harbor.fsutil import remove_tree

    trials = os.path.join(workdir, "trials")
    try:
        names = os.listdir(trials)
    except FileNotFoundError:
        return 0
    for name in names:
        path = os.path.join(trials, name)
        if os.path.isdir(path) and not os.path.islink(path):
            remove_tree(path)
        else:
            os.unlink(path)
    return len(names)


def remove_empty_trials_dir(workdir: str) -> None:
    """Removes `workdir/trials/` when no trial left anything in it (`harbor.keep_trial_logs=False`:
    every trial removes its own directory); a folder holding trial logs stays."""
    import errno

    try:
        os.rmdir(os.path.join(workdir, "trials"))
    except OSError as e:
        if e.errno not in (errno.ENOENT, errno.ENOTEMPTY, errno.EEXIST):
            raise


def is_harbor_run(c) -> bool:
    """True when config `c` trains on Harbor tasks: `data.task == "harbor"`, or `data.task ==
    "dataset"` with a `data.dataset_path` that is a Harbor task set (`is_task_set`)."""
    return config_lib._is_harbor_run(c)


def trial_fields(info: dict) -> dict[str, Any]:
    """What a trajectory adds to its trial_stats.csv row and rollout record: the trial's row
    (`TrialResult.to_row()` + agent columns) and the `episode` (text, rollouts only)."""
    row = dict(info.get("trial") or {})
    out: dict[str, Any] = {f"trial_{k}" if k in ("reward", "error") else k: v for k, v in row.items()}
    out["outcome"] = info.get("outcome", row.get("outcome", ""))
    for k in ("error_class", "error_treatment", "attempts"):
        if k in info:
            out[k] = info[k]
    for k in ("episode", "instruction"):
        if k in info:
            out[k] = info[k]
    return out


def outcome_metrics(trajs) -> dict[str, float]:
    """`env/outcome_<name>` (trials of the step per outcome, every outcome listed), `env/avg_num_turns`
    and `env/parse_error_rate` (parse errors per model turn)."""
    m: dict[str, float] = {}
    outcomes = [t.info.get("outcome") for t in trajs]
    for o in Outcome:
        m[f"env/outcome_{o.value}"] = float(sum(x == o.value for x in outcomes))
    turns = sum(t.num_turns for t in trajs)
    m["env/avg_num_turns"] = turns / max(len(trajs), 1)
    m["env/parse_error_rate"] = sum(int((t.info.get("trial") or {}).get("n_parse_errors", 0)) for t in trajs) \
        / max(turns, 1)
    from jaxrl.train.error_policy import policy_metrics

    m.update(policy_metrics(trajs))
    return m


def episodes_markdown(step: int, trials: list[dict]) -> Optional[str]:
    """`rollouts/step_XXXXXX.md`: every episode of the step for a person (None without episodes)."""
    if not any("episode" in t for t in trials):
        return None
    parts = [f"# Step {step}: {len(trials)} episodes", ""]
    for t in trials:
        title = (f"{t.get('task_id', '?')} (group {t.get('group_id')}, sample {t.get('sample_index')}, "
                 f"advantage {float(t.get('advantage', 0.0)):+.3f})")
        parts.append(episode_markdown(title, float(t.get("reward", 0.0)), str(t.get("outcome", "")),
                                      str(t.get("stop_reason", "")), t.get("episode") or [],
                                      t.get("instruction", ""),
                                      extra=f"Error: {t['trial_error']}" if t.get("trial_error") else ""))
    return "\n".join(parts)


def print_excluded(lines: list[str]) -> None:
    for line in lines:
        print(f"jaxrl: {line}", file=sys.stderr)
