"""The rollout engine's CPU matmul kernel: few rows times weights stored in column panels.

A decode step multiplies a few rows (the batch) by every weight of the model once, so on a CPU
it is bound by reading the weights. XLA:CPU's kernels at these shapes read them at about half the
memory bandwidth (docs/rollout_engine.md); `panel_matmul.cc` (next to this file) reads each
weight once, front to back, for all rows, with the reads prefetched so that they overlap the
FMAs, on XLA's intra-op threads. It is an XLA FFI custom call, built on first use with the
machine's C++ compiler (``c++``, e.g. g++, or ``$CXX``, which may carry arguments such as
``ccache g++``) for the machine's own vector instructions, and cached under
``$JAXRL_CACHE_DIR/kernels`` (default ``~/.cache/jaxrl/kernels``) by a hash of the source, the
jaxlib version, the compiler flags and the CPU. Used for matmuls of up to `KERNEL_MAX_ROWS` rows;
more rows (a long prefill) are one XLA dot on the same panels, which is faster there.

Weight layout (:func:`to_panels`): ``w [in, out]`` is stored as panels ``[out / 16, in, 16]``:
panel p holds output columns 16p .. 16p + 15, so each panel is one contiguous stream.

``JAXRL_CPU_KERNEL`` chooses: unset, empty or ``auto`` (default) uses the kernel and, where it
cannot be built or loaded (no C++ compiler, a failed compile, an unwritable cache), warns once
and runs XLA's kernels (the "out_in" layout, or "in_out" for a 1-row engine: about 0.6x the
decode speed at 8 rows); ``1`` requires the kernel (a failure is an error); ``0`` never uses it.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import subprocess
import tempfile
import threading
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp

PANEL = 16  # output columns per panel
# Rows up to which a matmul runs in the kernel; above, an XLA dot on the panels was faster
# (a [256, 256] x [256, 1536] prefill matmul: 7.2 ms in the kernel, 6.6 ms as the dot; at 64
# rows 1.3 ms against 3.2 ms; 2-core x86 CPU).
KERNEL_MAX_ROWS = 64
TARGET = "jaxrl_panel_matmul"
SOURCE = Path(__file__).with_name("panel_matmul.cc")

_lock = threading.Lock()
_state: dict = {}


class KernelBuildError(ValueError):
    """The CPU kernel could not be built or loaded on this machine (the message says why and what
    to do); a ValueError, as a setting (``JAXRL_CPU_KERNEL=1``, ``CXX``, ``JAXRL_CACHE_DIR``)
    asks for what the machine cannot do."""


def _cpu_id() -> str:
    """What the compiled code depends on: the architecture and the CPU's feature flags."""
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = line
                break
    except OSError:
        pass
    return f"{platform.machine()}|{flags}"


def _flags() -> list[str]:
    arch = ["-mcpu=native"] if platform.machine() in ("aarch64", "arm64") else ["-march=native"]
    return ["-O3", *arch, "-std=c++17", "-shared", "-fPIC", "-w"]


def _compiler() -> list[str]:
    """``$CXX`` split into words (default ``c++``).

    Raises:
      KernelBuildError: a CXX that does not split (an unclosed quote).
    """
    try:
        return shlex.split(os.environ.get("CXX", "")) or ["c++"]
    except ValueError as e:
        raise KernelBuildError(f"CPU kernel: CXX={os.environ['CXX']!r} is not a command line ({e}); fix CXX, or set "
                               f"JAXRL_CPU_KERNEL=0 to run the engine with XLA's kernels") from None


def _compile_command(src: Path, out: Path) -> list[str]:
    return [*_compiler(), *_flags(), f"-I{jax.ffi.include_dir()}", str(src), "-o", str(out)]


