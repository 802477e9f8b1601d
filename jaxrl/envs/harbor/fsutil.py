"""Host-side file operations on what a sandbox wrote, none of which follows a symlink the sandbox
may have planted: `read_file_nofollow` (regular files only, size-capped), `disk_usage` (blocks and
entries under the trial's writable directories) and `remove_tree` (also trees the sandbox made
inaccessible with chmod 000).
"""
from __future__ import annotations

import errno
import os
import shutil
import stat
from typing import Optional, Sequence


def read_file_nofollow(dirpath: str | os.PathLike, name: str, max_bytes: int,
                       tail: bool = False) -> tuple[Optional[bytes], str]:
    """Reads `dirpath/name` without following symlinks (neither `dirpath` nor `name`), only if it is a
    regular file; returns (data or None, reason). At most `max_bytes` are read: the first ones, or
    the last ones with `tail`."""
    try:
        dfd = os.open(dirpath, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        return None, f"{dirpath}: {e.strerror}"
    try:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=dfd)
        except FileNotFoundError:
            return None, "missing"
        except OSError as e:
            if e.errno == errno.ELOOP:
                return None, "is a symlink"
            return None, e.strerror
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None, "not a regular file"
            if tail and st.st_size > max_bytes:
                os.lseek(fd, st.st_size - max_bytes, os.SEEK_SET)
            chunks, n = [], 0
            while n < max_bytes:
                b = os.read(fd, min(1 << 16, max_bytes - n))
                if not b:
                    break
                chunks.append(b)
                n += len(b)
            return b"".join(chunks), ""
        finally:
            os.close(fd)
    finally:
        os.close(dfd)


def disk_usage(paths: Sequence[str | os.PathLike], stop_at_files: int = 10 ** 9) -> tuple[int, int]:
    """(bytes allocated, number of entries) under `paths`, symlinks not followed (st_blocks * 512)."""
    total, count = 0, 0
    stack = [os.fspath(p) for p in paths]
    while stack:
        d = stack.pop()
        try:
            it = os.scandir(d)
        except OSError:
            continue
        with it:
            for e in it:
                count += 1
                if count > stop_at_files:
                    return total, count
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode):
                    stack.append(e.path)
    return total, count


def remove_tree(path: str | os.PathLike) -> None:
    """Removes a directory the sandbox wrote into: symlinks are not followed (shutil.rmtree's fd-based
    walk); directories the sandbox made inaccessible (chmod 000) are made accessible (by their owner,
    never through a link) and the removal retried, one more level per pass.

    Raises:
      OSError: the tree could not be removed after those retries.
    """
    path = os.fspath(path)

    def onerror(func, p, exc_info):
        for q in (os.path.dirname(p), p):
            try:
                st = os.lstat(q)
                if stat.S_ISDIR(st.st_mode):
                    os.chmod(q, 0o700)
            except OSError:
                pass

    for _ in range(64):
        if not os.path.lexists(path):
            return
        shutil.rmtree(path, onerror=onerror)
    shutil.rmtree(path)  # raises with the reason
