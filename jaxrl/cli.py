"""Command-line plumbing shared by the absl-based commands (jaxrl.main, jaxrl.plan, jaxrl.evaluate).

* `--help` / `-h` prints the command's usage, its flags and how to list the `--config.*` keys,
  and exits 0 (absl's own help exits 1); `--helpfull` adds every absl flag, also with status 0.
* Library INFO logs (jax's backend probing, Orbax's I/O statistics) stay off stderr unless a
  logging flag such as `--verbosity=0` asks for them; warnings and errors still show.
* A bad command line (an unknown `--config.*` key, a value of the wrong type, an unknown flag)
  prints one line, `error: ...`, and exits 2. An unknown key is named by its full dotted path
  with the nearest valid key; a bad value is quoted as typed, with the type the key wants.
"""
from __future__ import annotations

import re
import sys
from typing import Callable, Optional, Sequence

HELP_FLAGS = ("-h", "-?", "--help", "--helpshort")
HELPFULL_FLAGS = ("--helpfull",)

KEYS_HINT = """\
Config keys: every key of a recipe can be overridden with --config.KEY=VALUE (e.g.
--config.trainer.optimizer.lr=1e-5). To list them with their values, types and meanings:
  python -m jaxrl.config show configs/rloo.py                   # every key
  python -m jaxrl.config show configs/rloo.py:qwen3_8b trainer  # the 8B scale, keys under trainer.
  python -m jaxrl.config diff configs/rloo.py configs/grpo.py   # the keys two recipes set differently"""


from jaxrl.errors import Terminated, note_sigterm  # noqa: E402,F401 (Terminated: its public name here)


INTERRUPTED_STATUS = {"SIGINT": 130, "SIGTERM": 143}  # 128 + the signal number, as a shell reports it


