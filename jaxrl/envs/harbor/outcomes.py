"""How a trial ended, and what it produced: `Outcome`, `AgentStop`, `VerifierResult`, `TrialResult`
(its trial_stats.csv row and result.json), and `parse_reward`, which reads the reward a verifier wrote.

Outcomes (`Outcome`, the column `outcome` of trial_stats.csv):

=========================  =========================================================  ============
outcome                    meaning                                                     reward
=========================  =========================================================  ============
ok                         the verifier ran and wrote a parsable reward                the reward
agent_timeout              the agent budget ran out; the verifier still ran            the reward
verifier_timeout           test.sh did not finish within the verifier budget           0
reward_missing             neither /logs/verifier/reward.json nor reward.txt exists     0
reward_empty               the reward file read is empty (0 bytes)                     0
reward_unparsable          not finite numbers / no "reward" entry / not a file         0
sandbox_error              the sandbox failed to start or run (infrastructure)         0
agent_error                the agent raised (not verified, Harbor's rule)              0
context_length_exceeded    the agent loop ran out of context (not verified)            0
output_length_exceeded     a model turn was cut by the per-turn token limit; none of
                           its commands ran and the episode ended (not verified)       0
=========================  =========================================================  ============

The reward is read as Harbor 0.26 reads it (`parse_reward`): `reward.json` first, `reward.txt` only
without it; a missing, empty or malformed reward file is an error class (its outcome), not a reward
of 0 (the trainer's error policy decides what it counts: `jaxrl/train/error_policy.py`). The host
reads both without following symlinks and only if they are regular files.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
from typing import Optional

from jaxrl.envs.harbor.fsutil import read_file_nofollow


LIMIT_KINDS = ("timeout", "memory", "pids", "file_size", "cpu_time", "disk")


class Outcome(str, enum.Enum):
    """How a trial ended (table in the module docstring). The values are the strings written to
    trial_stats.csv and used in metric names."""

    OK = "ok"
    AGENT_TIMEOUT = "agent_timeout"
    VERIFIER_TIMEOUT = "verifier_timeout"
    REWARD_MISSING = "reward_missing"
    REWARD_EMPTY = "reward_empty"
    REWARD_UNPARSABLE = "reward_unparsable"
    SANDBOX_ERROR = "sandbox_error"
    AGENT_ERROR = "agent_error"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    OUTPUT_LENGTH_EXCEEDED = "output_length_exceeded"

    def __str__(self) -> str:
        return self.value


VERIFIED_OUTCOMES = (Outcome.OK, Outcome.AGENT_TIMEOUT)
"""Outcomes whose reward came from the task's verifier."""


class AgentStop(Exception):
    """Raised by an agent (e.g. the Terminus loop on context overflow) to end the trial with a given
    outcome (`agent_error`, `context_length_exceeded` or `output_length_exceeded`); the trial is
    then not verified."""

    def __init__(self, outcome: Outcome, message: str = ""):
        super().__init__(message or str(outcome))
        self.outcome = Outcome(outcome)


@dataclasses.dataclass
class VerifierResult:
    """What the verifier produced.

    Attributes:
      reward: the reward (0.0 unless `outcome` is ok).
      outcome: ok, verifier_timeout, reward_missing, reward_empty, reward_unparsable or sandbox_error.
      details: `rewards` (the parsed dict), `reason` (why a reward is missing / unparsable),
        `test_output` (the tail of test-stdout.txt), `exit_code` (of test.sh; ignored, as in Harbor),
        `duration_sec`.
    """

    reward: float
    outcome: Outcome
    details: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class TrialResult:
    """One trial's record (`to_row()` is its trial_stats.csv row; `result.json` holds all of it)."""

    task_name: str
    trial_name: str
    outcome: Outcome
    reward: float
    rewards: dict = dataclasses.field(default_factory=dict)
    agent_duration_sec: float = 0.0
    verifier_duration_sec: float = 0.0
    n_commands: int = 0
    limits_hit: dict = dataclasses.field(default_factory=dict)
    error: str = ""
    verifier_exit_code: Optional[int] = None
    test_output: str = ""
    started_at: str = ""
    info: dict = dataclasses.field(default_factory=dict)

    def to_row(self) -> dict:
        """A flat dict: task_name, trial_name, outcome, reward, durations, n_commands, one
        `limit_<kind>` count per kind in `LIMIT_KINDS`, error, then the agent's `info` scalars."""
        row = {"task_name": self.task_name, "trial_name": self.trial_name, "outcome": str(self.outcome),
               "reward": self.reward, "agent_duration_sec": round(self.agent_duration_sec, 3),
               "verifier_duration_sec": round(self.verifier_duration_sec, 3), "n_commands": self.n_commands}
        for k in LIMIT_KINDS:
            row[f"limit_{k}"] = int(self.limits_hit.get(k, 0))
        row["error"] = self.error[:500]
        for k, v in self.info.items():
            if isinstance(v, (int, float, str, bool)) or v is None:
                row.setdefault(k, v)
        return row

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["outcome"] = str(self.outcome)
        return d


