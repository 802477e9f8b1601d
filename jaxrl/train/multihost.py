"""Multi-process helpers (one JAX process per host). Process 0 drives the sidecars, rollouts,
evaluation and run logs; every process takes part in the sharded update, the weight publication
and the checkpoints. Each helper is the identity / a no-op in a single-process run."""
from __future__ import annotations

import json
from typing import Optional

import jax
import numpy as np

from jaxrl import parallel


def sync(name: str) -> None:
    """Barrier across processes (no-op in a single-process run)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def broadcast_from_main(tree: Optional[dict]) -> dict:
    """Process 0's dict of numpy arrays, on every process (identity in a single-process run).

    Shapes are sent first (other processes do not know the bucketed length), then the arrays.
    """
    if jax.process_count() == 1:
        return tree
    from jax.experimental import multihost_utils

    meta = json.dumps({k: [list(v.shape), str(v.dtype)] for k, v in tree.items()}) if tree is not None else ""
    buf = np.zeros(1 << 16, np.uint8)
    if tree is not None:
        raw = np.frombuffer(meta.encode(), np.uint8)
        buf[:raw.size] = raw
    buf = np.asarray(multihost_utils.broadcast_one_to_all(buf))
    spec = json.loads(bytes(buf).rstrip(b"\0").decode())
    template = tree if tree is not None else {k: np.zeros(shape, dtype) for k, (shape, dtype) in spec.items()}
    return {k: np.asarray(v) for k, v in multihost_utils.broadcast_one_to_all(template).items()}


def global_array(x: np.ndarray, mesh) -> jax.Array:
    """A host array present in full on every process -> a global array with the batch sharding.

    Raises:
      ValueError: the rows do not split over the data x fsdp devices.
    """
    sharding = parallel.batch_sharding(mesh, x.ndim) if x.ndim else jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec())
    n = mesh.shape["data"] * mesh.shape["fsdp"]
    if x.ndim and x.shape[0] % n:
        raise ValueError(f"batch of {x.shape[0]} rows does not split over data x fsdp = {n} devices")
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])


def all_processes_ok(ok: bool, name: str) -> bool:
    """True iff `ok` holds on every process (so that all take the same branch)."""
    if jax.process_count() == 1:
        return ok
    from jax.experimental import multihost_utils

    return bool(np.all(multihost_utils.process_allgather(np.int32(ok))))
