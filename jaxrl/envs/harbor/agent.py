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
import math
import os
import re
import threading
from typing import Any, Optional, Sequence

from jaxrl.envs.base import DONE_IF_LAST_TURN, StepResult, Task
from jaxrl.envs.harbor.errors import AgentTimeoutError, SandboxError
from jaxrl.envs.harbor.task import HarborTask
from jaxrl.envs.harbor.terminal import MAX_OUTPUT_BYTES
from jaxrl.envs.harbor.trial import Outcome, Trial, TrialConfig

log = logging.getLogger(__name__)

MAX_COMMAND_DURATION_SEC = 60.0  # Terminus-2 caps each command's wait at 60 s
DEFAULT_DURATION_SEC = 1.0  # Terminus-2's default when "duration" is missing or invalid
INITIAL_SCREEN = "agent@sandbox:/app$ "  # the shell's first screen (for prompt-length checks)


# ---------------------------------------------------------------------------------------------------
# Prompt texts


@dataclasses.dataclass(frozen=True)
class PromptStyle:
    """The texts of the agent loop. Format fields: `{instruction}`, `{terminal_state}` (initial),
    `{output}` (output, confirm, warnings), `{error}` / `{warnings}` (parse_error, warnings).

    Attributes:
      initial: the first (only) user message of the prompt.
      output: the observation after commands ran; `{output}` is the terminal's new output.
      confirm: the observation after the first `task_complete: true`; `{output}` is the framed
        `output` observation of the commands of that turn.
      parse_error: the observation after an unparsable response (nothing ran).
      warnings: the observation after a parsable response with warnings; `{output}` is the framed
        output observation.
    """

    initial: str
    output: str
    confirm: str
    parse_error: str
    warnings: str


_TERMINUS_INITIAL = """You are an AI assistant that solves command-line tasks in a Linux environment. You are given \
a task description and the output of the commands run so far, and you solve the task by sending batches of \
shell commands to a terminal.

Format your response as one JSON object with this structure:

{{
  "analysis": "What the current terminal output shows: what has been done and what remains to do.",
  "plan": "The next steps: which commands you will run and what each one should achieve.",
  "commands": [
    {{
      "keystrokes": "ls -la\\n",
      "duration": 0.1
    }},
    {{
      "keystrokes": "cd project\\n",
      "duration": 0.1
    }}
  ],
  "task_complete": true
}}

Required fields:
- "analysis": your reading of the current situation
- "plan": your plan for the next steps
- "commands": an array of commands to run (it may be empty)

Optional fields:
- "task_complete": true once the task is done (default false)

Each command has:
- "keystrokes": the exact text sent to the terminal; it is typed verbatim. End a command with a newline \
("\\n") to run it. Special keys use tmux names, such as "C-c" for Ctrl+C and "C-d" for Ctrl+D, given alone \
as the keystrokes.
- "duration": how many seconds to wait for the command before the next one is sent (default 1.0, at most \
60). Use short waits (0.1) for quick commands such as cd, ls, echo or cat, and longer ones for compilers, \
tests or downloads. Never wait longer than needed: an empty command ("keystrokes": "") with a duration just \
waits, and you can always wait again later.

The text inside "keystrokes" must be valid JSON string content: escape newlines as \\n and quotes as \\".

Task Description:
{instruction}

Current terminal state:
{terminal_state}
"""

TERMINUS = PromptStyle(
    initial=_TERMINUS_INITIAL,
    output="New Terminal Output:\n{output}",
    confirm=("Current terminal state:\n{output}\n\nAre you sure you want to mark the task as complete? Your "
             "solution will then be graded and you cannot change it any more. If so, include \"task_complete\": "
             "true in your JSON response again."),
    parse_error=("Previous response had parsing errors:\nERROR: {error}{warnings}\n\nPlease fix these issues and "
                 "provide a proper JSON response."),
    warnings="Previous response had warnings:\nWARNINGS: {warnings}\n\n{output}",
)
"""The full Terminus-2-style texts (the seed runs' agent); the default."""

