"""What a failed Harbor trial counts for in training: the seed runs' error policy.

Every trial ends with an outcome (`jaxrl.envs.harbor.Outcome`). Each outcome other than `ok` is an
error class; Harbor names them by exception (`HARBOR_EXCEPTIONS`). The policy (config keys
`harbor.error_policy.*`; the seed runs' `terminal_bench.harbor` block of
`56GPU_qwen3_8b.yaml` is the 8B default) says, per class:

* **retry**: a trial whose class is not in `no_retry` is played again (a fresh trial and episode,
  another sampling seed), up to `max_retries` times, waiting `clip(wait_multiplier * 2**attempt,
  min_wait_sec, max_wait_sec)` seconds before attempt `attempt` (Harbor's exponential backoff); the
  last attempt is kept. Harbor's `exclude_exceptions` are `no_retry`.
* **treatment** of the trial that is kept:
  - `mask`: out of the loss and of the group's baseline (the trajectory is excluded, as an env
    failure is: loss mask 0, not a sequence of the reduction, not in the RLOO-n / GRPO statistics);
  - `passthrough`: the reward the verifier gave (an agent timeout is verified anyway);
  - `zero`: reward 0, trained on;
  - a class in none of the lists gets `default` (the seed: zero).
  `sandbox_error` is always masked (an environment failure says nothing about the policy).

Names in the lists may be jaxrl's outcome names or Harbor's exception names. Every trajectory gets
`info["error_class"]` ("" for ok), `info["error_treatment"]` and `info["attempts"]`; the step's metrics
count `env/error_<class>` and `env/treatment_<treatment>`, and trial_stats.csv has the columns.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Callable, Sequence

from jaxrl.config.field import schema_dataclass
from jaxrl.config.schema import FIELDS, FIELDS_BY_KEY, get_value
from jaxrl.envs.harbor.outcomes import Outcome

log = logging.getLogger(__name__)

TREATMENTS = FIELDS_BY_KEY["harbor.error_policy.default"].choices  # ("mask", "passthrough", "zero")

HARBOR_EXCEPTIONS: dict[str, tuple[str, ...]] = {
    "sandbox_error": ("DaytonaError", "EnvironmentStartTimeoutError", "NetworkError", "ConnectionError",
                      "AgentEnvironmentTimeoutError", "AddTestsDirError", "DownloadVerifierDirError",
                      "VerifierRuntimeError"),
    "reward_missing": ("RewardFileNotFoundError",),
    "reward_empty": ("RewardFileEmptyError",),
    "reward_unparsable": ("VerifierOutputParseError",),
    "verifier_timeout": ("VerifierTimeoutError",),
    "agent_timeout": ("AgentTimeoutError",),
    "context_length_exceeded": ("ContextLengthExceededError",),
    "output_length_exceeded": ("OutputLengthExceededError",),
    "agent_error": ("AgentError",),
}
"""Harbor's exception names of each jaxrl error class (an outcome other than ok)."""

ERROR_CLASSES = tuple(HARBOR_EXCEPTIONS)
_BY_NAME = {name: cls for cls, names in HARBOR_EXCEPTIONS.items() for name in names} | {c: c for c in ERROR_CLASSES}


def error_class(name: str) -> str:
    """The jaxrl error class of `name` (an outcome or a Harbor exception name).

    Raises:
      ValueError: an unknown name.
    """
    if name not in _BY_NAME:
        raise ValueError(f"unknown error class {name!r}: use one of {list(ERROR_CLASSES)} or Harbor's names "
                         f"{sorted(n for ns in HARBOR_EXCEPTIONS.values() for n in ns)}")
    return _BY_NAME[name]


