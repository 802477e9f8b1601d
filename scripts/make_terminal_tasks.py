"""Writes Harbor terminal tasks from the templates in `jaxrl/envs/harbor/families.py`.

    python scripts/make_terminal_tasks.py                    # (re)write the shipped set in jaxrl/assets/terminal_tasks/
    python scripts/make_terminal_tasks.py --check            # verify the committed set equals the generated one
    python scripts/make_terminal_tasks.py --family write-file --seeds 100-599 --out /tmp/train_tasks
                                                             # seeded variants of one family (e.g. SFT / RL splits)

Generation is deterministic: the same family and seed give byte-identical task directories.
"""
from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import sys
import tempfile
from pathlib import Path

from jaxrl.envs.harbor.families import FAMILIES, SHIPPED_TASKS_DIR, generate_tasks, write_shipped_tasks


def _seeds(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-")
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out


def _diff(a: Path, b: Path) -> list[str]:
    """Relative paths that differ between two trees (missing on either side or different bytes)."""
    def files(root):
        return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    fa, fb = files(a), files(b)
    bad = sorted(fa ^ fb)
    for rel in sorted(fa & fb):
        pa, pb = a / rel, b / rel
        if not filecmp.cmp(pa, pb, shallow=False) or (os.stat(pa).st_mode & 0o111) != (os.stat(pb).st_mode & 0o111):
            bad.append(rel)
    return bad


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help=f"output folder (default: {SHIPPED_TASKS_DIR})")
    p.add_argument("--check", action="store_true", help="compare the shipped set with a fresh generation")
    p.add_argument("--family", default=None, help=f"one family: {', '.join(FAMILIES)}")
    p.add_argument("--seeds", default=None, help="seeds for --family, e.g. 0-99 or 1,5,9")
    args = p.parse_args(argv)
    if args.family:
        if not args.seeds or not args.out:
            p.error("--family needs --seeds and --out")
        dirs = generate_tasks(args.family, _seeds(args.seeds), args.out)
        print(f"wrote {len(dirs)} tasks to {args.out}")
        return 0
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            write_shipped_tasks(tmp)
            bad = _diff(Path(tmp), SHIPPED_TASKS_DIR)
        if bad:
            print(f"{SHIPPED_TASKS_DIR} differs from the generated set: {bad[:20]}", file=sys.stderr)
            return 1
        print(f"{SHIPPED_TASKS_DIR} matches the generated set")
        return 0
    out = Path(args.out) if args.out else SHIPPED_TASKS_DIR
    if out.exists():
        shutil.rmtree(out)
    dirs = write_shipped_tasks(out)
    print(f"wrote {len(dirs)} tasks to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