COMPACT = PromptStyle(
    initial=("Solve the task in a Linux terminal. Reply with one JSON object: {{\"analysis\": \"...\", \"plan\": "
             "\"...\", \"commands\": [{{\"keystrokes\": \"...\\n\", \"duration\": 0.5}}], \"task_complete\": "
             "false}}. Set task_complete to true when the task is done.\n\nTask Description:\n{instruction}\n\n"
             "Current terminal state:\n{terminal_state}\n"),
    output="New Terminal Output:\n{output}",
    confirm="{output}\n\nAre you sure the task is complete? If so, reply with \"task_complete\": true again.",
    parse_error="Previous response had parsing errors:\nERROR: {error}{warnings}\n\nReply with one valid JSON object.",
    warnings="Previous response had warnings:\nWARNINGS: {warnings}\n\n{output}",
)
"""Short texts with the same schema and loop, for the small embedded terminal policy (its prompt is a
few hundred tokens instead of about a thousand)."""

PROMPT_STYLES: dict[str, PromptStyle] = {"terminus": TERMINUS, "compact": COMPACT}
"""Prompt styles by name (config key `harbor.prompt_style`)."""


# ---------------------------------------------------------------------------------------------------
# Parsing the model's response


@dataclasses.dataclass(frozen=True)
class Command:
    """One Terminus command: `keystrokes` sent verbatim, then a wait of `duration` seconds."""

    keystrokes: str
    duration: float


@dataclasses.dataclass
class ParsedResponse:
    """What `parse_response` read from one model turn.

    Attributes:
      commands: the commands to run, in order (empty on error).
      task_complete: the model marked the task complete.
      analysis, plan: the model's text fields ("" when absent or not strings).
      error: why the response cannot be used ("" when it can); nothing runs then.
      warnings: problems that did not stop it (fed back before the next terminal output).
    """

    commands: list[Command]
    task_complete: bool
    analysis: str = ""
    plan: str = ""
    error: str = ""
    warnings: list[str] = dataclasses.field(default_factory=list)