def parse_reward(verifier_dir: str | os.PathLike) -> tuple[Optional[float], Outcome, dict]:
    """Reads the reward a verifier wrote, by Harbor 0.26's rules (`harbor/verifier/verifier.py`):

    * `reward.json` is read first when it exists, `reward.txt` only when it does not;
    * a file of 0 bytes is `reward_empty` (Harbor's RewardFileEmptyError);
    * `reward.txt` must hold one finite float (surrounding whitespace allowed; whitespace only is
      unparsable); `reward.json` must decode to numbers (an object of numbers, or one number), all
      finite; otherwise `reward_unparsable` (VerifierOutputParseError); the reward is its `reward`
      entry, or its only entry;
    * neither file: `reward_missing` (RewardFileNotFoundError).
    A file that is not a regular file (a symlink, a directory) or is too large is unparsable.

    Returns:
      (reward or None, outcome, details) with outcome ok, reward_missing, reward_empty or
      reward_unparsable; details has `rewards` (dict) or `reason`.
    """
    data, why = read_file_nofollow(verifier_dir, "reward.json", 1 << 16)
    if data is not None or why != "missing":
        if data is None:
            return None, Outcome.REWARD_UNPARSABLE, {"reason": f"reward.json {why}"}
        if not data:
            return None, Outcome.REWARD_EMPTY, {"reason": "reward.json is empty"}
        text = data.decode("utf-8", errors="replace")
        try:
            obj = json.loads(text)
        except ValueError:
            return None, Outcome.REWARD_UNPARSABLE, {"reason": f"reward.json is not JSON: {text[:100]!r}"}
        values = obj if isinstance(obj, dict) else {"reward": obj}
        bad = [v for v in values.values() if not isinstance(v, (int, float))
               or (isinstance(v, float) and not math.isfinite(v))]
        if bad or not values:
            return None, Outcome.REWARD_UNPARSABLE, {"reason": f"reward.json holds a non-numeric or non-finite reward: "
                                                               f"{text[:100]!r}"}
        if "reward" in values:
            value = float(values["reward"])
        elif len(values) == 1:
            value = float(next(iter(values.values())))
        else:
            return None, Outcome.REWARD_UNPARSABLE, {"reason": f"reward.json has several entries and no 'reward': "
                                                               f"{sorted(values)}"}
        return value, Outcome.OK, {"rewards": {k: float(v) for k, v in values.items()}}
    data, why = read_file_nofollow(verifier_dir, "reward.txt", 4096)
    if data is None:
        if why == "missing":
            return None, Outcome.REWARD_MISSING, {"reason": "no /logs/verifier/reward.json or reward.txt"}
        return None, Outcome.REWARD_UNPARSABLE, {"reason": f"reward.txt {why}"}
    if not data:
        return None, Outcome.REWARD_EMPTY, {"reason": "reward.txt is empty"}
    text = data.decode("utf-8", errors="replace")
    try:
        value = float(text)
    except ValueError:
        return None, Outcome.REWARD_UNPARSABLE, {"reason": f"reward.txt is not one float: {text[:100]!r}"}
    if not math.isfinite(value):
        return None, Outcome.REWARD_UNPARSABLE, {"reason": f"reward.txt is not finite: {text[:100]!r}"}
    return value, Outcome.OK, {"rewards": {"reward": value}}
