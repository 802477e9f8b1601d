"""Task archives: the DCAgent Parquet form (`path`, `task_binary` = tar.gz of one task) and safe unpacking.

`safe_extract_tar` never writes outside its destination: it refuses absolute member names, `..`
components, members whose parent directory is a symlink, symlinks that point outside the task,
hard links to anything but an already-unpacked regular file inside the task (they are copied),
device / FIFO members, and it caps the number of members and the unpacked bytes (counted while
decompressing, so a compression bomb stops at the cap). File modes are reduced to 0644 / 0755
(directories 0755), minus the process umask, like every file jaxrl writes (`jaxrl.fileio`).
"""
from __future__ import annotations

import gzip
import hashlib
import io
import os
import posixpath
import re
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path
from typing import Iterable, Optional

from jaxrl.envs.harbor.errors import HarborTaskError
from jaxrl.fileio import umask_mode

MAX_ARCHIVE_BYTES = 256 << 20  # unpacked bytes per task
MAX_ARCHIVE_MEMBERS = 20000
_MARK = ".jaxrl-extracted"


def _norm_member(name: str, where: str) -> str:
    if "\0" in name:
        raise HarborTaskError(f"{where}: member name {name!r} contains a NUL byte")
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        raise HarborTaskError(f"{where}: member {name!r} has an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise HarborTaskError(f"{where}: member {name!r} contains '..'")
    return "/".join(parts)


def safe_extract_tar(data: bytes, dest: str | os.PathLike, *, where: str = "archive",
                     max_bytes: int = MAX_ARCHIVE_BYTES, max_members: int = MAX_ARCHIVE_MEMBERS) -> None:
    """Unpacks a (compressed) tar archive into the existing empty directory `dest` (rules above).

    Args:
      data: the archive bytes (tar, tar.gz, tar.bz2 or tar.xz).
      dest: the destination directory.
      where: label for error messages.
      max_bytes: cap on the total unpacked file bytes.
      max_members: cap on the number of members.

    Raises:
      HarborTaskError: an unsafe or oversized member, or an unreadable archive (the member is named).
    """
    dest = Path(dest)
    root = os.path.realpath(dest)
    total = 0
    regular: set[str] = set()
    try:
        tf = tarfile.open(fileobj=io.BytesIO(data), mode="r:*")
    except (tarfile.TarError, EOFError, OSError) as e:
        raise HarborTaskError(f"{where}: not a readable tar archive ({e})") from None
    with tf:
        n = 0
        try:
            for m in tf:
                n += 1
                if n > max_members:
                    raise HarborTaskError(f"{where}: more than {max_members} members")
                name = _norm_member(m.name, where)
                if not name:
                    if m.isdir():
                        continue
                    raise HarborTaskError(f"{where}: member {m.name!r} has an empty name")
                target = os.path.join(root, name)
                parent = os.path.dirname(target)
                if m.isdir():
                    _mkdirs(root, name, where)
                    continue
                _mkdirs(root, posixpath.dirname(name), where)
                if os.path.realpath(parent) != os.path.normpath(parent):
                    raise HarborTaskError(f"{where}: member {m.name!r} would be written through a symlink")
                if m.isreg():
                    if m.size > max_bytes - total:
                        raise HarborTaskError(f"{where}: unpacked size exceeds the cap of {max_bytes} bytes "
                                              f"(at member {m.name!r})")
                    src = tf.extractfile(m)
                    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                                 0o755 if m.mode & 0o111 else 0o644)
                    with os.fdopen(fd, "wb") as f:
                        while True:
                            chunk = src.read(1 << 20)
                            if not chunk:
                                break
                            total += len(chunk)
                            if total > max_bytes:
                                raise HarborTaskError(f"{where}: unpacked size exceeds the cap of {max_bytes} bytes "
                                                      f"(at member {m.name!r})")
                            f.write(chunk)
                    regular.add(name)
                elif m.issym():
                    link = m.linkname
                    if link.startswith("/"):
                        raise HarborTaskError(f"{where}: symlink {m.name!r} -> {link!r} is absolute")
                    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), link))
                    if resolved == ".." or resolved.startswith("../"):
                        raise HarborTaskError(f"{where}: symlink {m.name!r} -> {link!r} points outside the task")
                    os.symlink(link, target)
                elif m.islnk():
                    src_name = _norm_member(m.linkname, where)
                    if src_name not in regular:
                        raise HarborTaskError(f"{where}: hard link {m.name!r} -> {m.linkname!r} does not point to "
                                              "a regular file unpacked earlier")
                    total += os.path.getsize(os.path.join(root, src_name))
                    if total > max_bytes:
                        raise HarborTaskError(f"{where}: unpacked size exceeds the cap of {max_bytes} bytes")
                    shutil.copyfile(os.path.join(root, src_name), target, follow_symlinks=False)
                    os.chmod(target, umask_mode(0o755 if m.mode & 0o111 else 0o644))
                    regular.add(name)
                else:
                    raise HarborTaskError(f"{where}: member {m.name!r} is a device, FIFO or other special file")
        except FileExistsError as e:
            raise HarborTaskError(f"{where}: member {os.path.relpath(e.filename, root)!r} appears twice") from None
        except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
            raise HarborTaskError(f"{where}: corrupt archive ({e})") from None