def _find_json_object(text: str) -> tuple[int, int, int]:
    """(start, end, open_depth) of the first top-level `{...}` in `text`, scanning JSON strings
    and escapes: `end` is one past its closing brace, or -1 with the depth still open at the end of
    the text; start -1 when there is no `{` outside a string."""
    start, depth, in_string, escaped = -1, 0, False, False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"' and start != -1:
            in_string = True
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                return start, i + 1, 0
    return start, -1, depth if not in_string else -1


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def parse_response(text: str, max_duration: float = MAX_COMMAND_DURATION_SEC) -> ParsedResponse:
    """Reads a Terminus JSON response (module docstring; Harbor's `terminus_json_plain_parser` rules).

    Errors (nothing runs): no JSON object, invalid JSON, not an object, a missing `analysis` /
    `plan` / `commands`, `commands` not an array, a command that is not an object or lacks a string
    `keystrokes` (with `task_complete` true, a bad command list is only a warning and nothing runs).
    Warnings: text before / after the object, a closing brace added, `analysis` / `plan` not
    strings, fields out of the order analysis, plan, commands, a missing or invalid `duration`
    (1.0 used), a negative one (0 used), unknown command fields, a command followed by another
    without a trailing newline, `task_complete` not a boolean.

    Args:
      text: the model's turn (reasoning already removed).
      max_duration: cap on each command's wait (seconds); longer durations are cut silently.
    """
    warnings: list[str] = []
    start, end, open_depth = _find_json_object(text)
    if start == -1:
        return ParsedResponse([], False, error="No valid JSON object found in the response")
    if end == -1:
        if open_depth <= 0:
            return ParsedResponse([], False, error="Invalid JSON: the response ends inside a string")
        body = text[start:] + "}" * open_depth
        warnings.append(f"AUTO-CORRECTED: added {open_depth} missing closing brace(s) - please fix this in "
                        "future responses")
    else:
        body = text[start:end]
        if text[end:].strip():
            warnings.append("Extra text detected after JSON object")
    if text[:start].strip():
        warnings.insert(0, "Extra text detected before JSON object")
    try:
        data = json.loads(body, parse_constant=_reject_constant)
    except ValueError as e:
        return ParsedResponse([], False, error=f"Invalid JSON: {e}", warnings=warnings)
    if not isinstance(data, dict):
        return ParsedResponse([], False, error="Response must be a JSON object", warnings=warnings)
    missing = [k for k in ("analysis", "plan", "commands") if k not in data]
    if missing:
        return ParsedResponse([], False, error=f"Missing required fields: {', '.join(missing)}", warnings=warnings)
    analysis, plan = data["analysis"], data["plan"]
    for name, value in (("analysis", analysis), ("plan", plan)):
        if not isinstance(value, str):
            warnings.append(f"Field '{name}' should be a string")
    analysis = analysis if isinstance(analysis, str) else ""
    plan = plan if isinstance(plan, str) else ""
    positions = [body.find(f'"{k}"') for k in ("analysis", "plan", "commands")]
    if positions != sorted(positions):
        warnings.append("Fields appear in the wrong order; expected analysis, plan, commands")
    complete = data.get("task_complete", False)
    if isinstance(complete, str):
        complete = complete.strip().lower() in ("true", "1", "yes")
    elif not isinstance(complete, bool):
        warnings.append("Field 'task_complete' should be a boolean")
        complete = False
    raw = data["commands"]
    if not isinstance(raw, list):
        return ParsedResponse([], False, analysis, plan, error="Field 'commands' must be an array", warnings=warnings)
    commands, error = [], ""
    for i, cmd in enumerate(raw, start=1):
        if not isinstance(cmd, dict):
            error = f"Command {i} must be an object"
            break
        keys = cmd.get("keystrokes")
        if "keystrokes" not in cmd:
            error = f"Command {i} missing required 'keystrokes' field"
            break
        if not isinstance(keys, str):
            error = f"Command {i} 'keystrokes' must be a string"
            break
        duration = cmd.get("duration", None)
        if "duration" not in cmd:
            warnings.append(f"Command {i}: Missing duration field, using default {DEFAULT_DURATION_SEC}")
            duration = DEFAULT_DURATION_SEC
        elif isinstance(duration, bool) or not isinstance(duration, (int, float)) or not math.isfinite(duration):
            warnings.append(f"Command {i}: Invalid duration value, using default {DEFAULT_DURATION_SEC}")
            duration = DEFAULT_DURATION_SEC
        elif duration < 0:
            warnings.append(f"Command {i}: Negative duration, using 0")
            duration = 0.0
        unknown = sorted(set(cmd) - {"keystrokes", "duration"})
        if unknown:
            warnings.append(f"Command {i}: Unknown fields: {', '.join(unknown)}")
        if i < len(raw) and not keys.endswith("\n"):
            warnings.append(f"Command {i} should end with newline when followed by another command; otherwise "
                            "the two commands are typed on the same line")
        commands.append(Command(keys, min(float(duration), max_duration)))
    if error:
        if complete:
            return ParsedResponse([], True, analysis, plan, warnings=warnings + [error])
        return ParsedResponse([], False, analysis, plan, error=error, warnings=warnings)
    return ParsedResponse(commands, bool(complete), analysis, plan, warnings=warnings)


def _format_warnings(warnings: Sequence[str]) -> str:
    return "\n".join(f"- {w}" for w in warnings)


