"""A Terminus-2-style agent loop for Harbor tasks, as an env of the token-in/token-out rollout loop.

The policy plays Terminus-2 (Harbor's reference agent, the one the seed runs trained with):

* The first prompt is ONE user message (no system message): the agent's instructions, the response
  schema, `Task Description:` + the task's `instruction.md`, and `Current terminal state:` + the
  persistent shell's first screen (`PromptStyle.initial`).
* The model answers with a JSON object: `analysis` (str), `plan` (str), `commands` (a list of
  `{"keystrokes": str, "duration": seconds}`) and optionally `task_complete` (bool). Text around the
  object is tolerated with a warning; a missing closing brace is added with a warning
  (`parse_response`).
* A response that cannot be parsed runs nothing; the next prompt says what was wrong
  ("Previous response had parsing errors: ...").
* Otherwise each command's keystrokes are sent verbatim to the trial's shell (`Trial.send_keys`,
  tmux key names such as `C-c` translated), waiting `duration` seconds (at most 60, less when the
  command is back at the prompt). The next prompt is the terminal's new output,
  "New Terminal Output:" + at most `max_output_bytes` (10 kB, head and tail kept), after any parser
  warnings.
* `task_complete: true` must come twice in a row: the first time the commands of that turn run and
  the model is asked to confirm (`PromptStyle.confirm`); a second `true` ends the episode, anything
  else continues it. On the last allowed turn (`max_turns`) there is no turn left to confirm in: a
  first `true` there ends the episode as completed (stop reason `stop`, not `max_turns`).
* Observations are `user` turns (the seed runs' Harbor; Harbor later switched to `tool`).

Episode end and scoring (`TerminusEnv.finish`, called by `run_rollouts` once per trajectory):

=====================================  =====================================================  =======
how the episode ended                  trial outcome (trial_stats.csv)                        verified
=====================================  =====================================================  =======
completion confirmed                   ok (or the verifier's failure outcome)                 yes
`max_turns` reached                    ok (as Harbor after `max_turns` episodes)              yes
agent budget spent (agent timeout)     agent_timeout                                          yes
the shell exited (`exit`, C-d)         ok                                                     yes
turn cut by `max_tokens_per_turn`      output_length_exceeded (its commands never ran)        no
context full (`max_seq_len`,
`max_input_tokens`)                    context_length_exceeded (Harbor's ContextLength...)   no
sandbox failure                        sandbox_error (the trajectory ends `env_error`:
                                       excluded from the loss)                                no
engine returned invalid output         agent_error                                            no
=====================================  =====================================================  =======

The reward is the verifier's (0 when unverified). Each trajectory's `info` gets `outcome`,
`trial` (the trial_stats.csv row: `TrialResult.to_row()` plus the agent's `n_turns`,
`n_parse_errors`, `agent_stop`), and `episode` (one record per model turn: analysis, plan,
commands, parse error, the observation sent back) for the readable rollout logs.

Usage::

    from jaxrl.envs.harbor import load_task_set
    from jaxrl.envs.harbor.agent import AgentConfig, TerminusEnvFactory, rollout_tasks
    make_env = TerminusEnvFactory(AgentConfig(prompt_style="terminus"))
    trajs = run_rollouts(client, chat, rollout_tasks(load_task_set(path)), sampling,
                         RolloutConfig(max_turns=32, max_tokens_per_turn=4096, max_seq_len=32768,
                                       max_input_tokens=32000, env_workers=64), make_env=make_env)
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import threading
from typing import Any, Optional, Sequence

from jaxrl.envs.types import DONE_IF_LAST_TURN, StepResult, Task
from jaxrl.envs.harbor.errors import AgentTimeoutError, SandboxError
from jaxrl.envs.harbor.outcomes import Outcome
from jaxrl.envs.harbor.parser import (DEFAULT_DURATION_SEC, MAX_COMMAND_DURATION_SEC, Command,  # noqa: F401
                                      ParsedResponse, format_warnings, parse_response)
from jaxrl.envs.harbor.task import HarborTask
from jaxrl.envs.harbor.terminal import MAX_OUTPUT_BYTES
from jaxrl.envs.harbor.trial import Trial, TrialConfig

log = logging.getLogger(__name__)

INITIAL_SCREEN = "agent@sandbox:/app$ "  # the shell's first screen (for prompt-length checks)


# ---------------------------------------------------------------------------------------------------
# Prompt texts


@dataclasses.dataclass(frozen=True)
class PromptStyle:
    """The texts of the agent loop, as `str.format` templates.

    Attributes:
      initial: the first (only) user message; fields `{instruction}`, `{terminal_state}`.
      confirm: the observation after the first `task_complete: true`; `{output}` is the framed
        terminal output of that turn.
      parse_error: the observation after an unusable response (nothing ran); `{feedback}`.
      warnings: the observation after a usable response with warnings; `{feedback}`, `{output}`.
      error_feedback, error_warning_feedback, warning_feedback: the feedback lines (`{error}`,
        `{warning}`: the parser's warnings as `- ` lines).
      output_length: the re-prompt after a turn cut by the per-turn token cap; `{limit}`, made of
        `output_limit` (`{tokens}`), plus `truncated_warnings` (`{warning}`) when the cut text
        parses with warnings.
      new_output: the framing of the terminal's new output (`{output}`).
      screen: the framing of the visible screen, used for the first screen and when there is no
        new output (`{screen}`); None: always `new_output`, and the first screen unframed.
    """

    initial: str
    confirm: str
    parse_error: str
    warnings: str
    output_length: str
    new_output: str
    screen: Optional[str] = None
    error_feedback: str = "ERROR: {error}"
    error_warning_feedback: str = "\nWARNINGS: {warning}"
    warning_feedback: str = "WARNINGS: {warning}"
    output_limit: str = "{tokens} tokens"
    output_limit_unknown: str = "the per-turn token limit"
    truncated_warnings: str = "\n\nParser warnings from the cut response:\n{warning}"


COMPACT = PromptStyle(
    initial=("Solve the task in a Linux terminal. Reply with one JSON object: {{\"analysis\": \"...\", \"plan\": "
             "\"...\", \"commands\": [{{\"keystrokes\": \"...\\n\", \"duration\": 0.5}}], \"task_complete\": "
             "false}}. Set task_complete to true when the task is done.\n\nTask Description:\n{instruction}\n\n"
             "Current terminal state:\n{terminal_state}\n"),
    new_output="New Terminal Output:\n{output}",
    confirm="{output}\n\nAre you sure the task is complete? If so, reply with \"task_complete\": true again.",
    parse_error="Previous response had parsing errors:\n{feedback}\n\nReply with one valid JSON object.",
    warnings="Previous response had warnings:\n{feedback}\n\n{output}",
    output_length="Your answer was cut at {limit} and nothing in it ran. Reply with a shorter JSON object.",
)
"""Short texts of jaxrl's own with the same schema and loop, for the small embedded terminal policy
(its prompt is a few hundred tokens; it was trained on these texts)."""

PROMPT_STYLES = ("terminus-2", "compact")
"""Prompt style names (config key `harbor.prompt_style`): `terminus-2` is Harbor's own texts, read
from the harbor package or wheel at run time (`jaxrl.envs.harbor.terminus2`); `compact` is `COMPACT`."""


def prompt_style(name: str, harbor_wheel: str = "") -> PromptStyle:
    """The `PromptStyle` called `name` (`PROMPT_STYLES`).

    Raises:
      ValueError: an unknown name; `HarborFilesError` (a ValueError): Harbor's files are missing.
    """
    if name == "compact":
        return COMPACT
    if name == "terminus-2":
        from jaxrl.envs.harbor.terminus2 import terminus2_texts

        return PromptStyle(**terminus2_texts(harbor_wheel))
    raise ValueError(f"unknown prompt style {name!r}: use one of {list(PROMPT_STYLES)}")


# ---------------------------------------------------------------------------------------------------
# The env


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """Settings of the agent loop (the trainer builds it from the `harbor.*` config keys).

    Attributes:
      prompt_style: one of `PROMPT_STYLES` ("terminus-2" or "compact").
      harbor_wheel: a harbor wheel to read the terminus-2 texts from ("" = the installed package).
      strict_json_parser: parse with `parse_response(strict=True)`.
      max_output_bytes: cap on the terminal output of one observation (head and tail kept).
      max_output_tokens: the per-turn token cap named in the output-length re-prompt (0: the
        re-prompt says "the maximum output length").
      trial: the trial settings (agent / verifier / command timeouts, sandbox).
      trials_dir: where trial directories go (None: a temporary directory per trial; with
        `trial.keep="none"` nothing stays).
    """

    prompt_style: str = "terminus-2"
    harbor_wheel: str = ""
    strict_json_parser: bool = False
    max_output_bytes: int = MAX_OUTPUT_BYTES
    max_output_tokens: int = 0
    trial: TrialConfig = TrialConfig(keep="none")
    trials_dir: Optional[str] = None

    def __post_init__(self):
        if self.prompt_style not in PROMPT_STYLES:
            raise ValueError(f"AgentConfig.prompt_style={self.prompt_style!r}: use one of {list(PROMPT_STYLES)}")
        if isinstance(self.max_output_bytes, bool) or not isinstance(self.max_output_bytes, int) \
                or self.max_output_bytes < 64:
            raise ValueError(f"AgentConfig.max_output_bytes={self.max_output_bytes!r}: use an integer >= 64 "
                             "(Terminus: 10000)")
        self.trial.validate()

    @property
    def style(self) -> PromptStyle:
        return prompt_style(self.prompt_style, self.harbor_wheel)


def initial_prompt(instruction: str, terminal_state: str, style: PromptStyle = COMPACT) -> str:
    """The first user message: the style's instructions, the task and the terminal state (already
    framed: `frame_screen`). Terminus-2 passes the instruction as it is; the compact style without
    its trailing newlines."""
    if style.screen is None:
        instruction = instruction.rstrip("\n")
    return style.initial.format(instruction=instruction, terminal_state=terminal_state)


def frame_output(style: PromptStyle, new_output: str, screen: str) -> str:
    """The terminal state of one observation for a style without a `screen` framing: the new output."""
    return style.new_output.format(output=new_output)


def incremental_output(style: PromptStyle, previous: Optional[str], history: str, screen: str) -> str:
    """Harbor's terminal state of one observation (its tmux session's `get_incremental_output`):
    the visible `screen` on the first call (`previous` None); else, when the previous history
    (stripped) is found in the current one, the current history from the last line break of the
    previous one (so the last line seen before is repeated: the prompt the command was typed at), as
    new output if it is not blank; otherwise the visible screen.

    Args:
      previous: the history at the previous call (None before the first).
      history: the whole terminal history now (every line printed so far, as text).
      screen: the visible screen now (the last rows of the history).
    """
    if previous is None:
        return style.screen.format(screen=screen)
    old = previous.strip()
    if old in history:
        at = old.rfind("\n") if "\n" in old else history.index(old)
        new = history[at:]
        if new.strip():
            return style.new_output.format(output=new)
    return style.screen.format(screen=screen)


def rollout_tasks(tasks: Sequence[HarborTask]) -> list[Task]:
    """Harbor tasks as rollout `Task`s for `run_rollouts` with a `TerminusEnvFactory` (the
    instruction is kept in `messages` for the logs; the env renders the real prompt)."""
    return [Task(messages=[{"role": "user", "content": t.instruction}], reward_spec={}, env="terminal",
                 task_id=t.name, metadata={"harbor_task": t}) for t in tasks]


class TerminusEnv:
    """One trial driven by the model through the Terminus-2 loop (module docstring).

    `reset(task)` starts the trial (sandbox, agent clock, shell) and returns the prompt; `step(text)`
    runs one model turn; `finish(stop_reason, info)` ends the agent phase, verifies when Harbor
    would, and returns (reward, info); `close()` kills the trial's processes and removes its files.
    """

    tools = None

    def __init__(self, config: AgentConfig = AgentConfig()):
        self.config = config
        self.style = config.style
        self.trial: Optional[Trial] = None
        self.task: Optional[HarborTask] = None
        self.episode: list[dict] = []
        self._start_error = ""
        self._pending_completion = False
        self._agent_stop = ""  # why the agent phase ended (agent_stop column of trial_stats.csv)
        self._n_parse_errors = 0
        self._n_output_length = 0
        self._history: Optional[str] = None  # the terminal history at the last observation (terminus-2)
        self._closed = False

    # -- Env protocol ----------------------------------------------------------------------------
    def reset(self, task: Task) -> list[dict]:
        """Starts the trial of `task.metadata["harbor_task"]` and returns `[initial user message]`.
        A sandbox that cannot start is recorded (the first step raises, so the trajectory ends as
        `env_error`, and the trial's outcome is `sandbox_error`).

        Raises:
          ValueError: the task carries no Harbor task.
        """
        ht = task.metadata.get("harbor_task") if isinstance(task.metadata, dict) else None
        if not isinstance(ht, HarborTask):
            raise ValueError(f"task {task.task_id!r}: env 'terminal' needs metadata['harbor_task'] (a HarborTask); "
                             "build the tasks with jaxrl.envs.harbor.agent.rollout_tasks")
        self.task = ht
        trial_dir = None
        if self.config.trials_dir is not None:
            trial_dir = os.path.join(self.config.trials_dir, _unique_name(ht.name))
        self.trial = Trial(ht, trial_dir, self.config.trial)
        state = ""
        try:
            self.trial.start()
            term = self.trial.terminal
            first = term.read_new_output(self.config.max_output_bytes)
            if self.style.screen is None:
                state = first
            else:  # Harbor's first capture: the visible screen, framed
                from jaxrl.envs.harbor.terminal import limit_output

                self._history = term.history()
                state = limit_output(incremental_output(self.style, None, self._history, term.screen()),
                                     self.config.max_output_bytes)
        except (SandboxError, AgentTimeoutError) as e:
            self._start_error = f"{type(e).__name__}: {e}"
            log.warning("trial %s did not start: %s", self.trial.name, e)
            if isinstance(e, SandboxError):
                self.trial.record_sandbox_error(str(e))
        return [{"role": "user", "content": initial_prompt(ht.instruction, state, self.style)}]

    def _terminal_state(self) -> str:
        from jaxrl.envs.harbor.terminal import limit_output

        term = self.trial.terminal
        new = term.read_new_output(self.config.max_output_bytes)
        if self.style.screen is None:
            return limit_output(frame_output(self.style, new, ""), self.config.max_output_bytes)
        history = term.history()
        framed = incremental_output(self.style, self._history, history, term.screen())
        self._history = history
        return limit_output(framed, self.config.max_output_bytes)

    def step(self, assistant_text: str) -> StepResult:
        """One model turn (module docstring). Returns the next user observation, reward 0 (the
        verifier runs in `finish`), and done when the completion is confirmed, the agent budget is
        spent or the shell has exited.

        Raises:
          SandboxError: the sandbox failed (the trial's outcome becomes `sandbox_error`).
        """
        trial = self._require_trial()
        parsed = parse_response(assistant_text, strict=self.config.strict_json_parser)
        record: dict[str, Any] = {"turn": len(self.episode) + 1, "analysis": parsed.analysis, "plan": parsed.plan,
                                  "commands": [dataclasses.asdict(c) for c in parsed.commands],
                                  "task_complete": parsed.task_complete}
        self.episode.append(record)
        st = self.style
        if parsed.error:  # nothing runs; a pending completion stays pending (Harbor)
            self._n_parse_errors += 1
            record["parse_error"] = parsed.error
            if not record["analysis"] and not record["plan"]:
                record["response"] = assistant_text[:2000]
            feedback = st.error_feedback.format(error=parsed.error)
            if parsed.warnings:
                feedback += st.error_warning_feedback.format(warning=parsed.warning_text)
            return self._observe(record, st.parse_error.format(feedback=feedback))
        if parsed.warnings:
            record["warnings"] = list(parsed.warnings)
        if trial.timed_out or trial.agent_time_left <= 0:
            return self._end(record, "agent_timeout")
        try:
            for cmd in parsed.commands:
                if not trial.terminal.is_alive():
                    return self._end(record, "shell_exited")
                trial.send_keys(cmd.keystrokes, cmd.duration)
            if not trial.terminal.is_alive():
                return self._end(record, "shell_exited", output=trial.terminal.read_new_output(self.config.max_output_bytes))
            framed = self._terminal_state()
        except AgentTimeoutError:
            return self._end(record, "agent_timeout")
        except SandboxError as e:
            trial.record_sandbox_error(f"{type(e).__name__}: {e}")
            self._agent_stop = "sandbox_error"
            raise
        record["output"] = framed
        if parsed.task_complete and self._pending_completion:
            return self._end(record, "completed")
        if parsed.task_complete:  # Harbor drops the warnings of a completing turn
            self._pending_completion = True
            obs = st.confirm.format(output=framed)
        else:
            self._pending_completion = False
            obs = framed
            if parsed.warnings:
                obs = st.warnings.format(feedback=st.warning_feedback.format(warning=parsed.warning_text), output=obs)
        result = self._observe(record, obs)
        if parsed.task_complete:  # on the last turn there is no turn to confirm in: the episode is complete
            result.info[DONE_IF_LAST_TURN] = True
        return result

    def reprompt_truncated(self, assistant_text: str) -> StepResult:
        """A turn cut by the per-turn token cap: none of it runs and the episode goes on with Harbor's
        output-length re-prompt (plus the parser's warnings on the cut text, if any)."""
        self._require_trial()
        st = self.style
        self._n_output_length += 1
        record: dict[str, Any] = {"turn": len(self.episode) + 1, "analysis": "", "plan": "", "commands": [],
                                  "task_complete": False, "output_length": True,
                                  "response": assistant_text[:2000]}
        self.episode.append(record)
        limit = (st.output_limit.format(tokens=self.config.max_output_tokens) if self.config.max_output_tokens
                 else st.output_limit_unknown)
        msg = st.output_length.format(limit=limit)
        warned = parse_response(assistant_text).warning_text
        if warned:
            msg += st.truncated_warnings.format(warning=warned)
        return self._observe(record, msg)

    def finish(self, stop_reason: str, info: dict) -> tuple[float, dict]:
        """Ends the agent phase and scores the trial (the table in the module docstring).

        Args:
          stop_reason: the trajectory's stop reason (`jaxrl.envs.base.STOP_REASONS`).
          info: the trajectory's info so far (`truncated_by` for `length`).
        Returns:
          (reward, info) with `outcome`, `trial` (the trial_stats.csv row) and `episode`.
        """
        trial = self.trial
        if trial is None:
            raise RuntimeError("TerminusEnv: call reset(task) first")
        if not self._agent_stop:
            if stop_reason == "stop":
                self._agent_stop = "completed"
            elif stop_reason == "max_turns":
                self._agent_stop = "max_turns"
            elif stop_reason == "length":
                self._agent_stop = ("output_length" if info.get("truncated_by") == "max_tokens_per_turn"
                                    else "context_length")
            else:
                self._agent_stop = stop_reason
        verify = False
        if self._start_error or self._agent_stop == "sandbox_error":
            pass  # sandbox_error is already recorded
        elif self._agent_stop == "output_length":
            trial.stop_agent(Outcome.OUTPUT_LENGTH_EXCEEDED,
                             "a model turn was cut by the per-turn token limit (max_generate_length); none of its "
                             "commands ran")
        elif self._agent_stop == "context_length":
            trial.stop_agent(Outcome.CONTEXT_LENGTH_EXCEEDED,
                             f"the conversation reached the context limit ({info.get('truncated_by', 'max_seq_len')})")
        elif stop_reason in ("env_error", "invalid_output"):
            detail = info.get("error") or info.get("invalid_output") or stop_reason
            trial.stop_agent(Outcome.AGENT_ERROR, f"{stop_reason}: {detail}"[:500])
        else:
            verify = True
        if verify:
            trial.verify()
        trial.info.update({"n_turns": len(self.episode), "n_parse_errors": self._n_parse_errors,
                           "n_output_length": self._n_output_length, "agent_stop": self._agent_stop})
        result = trial.close()
        self._closed = True
        row = result.to_row()
        out = {"outcome": str(result.outcome), "trial": row, "episode": list(self.episode),
               "instruction": self.task.instruction if self.task is not None else ""}
        if result.test_output and result.outcome != Outcome.OK:
            out["test_output"] = result.test_output[-2000:]
        return float(result.reward), out

    def close(self) -> None:
        """Kills every process of the trial and removes its files (safe to call twice)."""
        if self.trial is not None and not self._closed:
            self._closed = True
            self.trial.close()

    # -- helpers ---------------------------------------------------------------------------------
    def _require_trial(self) -> Trial:
        if self.trial is None:
            raise RuntimeError("TerminusEnv: call reset(task) first")
        if self._start_error:
            raise SandboxError(f"the trial's sandbox did not start ({self._start_error})")
        return self.trial

    def _observe(self, record: dict, observation: str) -> StepResult:
        record["observation"] = observation
        return StepResult([{"role": "user", "content": observation}], 0.0, False, {})

    def _end(self, record: dict, why: str, output: Optional[str] = None) -> StepResult:
        self._agent_stop = why
        record["end"] = why
        if output is not None:
            record["output"] = output
        return StepResult([], 0.0, True, {})


class TerminusEnvFactory:
    """`make_env` for `run_rollouts`: a fresh `TerminusEnv(config)` per trajectory."""

    def __init__(self, config: AgentConfig = AgentConfig()):
        self.config = config

    def __call__(self, task: Task) -> TerminusEnv:
        return TerminusEnv(self.config)


_COUNTER_LOCK = threading.Lock()
_COUNTER = [0]


def _unique_name(task_name: str) -> str:
    with _COUNTER_LOCK:
        _COUNTER[0] += 1
        i = _COUNTER[0]
    return f"{re.sub(r'[^A-Za-z0-9._-]', '_', task_name)[:32]}__{os.getpid()}-{i}"


# ---------------------------------------------------------------------------------------------------
# Readable episodes (rollouts/step_XXXXXX.md)


def episode_markdown(title: str, reward: float, outcome: str, stop_reason: str, episode: Sequence[dict],
                     instruction: str = "", extra: str = "") -> str:
    """One episode as Markdown: the task, then each turn's analysis, plan, commands (keystrokes and
    duration), parse errors, and the terminal output the model got back, then the reward."""
    lines = [f"## {title}", "", f"**reward {reward:g}** · outcome `{outcome}` · stop `{stop_reason}` · "
             f"{len(episode)} turn(s)", ""]
    if instruction:
        lines += ["Task:", "", _quote(instruction.strip()), ""]
    for rec in episode:
        lines.append(f"### Turn {rec.get('turn', '?')}")
        lines.append("")
        if rec.get("parse_error"):
            lines += [f"- parse error: {rec['parse_error']}"]
            if rec.get("response"):
                lines += ["", "```text", rec["response"].replace("```", "`` `"), "```"]
        if rec.get("analysis"):
            lines.append(f"- analysis: {_one_line(rec['analysis'])}")
        if rec.get("plan"):
            lines.append(f"- plan: {_one_line(rec['plan'])}")
        for c in rec.get("commands", []):
            lines.append(f"- command ({c['duration']:g} s): `{_one_line(json.dumps(c['keystrokes'])[1:-1])}`")
        if rec.get("task_complete"):
            lines.append("- task_complete: true")
        for w in rec.get("warnings", []):
            lines.append(f"- warning: {w}")
        if "output" in rec:
            lines += ["", "Terminal output:", "", "```text", (rec["output"] or "").replace("```", "`` `"), "```"]
        if rec.get("end"):
            lines += ["", f"Episode ended: {rec['end']}"]
        lines.append("")
    if extra:
        lines += [extra, ""]
    return "\n".join(lines)


def _one_line(s: str, limit: int = 400) -> str:
    s = " ".join(str(s).split())
    return s if len(s) <= limit else s[:limit] + " ..."


def _quote(s: str) -> str:
    return "\n".join("> " + line for line in s.splitlines())
