"""Harbor's own files for the differential tests: the harbor 0.26.0 wheel from PyPI, downloaded once
into ~/.cache/jaxrl/harbor/ (CI caches ~/.cache/jaxrl/; `.ci/run` fetches it first), and Harbor's
terminus-2 JSON parser module loaded from it (it imports only the standard library, so it runs on
Python 3.11 although the harbor package needs 3.12)."""
from __future__ import annotations

import functools
import os
import subprocess
import sys
import types
import zipfile

from jaxrl.envs.harbor.terminus2 import HARBOR_VERSION

CACHE = os.path.join(os.path.expanduser("~"), ".cache", "jaxrl", "harbor")
WHEEL = os.path.join(CACHE, f"harbor-{HARBOR_VERSION}-py3-none-any.whl")


@functools.lru_cache(maxsize=1)
def harbor_wheel() -> str:
    """The wheel's path, downloading it with pip when it is not cached (a failure fails the test)."""
    if not os.path.isfile(WHEEL):
        os.makedirs(CACHE, exist_ok=True)
        r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--python-version", "3.12",
                            "--only-binary=:all:", f"harbor=={HARBOR_VERSION}", "-d", CACHE],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0 and os.path.isfile(WHEEL), f"pip download of harbor failed: {r.stderr[-2000:]}"
    return WHEEL


def harbor_module(path: str) -> types.ModuleType:
    """A module of the wheel (e.g. `harbor/agents/terminus_2/terminus_json_plain_parser.py`), executed
    from the wheel's source on its own (not imported as part of the harbor package)."""
    with zipfile.ZipFile(harbor_wheel()) as z:
        src = z.read(path).decode("utf-8")
    mod = types.ModuleType("harbor_" + os.path.basename(path)[:-3])
    mod.__file__ = f"{harbor_wheel()}/{path}"
    sys.modules[mod.__name__] = mod  # dataclasses look their module up
    exec(compile(src, mod.__file__, "exec"), mod.__dict__)
    return mod


@functools.lru_cache(maxsize=1)
def harbor_parser():
    """Harbor 0.26's `TerminusJSONPlainParser()`."""
    return harbor_module("harbor/agents/terminus_2/terminus_json_plain_parser.py").TerminusJSONPlainParser()
