"""Policy weight sync through Orbax checkpoints in a shared directory (docs/sidecar.md).

Layout written by `publish` (one directory per policy version):

    sync_dir/<version>/params/      Orbax PyTree checkpoint (OCDBT + zarr) of the params, in the
                                    engine's compute dtype (bf16 at scale, float32 on CPU)
    sync_dir/<version>/sync.json    {"version", "names", "bytes", "dtype", ...}; written last

The publish dtype must be the rollout engine's compute dtype, so that trainer and engine hold the
same weights at equal versions (a float32 engine fed bf16-rounded weights samples from another
policy: max |log pi - log mu| 3e-2 instead of ~1e-6 on the embedded default policy).

A version is written under a hidden temporary name (`sync_dir/.tmp-<version>`) and then renamed to
`sync_dir/<version>` with one `os.rename`, which is atomic on POSIX file systems: a directory named
by an integer is always complete. `latest_version` additionally requires `sync.json` in it.
The last `keep` versions are kept; older ones are deleted after a new one is committed.

This module imports neither jax nor orbax at import time: the tensorstore reader
(`iter_arrays`, `read_numpy`) runs in a process without JAX (the vLLM worker,
qwen3_vllm.md §5 "Reading from a process without JAX"). `publish` and `load` import them lazily.

Array names are Orbax's: the pytree key path joined with '.', e.g. ``layers.attn.q_proj.kernel``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from typing import Any, Iterator, Optional

import numpy as np

SYNC_FILE = "sync.json"
PARAMS_ITEM = "params"
_TMP_PREFIX = ".tmp-"


@dataclasses.dataclass(frozen=True)
class SyncStats:
    """Cost of one publish or load.

    Attributes:
      version: policy version written or read.
      path: absolute path of the version directory.
      seconds: wall time of the operation (s).
      bytes: bytes of tensor data (in the publish dtype for publish; as read for load).
      disk_bytes: bytes of all files in the version directory (after compression).
    """

    version: int
    path: str
    seconds: float
    bytes: int
    disk_bytes: int

    @property
    def gbytes_per_s(self) -> float:
        """Tensor bytes per second, in GB/s (1e9 bytes)."""
        return self.bytes / max(self.seconds, 1e-9) / 1e9


def version_path(sync_dir: str, version: int) -> str:
    """Absolute path of `sync_dir/<version>` (whether or not it exists)."""
    return os.path.join(os.path.abspath(sync_dir), str(int(version)))


def committed_versions(sync_dir: str) -> list[int]:
    """Sorted versions whose directory is committed (final name and `sync.json` present)."""
    if not os.path.isdir(sync_dir):
        return []
    out = []
    for name in os.listdir(sync_dir):
        if name.isdigit() and os.path.isfile(os.path.join(sync_dir, name, SYNC_FILE)):
            out.append(int(name))
    return sorted(out)


def latest_version(sync_dir: str) -> Optional[int]:
    """Newest committed version in `sync_dir`, or None if there is none. Never a partial one."""
    versions = committed_versions(sync_dir)
    return versions[-1] if versions else None


def wait_for_version(sync_dir: str, version: int, timeout_s: float = 600.0, poll_s: float = 0.1) -> str:
    """Blocks until `version` is committed in `sync_dir`; returns its path.

    Raises:
      TimeoutError: the version did not appear within `timeout_s` seconds.
    """
    deadline = time.monotonic() + timeout_s
    path = version_path(sync_dir, version)
    while not os.path.isfile(os.path.join(path, SYNC_FILE)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"policy version {version} was not committed in {sync_dir} within {timeout_s} s")
        time.sleep(poll_s)
    return path


def resolve_version_dir(sync_dir: str, path: str) -> tuple[str, int]:
    """Checks that `path` is a committed version directory directly inside `sync_dir`.

    Symlinks and `..` are resolved before the check, so a path that points outside the sync
    directory is refused even if it is spelled as being inside it.

    Returns:
      (real path of the version directory, its version number).
    Raises:
      PermissionError: `path` resolves outside `sync_dir` or is not a direct child of it.
      FileNotFoundError: it is inside but not a committed version (missing or still being written).
    """
    root = os.path.realpath(sync_dir)
    real = os.path.realpath(path if os.path.isabs(path) else os.path.join(root, path))
    if os.path.dirname(real) != root:
        raise PermissionError(f"weight path {path!r} resolves to {real!r}, which is not a version directory "
                              f"directly inside the sync directory {root!r}")
    name = os.path.basename(real)
    if not name.isdigit():
        raise PermissionError(f"weight path {path!r}: {name!r} is not a version directory (expected an integer name)")
    if not os.path.isfile(os.path.join(real, SYNC_FILE)):
        raise FileNotFoundError(f"policy version directory {real!r} is not committed (no {SYNC_FILE})")
    return real, int(name)


def _dir_bytes(path: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            fp = os.path.join(dirpath, f)
            if not os.path.islink(fp):
                total += os.path.getsize(fp)
    return total


def _to_pure_tree(params: Any) -> Any:
    """nnx.State (or a tree with nnx.Variable leaves) -> plain nested containers of arrays."""
    if hasattr(params, "to_pure_dict"):
        return params.to_pure_dict()
    try:
        from flax import nnx
    except ImportError:  # pragma: no cover - flax is a hard dependency of the trainer
        return params
    import jax

    return jax.tree.map(lambda x: x.get_value() if isinstance(x, nnx.Variable) else x, params,
                        is_leaf=lambda x: isinstance(x, nnx.Variable))


PUBLISH_DTYPES = ("bfloat16", "float32")


def _cast_floats(tree: Any, dtype: str) -> Any:
    """Floating leaves cast to `dtype` ("bfloat16" | "float32"); integer leaves unchanged."""
    import jax
    import jax.numpy as jnp
    import ml_dtypes

    np_dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32

    def cast(x):
        if isinstance(x, jax.Array):
            return x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x
        x = np.asarray(x)
        if np.issubdtype(x.dtype, np.floating) or x.dtype == ml_dtypes.bfloat16:
            return x.astype(np_dt)
        return x

    return jax.tree.map(cast, tree)


def _sync_processes(name: str) -> None:
    import jax

    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def publish(params: Any, sync_dir: str, version: int, keep: int = 2, dtype: Optional[str] = None) -> SyncStats:
    """Writes `params` (floats cast to `dtype`) as committed policy version `version` in `sync_dir`.

    Every JAX process must call this with the same arguments (Orbax writes each process's
    addressable shards; process 0 commits). Integer leaves are written unchanged.

    Args:
      params: pytree of jax or numpy arrays, or an `nnx.State` (written as its pure dict).
      sync_dir: shared directory (created if missing).
      version: integer >= 0, larger than any committed version.
      keep: number of newest committed versions kept (>= 1); older ones are deleted.
      dtype: None (default: every leaf written in its own dtype, so a direct caller publishes
        exactly the weights it holds), or "bfloat16" / "float32": floats cast to the rollout
        engine's compute dtype (the trainer passes `model.compute_dtype`, so the engine computes
        with exactly the weights published).
    Returns:
      SyncStats with the wall time from the call to the commit and the tensor bytes (in `dtype`).
    Raises:
      ValueError: bad `version`/`keep`/`dtype`, or the version exists already.
    """
    import jax
    import orbax.checkpoint as ocp

    if int(version) != version or version < 0:
        raise ValueError(f"publish: version must be an integer >= 0, got {version!r}")
    if keep < 1:
        raise ValueError(f"publish: keep must be >= 1, got {keep}")
    if dtype is not None and dtype not in PUBLISH_DTYPES:
        raise ValueError(f"publish: dtype must be None or one of {PUBLISH_DTYPES}, got {dtype!r}")
    t0 = time.perf_counter()
    sync_dir = os.path.abspath(sync_dir)
    final = version_path(sync_dir, version)
    if os.path.exists(final):
        raise ValueError(f"publish: policy version {version} already exists at {final}; versions must increase")
    tmp = os.path.join(sync_dir, f"{_TMP_PREFIX}{int(version)}")
    primary = jax.process_index() == 0
    if primary:
        os.makedirs(sync_dir, exist_ok=True)
        if os.path.exists(tmp):  # left over by a crashed publish of the same version
            shutil.rmtree(tmp)
        os.makedirs(tmp)
    _sync_processes(f"jaxrl_publish_begin_{version}")

    tree = _to_pure_tree(params)
    if dtype is not None:
        tree = _cast_floats(tree, dtype)
    else:
        tree = jax.tree.map(lambda x: x if isinstance(x, jax.Array) else np.asarray(x), tree)
        floats = sorted({str(np.dtype(x.dtype)) for x in jax.tree.leaves(tree)
                         if np.issubdtype(np.dtype(x.dtype), np.floating) or str(np.dtype(x.dtype)) == "bfloat16"})
        dtype = ",".join(floats) or "none"
    leaves_with_path = jax.tree_util.tree_flatten_with_path(tree)[0]
    names = [".".join(_key_str(k) for k in path) for path, _ in leaves_with_path]
    nbytes = int(sum(np.prod(x.shape, dtype=np.int64) * np.dtype(x.dtype).itemsize for _, x in leaves_with_path))
    try:
        if primary:  # a version that cannot fit fails here, before Orbax starts (fileio.require_free_space)
            from jaxrl.fileio import require_free_space

            require_free_space(tmp, nbytes, f"policy version {version}")
        ocp.PyTreeCheckpointer().save(os.path.join(tmp, PARAMS_ITEM), tree)
        _sync_processes(f"jaxrl_publish_saved_{version}")
        if primary:
            meta = {"version": int(version), "names": names, "bytes": nbytes, "format": "orbax-pytree",
                    "item": PARAMS_ITEM, "dtype": dtype, "created": time.time()}
            with open(os.path.join(tmp, SYNC_FILE), "w") as f:
                json.dump(meta, f)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, final)
    except BaseException:
        if primary:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    _sync_processes(f"jaxrl_publish_committed_{version}")
    if primary:
        for old in committed_versions(sync_dir)[:-keep]:
            shutil.rmtree(version_path(sync_dir, old), ignore_errors=True)
    seconds = time.perf_counter() - t0
    return SyncStats(int(version), final, seconds, nbytes, _dir_bytes(final) if primary else 0)


def _key_str(k) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def load(sync_dir: str, version: Optional[int] = None, target: Any = None) -> tuple[Any, SyncStats]:
    """Reads a committed version back with Orbax (imports jax).

    Args:
      sync_dir: the sync directory.
      version: version to read; None = the latest committed one.
      target: optional pytree matching the published structure (an `nnx.State` is compared as its
        pure dict) whose leaves are arrays or `jax.ShapeDtypeStruct`s; each restored leaf gets the
        leaf's dtype and, for jax leaves carrying one, its sharding. None = numpy arrays as stored
        (bf16 as `ml_dtypes.bfloat16`).
    Returns:
      (tree of arrays, SyncStats). With an `nnx.State` target the tree is its pure dict; apply it
      with `nnx.replace_by_pure_dict(state, tree)`.
    Raises:
      FileNotFoundError: no committed version (or not this one) in `sync_dir`.
    """
    import jax
    import orbax.checkpoint as ocp

    t0 = time.perf_counter()
    if version is None:
        version = latest_version(sync_dir)
        if version is None:
            raise FileNotFoundError(f"no committed policy version in {sync_dir}")
    path, version = resolve_version_dir(sync_dir, version_path(sync_dir, version))
    item = os.path.join(path, PARAMS_ITEM)
    ckptr = ocp.PyTreeCheckpointer()
    if target is None:
        meta = ckptr.metadata(item)
        tree_meta = getattr(meta, "item_metadata", meta)
        tree_meta = getattr(tree_meta, "tree", tree_meta)
        restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree_meta)
    else:
        target = _to_pure_tree(target)

        def arg(x):
            sharding = getattr(x, "sharding", None)
            if isinstance(x, (jax.Array, jax.ShapeDtypeStruct)) and sharding is not None:
                return ocp.ArrayRestoreArgs(sharding=sharding, dtype=x.dtype, global_shape=x.shape)
            return ocp.RestoreArgs(restore_type=np.ndarray, dtype=x.dtype)

        restore_args = jax.tree.map(arg, target)
    tree = ckptr.restore(item, args=ocp.args.PyTreeRestore(item=target, restore_args=restore_args))
    nbytes = int(sum(np.prod(x.shape, dtype=np.int64) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))
    return tree, SyncStats(version, path, time.perf_counter() - t0, nbytes, _dir_bytes(path))


# ---------------------------------------------------------------------------------------------
# JAX-free reader (tensorstore only): used by the vLLM worker extension.
# ---------------------------------------------------------------------------------------------

def _read_metadata(item_dir: str) -> tuple[list[tuple[str, tuple]], bool]:
    with open(os.path.join(item_dir, "_METADATA")) as f:
        meta = json.load(f)
    entries = []
    for info in meta["tree_metadata"].values():
        keys = tuple(k["key"] if k.get("key_type") != 1 else int(k["key"]) for k in info["key_metadata"])
        entries.append((".".join(str(k) for k in keys), keys))
    return entries, bool(meta.get("use_zarr3", False))


def read_meta(version_dir: str) -> dict:
    """The commit record (``sync.json``: version, names, bytes, dtype, ...) of a committed version.

    Raises:
      OSError: no readable record (not a committed version). ValueError: the record is not JSON.
    """
    with open(os.path.join(version_dir, SYNC_FILE)) as f:
        return json.load(f)


def array_names(version_dir: str) -> list[tuple[str, tuple]]:
    """(name, key path) of every array in a published version, without JAX. Key paths hold str
    dict keys and int sequence indices."""
    return _read_metadata(os.path.join(version_dir, PARAMS_ITEM))[0]


def _open_spec(item_dir: str, name: str, zarr3: bool) -> dict:
    return {"driver": "zarr3" if zarr3 else "zarr",
            "kvstore": {"driver": "ocdbt", "base": "file://" + os.path.abspath(item_dir) + "/", "path": name + "/"}}


def open_array(version_dir: str, name: str):
    """An open tensorstore handle of one array of a published version (no JAX); slice it before
    ``.read().result()`` to read only the needed chunks (e.g. one layer)."""
    import tensorstore as ts

    item = os.path.join(version_dir, PARAMS_ITEM)
    _, zarr3 = _read_metadata(item)
    return ts.open(_open_spec(item, name, zarr3)).result()


def iter_arrays(version_dir: str, names: Optional[list[str]] = None) -> Iterator[tuple[str, np.ndarray]]:
    """Yields (name, numpy array) of a published version one at a time, with tensorstore only.

    Reading one array at a time bounds host memory to the largest tensor. bf16 arrays come back as
    `ml_dtypes.bfloat16`. `version_dir` must be a committed version directory (check it with
    `resolve_version_dir` first when the path comes from outside).

    Raises:
      KeyError: a requested name is not in the checkpoint.
    """
    import tensorstore as ts

    item = os.path.join(version_dir, PARAMS_ITEM)
    entries, zarr3 = _read_metadata(item)
    available = [n for n, _ in entries]
    if names is None:
        names = available
    else:
        missing = sorted(set(names) - set(available))
        if missing:
            raise KeyError(f"arrays {missing} are not in the checkpoint {version_dir} (it has {available})")
    for name in names:
        yield name, ts.open(_open_spec(item, name, zarr3)).result().read().result()


def read_numpy(version_dir: str) -> dict[str, np.ndarray]:
    """All arrays of a published version as {name: numpy array}, with tensorstore only (no JAX).

    Reads are issued concurrently. Returns the same names as `array_names`.
    """
    import tensorstore as ts

    item = os.path.join(version_dir, PARAMS_ITEM)
    entries, zarr3 = _read_metadata(item)
    stores = {n: ts.open(_open_spec(item, n, zarr3)) for n, _ in entries}
    futures = {n: s.result().read() for n, s in stores.items()}
    return {n: f.result() for n, f in futures.items()}


def read_tree(version_dir: str) -> dict:
    """A published version as nested dicts (sequence indices become int keys), numpy leaves, no JAX."""
    entries = dict(array_names(version_dir))
    out: dict = {}
    for name, arr in read_numpy(version_dir).items():
        node = out
        keys = entries[name]
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = arr
    return out