@schema_dataclass(FIELDS, "error_policy")
class ErrorPolicy:
    """The error policy (module docstring); lists hold outcome or Harbor exception names.

    Its fields (mask, passthrough, zero, default, no_retry, max_retries, min_wait_sec,
    max_wait_sec, wait_multiplier), their defaults and per-field checks are the
    `harbor.error_policy.*` keys of the config schema (jaxrl/config/schema.py); none is declared here.
    """

    def __post_init__(self):  # after every field's own check
        seen: dict[str, str] = {}
        for treatment in TREATMENTS:
            for name in getattr(self, treatment):
                cls = error_class(name)
                if cls in seen and seen[cls] != treatment:
                    raise ValueError(f"error class {cls} ({name}) is both {seen[cls]} and {treatment}")
                seen[cls] = treatment
        for name in self.no_retry:
            error_class(name)
        if not (isinstance(self.max_retries, int) and self.max_retries >= 0):
            raise ValueError(f"max_retries {self.max_retries!r}: use an integer >= 0")
        if not (0 <= self.min_wait_sec <= self.max_wait_sec) or self.wait_multiplier < 0:
            raise ValueError("retry waits: need 0 <= min_wait_sec <= max_wait_sec and wait_multiplier >= 0")

    @classmethod
    def from_config(cls, ep) -> "ErrorPolicy":
        """From the `harbor.error_policy` ConfigDict (each field read from its schema key's last part).
        Raises: ValueError (a field outside its Field, or the checks above)."""
        fields = dataclasses.fields(cls)
        return cls(**{f.name: f.metadata["schema"].to_object(get_value(ep, f.metadata["schema"].leaf)) for f in fields})

    def treatment(self, cls: str) -> str:
        """The treatment of error class `cls` ("" for ok)."""
        if not cls:
            return ""
        if cls == "sandbox_error":
            return "mask"
        for treatment in TREATMENTS:
            if cls in {error_class(n) for n in getattr(self, treatment)}:
                return treatment
        return self.default

    def retryable(self, cls: str) -> bool:
        return bool(cls) and cls not in {error_class(n) for n in self.no_retry}

    def wait_sec(self, attempt: int) -> float:
        """Seconds to wait before retry number `attempt` (1, 2, ...)."""
        return float(min(self.max_wait_sec, max(self.min_wait_sec, self.wait_multiplier * 2.0 ** attempt)))


def trajectory_class(t) -> str:
    """The error class of a trajectory's trial ("" for ok; sandbox_error for an env failure)."""
    outcome = t.info.get("outcome", "")
    if outcome in ("", Outcome.OK.value):
        return "sandbox_error" if t.stop_reason == "env_error" else ""
    return outcome


def apply(policy: ErrorPolicy, t, attempts: int = 1) -> None:
    """Sets `t.info` error_class / error_treatment / attempts and applies the treatment to `t.reward`
    (zero: 0; mask: 0, and the trajectory is excluded, `jaxrl.train.batching.is_excluded`)."""
    cls = trajectory_class(t)
    treatment = policy.treatment(cls)
    t.info["error_class"] = cls
    t.info["error_treatment"] = treatment
    t.info["attempts"] = attempts
    if treatment in ("zero", "mask"):
        t.reward = 0.0


def with_retries(policy: ErrorPolicy, generate: Callable[[list, int, int], list], tasks: Sequence, n: int,
                 sleep: Callable[[float], None] = time.sleep) -> list:
    """`generate(tasks, n, attempt)` (attempt 0 first), then each trajectory whose class is
    retryable played again alone (`generate([task], 1, attempt)`) up to `max_retries` times; the
    replacement keeps the original's place, group id and sample index. Applies the treatments.

    Returns the trajectories in `generate`'s order.
    """
    trajs = list(generate(list(tasks), n, 0))
    attempts = [1] * len(trajs)
    task_of = [tasks[i // n] for i in range(len(trajs))] if len(trajs) == len(tasks) * n else None
    for attempt in range(1, policy.max_retries + 1):
        todo = [i for i, t in enumerate(trajs) if policy.retryable(trajectory_class(t))]
        if not todo or task_of is None:
            break
        wait = policy.wait_sec(attempt)
        log.info("retrying %d failed trial(s) (attempt %d of %d) after %.0f s", len(todo), attempt + 1,
                 policy.max_retries + 1, wait)
        sleep(wait)
        again = generate([task_of[i] for i in todo], 1, attempt)
        for i, t in zip(todo, again):
            old = trajs[i]
            t.group_id = old.group_id
            t.info["sample_index"] = old.info.get("sample_index", 0)
            trajs[i] = t
            attempts[i] = attempt + 1
    for t, a in zip(trajs, attempts):
        apply(policy, t, a)
    return trajs


def policy_metrics(trajs) -> dict[str, float]:
    """`env/error_<class>` (trials of the step per error class, every class listed) and
    `env/treatment_<treatment>` (trials per treatment), `env/retried` (trials played more than once)."""
    m: dict[str, float] = {}
    for cls in ERROR_CLASSES:
        m[f"env/error_{cls}"] = float(sum(t.info.get("error_class") == cls for t in trajs))
    for tr in TREATMENTS:
        m[f"env/treatment_{tr}"] = float(sum(t.info.get("error_treatment") == tr for t in trajs))
    m["env/retried"] = float(sum(int(t.info.get("attempts", 1)) > 1 for t in trajs))
    return m
