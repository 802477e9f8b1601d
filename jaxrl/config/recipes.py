"""Loading a recipe (`path/to/recipe.py[:scale]`, what `--config=` takes) and the one-line errors
of a recipe or a mistyped key: `load_recipe`, `recipe_error`, `recipe_file_problem`,
`nearest_key` / `unknown_key_hint`."""
from __future__ import annotations

import os
import re
from typing import Optional

import ml_collections

from jaxrl.errors import ConfigError


def nearest_key(key: str, keys) -> Optional[str]:
    """The valid key a mistyped dotted `key` most likely meant, or None.

    A key with the same last component wins (`trainer.lr` -> `trainer.optimizer.lr`), the one
    whose full path is closest if several do; otherwise the closest full path, then the closest
    last component (difflib similarity >= 0.6).
    """
    import difflib

    keys = list(keys)
    leaf = key.rsplit(".", 1)[-1]
    ratio = lambda k: difflib.SequenceMatcher(None, key, k).ratio()
    same_leaf = [k for k in keys if k.rsplit(".", 1)[-1] == leaf]
    if same_leaf:
        return max(same_leaf, key=ratio)
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    if close:
        return close[0]
    leaves = {k.rsplit(".", 1)[-1]: k for k in keys}
    close = difflib.get_close_matches(leaf, list(leaves), n=1, cutoff=0.6)
    return leaves[close[0]] if close else None


def key_sections(keys) -> set[str]:
    """Every section above the dotted leaf `keys` (`trainer`, `trainer.optimizer`, ...)."""
    return {k.rsplit(".", i)[0] for k in keys for i in range(1, k.count(".") + 1)}


def unknown_key_hint(key: str, keys, sections: bool = False) -> str:
    """What to say about a `key` that is not one of the dotted leaf `keys`: `did you mean `K`?` with
    the nearest key (`nearest_key`; with `sections`, sections such as `trainer.optimizer` are
    candidates too), or, when none is close, the top-level names to start from."""
    keys = list(keys)
    near = nearest_key(key, [*keys, *sorted(key_sections(keys))] if sections else keys)
    if near:
        return f"did you mean `{near}`?"
    top = sorted({k.split(".", 1)[0] for k in keys})
    return f"no key is close to it; the top-level keys are {', '.join(top)}."


def recipe_error(e: BaseException, path: str) -> Optional[ConfigError]:
    """A one-line error naming the file and line of a recipe that failed to load, or None.

    `e` is what loading the recipe file `path` raised (compiling it, running it, or its
    `get_config`), or an exception chained to it (ml_collections re-raises a recipe's TypeError /
    ValueError with the traceback as text, and defers an OSError behind another): a SyntaxError
    names its own file and line; any other exception the last line of `path` in its traceback.
    None when no exception of the chain came from `path`. A ConfigError in the chain (jaxrl's own
    one-line error with its fix, such as an unknown scale) is returned as it is: the recipe's line
    that called into jaxrl is not where the problem is.
    """
    import traceback

    target = os.path.realpath(path)
    seen: set[int] = set()
    chain: list[BaseException] = []
    err: Optional[BaseException] = e
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        chain.append(err)
        err = err.__cause__ or err.__context__
    own = [x for x in chain if isinstance(x, ConfigError)]
    if own:  # the innermost: ml_collections re-raises it with the traceback in the message
        return ConfigError(" ".join(str(own[-1]).split()))
    for err in chain:
        if isinstance(err, SyntaxError) and err.filename and os.path.isfile(err.filename):
            where, line, text = err.filename, err.lineno, err.msg
        else:
            line = None
            for frame, lineno in traceback.walk_tb(err.__traceback__):
                if os.path.realpath(frame.f_code.co_filename) == target:
                    line = lineno
            where, text = path, " ".join(str(err).split())
        if line is not None:
            return ConfigError(f"--config: recipe file {where}, line {line}: {type(err).__name__}: {text}. "
                               f"Fix: correct line {line} of {where}")
    return None


RECIPE_FIX = "Fix: pass a recipe such as configs/rloo.py (or configs/rloo.py:qwen3_8b)"


def recipe_file_problem(spec: str) -> Optional[str]:
    """Why `spec` (`path/to/recipe.py[:scale]`) cannot be a recipe, checked without running it, or
    None: no file name, an empty scale after the colon, a directory, a file whose name does not end in .py, or a
    Python file with no ``def get_config`` (a missing file is reported where it is loaded)."""
    path, sep, scale = spec.partition(":")
    if not path.strip():
        return f"no recipe file given ({spec!r}). {RECIPE_FIX}"
    if sep and not scale.strip():
        return (f"{spec!r} names no scale after the ':'. Fix: drop the ':' for the CPU scale "
                f"({path}) or name one ({path}:qwen3_8b)")
    if os.path.isdir(path):
        return f"{path!r} is a directory, not a recipe file. {RECIPE_FIX}"
    if not os.path.isfile(path):
        return None
    if not path.endswith(".py"):
        return f"{path!r} is not a Python recipe file (.py with get_config()). {RECIPE_FIX}"
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        return f"recipe file {path!r} cannot be read ({e}). {RECIPE_FIX}"
    if not re.search(r"^\s*def\s+get_config\s*\(", text, re.M):
        return f"recipe file {path!r} defines no get_config(), so it is not a recipe. {RECIPE_FIX}"
    return None


def load_recipe(spec: str) -> ml_collections.ConfigDict:
    """The config of a recipe spec `path/to/recipe.py[:scale]` (what --config=... loads).

    Raises:
      ConfigError: the file does not exist, is not a Python file with `get_config`, the
        scale is unknown, or the file has a syntax error or its code raises (`recipe_error`:
        the file and line).
    """
    import importlib.util

    path, sep, arg = spec.partition(":")
    if not os.path.exists(path):
        raise ConfigError(f"recipe file {path!r} does not exist. {RECIPE_FIX}")
    problem = recipe_file_problem(spec)
    if problem:
        raise ConfigError(problem)
    name = "jaxrl_recipe_" + os.path.splitext(os.path.basename(path))[0]
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
        return module.get_config(arg) if sep else module.get_config()
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - any error of the recipe's own code, reported with its line
        error = recipe_error(e, path)
        if error is None:
            raise
        raise error from None