# ---------------------------------------------------------------------------------------------------
# The env


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """Settings of the agent loop (the trainer builds it from the `harbor.*` config keys).

    Attributes:
      prompt_style: a key of `PROMPT_STYLES` ("terminus" or "compact").
      max_output_bytes: cap on the terminal output of one observation (head and tail kept).
      trial: the trial settings (agent / verifier / command timeouts, sandbox).
      trials_dir: where trial directories go (None: a temporary directory per trial; with
        `trial.keep="none"` nothing stays).
    """

    prompt_style: str = "terminus"
    max_output_bytes: int = MAX_OUTPUT_BYTES
    trial: TrialConfig = TrialConfig(keep="none")
    trials_dir: Optional[str] = None

    def __post_init__(self):
        if self.prompt_style not in PROMPT_STYLES:
            raise ValueError(f"AgentConfig.prompt_style={self.prompt_style!r}: use one of {sorted(PROMPT_STYLES)}")
        if isinstance(self.max_output_bytes, bool) or not isinstance(self.max_output_bytes, int) \
                or self.max_output_bytes < 64:
            raise ValueError(f"AgentConfig.max_output_bytes={self.max_output_bytes!r}: use an integer >= 64 "
                             "(Terminus: 10000)")
        self.trial.validate()

    @property
    def style(self) -> PromptStyle:
        return PROMPT_STYLES[self.prompt_style]


def initial_prompt(instruction: str, terminal_state: str, style: PromptStyle = TERMINUS) -> str:
    """The first user message: the style's instructions, the task and the terminal state."""
    return style.initial.format(instruction=instruction.rstrip("\n"), terminal_state=terminal_state)


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
        screen = ""
        try:
            self.trial.start()
            screen = self.trial.terminal.read_new_output(self.config.max_output_bytes)
        except (SandboxError, AgentTimeoutError) as e:
            self._start_error = f"{type(e).__name__}: {e}"
            log.warning("trial %s did not start: %s", self.trial.name, e)
            if isinstance(e, SandboxError):
                self.trial.record_sandbox_error(str(e))
        return [{"role": "user", "content": initial_prompt(ht.instruction, screen, self.style)}]

    def step(self, assistant_text: str) -> StepResult:
        """One model turn (module docstring). Returns the next user observation, reward 0 (the
        verifier runs in `finish`), and done when the completion is confirmed, the agent budget is
        spent or the shell has exited.

        Raises:
          SandboxError: the sandbox failed (the trial's outcome becomes `sandbox_error`).
        """
        trial = self._require_trial()
        parsed = parse_response(assistant_text)
        record: dict[str, Any] = {"turn": len(self.episode) + 1, "analysis": parsed.analysis, "plan": parsed.plan,
                                  "commands": [dataclasses.asdict(c) for c in parsed.commands],
                                  "task_complete": parsed.task_complete}
        self.episode.append(record)
        if parsed.error:
            self._n_parse_errors += 1
            self._pending_completion = False
            record["parse_error"] = parsed.error
            if not record["analysis"] and not record["plan"]:
                record["response"] = assistant_text[:2000]
            warn = f"\nWARNINGS: {_format_warnings(parsed.warnings)}" if parsed.warnings else ""
            obs = self.style.parse_error.format(error=parsed.error, warnings=warn)
            return self._observe(record, obs)
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
            output = trial.terminal.read_new_output(self.config.max_output_bytes)
        except AgentTimeoutError:
            return self._end(record, "agent_timeout")
        except SandboxError as e:
            trial.record_sandbox_error(f"{type(e).__name__}: {e}")
            self._agent_stop = "sandbox_error"
            raise
        framed = self.style.output.format(output=output)
        if parsed.task_complete and self._pending_completion:
            record["output"] = output
            return self._end(record, "completed")
        if parsed.task_complete:
            self._pending_completion = True
            obs = self.style.confirm.format(output=framed)
        else:
            self._pending_completion = False
            obs = framed
        if parsed.warnings:
            obs = self.style.warnings.format(warnings=_format_warnings(parsed.warnings), output=obs)
        record["output"] = output
        result = self._observe(record, obs)
        if parsed.task_complete:  # on the last turn there is no turn to confirm in: the episode is complete
            result.info[DONE_IF_LAST_TURN] = True
        return result

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
                           "agent_stop": self._agent_stop})
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
