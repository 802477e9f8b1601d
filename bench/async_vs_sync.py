"""Asynchronous vs synchronous RL on the default recipe, with generation made slow on purpose.

Runs `python -m jaxrl.main --config=configs/rloo.py` twice in this invocation, one after the other
with the same seed and settings: `trainer.async_rl.mode=sync`, then `fully_async` with
`max_staleness_steps` (default 2). Every episode takes at least `generator.episode_delay_s`
(spread by `episode_delay_jitter`), as slow multi-turn episodes do: a synchronous step waits for
its slowest episode, while the asynchronous generator keeps generating during training. Both runs
use token-level TIS (`off_policy_correction.tis_ratio_type=token`, which fully_async requires and
which is a no-op on on-policy data), evaluate the held-out set before step 1 and after the last
step, and checkpoint only at the end.

Printed: steps per minute of each (the training steps after the first, from the runs'
`timing/elapsed`: step 1 holds the compilations), their ratio (target >= 1.5x for fully_async),
the end-to-end wall time, the mean staleness and dropped trajectories of the async run, and the
held-out success of both after the same number of steps (target: within 5 points).

Usage: python bench/async_vs_sync.py [--steps 30 --delay 2.0 --jitter 0.5 --staleness 2]
       python bench/async_vs_sync.py --tiny   # 4 prompts x 2 samples, 4 steps: checks the script
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(mode: str, workdir: str, args) -> dict:
    common = [f"--config.trainer.num_steps={args.steps}", "--config.trainer.eval_interval=0",
              f"--config.trainer.ckpt_interval={args.steps}", "--config.trainer.save_on_new_best=False",
              "--config.trainer.export_best=False", f"--config.data.num_eval_prompts={args.eval_prompts}",
              "--config.trainer.algorithm.off_policy_correction.tis_ratio_type=token",
              f"--config.generator.episode_delay_s={args.delay}",
              f"--config.generator.episode_delay_jitter={args.jitter}",
              f"--config.trainer.async_rl.mode={mode}",
              f"--config.trainer.async_rl.max_staleness_steps={args.staleness if mode != 'sync' else 0}"]
    if args.tiny:
        common += ["--config.trainer.train_batch_size=4", "--config.trainer.mini_batch_size=4",
                   "--config.trainer.micro_batch_size=8", "--config.generator.n_samples_per_prompt=2"]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "jaxrl.main", "--config=configs/rloo.py", f"--workdir={workdir}",
                          *common], cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        sys.exit(f"{mode} run failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    with open(os.path.join(workdir, "metrics.csv")) as f:
        rows = [r for r in csv.DictReader(f)]
    steps = [r for r in rows if int(r["step"]) >= 1]
    elapsed = {int(r["step"]): float(r["timing/elapsed"]) for r in steps}
    first, last = min(elapsed), max(elapsed)
    result = {"mode": mode, "wall_s": wall, "steps_per_min": 60.0 * (last - first) / (elapsed[last] - elapsed[first]),
              "eval_start": float(rows[0]["eval/success_rate"]) if rows[0]["step"] == "0" else None,
              "eval_end": float(steps[-1]["eval/success_rate"]),
              "reward_last5": sum(float(r["reward/avg_raw_reward"]) for r in steps[-5:]) / len(steps[-5:])}
    if mode != "sync":
        result["staleness_mean"] = sum(float(r["async/staleness_mean"]) for r in steps) / len(steps)
        result["dropped"] = float(steps[-1]["async/dropped_stale_total"])
        result["trainer_idle_s"] = sum(float(r["timing/trainer_idle"]) for r in steps[1:]) / max(len(steps) - 1, 1)
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--delay", type=float, default=2.0, help="generator.episode_delay_s (s)")
    p.add_argument("--jitter", type=float, default=0.5, help="generator.episode_delay_jitter")
    p.add_argument("--staleness", type=int, default=2, help="max_staleness_steps of the fully_async run")
    p.add_argument("--eval-prompts", type=int, default=200)
    p.add_argument("--workdir", default="", help="where the two runs go (default: a temporary directory)")
    p.add_argument("--tiny", action="store_true", help="4 prompts x 2 samples, 4 steps, 8 eval prompts, delay 0.5 s")
    args = p.parse_args()
    if args.tiny:
        args.steps, args.eval_prompts, args.delay = 4, 8, 0.5
    base = args.workdir or tempfile.mkdtemp(prefix="async_vs_sync_")
    results = [run(mode, os.path.join(base, mode), args) for mode in ("sync", "fully_async")]
    sync, fa = results
    print(f"default recipe, {args.steps} steps, episode delay {args.delay} s (jitter {args.jitter}), "
          f"fully_async max_staleness_steps={args.staleness}; runs in {base}")
    print(f"{'mode':<12} {'steps/min':>9} {'wall s':>7} {'eval start':>10} {'eval end':>9} {'reward last5':>12}")
    for r in results:
        print(f"{r['mode']:<12} {r['steps_per_min']:>9.2f} {r['wall_s']:>7.0f} {100 * (r['eval_start'] or 0):>9.1f}% "
              f"{100 * r['eval_end']:>8.1f}% {r['reward_last5']:>12.3f}")
    ratio = fa["steps_per_min"] / sync["steps_per_min"]
    gap = 100 * (fa["eval_end"] - sync["eval_end"])
    print(f"fully_async / sync steps per minute: {ratio:.2f}x (target >= 1.5x)")
    print(f"held-out success after {args.steps} steps: fully_async - sync = {gap:+.1f} points (target within 5)")
    print(f"fully_async: mean staleness {fa['staleness_mean']:.2f}, dropped {fa['dropped']:.0f} trajectories, "
          f"trainer idle {fa['trainer_idle_s']:.2f} s per step")
    print(json.dumps({"ratio": ratio, "eval_gap_points": gap, "runs": results}))


if __name__ == "__main__":
    main()