def cache_dir() -> Path:
    """Where built kernels are kept: ``$JAXRL_CACHE_DIR/kernels`` (default ``~/.cache/jaxrl``)."""
    root = os.environ.get("JAXRL_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "jaxrl")
    return Path(root) / "kernels"


def build() -> Path:
    """Builds the kernel library if this machine has no built copy yet; returns its path.

    The build writes a temporary file and renames it into place, so processes building at once
    (test workers, several engines) each end with a complete library. A library's name ends with
    the hash of its own bytes: a cached file damaged on disk (loading it could crash the process)
    no longer matches and is built again. Temporary files of builds killed an hour or more ago
    are removed.

    Raises:
      KernelBuildError: no C++ compiler or one that cannot be run, a failed compile (with the
        compiler's message) or one that wrote no library, or an unwritable cache directory; the
        message names ``JAXRL_CPU_KERNEL=0`` as the way to run without the kernel.
    """
    key = _key()
    out_dir = cache_dir()
    hint = "set JAXRL_CPU_KERNEL=0 to run the engine with XLA's kernels instead"
    _compiler()  # a CXX that does not split is refused before anything is written
    try:
        for old in sorted(out_dir.glob(f"panel_matmul-{key}-*.so")):
            if old.stem.rsplit("-", 1)[1] == _digest(old):
                return old
            old.unlink(missing_ok=True)
    except OSError as e:
        raise KernelBuildError(f"CPU kernel: cannot read or clean the cache {out_dir} ({e}); set JAXRL_CACHE_DIR to a "
                               f"directory of your own, or {hint}") from None
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for stale in out_dir.glob("panel_matmul-*.tmp"):
            if stale.stat().st_mtime < time.time() - 3600:
                stale.unlink(missing_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f"panel_matmul-{key}.", suffix=".tmp", dir=out_dir)
        os.close(fd)
    except OSError as e:
        raise KernelBuildError(f"CPU kernel: cannot write to {out_dir} ({e}); set JAXRL_CACHE_DIR to a writable "
                               f"directory, or {hint}") from None
    cmd = _compile_command(SOURCE, Path(tmp))
    try:
        try:
            res = subprocess.run(cmd, capture_output=True, text=True)
        except FileNotFoundError:
            raise KernelBuildError(f"CPU kernel: no C++ compiler {cmd[0]!r}; install g++ (e.g. 'apt-get install g++') "
                                   f"or set CXX, or {hint}") from None
        except OSError as e:
            raise KernelBuildError(f"CPU kernel: cannot run the C++ compiler {cmd[0]!r} ({e.strerror}); set CXX to "
                                   f"a C++ compiler, or {hint}") from None
        if res.returncode != 0:
            raise KernelBuildError(f"CPU kernel: '{shlex.join(cmd)}' failed:\n{res.stderr.strip()[-2000:]}\n{hint}")
        if os.path.getsize(tmp) == 0:
            raise KernelBuildError(f"CPU kernel: '{shlex.join(cmd)}' succeeded but wrote no library; check CXX, or {hint}")
        os.chmod(tmp, 0o755)  # mkstemp's 0600: readable by the users of a shared cache
        out = out_dir / f"panel_matmul-{key}-{_digest(Path(tmp))}.so"
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _key() -> str:
    """The cache key: the source, jaxlib's version, the flags and the CPU (neither the compiler's
    name nor the venv's include path changes what is built)."""
    import jaxlib

    return hashlib.sha256(b"\0".join([SOURCE.read_bytes(), jaxlib.__version__.encode(), " ".join(_flags()).encode(),
                                      _cpu_id().encode()])).hexdigest()[:16]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def ensure_registered() -> None:
    """Builds (once per machine) and registers the custom call (once per process). A library that
    does not load (one built against other system libraries, say) is removed from the cache, so
    that the next process builds it again.

    Raises:
      KernelBuildError: see :func:`build`; or the library does not load.
    """
    with _lock:
        if _state.get("registered"):
            return
        path = build()
        try:
            lib = ctypes.cdll.LoadLibrary(str(path))
            handler = lib.JaxrlPanelMatmul
        except (OSError, AttributeError) as e:
            path.unlink(missing_ok=True)
            raise KernelBuildError(f"CPU kernel: the library built from {SOURCE.name} does not load ({e}); "
                                   f"check CXX, or set JAXRL_CPU_KERNEL=0 to run the engine with XLA's kernels") from None
        jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(handler), platform="cpu")
        _state["path"] = path
        _state["lib"] = lib  # keep the library loaded
        _state["registered"] = True


def to_panels(w):
    """Weights ``w [in, out]`` (float32) as panels ``[ceil(out / 16), in, 16]`` (zeros pad a last,
    partial panel): element ``[p, k, c]`` is ``w[k, 16 p + c]``."""
    K, N = w.shape
    P = -(-N // PANEL)
    w = jnp.pad(w, ((0, 0), (0, P * PANEL - N)))
    return w.reshape(K, P, PANEL).transpose(1, 0, 2)


def panel_matmul(x, w_panels, n: int):
    """``x [M, K] @ w [K, n]`` for float32 ``x`` and the panels of `w` (:func:`to_panels`), as
    ``[M, n]`` float32; each output is a float32 sum over k in order. CPU only, no ``vmap`` or
    gradient (the engine needs neither); builds and registers the kernel on first use
    (:func:`ensure_registered`).

    Raises:
      ValueError: shapes or dtypes that do not match.
      KernelBuildError: see :func:`build`.
    """
    P, K, c = w_panels.shape
    if x.ndim != 2 or x.shape[1] != K or c != PANEL or not (PANEL * (P - 1) < n <= PANEL * P):
        raise ValueError(f"panel_matmul: x {x.shape} and panels {w_panels.shape} do not multiply to {n} columns")
    if x.dtype != jnp.float32 or w_panels.dtype != jnp.float32:
        raise ValueError(f"panel_matmul: float32 only, got x {x.dtype} and panels {w_panels.dtype}")
    ensure_registered()
    return jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((x.shape[0], n), jnp.float32))(x, w_panels)


def mode() -> str:
    """``JAXRL_CPU_KERNEL``: "auto" (unset or empty), "1" or "0" (module docstring).

    Raises:
      ValueError: any other value.
    """
    v = os.environ.get("JAXRL_CPU_KERNEL") or "auto"
    if v not in ("auto", "0", "1"):
        raise ValueError(f"JAXRL_CPU_KERNEL={v!r}: set it to auto (the default: use the CPU kernel where it builds), "
                         f"1 (require it) or 0 (XLA's kernels)")
    return v


def available() -> bool:
    """Whether engines use the kernel in this process (:func:`mode`): built and registered. Under
    "auto" a failed build warns (with the reason and the fix) and returns False, and is not tried
    again in this process (so that its engines share one layout; a new process tries again).

    Raises:
      KernelBuildError: the build failed under ``JAXRL_CPU_KERNEL=1`` (see :func:`build`).
      ValueError: a bad ``JAXRL_CPU_KERNEL`` (:func:`mode`).
    """
    m = mode()
    if m == "0":
        return False
    if m == "auto" and "failure" in _state:  # one attempt per process: every engine gets the same layout
        return False
    try:
        ensure_registered()
    except KernelBuildError as e:
        if m == "1":
            raise
        _state["failure"] = e
        warnings.warn(f"{e}. The rollout engine now runs with XLA's kernels.", RuntimeWarning, stacklevel=4)
        return False
    return True


if __name__ == "__main__":  # python -m jaxrl.models.cpu_kernel: build (if needed), load, say where
    import sys

    try:
        ensure_registered()
    except KernelBuildError as e:
        sys.exit(f"error: {e}")
    print(_state["path"])
