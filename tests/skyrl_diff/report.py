"""Print the tier's numbers: cases and comparisons per pair, how many agreed via SkyRL's float64, the largest
error relative to each quantity's tolerance, and the listed differences.

    python -m tests.skyrl_diff.report        # from the repository root, in the project venv
"""
from __future__ import annotations

import collections
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # import as the tests do (skyrl_diff.*)

from skyrl_diff import cases as cases_mod  # noqa: E402
from skyrl_diff import compare, differences, install_env, jaxrl_side  # noqa: E402


def run_skyrl(all_cases, folder: Path) -> dict:
    python = install_env.ensure_env()
    (folder / "cases.pkl").write_bytes(pickle.dumps(all_cases))
    proc = subprocess.run([str(python), str(HERE / "skyrl_side.py"), str(folder / "cases.pkl"),
                           str(folder / "results.pkl")], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    return pickle.loads((folder / "results.pkl").read_bytes())


def main():
    agreement = cases_mod.build_cases()
    diffs = differences.build()
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        sky = run_skyrl(agreement + [d["case"] for d in diffs], Path(tmp))
    t_sky = time.time() - t0
    stats = collections.defaultdict(lambda: collections.Counter())
    worst = collections.defaultdict(float)
    t0 = time.time()
    for case in agreement:
        j = jaxrl_side.run(case)
        s32, s64 = sky[case["id"]]["float32"], sky[case["id"]]["float64"]
        stats[case["pair"]]["cases"] += 1
        for key, where in compare.compared_keys(case, j, s32):
            a, b = compare.skyrl_value(case, key, s32), compare.skyrl_value(case, key, s64)
            ok, how, err = compare.agree(j[key], a, b, where, compare.condition_scale(case))
            stats[case["pair"]]["comparisons"] += 1
            stats[case["pair"]][how] += 1
            ref = b if where is None else __import__("numpy").asarray(b)[where]
            worst[case["pair"]] = max(worst[case["pair"]], err / compare.tolerance(ref, compare.condition_scale(case)))
    t_jax = time.time() - t0
    total = collections.Counter()
    print(f"{'pair':34s} cases  comparisons  via float64  failed  max err/tol")
    for pair in sorted(stats):
        s = stats[pair]
        total.update(s)
        print(f"{pair:34s} {s['cases']:5d}  {s['comparisons']:11d}  {s['float64']:11d}  {s['none']:6d}  {worst[pair]:.3f}")
    print(f"{'total':34s} {total['cases']:5d}  {total['comparisons']:11d}  {total['float64']:11d}  {total['none']:6d}")
    print(f"{len(stats)} pairs; {len(diffs) - 1} listed differences + {len(differences.DIFFERING_DEFAULTS)} "
          f"differing defaults; SkyRL side {t_sky:.1f} s, jaxrl side {t_jax:.1f} s")


if __name__ == "__main__":
    main()
