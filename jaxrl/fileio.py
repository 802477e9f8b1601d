"""Atomic file writes: a reader (or a resumed run) sees the old file or the new one, never a part.
Also the checks of the paths a command is given to write (`output_dir_problem`,
`output_file_problem`) and to read a model from (`hf_checkpoint_problem`), each a one-line reason.

Files come out with the mode a plain `open(path, "w")` would give them (0666 minus the process
umask), so teammates on a shared cluster filesystem can read a run directory as usual. (Python's
`tempfile.mkstemp` creates 0600 files, which a rename would carry over to every run file.)
"""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import secrets
import tempfile
from typing import Any, Optional

HF_CHECKPOINT_HINT = "an HF-format checkpoint directory (config.json + *.safetensors, as save_pretrained writes)"


def _open_new(directory: str, base: str) -> tuple[int, str]:
    """Creates a fresh hidden temp file next to the target; mode 0666 & ~umask (the kernel applies it)."""
    for _ in range(100):
        tmp = os.path.join(directory, f".tmp_{base}.{os.getpid()}.{secrets.token_hex(4)}")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a temporary file in {directory}")


DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_DISK_FULL_TEXT = ("No space left on device", "Disk quota exceeded", "ENOSPC", "RESOURCE_EXHAUSTED: Failed to write",
                   "File too large")
_PATH_IN_TEXT = re.compile(r"(/[^\s'\"(),:]+)")


def _chain(e: BaseException):
    """`e`, its causes and contexts, and the members of exception groups, each once."""
    seen, todo = set(), [e]
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        yield x
        todo.extend([x.__cause__, x.__context__, *getattr(x, "exceptions", ())])


def disk_full_path(e: BaseException, default: str) -> Optional[str]:
    """The path a write failed on when `e` (or anything in its cause chain) says the disk is full
    (ENOSPC, EDQUOT, or a library's text of them, e.g. Orbax/TensorStore's); None otherwise.

    The path is the OSError's filename, else the first absolute path in the message under
    `default`'s folder, else `default` (the folder being written, e.g. the run directory)."""
    hit = None
    for x in _chain(e):
        if isinstance(x, OSError) and x.errno in DISK_FULL_ERRNOS:
            if x.filename:
                return os.fspath(x.filename)
            hit = hit or x
        elif any(t in str(x) for t in _DISK_FULL_TEXT):
            hit = hit or x
    if hit is None:
        return None
    root = os.path.abspath(default)
    for x in _chain(e):
        paths = [p for p in _PATH_IN_TEXT.findall(str(x)) if p.startswith(root)]
        if paths:
            return max(paths, key=len)  # the most specific: the file, not its database folder
    return default


DISK_MARGIN_BYTES = 1 << 20  # metadata, manifests, JSON next to the tensors


def require_free_space(path: str, nbytes: int, what: str) -> None:
    """Raises OSError(ENOSPC, ..., path) before a write of about `nbytes` bytes under `path` when
    its filesystem has less free space than that (plus `DISK_MARGIN_BYTES`), so a write that
    cannot fit fails cleanly before it starts (no partial folder, no library's failure noise).

    Args: path: the file or folder to be written (need not exist yet); nbytes: its size in
      bytes; what: what it is, for the message ("checkpoint of step 3").
    """
    where = _nearest_existing(os.path.dirname(os.path.abspath(path)) if not os.path.isdir(path) else path)
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        return  # no statistics (an exotic filesystem): the write itself will tell
    need = int(nbytes) + DISK_MARGIN_BYTES
    if free < need:
        raise OSError(errno.ENOSPC, f"No space left on device: the {what} needs {need / 2**20:.1f} MiB, "
                      f"{free / 2**20:.1f} MiB are free", os.path.abspath(path))


