"""What the user reads: the end-of-run `report.md` text and the progress bar over RL steps."""
from __future__ import annotations

import os

import numpy as np

from jaxrl.train.rundir import TrainerState


class NoLogger:
    """Stands in for `metrics.RunLogger` on processes other than 0."""

    rows: list = []

    def log_step(self, *a, **k):
        pass

    def log_trials(self, *a, **k):
        pass

    def update_step(self, *a, **k):
        pass

    def close(self):
        pass


def report_text(c, summary, rows, state: TrainerState, collapsed: bool) -> str:
    """The markdown of `report.md`: recipe, result (best step, held-out success, the wall time of
    every launch of the run), events, and the mean time per step of each phase."""
    a = c.trainer.algorithm
    timing_keys = sorted({k for r in rows for k in r if k.startswith("timing/") and k != "timing/elapsed"})
    timing_lines = [f"| {k[7:]} | {np.mean([float(r[k]) for r in rows if k in r and r['step'] > 0] or [0]):.2f} |"
                    for k in timing_keys]
    last = rows[-1] if rows else {}
    lines = [
        f"# jaxrl run report: {c.name} ({c.scale})", "",
        "## Recipe", "",
        f"- advantage estimator `{a.advantage_estimator}`, policy loss `{a.policy_loss_type}` "
        f"(eps_clip_low {a.eps_clip_low}, eps_clip_high {a.eps_clip_high}), reduction `{a.loss_reduction}`",
        f"- kl_loss_coef {a.kl_loss_coef}, TIS `{a.off_policy_correction.tis_ratio_type or 'off'}`, "
        f"lr {c.trainer.optimizer.lr} " + (f"(x{state.lr_scale:g} now: {state.rollbacks} reward-collapse rollback"
                                           f"{'s' if state.rollbacks != 1 else ''}, each x trainer.collapse.lr_factor)"
                                           if state.lr_scale != 1 else "(never lowered: no reward-collapse rollback)")
        + f", grad clip {c.trainer.optimizer.max_grad_norm}",
        f"- {c.trainer.train_batch_size} prompts x {c.generator.n_samples_per_prompt} samples per step, "
        f"mini-batch {c.trainer.mini_batch_size} prompts, micro-batch {c.trainer.micro_batch_size} sequences",
        f"- policy `{c.model.path or 'embedded default'}`, task `{c.data.task}`", "",
        "## Result", "",
        f"- steps run: {summary['last_step']} of {c.trainer.num_steps}; wall time {wall_time_text(summary)}",
        f"- best step by reward EMA (span {c.trainer.ema_span}): **{summary['best_step']}** "
        f"(EMA {summary['best_ema']:.3f})",
        eval_line(c, summary),
        f"- final step: mean reward {float(last.get('reward/avg_raw_reward', float('nan'))):.3f}, "
        f"EMA {float(last.get('reward/ema', float('nan'))):.3f}",
        f"- skipped (non-finite) updates: {state.skipped_updates}", "",
        "## Events", "",
        *([f"- {e}" for e in state.events] or ["- none"]),
        *(["- the run stopped after a reward collapse"] if collapsed else []), "",
        "## Mean time per step (s)", "", "| phase | seconds |", "|---|---|", *timing_lines, "",
        "![reward](reward_plot.png)", "",
    ]
    return "\n".join(lines)


def eval_line(c, summary) -> str:
    """The report's held-out line: success at the start, at the best-EMA checkpoint and at the
    final step, and what it is measured on; says why there is no number when there is none."""
    if c.data.num_eval_prompts == 0:
        return "- held-out success: not evaluated (data.num_eval_prompts=0)"
    if not summary.get("heldout"):
        return ("- held-out success: not evaluated (no held-out set: set data.eval_dataset_path, "
                "data.eval_fraction > 0 or data.eval_task)")
    best = summary.get("best_step", -1)
    n = summary.get("eval_n")
    return (f"- held-out success ({summary['heldout']}): start {_pct(summary.get('initial_eval'), n)} -> "
            f"best-EMA checkpoint{f' (step {best})' if best >= 1 else ''} {_pct(summary.get('best_eval'), n)}; "
            f"final step ({summary.get('last_step')}) {_pct(summary.get('final_eval'), n)} (± one binomial "
            "standard error: the spread to expect from another draw of as many prompts or samples)")


def wall_time_text(summary: dict) -> str:
    """`12.3 min`, or `12.3 min over 2 launches (resumed 1 time)` for a run that was resumed: the
    summary's `wall_s` counts every launch of the run (`rundir.WallClock`)."""
    text = f"{summary.get('wall_s', 0.0) / 60:.1f} min"
    n = int(summary.get("launches", 1))
    return text if n <= 1 else f"{text} over {n} launches (resumed {n - 1} time{'s' if n > 2 else ''})"


def _pct(x, n=None) -> str:
    """`36.0%`, or with n scored prompts `36.0% ± 3.4%` (binomial standard error sqrt(p(1 − p)/n))."""
    if x is None:
        return "n/a"
    if not n:
        return f"{100 * x:.1f}%"
    return f"{100 * x:.1f}% ± {100 * (x * (1 - x) / n) ** 0.5:.1f}%"


def summary_text(summary: dict, workdir: str) -> str:
    """The console summary printed at the end of every run (a few lines): best step, held-out
    success at start / best / final step, wall time, and where report.md and best/ are."""
    best = summary.get("best_step", -1)
    lines = [f"jaxrl: run finished: {workdir}",
             f"  steps: {summary.get('last_step')} in {wall_time_text(summary)}; best step by "
             f"reward EMA: {best if best >= 1 else 'none'}"
             + (f" (EMA {summary['best_ema']:.3f})" if best >= 1 and summary.get("best_ema") is not None else "")]
    if summary.get("heldout"):
        n = summary.get("eval_n")
        lines.append(f"  held-out success: start {_pct(summary.get('initial_eval'), n)}, best-EMA "
                     f"{_pct(summary.get('best_eval'), n)}, final step {_pct(summary.get('final_eval'), n)}  "
                     f"({summary['heldout']})")
    else:
        lines.append("  held-out success: not evaluated (see report.md)")
    lines.append(f"  report: {os.path.join(workdir, 'report.md')}")
    best_dir = os.path.join(workdir, "best")
    if os.path.isdir(best_dir):
        lines.append(f"  best checkpoint (HF format): {best_dir}   try: python -m jaxrl.chat --model {best_dir}")
    return "\n".join(lines)


class Progress:
    """A tqdm bar over RL steps showing reward, EMA and step time (silent when disabled)."""

    def __init__(self, start: int, total: int, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, desc="rl", unit="step", dynamic_ncols=True)
        self.last = start

    def update(self, step: int, reward: float, ema: float, seconds: float):
        if self.bar is not None:
            self.bar.update(step - self.last)
            self.bar.set_postfix(reward=f"{reward:.3f}", ema=f"{ema:.3f}", step_s=f"{seconds:.1f}")
        self.last = step

    def note(self, text: str) -> None:
        """Shows `text` after the bar until the next `update` (what the run is doing before a step ends)."""
        if self.bar is not None:
            self.bar.set_postfix_str(text)

    def close(self):
        if self.bar is not None:
            self.bar.close()