def _mkdirs(root: str, rel: str, where: str) -> None:
    cur = root
    for part in [p for p in rel.split("/") if p]:
        cur = os.path.join(cur, part)
        if os.path.islink(cur):
            raise HarborTaskError(f"{where}: directory {os.path.relpath(cur, root)!r} is a symlink in the archive")
        if not os.path.isdir(cur):
            if os.path.exists(cur):
                raise HarborTaskError(f"{where}: {os.path.relpath(cur, root)!r} is both a file and a directory")
            os.mkdir(cur, 0o755)


def pack_task(task_dir: str | os.PathLike) -> bytes:
    """A deterministic tar.gz of one task directory (members relative to it, sorted, mtime 0, owner 0).

    Symlinks are stored as symlinks; other special files raise `HarborTaskError`.
    """
    task_dir = Path(task_dir)
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w",
                                                                            format=tarfile.PAX_FORMAT) as tf:
        for dirpath, dirnames, filenames in os.walk(task_dir):
            dirnames.sort()
            for n in sorted(dirnames) + sorted(filenames):
                full = os.path.join(dirpath, n)
                rel = os.path.relpath(full, task_dir)
                ti = tf.gettarinfo(full, arcname=rel)
                if not (ti.isreg() or ti.isdir() or ti.issym()):
                    raise HarborTaskError(f"{full}: special files cannot be packed")
                ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = 0, 0, 0, "", ""
                ti.mode = 0o755 if (ti.isdir() or ti.mode & 0o111) else 0o644
                if ti.isreg():
                    with open(full, "rb") as f:
                        tf.addfile(ti, f)
                else:
                    tf.addfile(ti)
    return buf.getvalue()


def write_parquet(task_dirs: Iterable[str | os.PathLike], out_path: str | os.PathLike,
                  names: Optional[Iterable[str]] = None) -> None:
    """Writes tasks in the DCAgent Parquet form (one row per task: `path` = the task's name, or
    `names[i]`; `task_binary` = `pack_task(dir)`), atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jaxrl.fileio import atomic_write_bytes

    dirs = [Path(d) for d in task_dirs]
    paths = list(names) if names is not None else [d.name for d in dirs]
    if len(paths) != len(dirs):
        raise ValueError(f"write_parquet: {len(dirs)} task dirs but {len(paths)} names")
    table = pa.table({"path": pa.array(paths, pa.string()),
                      "task_binary": pa.array([pack_task(d) for d in dirs], pa.binary())})
    sink = io.BytesIO()
    pq.write_table(table, sink)
    atomic_write_bytes(str(out_path), sink.getvalue())


def _safe_dirname(path_value: str, index: int) -> str:
    base = posixpath.basename(path_value.rstrip("/")) or f"task-{index}"
    base = re.sub(r"[^A-Za-z0-9._-]", "_", base).lstrip(".") or f"task-{index}"
    return base[:120]


def extract_parquet(path: str | os.PathLike, extract_dir: str | os.PathLike | None = None) -> list[tuple[Path, str]]:
    """Unpacks every row of a DCAgent Parquet task set; returns `(task directory, source label)` pairs.

    Each row goes to `extract_dir/<basename of path>/` (a name used twice gets `-<row>` appended).
    A row already unpacked from the same bytes (sha256 recorded in a marker file) is not unpacked
    again; otherwise the directory is replaced atomically.

    Raises:
      HarborTaskError: missing columns, a null or non-bytes `task_binary`, an unsafe archive, or an
        archive without `instruction.md` at its root or in its single top directory.
    """
    import pyarrow.parquet as pq

    path = Path(path)
    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for a bad file
        raise HarborTaskError(f"{path}: not a readable Parquet file ({e})") from None
    cols = set(table.column_names)
    if not {"path", "task_binary"} <= cols:
        raise HarborTaskError(f"{path}: a DCAgent task set needs the columns 'path' and 'task_binary' "
                              f"(has {sorted(cols)})")
    out_root = Path(extract_dir) if extract_dir is not None else path.with_name(path.name + ".tasks")
    out_root.mkdir(parents=True, exist_ok=True)
    result, used = [], set()
    paths = table.column("path").to_pylist()
    blobs = table.column("task_binary").to_pylist()
    for i, (p, blob) in enumerate(zip(paths, blobs)):
        where = f"{path}:row {i}"
        if not isinstance(p, str) or not p:
            raise HarborTaskError(f"{where}: `path` must be a non-empty string")
        if not isinstance(blob, (bytes, bytearray)) or not blob:
            raise HarborTaskError(f"{where} ({p}): `task_binary` must be the bytes of a tar.gz archive")
        name = _safe_dirname(p, i)
        if name in used:
            name = f"{name}-{i}"
        used.add(name)
        dest = out_root / name
        digest = hashlib.sha256(blob).hexdigest()
        mark = dest / _MARK
        if not (mark.is_file() and mark.read_text().strip() == digest):
            tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=out_root))
            try:
                os.chmod(tmp, umask_mode(0o755))  # mkdtemp makes it 0700; the rename would keep that
                safe_extract_tar(bytes(blob), tmp, where=f"{where} ({p})")
                (tmp / _MARK).write_text(digest)
                if dest.exists():
                    shutil.rmtree(dest)
                os.replace(tmp, dest)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        root = dest
        if not (dest / "instruction.md").exists():
            subs = [d for d in dest.iterdir() if d.is_dir() and not d.is_symlink()]
            if len(subs) == 1 and (subs[0] / "instruction.md").exists():
                root = subs[0]
            else:
                raise HarborTaskError(f"{where} ({p}): the archive has no instruction.md at its root or in a "
                                      "single top-level directory")
        result.append((root, f"{where} ({p})"))
    return result
