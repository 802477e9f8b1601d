"""The Python of the sandbox's `python` profile: found once, probed for pytest, bound read-only.

The Python of the `python` profile is found in this order: `find_python(path)` argument, the
`JAXRL_SANDBOX_PYTHON` environment variable, the running interpreter (`sys.executable`, e.g. the
project's venv, which has pytest with the `dev` extra), `/usr/bin/python3`. The first one that can
import pytest is used; its install prefixes are bound read-only into the sandbox at the same paths
and `python3`, `python`, `pytest` and `pip` on the sandbox PATH run it.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
from typing import Optional

from jaxrl.envs.harbor.errors import UnsupportedEnvironmentError


@dataclasses.dataclass(frozen=True)
class PythonRuntime:
    """A Python that can import pytest, as seen from the sandbox.

    Attributes:
      executable: the interpreter path (the same path on the host and in the sandbox).
      bind_paths: host directories bound read-only at the same path (its prefixes, outside /usr).
      version: `sys.version` of that Python.
    """

    executable: str
    bind_paths: tuple[str, ...]
    version: str


_PROBE = r"""
import json, sys, sysconfig
try:
    import pytest
    pt = pytest.__file__
except Exception:
    pt = None
print(json.dumps({"executable": sys.executable, "prefix": sys.prefix, "base_prefix": sys.base_prefix,
                  "exec_prefix": sys.exec_prefix, "base_exec_prefix": sys.base_exec_prefix,
                  "purelib": sysconfig.get_path("purelib"), "platlib": sysconfig.get_path("platlib"),
                  "version": sys.version, "pytest": pt}))
"""


def _probe(exe: str) -> Optional[dict]:
    try:
        out = subprocess.run([exe, "-I", "-c", _PROBE], capture_output=True, text=True, timeout=60,
                             env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def _under(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root


@functools.lru_cache(maxsize=None)
def _runtime_for(exe: str) -> Optional[PythonRuntime]:
    info = _probe(exe)
    if info is None or info["pytest"] is None:
        return None
    dirs = []
    for key in ("base_prefix", "prefix", "base_exec_prefix", "exec_prefix"):
        d = os.path.realpath(info[key])
        if d not in dirs:
            dirs.append(d)
    # pytest may live outside the prefixes (a user site); bind its site-packages directory too.
    site = os.path.dirname(os.path.dirname(os.path.realpath(info["pytest"])))
    if not any(_under(site, d) for d in dirs):
        dirs.append(site)
    dirs = [d for d in dirs if not _under(d, "/usr") and d != "/"]
    # keep only outermost directories
    dirs = [d for d in dirs if not any(o != d and _under(d, o) for o in dirs)]
    # the executable itself (e.g. a venv's bin/python, a symlink into base_prefix) must be reachable
    exe_path = info["executable"]
    if not any(_under(os.path.dirname(exe_path), d) for d in dirs) and not _under(exe_path, "/usr"):
        dirs.append(os.path.dirname(exe_path))
    return PythonRuntime(executable=exe_path, bind_paths=tuple(sorted(dirs)), version=info["version"])


def find_python(path: Optional[str] = None) -> PythonRuntime:
    """The Python the `python` profile runs (order in the module docstring).

    Raises:
      UnsupportedEnvironmentError: no candidate can import pytest (the message lists what was tried and the fix).
    """
    if path:
        candidates = [path]
    elif os.environ.get("JAXRL_SANDBOX_PYTHON"):
        candidates = [os.environ["JAXRL_SANDBOX_PYTHON"]]
    else:
        candidates = [sys.executable, "/usr/bin/python3"]
    for c in candidates:
        exe = shutil.which(c) or c
        rt = _runtime_for(exe)
        if rt is not None:
            return rt
    raise UnsupportedEnvironmentError(
        f"no Python with pytest for the sandbox's `python` profile (tried {', '.join(candidates)}): "
        "install pytest into one of them (`pip install pytest`: the plain `pip install -e .` has none, "
        "`pip install -e '.[dev]'` has it; or `apt-get install python3-pytest`) "
        "or point JAXRL_SANDBOX_PYTHON / sandbox.python at a Python that has it")


@functools.lru_cache(maxsize=None)
def _importable(exe: str, modules: tuple[str, ...]) -> dict:
    code = ("import importlib.util, json, sys\n"
            "print(json.dumps({m: importlib.util.find_spec(m) is not None for m in sys.argv[1:]}))")
    out = subprocess.run([exe, "-I", "-c", code, *modules], capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout) if out.returncode == 0 else {m: False for m in modules}
