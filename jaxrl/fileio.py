"""Atomic file writes: a reader (or a resumed run) sees the old file or the new one, never a part.

Files come out with the mode a plain `open(path, "w")` would give them (0666 minus the process
umask), so teammates on a shared cluster filesystem can read a run directory as usual. (Python's
`tempfile.mkstemp` creates 0600 files, which a rename would carry over to every run file.)
"""
from __future__ import annotations

import json
import os
import secrets
from typing import Any


def _open_new(directory: str, base: str) -> tuple[int, str]:
    """Creates a fresh hidden temp file next to the target; mode 0666 & ~umask (the kernel applies it)."""
    for _ in range(100):
        tmp = os.path.join(directory, f".tmp_{base}.{os.getpid()}.{secrets.token_hex(4)}")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a temporary file in {directory}")


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Writes `data` to a temp file in the same directory, fsyncs it, then renames it over `path`.

    The file gets the umask's mode (like `open(path, "w")`), not 0600.
    """
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = _open_new(d, os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def atomic_write_text(path: str, text: str) -> None:
    """`atomic_write_bytes` of UTF-8 text."""
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str, obj: Any) -> None:
    """`atomic_write_text` of `obj` as indented JSON with sorted keys."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True))


def umask_mode(mode: int = 0o666) -> int:
    """`mode` with the process umask removed: the mode a newly created file gets."""
    try:  # Linux: read it without changing it (os.umask is process-wide, racy with other threads)
        with open("/proc/self/status") as f:
            mask = next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        mask = os.umask(0)
        os.umask(mask)
    return mode & ~mask
