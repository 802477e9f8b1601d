"""Run logs (docs/usage.md, 'What a run produces'): metrics.csv, trainer_log.jsonl, trial_stats.csv, rollouts/, tensorboard/,
reward_plot.png, report.md; plus the reward EMA that selects the best checkpoint and detects collapse.

Every file is written so that a killed run loses nothing committed and a resumed run continues
exactly: on resume, rows newer than the restored checkpoint's step are dropped, and whole-file
rewrites go through a temp file and `os.replace`.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import shutil
import sys
import time
from typing import Any, Iterable, Optional

from jaxrl.fileio import atomic_write_bytes, atomic_write_text


def _summary_writer_class():
    """`tensorboardX.SummaryWriter`, imported without torch when this process has not imported torch.

    tensorboardX imports torch whenever it is installed (1.4 s on 2 cores), only to accept torch
    tensors as values; jaxrl logs Python floats. While tensorboardX is first imported, `import torch`
    raises ImportError (a `None` entry in `sys.modules`), the case tensorboardX handles itself when
    torch is not installed (the trainer's usual environment); torch stays importable afterwards.
    """

    if "tensorboardX" not in sys.modules and "torch" not in sys.modules:
        sys.modules["torch"] = None
        try:
            import tensorboardX  # noqa: F401
        finally:
            if sys.modules.get("torch", 0) is None:
                del sys.modules["torch"]
    from tensorboardX import SummaryWriter

    return SummaryWriter


@dataclasses.dataclass
class RewardEMA:
    """Trailing exponential moving average of the per-step mean training reward.

    ema_1 = r_1; ema_t = alpha * r_t + (1 - alpha) * ema_{t-1}, alpha = 2 / (span + 1)
    (the usual "N-period" EMA; span 5 gives alpha = 1/3). The best checkpoint is the step with
    the highest EMA. A collapse is `patience` consecutive steps with ema < best_ema - drop.

    The whole state is plain floats/ints so it is saved with every checkpoint and restored
    exactly on resume.
    """

    span: int = 5
    value: Optional[float] = None
    best_value: float = -math.inf
    best_step: int = -1
    steps_below: int = 0

    @property
    def alpha(self) -> float:
        return 2.0 / (self.span + 1.0)

    def update(self, step: int, reward: float, drop: float = math.inf) -> tuple[float, bool]:
        """Adds the mean reward of `step`; returns (ema, is_new_best).

        `drop`: collapse threshold (absolute reward below the best EMA) used for `steps_below`.

        Raises:
          ValueError: if `reward` is not finite.
        """
        if not math.isfinite(reward):
            raise ValueError(f"mean reward of step {step} is {reward}; rewards must be finite")
        self.value = reward if self.value is None else self.alpha * reward + (1 - self.alpha) * self.value
        is_best = self.value > self.best_value
        if is_best:
            self.best_value, self.best_step = self.value, step
        self.steps_below = self.steps_below + 1 if self.value < self.best_value - drop else 0
        return self.value, is_best

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_state_dict(cls, d: dict[str, Any]) -> "RewardEMA":
        return cls(**d)


def _step_of(row: dict) -> int:
    """The integer `step` of a log row. Raises KeyError / TypeError / ValueError when it has none."""
    if not isinstance(row, dict):
        raise TypeError("not a row")
    return int(row["step"])


def _warn_damaged(path: str, what: str, where: list) -> None:
    if where:
        print(f"jaxrl: warning: {path}: dropped {len(where)} damaged {what} (first at line {where[0]}) while "
              "resuming", file=sys.stderr)


class RunLogger:
    """Writes the per-step and per-trajectory logs of a run directory.

    Args:
      workdir: the run directory.
      resume_step: the step of the restored checkpoint (rows with step > resume_step, written by
        a run that was killed later, are dropped); None for a fresh run (existing logs removed).
      use_tensorboard: write tensorboardX events under workdir/tensorboard. A resumed run's event
        file starts with TensorBoard's purge marker (``SessionLog.START`` at step resume_step + 1),
        so TensorBoard drops the killed run's events of those steps instead of showing them next
        to the new ones; a fresh run removes the old event files.
    """

    def __init__(self, workdir: str, resume_step: Optional[int] = None, use_tensorboard: bool = True):
        self.workdir = workdir
        os.makedirs(os.path.join(workdir, "rollouts"), exist_ok=True)
        self.metrics_path = os.path.join(workdir, "metrics.csv")
        self.jsonl_path = os.path.join(workdir, "trainer_log.jsonl")
        self.trials_path = os.path.join(workdir, "trial_stats.csv")
        keep = (lambda row: _step_of(row) <= resume_step) if resume_step is not None else (lambda row: False)
        self.rows: list[dict[str, Any]] = [r for r in self._read_jsonl(self.jsonl_path) if keep(r)]
        trials = [r for r in self._read_csv(self.trials_path) if keep(r)]
        self.trial_fields: Optional[list[str]] = list(trials[0].keys()) if trials else None
        self._rewrite_trials(trials)
        self._rewrite_step_logs()
        for name in os.listdir(os.path.join(workdir, "rollouts")):
            if name.startswith("step_") and (resume_step is None or int(name[5:11]) > resume_step):
                os.remove(os.path.join(workdir, "rollouts", name))
        self.tb = None
        if use_tensorboard:
            SummaryWriter = _summary_writer_class()
            tb_dir = os.path.join(workdir, "tensorboard")
            if resume_step is None:
                shutil.rmtree(tb_dir, ignore_errors=True)
            # tensorboardX names an event file by the second and host only; two writers in one
            # second (a quick resume) would share a file, and the second would truncate the first.
            # The nanosecond suffix keeps them apart and in TensorBoard's (lexicographic) order.
            self.tb = SummaryWriter(tb_dir, purge_step=None if resume_step is None else resume_step + 1,
                                    filename_suffix=f".{time.time_ns()}")

    @staticmethod
    def _read_jsonl(path: str) -> list[dict[str, Any]]:
        """Rows of a step log; a damaged line (not JSON, not an object with an integer step) is
        dropped with a one-line warning naming the file and line (the checkpoint, not this log,
        is what a resumed run continues from)."""
        if not os.path.exists(path):
            return []
        rows, bad = [], []
        with open(path, encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, start=1):
                line = line.strip()
                if not line:
                    continue
                try:
                    row = json.loads(line)
                    _step_of(row)
                except (json.JSONDecodeError, TypeError, KeyError, ValueError):
                    bad.append(lineno)
                    continue
                rows.append(row)
        _warn_damaged(path, "lines", bad)
        return rows

    @staticmethod
    def _read_csv(path: str) -> list[dict[str, Any]]:
        """Rows of trial_stats.csv; damaged rows are dropped with a one-line warning (a row cut by
        a kill mid-append belongs to a step after the checkpoint and is dropped anyway)."""
        if not os.path.exists(path):
            return []
        try:
            with open(path, newline="", encoding="utf-8", errors="replace") as f:
                rows = list(csv.DictReader(f))
        except csv.Error as e:
            print(f"jaxrl: warning: {path}: unreadable ({e}); its rows are dropped while resuming", file=sys.stderr)
            return []
        good, bad = [], []
        for i, r in enumerate(rows, start=2):  # line 1 is the header
            try:
                _step_of(r)
                good.append(r)
            except (KeyError, TypeError, ValueError):
                bad.append(i)
        _warn_damaged(path, "lines", bad)
        return good

    def _rewrite_step_logs(self) -> None:
        atomic_write_text(self.jsonl_path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in self.rows))
        fields: list[str] = []
        for r in self.rows:
            fields.extend(k for k in r if k not in fields)
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=["step"] + sorted(f for f in fields if f != "step"))
        w.writeheader()
        for r in self.rows:
            w.writerow(r)
        atomic_write_text(self.metrics_path, buf.getvalue())

    def _rewrite_trials(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            if os.path.exists(self.trials_path):
                os.remove(self.trials_path)
            return
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=self.trial_fields)
        w.writeheader()
        w.writerows(rows)
        atomic_write_text(self.trials_path, buf.getvalue())

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        """Appends one row (all metrics of one RL step) to metrics.csv, trainer_log.jsonl, tensorboard."""
        row = {"step": int(step)}
        row.update({k: (float(v) if isinstance(v, (int, float)) or hasattr(v, "item") else v) for k, v in metrics.items()})
        self.rows = [r for r in self.rows if int(r["step"]) != step] + [row]
        self._rewrite_step_logs()
        if self.tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, float) and math.isfinite(v):
                    self.tb.add_scalar(k, v, step)
            self.tb.flush()

    def update_step(self, step: int, extra: dict[str, float]) -> None:
        """Adds metrics to the already-logged row of `step` (e.g. the checkpoint time measured after it)."""
        for r in self.rows:
            if int(r["step"]) == step:
                r.update({k: float(v) for k, v in extra.items()})
        self._rewrite_step_logs()
        if self.tb is not None:
            for k, v in extra.items():
                self.tb.add_scalar(k, float(v), step)
            self.tb.flush()

    def log_trials(self, step: int, trials: Iterable[dict[str, Any]]) -> None:
        """Appends one row per trajectory to trial_stats.csv and writes rollouts/step_XXXXXX.jsonl.

        Each trial dict holds scalar fields (reward, num_tokens, stop_reason, group_id, ...) and may
        hold text fields (prompt, response, episode, instruction) that go only to the rollouts file;
        with terminal episodes (Harbor runs) `rollouts/step_XXXXXX.md` shows them for a person.
        """
        trials = list(trials)
        text_keys = {"prompt", "response", "messages", "episode", "instruction"}
        atomic_write_text(
            os.path.join(self.workdir, "rollouts", f"step_{step:06d}.jsonl"),
            "".join(json.dumps({"step": step, **t}, default=str) + "\n" for t in trials),
        )
        from jaxrl.train.harbor import episodes_markdown  # terminal episodes, readable (Harbor runs)

        md = episodes_markdown(step, trials)
        if md is not None:
            atomic_write_text(os.path.join(self.workdir, "rollouts", f"step_{step:06d}.md"), md)
        rows = [{"step": step, **{k: v for k, v in t.items() if k not in text_keys}} for t in trials]
        if not rows:
            return
        if self.trial_fields is None:
            self.trial_fields = list(rows[0].keys())
        new_file = not os.path.exists(self.trials_path)
        with open(self.trials_path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=self.trial_fields, extrasaction="ignore")
            if new_file:
                w.writeheader()
            w.writerows(rows)
            f.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def plot_rewards(workdir: str, rows: list[dict[str, Any]], best_step: int, reward_key: str = "reward/avg_raw_reward",
                 ema_key: str = "reward/ema", eval_key: str = "eval/success_rate") -> str:
    """Draws reward per step, its EMA, held-out success, and marks the best step; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [int(r["step"]) for r in rows if reward_key in r]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax.plot(steps, [float(r[reward_key]) for r in rows if reward_key in r], ".-", alpha=0.5, label="mean reward")
    ax.plot([int(r["step"]) for r in rows if ema_key in r], [float(r[ema_key]) for r in rows if ema_key in r],
            "-", lw=2, label="reward EMA")
    ev = [(int(r["step"]), float(r[eval_key])) for r in rows if r.get(eval_key) not in (None, "")]
    if ev:
        ax.plot([s for s, _ in ev], [v for _, v in ev], "s--", label="held-out success")
    if best_step >= 0:
        ax.axvline(best_step, color="tab:red", ls=":", label=f"best EMA (step {best_step})")
    ax.set_xlabel("RL step")
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    path = os.path.join(workdir, "reward_plot.png")
    atomic_write_bytes(path, buf.getvalue())
    return path


def write_report(workdir: str, text: str) -> str:
    """Writes workdir/report.md atomically; returns the path."""
    path = os.path.join(workdir, "report.md")
    atomic_write_text(path, text)
    return path
