"""`python -m jaxrl.config`: list the keys of a recipe, or the keys two recipes set differently.

  python -m jaxrl.config show configs/rloo.py                  # every key: value, type, meaning
  python -m jaxrl.config show configs/rloo.py:qwen3_8b trainer.algorithm mesh   # keys under prefixes
  python -m jaxrl.config diff configs/rloo.py configs/seqmean.py
  python -m jaxrl.config diff runs/a/rl_config.json runs/b/rl_config.json       # two runs' resolved configs

A recipe is `path/to/recipe.py[:scale]` (what `--config=` takes), a run's `rl_config.json` or the
run's workdir.
Every key can be overridden on the command line of `jaxrl.main`: `--config.KEY=VALUE`. The
meanings come from `jaxrl.config.KEY_DOCS`, generated from the schema (jaxrl/config/schema.py).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Optional, Sequence

from jaxrl import config as config_lib
from jaxrl.errors import ArgumentParser



def load(spec: str) -> dict[str, Any]:
    """Flat `{dotted key: value}` of a recipe spec, an `rl_config.json` or a run directory holding
    one (JSON lists as tuples).

    Raises:
      ConfigError: a missing or unloadable recipe (see `config.load_recipe`), or a JSON file that
        is not a config object.
    """
    if os.path.isdir(spec):  # a run directory: its resolved config
        if not os.path.isfile(os.path.join(spec, "rl_config.json")):
            raise config_lib.ConfigError(f"{spec} is a directory without an rl_config.json. Fix: pass a recipe "
                                         "such as configs/rloo.py, a run's rl_config.json or its workdir")
        spec = os.path.join(spec, "rl_config.json")
    if spec.endswith(".json"):
        try:
            with open(spec) as f:
                obj = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise config_lib.ConfigError(f"{spec}: cannot read the config JSON ({reason}). Fix: pass a run's "
                                         "rl_config.json or a recipe such as configs/rloo.py") from None
        if not isinstance(obj, dict):
            raise config_lib.ConfigError(f"{spec}: not a JSON object. Fix: pass a run's rl_config.json")
        obj.pop("_derived", None)  # notes derived from the config, not keys
        return {k: tuple(v) if isinstance(v, list) else v for k, v in config_lib.flatten(obj).items()}
    return config_lib.flatten(config_lib.load_recipe(spec))


def _fmt(value: Any) -> str:
    return repr(value)


def _doc(key: str) -> str:
    """`allowed VALUES; MEANING` of a key from its schema Field (`allowed` only for a key with
    bounds or choices); a key the schema lacks (an old rl_config.json) says so."""
    f = config_lib.FIELDS_BY_KEY.get(key)
    if f is None:
        return "(not a key of this jaxrl version's schema, jaxrl/config/schema.py)"
    from jaxrl.config.docs import allowed

    values = allowed(f).replace("`", "")
    return f"allowed {values}; {f.doc}" if values else f.doc


SHOW_WIDTH = 100  # `show` lines are at most this wide (a terminal, a code review, a log viewer)


def show_lines(spec: str, prefixes: Sequence[str] = ()) -> list[str]:
    """The lines `show` prints, none wider than `SHOW_WIDTH`: a header, then per key
    `key = value` and, indented below it, `type: meaning` (wrapped). A value too long for its key's
    line goes on a line of its own below the key.

    Raises:
      ConfigError: as `load`; or a prefix that starts no key (naming the nearest key or section,
        or the top-level keys when none is close: `config.unknown_key_hint`).
    """
    import textwrap

    flat = load(spec)
    for p in prefixes:
        if not any(k.startswith(p) for k in flat):
            raise config_lib.ConfigError(f"no key of {spec} starts with {p!r}; "
                                         f"{config_lib.unknown_key_hint(p, flat, sections=True)} Fix: give the start "
                                         f"of a dotted key, e.g. trainer.optimizer (every key: "
                                         f"python -m jaxrl.config show {spec})")
    keys = [k for k in flat if not prefixes or any(k.startswith(p) for p in prefixes)]
    scale = flat.get("scale", "?")
    lines = [f"# {spec} (scale {scale}): {len(keys)} of {len(flat)} keys",
             "# each key: KEY = VALUE, then TYPE: [allowed VALUES;] MEANING; override with --config.KEY=VALUE"]
    indent = "    "
    for k in keys:
        v = _fmt(flat[k])
        head = f"{k} = {v}"
        if len(head) <= SHOW_WIDTH:
            lines.append(head)
        else:
            lines.append(f"{k} =")
            lines += textwrap.wrap(v, SHOW_WIDTH, initial_indent=indent, subsequent_indent=indent,
                                   break_on_hyphens=False) or [indent]
        lines += textwrap.wrap(f"{config_lib.key_type(k, flat[k])}: {_doc(k)}", SHOW_WIDTH, initial_indent=indent,
                               subsequent_indent=indent, break_on_hyphens=False)
    return lines


def diff_lines(spec_a: str, spec_b: str) -> list[str]:
    """The lines `diff` prints: how many keys differ, then `key  value in A  value in B` for each
    (a key present on one side only shows `(absent)` on the other)."""
    a, b = load(spec_a), load(spec_b)
    missing = object()
    keys = sorted(k for k in set(a) | set(b) if a.get(k, missing) != b.get(k, missing))
    if not keys:
        return [f"# {spec_a} and {spec_b} set every key alike ({len(a)} keys)"]
    va = {k: _fmt(a[k]) if k in a else "(absent)" for k in keys}
    vb = {k: _fmt(b[k]) if k in b else "(absent)" for k in keys}
    kw = max(len(k) for k in keys)
    aw = max(len(spec_a), *(len(v) for v in va.values()))
    lines = [f"# {len(keys)} of {len(set(a) | set(b))} keys differ",
             f"{'KEY':<{kw}}  {spec_a:<{aw}}  {spec_b}"]
    lines += [f"{k:<{kw}}  {va[k]:<{aw}}  {vb[k]}" for k in keys]
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command; returns the exit status (0, or 2 after a one-line error)."""
    parser = ArgumentParser(
        prog="python -m jaxrl.config", description=__doc__.split("\n\n")[0].split(": ", 1)[1],
        epilog="examples:\n" + __doc__.split("\n\n")[1] + "\n\nA recipe is path/to/recipe.py[:scale] (as --config= "
               "takes), a run's rl_config.json or its workdir.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_show = sub.add_parser("show", help="every key of a recipe with its value, type and meaning")
    p_show.add_argument("recipe", nargs="?", help="e.g. configs/rloo.py or configs/rloo.py:qwen3_8b")
    p_show.add_argument("prefix", nargs="*", help="only the keys that start with one of these (e.g. trainer.optimizer)")
    p_diff = sub.add_parser("diff", help="the keys two recipes (or two runs' rl_config.json) set differently")
    p_diff.add_argument("a", nargs="?", help="a recipe, a run's rl_config.json or its workdir")
    p_diff.add_argument("b", nargs="?", help="the same for the other side")
    from jaxrl import cli

    argv = list(sys.argv[1:] if argv is None else argv)
    problem = cli.no_overrides(argv, "python -m jaxrl.config", "it lists the keys those overrides take")
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    spec = cli.recipe_spec(argv)
    if spec is not None and argv[:1] == ["show"]:  # `show --config=RECIPE`, as jaxrl.main takes it
        i = next(i for i, a in enumerate(argv) if a == "--config" or a.startswith("--config="))
        argv = ["show", spec] + argv[1:i] + argv[i + (1 if "=" in argv[i] else 2):]
    if not argv:  # argparse would say only "the following arguments are required: command"
        parser.print_help(sys.stderr)
        return 2
    args = parser.parse_args(argv)
    # argparse would say "the following arguments are required: recipe, prefix" (prefix is optional)
    if args.command == "show" and args.recipe is None:
        parser.exit(2, "error: config show needs a recipe: python -m jaxrl.config show configs/rloo.py [PREFIX ...] "
                       "(the recipes are the files in configs/; PREFIX, optional, keeps the keys starting with it)\n")
    if args.command == "diff" and args.b is None:
        parser.exit(2, "error: config diff needs two configs: python -m jaxrl.config diff configs/rloo.py "
                       "configs/grpo.py (each a recipe, a run's rl_config.json or its workdir)\n")
    try:
        lines = show_lines(args.recipe, args.prefix) if args.command == "show" else diff_lines(args.a, args.b)
    except config_lib.ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