def handle_sigterm() -> None:
    """Makes SIGTERM (what `scancel`, SLURM time limits and most schedulers send) raise `Terminated`
    in the main thread, once: a second SIGTERM during the cleanup is ignored (the scheduler's
    SIGKILL after its grace period still ends the process). Call it first thing in a command's main.
    The arrival is also recorded (`jaxrl.errors.raise_if_terminated`): a raise that lands in a
    garbage-collector callback is swallowed by Python, and the run's loop then raises it at its next step."""
    import signal

    def on_sigterm(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        note_sigterm()
        raise Terminated("SIGTERM")

    signal.signal(signal.SIGTERM, on_sigterm)


def interrupted_exit(what: str) -> None:
    """Prints the one line that says how to resume after SIGINT or SIGTERM, and exits 130 / 143.

    `what`: the thing to resume, e.g. "runs/rloo from its last checkpoint"."""
    import signal

    name = "SIGTERM" if isinstance(sys.exc_info()[1], Terminated) else "SIGINT"
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the exit path is not interrupted again
    print(f"\ninterrupted ({name}); rerun the same command to resume {what}", file=sys.stderr, flush=True)
    sys.exit(INTERRUPTED_STATUS[name])


def help_text(doc: str, keys_hint: bool = True) -> str:
    """`doc` (a module docstring), the flags of the running command and, if `keys_hint`, how to
    list the config keys."""
    from absl import flags

    module_flags = flags.FLAGS.main_module_help().strip().split("\n", 1)  # drop the "path/to/main.py:" line
    parts = [doc.strip(), "flags:\n" + (module_flags[1] if len(module_flags) > 1 else "  (none)")]
    if keys_hint:
        parts.append(KEYS_HINT)
    parts.append("--helpfull lists every flag, including absl's logging flags.")
    return "\n\n".join(parts) + "\n"


def run(main: Callable, doc: str, keys_hint: bool = True, argv: Optional[Sequence[str]] = None,
        no_config_hint: str = "") -> None:
    """`absl.app.run(main)` with a help that exits 0 and one-line command-line errors (exit 2).

    `--config=RECIPE` may come after its `--config.KEY` overrides (it is moved first); overrides
    without a recipe are a usage error that says to pass `--config=configs/<recipe>.py` (or, for a
    command without a `--config` flag, that it takes none: `no_config_hint` says what it takes).
    """
    from absl import app, flags

    real = argv is None
    argv = list(sys.argv if argv is None else argv)
    argv = argv[:1] + recipe_first(argv[1:])
    if real:  # ml_collections reads its overrides from sys.argv itself
        sys.argv[:] = argv
    if any(a in HELP_FLAGS for a in argv[1:]):
        sys.stdout.write(help_text(doc, keys_hint))
        sys.exit(0)
    if any(a in HELPFULL_FLAGS for a in argv[1:]):
        sys.stdout.write(help_text(doc, keys_hint) + "\nall flags:\n" + flags.FLAGS.get_help() + "\n")
        sys.exit(0)
    spec = recipe_spec(argv[1:])
    if "config" not in flags.FLAGS and spec is not None:
        usage_error(f"--config: this command has no --config recipe{no_config_hint}")
    if spec is not None:
        # Before absl loads (executes) the file: a directory, a non-Python file or a Python file that
        # is no recipe (setup.py would run its own command line).
        from jaxrl.config import recipe_file_problem

        problem = recipe_file_problem(spec)
        if problem:
            usage_error(f"--config: {problem}")
    overrides = _overrides(argv[1:])
    if overrides and spec is None:
        if "config" in flags.FLAGS:
            usage_error(missing_recipe_message(overrides[0][0]))
        usage_error(f"{overrides[0][0]}: this command has no --config recipe, so it takes no --config.KEY "
                    f"overrides{no_config_hint}")
    quiet = not any(a.startswith(("--verbosity", "-v=", "--v=", "--logtostderr", "--alsologtostderr"))
                    or a in ("-v", "--v") for a in argv[1:])

    def quiet_main(args):
        if quiet:  # absl's default shows every library's INFO records (jax backends, Orbax I/O) on stderr
            from absl import logging as absl_logging

            absl_logging.set_verbosity(absl_logging.WARNING)
        return main(args)

    app.run(quiet_main, argv=argv, flags_parser=parse_flags)


def recipe_load_error(e: OSError, flag: str = "config") -> None:
    """Exits 2 after one line for a `--config` recipe that ml_collections could not load (it defers
    a missing file, or an OSError raised by the recipe's code, to the first access of the config):
    the file and line when the error came from the recipe's code (`config.recipe_error`), else
    the library's reason."""
    from jaxrl import config as config_lib

    import os

    spec = recipe_spec(sys.argv[1:], flag)
    path = spec.partition(":")[0] if spec else None
    error = config_lib.recipe_error(e, path) if path else None
    if error is None and path and not os.path.isfile(path):
        error = f"--{flag}: recipe file {path!r} does not exist, so it could not be loaded. {config_lib.RECIPE_FIX}"
    print(f"error: {error or str(e).splitlines()[-1].strip() + ': the --config recipe file could not be loaded'}",
          file=sys.stderr)
    sys.exit(2)


def recipe_first(args: Sequence[str], flag: str = "config") -> list[str]:
    """`args` with the recipe (`--config=R`, or `--config R`) moved before its first `--config.KEY`
    override: ml_collections refuses an override that comes before the recipe."""
    args = list(args)
    for i, a in enumerate(args):
        if a.startswith(f"--{flag}=") or (a == f"--{flag}" and i + 1 < len(args)):
            spec = args[i:i + (1 if "=" in a else 2)]
            first = next((j for j, b in enumerate(args) if b.startswith(f"--{flag}.")), None)
            if first is None or first > i:
                return args
            rest = args[:i] + args[i + len(spec):]
            return rest[:first] + spec + rest[first:]
    return args


def missing_recipe_message(arg: str, flag: str = "config") -> str:
    """The usage error for a `--config.KEY=VALUE` override given without a recipe."""
    return (f"{arg} overrides a key of a recipe, but no recipe was given. Fix: pass the recipe too, "
            f"e.g. --{flag}=configs/rloo.py {arg} (the recipes are the files in configs/)")


def take_overrides(args: Sequence[str], flag: str = "config") -> tuple[list[str], list[str]]:
    """Splits `args` into the `--config.KEY=VALUE` / `--config.KEY VALUE` overrides (each as one
    `--config.KEY=VALUE` argument) and the rest (for a command that applies them to a config it
    reads itself, not to a `--config` recipe)."""
    spans = _override_spans(args, flag)
    used = {i for start, end, *_ in spans for i in range(start, end)}
    taken = [a if "=" in a or value is None else f"{a}={value}" for _, _, a, _, value in spans]
    return [a for i, a in enumerate(args) if i not in used], taken


def apply_overrides(c, overrides: Sequence[str], source: str, flag: str = "config"):
    """A copy of config `c` (read from `source`, e.g. a run's rl_config.json) with the
    `--config.KEY=VALUE` overrides applied as `--config=RECIPE` would apply them (same types and
    checks). Exits 2 after one line (`flag_error_line`'s: the unknown key and the nearest one, or
    the bad value and the type the key wants)."""
    from absl import flags
    from ml_collections import config_flags

    fv = flags.FlagValues()
    argv = ["jaxrl", *overrides]
    try:
        config_flags.DEFINE_config_dict(flag, c.copy_and_resolve_references(), flag_values=fv, lock_config=True,
                                        sys_argv=argv)
        fv(argv)
    except Exception as e:  # as in parse_flags: ml_collections raises AttributeError/KeyError/ValueError
        print(f"error: {flag_error_line(e, argv, flag, recipe=(source, c))}", file=sys.stderr)
        sys.exit(2)
    return fv[flag].value


def no_overrides(args: Sequence[str], prog: str, takes: str) -> Optional[str]:
    """The one-line error for `--config.KEY` overrides given to a command that takes none
    (`prog`, e.g. "python -m jaxrl.tasks"; `takes`: what it takes instead), or None."""
    arg = next((a for a in args if a.startswith("--config.")), None)
    if arg is None:
        return None
    return (f"{arg}: {prog} takes no --config.KEY overrides ({takes}); they go to a command that runs a recipe: "
            "python -m jaxrl.main / jaxrl.evaluate / jaxrl.plan --config=configs/rloo.py --config.KEY=VALUE")


def usage_error(message: str) -> None:
    """Exits 2 after printing `error: <message> (see --help)` (one line)."""
    print(f"error: {message} (see --help)", file=sys.stderr)
    sys.exit(2)


def parse_flags(argv: Sequence[str]):
    """absl flag parsing whose errors are one line: exits 2 with `error: ...` instead of a traceback."""
    from absl import flags

    try:
        return flags.FLAGS(list(argv))
    except Exception as e:  # ml_collections raises AttributeError/KeyError/ValueError, absl flags.Error
        print(f"error: {flag_error_line(e, argv)}", file=sys.stderr)
        sys.exit(2)


def recipe_spec(argv: Sequence[str], flag: str = "config") -> Optional[str]:
    """The recipe given as `--config=R` or `--config R` in argv, or None."""
    for i, a in enumerate(argv):
        if a.startswith(f"--{flag}="):
            return a.split("=", 1)[1]
        if a == f"--{flag}" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def _override_spans(argv: Sequence[str], flag: str = "config") -> list[tuple[int, int, str, str, Optional[str]]]:
    """`(start, end, argument, key, value)` of every `--config.KEY=VALUE` (argv[start:end] is the one
    argument) or `--config.KEY VALUE` (the two arguments) in argv; value None when nothing follows."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a.startswith(f"--{flag}."):
            body = a[len(flag) + 3:]
            if "=" in body:
                key, value = body.split("=", 1)
                out.append((i, i + 1, a, key, value))
            else:
                value = argv[i + 1] if i + 1 < len(argv) else None
                out.append((i, i + 1 if value is None else i + 2, a, body, value))
                i += 0 if value is None else 1
        i += 1
    return out


def _overrides(argv: Sequence[str], flag: str = "config") -> list[tuple[str, str, Optional[str]]]:
    """`(argument, key, value)` of every `--config.KEY=VALUE` (or `--config.KEY VALUE`) in argv."""
    return [(a, key, value) for _, _, a, key, value in _override_spans(argv, flag)]


def flag_error_line(e: BaseException, argv: Sequence[str], flag: str = "config", recipe=None) -> str:
    """One line saying what is wrong with a command line that absl / ml_collections refused.

    A recipe file that does not compile or whose code raises: the file and line
    (`config.recipe_error`). An unknown `--config.KEY`: the full dotted KEY, the nearest valid key and the command that
    lists the keys. A value that does not parse: the value as typed (quoted), the type the key
    wants and the recipe's value. Anything else: the library's message on one line. `recipe`:
    `(source, ConfigDict)` the overrides apply to, when it is not a `--config=` recipe in argv.
    """
    from jaxrl import config as config_lib

    spec = recipe_spec(argv, flag)
    if spec is not None:  # a syntax error in the recipe file, or an exception of its code
        error = config_lib.recipe_error(e, spec.partition(":")[0])
        if error is not None:
            return str(error)
    overrides = _overrides(argv, flag)
    has = "the recipe has"
    if recipe is not None:
        (spec, recipe), has = recipe, "the config has"
    elif spec is not None and overrides:
        try:
            recipe = config_lib.load_recipe(spec)
        except Exception:  # noqa: BLE001 - the recipe's own error is reported by the library message below
            recipe = None
    if recipe is not None:
        leaves = config_lib.flatten(recipe)
        sections = config_lib.key_sections(leaves)
        list_cmd = f"python -m jaxrl.config show {spec}"
        for arg, key, value in overrides:
            if key in leaves or key in sections:
                continue
            return (f"unknown config key `{key}` (in {arg}); {config_lib.unknown_key_hint(key, leaves)} "
                    f"List the keys with: {list_cmd}")
        msg = _library_message(e)
        m = re.match(rf"Missing value for flag --{re.escape(flag)}\.(\S+)$", msg)
        if m and m.group(1) in leaves:
            key = m.group(1)
            return (f"--{flag}.{key} needs a value ({has} {leaves[key]!r}). "
                    f"Fix: --{flag}.{key}=VALUE, e.g. --{flag}.{key}={leaves[key]!r}")
        m = re.match(rf"flag --{re.escape(flag)}\.([^=]+)=", msg)
        if m and (m.group(1) in leaves or m.group(1) in sections):
            key = m.group(1)
            value = next((v for _, k, v in overrides if k == key), None)
            if key in sections:
                example = next(k for k in leaves if k.startswith(key + "."))
                return (f"config key `{key}` is a section of keys, not a value; set a key inside it, e.g. "
                        f"--{flag}.{example}={leaves[example]!r}. List the keys with: {list_cmd} {key}")
            current = leaves[key]
            want = config_lib.key_type(key, current)
            return (f"config key `{key}`: {value!r} is not a valid {want} value ({has} {current!r}). "
                    f"Fix: e.g. --{flag}.{key}={current!r}")
    msg = _library_message(e)
    m = re.match(r"Missing value for flag (--\S+)$", msg)
    if m:
        return f"{m.group(1)} needs a value. Fix: {m.group(1)}=VALUE"
    return msg


def _library_message(e: BaseException) -> str:
    """The useful line of a flag-parsing error (ml_collections embeds tracebacks in its messages)."""
    msg = e.args[0] if e.args and isinstance(e.args[0], str) else str(e)
    if isinstance(e, AttributeError) and e.args and isinstance(e.args[0], KeyError):
        msg = str(e.args[0].args[0]) if e.args[0].args else str(e.args[0])
    if "Traceback" in msg:  # keep the final "SomeError: message" line of the embedded traceback
        last = [line for line in msg.strip().splitlines() if line.strip()][-1]
        msg = last.split(": ", 1)[1] if ": " in last else last
    return " ".join(msg.replace("\\n", " ").split())
