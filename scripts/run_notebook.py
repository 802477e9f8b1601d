"""Execute research notebooks top to bottom in a fresh kernel and save them WITH their outputs.

    python scripts/run_notebook.py notebooks/loss_variants.ipynb [more.ipynb ...] [--timeout 3600]
    JAXRL_NOTEBOOK_MODE=ci python scripts/run_notebook.py notebooks/recipe_ablation.ipynb --out /tmp/x.ipynb

The committed notebooks carry their outputs (figures as embedded PNGs) so that a plain viewer such
as GitHub's shows them without running anything; this script regenerates them. It runs each
notebook from the repository root, with matplotlib's Agg backend and JAX on the CPU (as the tests
do), and writes no per-cell timing metadata, so a rerun changes only what the code printed or drew.
Exit status 1 if a cell raised (the notebook is still written, with the error in its outputs).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def execute(path: pathlib.Path, out: pathlib.Path, timeout: int) -> bool:
    """Runs `path` in a fresh python3 kernel (cwd = repository root) and writes it to `out`.
    Returns True when every cell ran without an error."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(ROOT)}})
    ok = True
    try:
        client.execute()
    except CellExecutionError as e:
        print(f"{path}: a cell failed: {str(e).splitlines()[0] if str(e) else e}", file=sys.stderr)
        ok = False
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, out)
    return ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("notebooks", nargs="+", type=pathlib.Path)
    p.add_argument("--out", type=pathlib.Path, default=None,
                   help="output path (one notebook only); default: overwrite the notebook in place")
    p.add_argument("--timeout", type=int, default=3600, help="seconds per cell (default 3600)")
    args = p.parse_args(argv)
    if args.out is not None and len(args.notebooks) != 1:
        p.error("--out takes one notebook")
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    ok = True
    for nb_path in args.notebooks:
        t0 = time.time()
        ok &= execute(nb_path.resolve(), (args.out or nb_path).resolve(), args.timeout)
        print(f"{nb_path}: executed in {time.time() - t0:.0f} s", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
