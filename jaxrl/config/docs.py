"""docs/config.md, generated from the schema (`schema.FIELDS`): one table per section with every
key's type, default, allowed values, meaning and source. `python -m jaxrl.config.docs` rewrites
the file; tests/test_config_schema.py fails when it is not what `markdown()` gives.
"""
from __future__ import annotations

import os
import sys

from jaxrl.config.field import Field
from jaxrl.config.schema import FIELDS

DOC_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "docs", "config.md")

HEADER = """# Config keys

Generated from the schema (`jaxrl/config/schema.py`, `jaxrl/config/algorithm.py`) by
`python -m jaxrl.config.docs`; do not edit by hand (`tests/test_config_schema.py` fails when this
file differs from the schema). Each key is declared once, as a `Field`: its type and default (the
CPU scale's; `configs/*.py` recipes and the `:qwen3_8b` scale set others), the values it accepts,
one line on what it means and, where it has one, its source. `validate()` checks every key
against that declaration before a run starts (one line naming the key and the fix), then the
checks that need more than one key (`jaxrl/config/validate.py`). `python -m jaxrl.config show
RECIPE` prints a recipe's values with the same meanings; `--config.KEY=VALUE` overrides any key.
The formulas behind the `trainer.algorithm` keys are in docs/recipes.md ("trainer.algorithm keys").

"Off" values: a key with one turns its option off with it (`''` or `0`); the objective's
dataclasses (`LossConfig`, `AdvantageConfig`, generated from the same declarations) hold None
for it. "Field" names the dataclass attribute a `trainer.algorithm` key sets.
"""


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def allowed(f: Field) -> str:
    """The values `f` accepts, in words: bounds, choices, extra values and the off value."""
    parts = []
    if f.bounds:
        parts.append(f.bounds.strip())
    if f.choices:
        parts.append(" | ".join(f"`{c}`" if c else "`''` (empty)" for c in f.choices))
    if f.also:
        parts.append("or " + ", ".join(f"`{a!r}`" for a in f.also))
    if f.has_off:
        parts.append(f"`{f.off!r}` = off")
    return "; ".join(parts)


def markdown() -> str:
    """The text of docs/config.md: `HEADER`, then a table per section of the schema, in order."""
    out = [HEADER]
    section, seen = None, set()
    for f in FIELDS:
        sec = f.key.rpartition(".")[0] or "(top level)"
        if sec != section:
            section = sec
            out.append(f"\n## `{sec}`{' (continued)' if sec in seen else ''}\n")  # resumed after a subsection
            seen.add(sec)
            out.append("| key | type | default | allowed | meaning | source |")
            out.append("|---|---|---|---|---|---|")
        src = f.source + (f" (field `{'LossConfig' if f.owner == 'loss' else 'AdvantageConfig'}.{f.attr}`)"
                          if f.owner else "")
        out.append(f"| `{f.key}` | {f.type_name} | `{f.default!r}` | {_cell(allowed(f))} | {_cell(f.doc)} | "
                   f"{_cell(src)} |")
    return "\n".join(out) + "\n"


def main(argv) -> int:
    """`python -m jaxrl.config.docs`: rewrites docs/config.md (atomically); `--help` prints what it does
    and writes nothing; any other argument is one line and status 2."""
    from jaxrl.fileio import atomic_write_text

    if any(a in ("-h", "--help") for a in argv):
        print(f"python -m jaxrl.config.docs: rewrites {os.path.relpath(DOC_PATH)} from the schema "
              "(jaxrl/config/schema.py, jaxrl/config/algorithm.py); it takes no arguments")
        return 0
    if argv:
        print(f"error: python -m jaxrl.config.docs takes no arguments (got {argv[0]!r}); "
              "run it alone to rewrite docs/config.md", file=sys.stderr)
        return 2
    atomic_write_text(DOC_PATH, markdown())
    print(f"wrote {DOC_PATH} ({len(FIELDS)} keys)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