def tree_nbytes(tree) -> int:
    """Total bytes of the arrays (or ShapeDtypeStructs) of a pytree, in their dtypes."""
    import jax
    import numpy as np

    return int(sum(int(np.prod(x.shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize
                   for x in jax.tree.leaves(tree) if hasattr(x, "shape") and hasattr(x, "dtype")))


def disk_full_message(path: str, folder: str, resume_hint: str, e: Optional[BaseException] = None) -> str:
    """The one line for a full disk: the path that could not be written (with what it needed, when
    `require_free_space` raised `e`), the space left on its filesystem and the fix (`resume_hint`
    says what rerunning does)."""
    need = next((x.strerror.split(": ", 1)[1] for x in (_chain(e) if e is not None else ())
                 if isinstance(x, OSError) and x.errno == errno.ENOSPC and (x.strerror or "").startswith(
                     "No space left on device: ")), "")
    where = _nearest_existing(folder)
    try:
        usage = shutil.disk_usage(where)
        free = (f"{need}; {usage.total / 2**20:.1f} MiB in all" if need else
                f"{usage.free / 2**20:.1f} MiB free of {usage.total / 2**20:.1f} MiB") + f" on the filesystem of {where}"
    except OSError:
        free = need or f"the filesystem of {where}"
    return (f"no space left on device: could not write {path} ({free}). Fix: free space "
            f"there (df -h {where}) or use a larger disk for it, then {resume_hint}")


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


def _nearest_existing(path: str) -> str:
    """`path` or its nearest ancestor that exists (`os.path.exists`: false under a regular file)."""
    p = os.path.abspath(path)
    while not os.path.exists(p) and os.path.dirname(p) != p:
        p = os.path.dirname(p)
    return p


def output_dir_problem(path: str) -> Optional[str]:
    """Why `path` cannot be a directory a command creates (when missing) and writes into, or None.

    Catches, before any work: `path` is a regular file; a component above it is a regular file
    (`/data/file.txt/run`); `path`, or the nearest existing directory above it, is not writable.
    """
    return _creatable(path, os.path.abspath(path))


def _write_probe(directory: str) -> Optional[str]:
    """Why no file can be created in the existing `directory`, or None: the permission bits, then a real
    probe (a temporary file created and removed), which also catches what `os.access` passes for root:
    a read-only filesystem, /proc or /sys."""
    if not os.access(directory, os.W_OK | os.X_OK):
        return "is a directory this user cannot write to"
    try:
        fd, probe = tempfile.mkstemp(prefix=".jaxrl-write-probe-", dir=directory)
    except OSError as e:
        return f"is a directory where no file can be created ({e.strerror or e})"
    os.close(fd)
    try:
        os.unlink(probe)
    except OSError:
        pass
    return None


def _creatable(path: str, directory: str) -> Optional[str]:
    """Why `directory` (the folder `path` is or goes into) cannot be created or written, or None."""
    if os.path.exists(directory):
        if not os.path.isdir(directory):
            return (f"{path} exists and is a file, not a directory" if directory == os.path.abspath(path)
                    else f"{path} cannot be created: {directory} is a file, not a directory")
        why = _write_probe(directory)
        return f"{path} cannot be written: {directory} {why}" if why else None
    above = _nearest_existing(directory)
    if not os.path.isdir(above):
        return f"{path} cannot be created: {above} is a file, not a directory"
    why = _write_probe(above)
    return f"{path} cannot be created: {above} {why}" if why else None


def output_file_problem(path: str) -> Optional[str]:
    """Why a file cannot be written at `path` (its folder is created when missing), or None:
    `path` is a directory, or its folder cannot be created or written (`output_dir_problem`)."""
    if os.path.isdir(path):
        return f"{path} is a directory, not a file"
    return _creatable(path, os.path.dirname(os.path.abspath(path)))


def _json_object(path: str, what: str) -> tuple[Optional[dict], Optional[str]]:
    """``(the JSON object in file path, None)``, or ``(None, why it is not one)`` (`what` names the
    file's role in the message)."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, UnicodeDecodeError) as e:
        return None, f"{path!r} cannot be read ({type(e).__name__}: {e})"
    except json.JSONDecodeError as e:
        return None, f"{path!r} is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}), so {what} is damaged"
    if not isinstance(value, dict):
        return None, f"{path!r} holds a JSON {type(value).__name__}, not an object"
    return value, None


def hf_checkpoint_problem(path: str) -> Optional[str]:
    """Why `path` is not a usable HF-format checkpoint directory (`HF_CHECKPOINT_HINT`), or None.

    In order: it does not exist; it is a file; it has no config.json; config.json is not a JSON
    object; it has no weights (model.safetensors, model.safetensors.index.json or another
    *.safetensors file); the index is not JSON with a weight_map, or names a file that is missing;
    a safetensors file's header cannot be read or does not cover the file (a truncated or partly
    copied file; checked with the safetensors library, which reads only the header).
    """
    if not os.path.exists(path):
        return f"{path!r} does not exist"
    if not os.path.isdir(path):
        return f"{path!r} is a file, not a directory"
    config = os.path.join(path, "config.json")
    if not os.path.isfile(config):
        return f"{path!r} has no config.json, so it is not an HF-format checkpoint directory"
    _, problem = _json_object(config, "the checkpoint's config")
    if problem:
        return problem
    names = os.listdir(path)
    if not any(name.endswith((".safetensors", ".safetensors.index.json")) for name in names):
        return f"{path!r} has a config.json but no *.safetensors weights"
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        value, problem = _json_object(index, "the weight index")
        if problem:
            return problem
        weight_map = value.get("weight_map")
        if not isinstance(weight_map, dict):
            return f"{index!r} has no weight_map object"
        files = sorted(set(map(str, weight_map.values())))
        missing = [fn for fn in files if not os.path.isfile(os.path.join(path, fn))]
        if missing:
            return f"{index!r} names weight files that are missing: {missing}"
    else:
        files = sorted(name for name in names if name.endswith(".safetensors"))
    from safetensors import safe_open

    for fn in files:
        try:
            with safe_open(os.path.join(path, fn), framework="numpy"):
                pass
        except Exception as e:  # noqa: BLE001 - the library's own error types (SafetensorError, OSError)
            return f"{os.path.join(path, fn)!r} is not a readable safetensors file ({' '.join(str(e).split())})"
    return None


def tokenizer_problem(path: str) -> Optional[str]:
    """Why directory `path` holds no tokenizer jaxrl can chat with, or None. In order: no tokenizer
    files transformers can build a tokenizer from (tokenizer.json, a fast tokenizer; vocab.json +
    merges.txt, Qwen's BPE files; or tokenizer.model, SentencePiece: a directory with
    tokenizer_config.json alone would load as a tokenizer that encodes text to nothing); a
    tokenizer_config.json that is not a JSON object; no chat template (a non-empty `chat_template`
    in tokenizer_config.json, or a chat_template.jinja / chat_template.json file)."""
    def has(name):
        return os.path.isfile(os.path.join(path, name))

    if not (has("tokenizer.json") or (has("vocab.json") and has("merges.txt")) or has("tokenizer.model")):
        return (f"{path!r} has no tokenizer files (tokenizer.json, or vocab.json + merges.txt); without them text "
                "would be encoded to nothing")
    config = {}
    if has("tokenizer_config.json"):
        config, problem = _json_object(os.path.join(path, "tokenizer_config.json"), "the tokenizer's config")
        if problem:
            return problem
    if not (config.get("chat_template") or has("chat_template.jinja") or has("chat_template.json")):
        return (f"{path!r} has no chat template (a chat_template in tokenizer_config.json, or chat_template.jinja), "
                "which every prompt and turn is rendered with")
    return None


_TENSORSTORE_SPEC = re.compile(r"\s*\[tensorstore_spec(\[\d+\])?='.*?'\]", re.S)
_TENSORSTORE_REPR = re.compile(r"\s*See full TensorStore details: <bound method .*", re.S)
_DRIVER_CHAIN = re.compile(r'Error opening "\w+" driver: ')


def without_tensorstore_noise(message: str) -> str:
    """`message` (of an Orbax / TensorStore read error) without the specs TensorStore appends
    (`[tensorstore_spec='...']` JSON, or Orbax's `See full TensorStore details: <bound method ...
    spec of TensorStore({...})>`, kilobytes each) and its chain of `Error opening "<driver>"
    driver:` prefixes; other text is returned unchanged."""
    return _DRIVER_CHAIN.sub("", _TENSORSTORE_REPR.sub("", _TENSORSTORE_SPEC.sub("", message)))


def read_error_text(e: BaseException, limit: int = 400) -> str:
    """A failed checkpoint or weight read on one line, by its cause: `Type: message` of the innermost
    exception of the chain (`__cause__`, else `__context__`; Orbax wraps TensorStore's error,
    e.g. "Encountered error while reading array index ..." around "OUT_OF_RANGE: Error reading
    "w/0.0" ... is not valid for value of size 121258"), without TensorStore's noise
    (`without_tensorstore_noise`). Longer than `limit` characters, the middle is
    cut: the end of the message says what is wrong, and long paths sit in the middle."""
    root, seen = e, {id(e)}
    while (nxt := root.__cause__ or root.__context__) is not None and id(nxt) not in seen:
        root = nxt
        seen.add(id(root))
    text = " ".join(f"{type(root).__name__}: {without_tensorstore_noise(str(root))}".split())
    if len(text) <= limit:
        return text
    head = limit // 4
    return f"{text[:head]} ... {text[-(limit - head - 5):]}"
