"""Build the environment SkyRL's code runs in, cached under ~/.cache/jaxrl/.

    python -m tests.skyrl_diff.install_env      # prints the environment's python; builds it if missing

A separate venv (never the project's): CPU torch 2.13.0 (the wheel on the machine), PyPI `skyrl` 0.3.0
installed with --no-deps (its declared dependencies are the whole training stack: ray, vLLM, flash-attn,
...), and only the small packages that the two compared modules
(`skyrl/backends/skyrl_train/utils/ppo_utils.py`, `off_policy_correction_utils.py`, and the
`torch_utils.py` they import) import: numpy, loguru, jaxtyping, omegaconf. What is stubbed instead,
and why, is in skyrl_side.py.

The folder is named by a hash of the pinned list and the Python version, so a change of pins builds a
new one. It counts as built only once `ready` is written in it (last, atomically); a folder without it
(a killed build) is removed and built again. Concurrent callers serialise on a lock file.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

SKYRL = "skyrl==0.3.0"
PINNED = ("torch==2.13.0", "numpy==2.4.6", "loguru==0.7.3", "jaxtyping==0.3.11", "omegaconf==2.4.0")
CACHE = Path(os.environ.get("JAXRL_CACHE_DIR", Path.home() / ".cache" / "jaxrl"))


class EnvError(RuntimeError):
    """The SkyRL environment could not be built; the message is one line naming the cause and the fix."""


def env_dir() -> Path:
    key = "\n".join((SKYRL, *PINNED, f"python {sys.version_info.major}.{sys.version_info.minor}"))
    return CACHE / f"skyrl-env-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def env_python(path: Path | None = None) -> Path:
    return (path or env_dir()) / "bin" / "python"


def _run(cmd, what):
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()
                and not line.startswith("WARNING: Location")]
        raise EnvError(f"SkyRL differential environment: {what} failed ({tail[-1] if tail else 'no output'}); "
                       f"fix the cause (network to PyPI, disk space) and rerun `python -m tests.skyrl_diff.install_env`")


def ensure_env(verbose: bool = False) -> Path:
    """The python of the SkyRL environment, built first if missing. Raises EnvError (one line)."""
    path = env_dir()
    if (path / "ready").exists():
        return env_python(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(path) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (path / "ready").exists():  # built by another process while we waited
            return env_python(path)
        if path.exists():
            shutil.rmtree(path)  # an unfinished build
        if verbose:
            print(f"building {path} ({SKYRL} --no-deps, {', '.join(PINNED)})", file=sys.stderr)
        base = getattr(sys, "_base_executable", sys.executable)
        _run([base, "-m", "venv", str(path)], "creating the venv")
        py = str(env_python(path))
        pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        _run(pip + list(PINNED), "pip install " + " ".join(PINNED))
        _run(pip + ["--no-deps", SKYRL], f"pip install --no-deps {SKYRL}")
        # The check loads SkyRL's modules exactly as the tests do.
        _run([py, str(Path(__file__).with_name("skyrl_side.py")), "--check"], "loading SkyRL's modules")
        tmp = path / "ready.tmp"
        tmp.write_text("\n".join((SKYRL, *PINNED)) + "\n")
        os.replace(tmp, path / "ready")
    return env_python(path)


def main() -> int:
    try:
        print(ensure_env(verbose=True))
    except EnvError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
