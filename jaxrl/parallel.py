"""Device mesh, logical-axis sharding rules and sharding helpers (docs/architecture.md §5).

The mesh always has the three axes ``('data', 'fsdp', 'tensor')``:

* ``data``   — pure data parallelism: params are replicated over it (HSDP when combined with fsdp);
* ``fsdp``   — the batch is split over it AND params/optimizer state are sharded over it (ZeRO-3);
* ``tensor`` — Megatron-style tensor parallelism over heads / MLP width / vocabulary.

Every model weight carries a tuple of *logical* axis names as nnx metadata (``logical_axes``);
:data:`LOGICAL_AXIS_RULES` is the single table mapping those names to mesh axes. Batches are
sharded ``P(('data', 'fsdp'), None)``.

jax 0.10 rejects uneven shardings of jit arguments, so every sharded dimension must divide the
product of its mesh axes; :func:`param_shardings` checks this up front and raises
:class:`ShardingError` naming the parameter, the dimension and the axes, with mesh shapes that
would work.
"""
from __future__ import annotations

import itertools
import math
import os
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# Logical axis name -> mesh axis (str), tuple of mesh axes, or None (replicated).
LOGICAL_AXIS_RULES: dict[str, Any] = {
    "batch": BATCH_AXES,
    "vocab": "tensor",
    "embed": "fsdp",
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "layers": None,
}


class ShardingError(ValueError):
    """A tensor dimension does not divide the mesh axes it is sharded over."""


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def mesh_hint(data: int, fsdp: int, tensor: int, num_devices: int) -> str:
    """What to change when the mesh `data x fsdp x tensor` (one axis may be -1) does not fit
    `num_devices`, for the case at hand: with an axis at -1 already, the device counts that work
    and the values of each fixed axis that work on these devices; without one, the axis that
    could be -1 (and the shape it gives) and the product to aim for.
    """
    sizes = {"data": int(data), "fsdp": int(fsdp), "tensor": int(tensor)}
    auto = [n for n, v in sizes.items() if v == -1]
    fixed = {n: v for n, v in sizes.items() if v != -1}
    prod = math.prod(fixed.values())
    if len(auto) == 1:
        counts = ", ".join(str(prod * k) for k in (1, 2, 3)) + ", ..."
        options = []
        for name, v in fixed.items():
            others = prod // v
            if num_devices % others == 0:
                good = _divisors(num_devices // others)
                options.append(f"mesh.{name}={good[0]}" if len(good) == 1 else
                               f"mesh.{name} to one of {', '.join(map(str, good))}")
        fixed_txt = " x ".join(f"{n}={v}" for n, v in fixed.items())
        text = (f"mesh.{auto[0]}=-1 takes the devices the other axes leave, but they use {fixed_txt} = {prod} "
                f"devices, which does not divide {num_devices}: run on a multiple of {prod} devices ({counts})")
        if options:
            text += f", or for {num_devices} devices set " + " or ".join(options)
        return text
    options = []
    for name in sizes:
        rest = math.prod(v for n, v in sizes.items() if n != name)
        if num_devices % rest == 0:
            shape = " x ".join(f"{n}={num_devices // rest if n == name else v}" for n, v in sizes.items())
            options.append(f"mesh.{name}=-1 (gives {shape})")
    text = f"choose sizes whose product is {num_devices}"
    if options:
        text += ", or set " + " or ".join(options)
    else:
        text += f" (e.g. mesh.data=1 mesh.fsdp={num_devices} mesh.tensor=1, or mesh.fsdp=-1 with the other axes " \
                f"dividing {num_devices})"
    return text


def resolve_mesh_shape(data: int, fsdp: int, tensor: int, num_devices: int) -> tuple[int, int, int]:
    """Returns the concrete ``(data, fsdp, tensor)`` sizes; at most one may be ``-1`` (= the rest).

    Raises:
      ValueError: a size is 0 or < -1, more than one is -1, or the product is not ``num_devices``.
    """
    sizes = {"data": int(data), "fsdp": int(fsdp), "tensor": int(tensor)}
    for name, v in sizes.items():
        if v == 0 or v < -1:
            raise ValueError(f"mesh axis {name}={v}: sizes must be positive or -1 (all remaining devices)")
    auto = [n for n, v in sizes.items() if v == -1]
    if len(auto) > 1:
        raise ValueError(f"mesh axes {auto} are all -1; at most one axis may be -1")
    fixed = math.prod(v for v in sizes.values() if v != -1)
    if auto:
        if num_devices % fixed:
            raise ValueError(
                f"mesh data={data} x fsdp={fsdp} x tensor={tensor} does not fit the {num_devices} available "
                f"devices; {mesh_hint(data, fsdp, tensor, num_devices)}")
        sizes[auto[0]] = num_devices // fixed
    if math.prod(sizes.values()) != num_devices:
        raise ValueError(
            f"mesh data={sizes['data']} x fsdp={sizes['fsdp']} x tensor={sizes['tensor']} = "
            f"{math.prod(sizes.values())} devices, but {num_devices} devices are available; "
            f"{mesh_hint(data, fsdp, tensor, num_devices)}")
    return sizes["data"], sizes["fsdp"], sizes["tensor"]


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, devices: Sequence[Any] | None = None) -> Mesh:
    """Builds the ``('data', 'fsdp', 'tensor')`` mesh over ``devices`` (default: all devices).

    Axes are of type ``Auto`` so ``with_sharding_constraint`` with a ``PartitionSpec`` works
    (``jax.make_mesh`` defaults to Explicit axes in jax 0.10). ``-1`` for one axis means all
    remaining devices. Raises ValueError when the sizes do not multiply to the device count.
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = resolve_mesh_shape(data, fsdp, tensor, len(devices))
    axis_types = (jax.sharding.AxisType.Auto,) * 3
    if len(devices) == len(jax.devices()):
        try:  # topology-aware device order (ICI/NVLink locality) when using every device
            return jax.make_mesh(shape, MESH_AXES, axis_types=axis_types, devices=devices)
        except (TypeError, ValueError):
            pass
    return Mesh(np.asarray(devices, dtype=object).reshape(shape), MESH_AXES, axis_types=axis_types)


def logical_to_spec(axes: Sequence[str | None], rules: Mapping[str, Any] | None = None) -> P:
    """Maps a tuple of logical axis names to a PartitionSpec with :data:`LOGICAL_AXIS_RULES`.

    Raises KeyError (naming the axis) for a logical name missing from the rules.
    """
    rules = LOGICAL_AXIS_RULES if rules is None else rules
    out = []
    for a in axes:
        if a is None:
            out.append(None)
            continue
        if a not in rules:
            raise KeyError(f"logical axis {a!r} has no entry in the sharding rules {sorted(rules)}")
        out.append(rules[a])
    return P(*out)


def _axis_size(mesh_shape: Mapping[str, int], entry) -> int:
    if entry is None:
        return 1
    if isinstance(entry, str):
        return mesh_shape[entry]
    return math.prod(mesh_shape[e] for e in entry)


def _flatten(tree: Mapping, prefix=()) -> list[tuple[tuple[str, ...], Any]]:
    out = []
    for k, v in tree.items():
        if isinstance(v, Mapping):
            out.extend(_flatten(v, prefix + (k,)))
        else:
            out.append((prefix + (k,), v))
    return out


def _unflatten(items) -> dict:
    out: dict = {}
    for path, v in items:
        d = out
        for k in path[:-1]:
            d = d.setdefault(k, {})
        d[path[-1]] = v
    return out


def logical_axes_of(model_or_state) -> dict:
    """Nested dict (same layout as ``nnx.state(model, nnx.Param).to_pure_dict()``) of each param's
    ``logical_axes`` metadata tuple. Accepts an nnx Module (also an abstract one from
    ``nnx.eval_shape``) or an ``nnx.State``. Raises ValueError for a param without metadata."""
    from flax import nnx

    state = model_or_state if isinstance(model_or_state, nnx.State) else nnx.state(model_or_state, nnx.Param)
    items = []
    for path, var in nnx.to_flat_state(state):
        meta = var.get_metadata()
        if "logical_axes" not in meta:
            raise ValueError(f"param {'.'.join(map(str, path))} has no 'logical_axes' metadata")
        items.append((tuple(str(p) for p in path), tuple(meta["logical_axes"])))
    return _unflatten(items)


def _divisibility_problems(shapes: dict, axes: dict, mesh_shape: Mapping[str, int], rules) -> list[str]:
    problems = []
    ax_by_path = dict(_flatten(axes))
    for path, shape in _flatten(shapes):
        logical = ax_by_path[path]
        shape = tuple(getattr(shape, "shape", shape))
        for dim, (size, name) in enumerate(zip(shape, logical)):
            entry = rules.get(name) if name is not None else None
            n = _axis_size(mesh_shape, entry)
            if size % n:
                problems.append(
                    f"param {'.'.join(path)} dim {dim} (logical axis {name!r}, size {size}) is not "
                    f"divisible by mesh axes {entry!r} (size {n})")
    return problems


def suggest_mesh_shapes(shapes: dict, axes: dict, num_devices: int, rules: Mapping[str, Any] | None = None,
                        limit: int = 6) -> list[tuple[int, int, int]]:
    """Mesh shapes ``(data, fsdp, tensor)`` over ``num_devices`` under which every param divides.

    Ordered by preference: largest fsdp first (most memory saving), then smallest tensor.
    """
    rules = LOGICAL_AXIS_RULES if rules is None else rules
    found = []
    divs = [d for d in range(1, num_devices + 1) if num_devices % d == 0]
    for fsdp, tensor in itertools.product(divs, divs):
        if num_devices % (fsdp * tensor):
            continue
        ms = {"data": num_devices // (fsdp * tensor), "fsdp": fsdp, "tensor": tensor}
        if not _divisibility_problems(shapes, axes, ms, rules):
            found.append((ms["data"], fsdp, tensor))
    found.sort(key=lambda s: (-s[1], s[2]))
    return found[:limit]


def param_shardings(axes: dict, mesh: Mesh, shapes: dict | None = None,
                    rules: Mapping[str, Any] | None = None) -> dict:
    """NamedShardings for a param tree from its logical axes (see :func:`logical_axes_of`).

    Args:
      axes: nested dict of logical-axis tuples.
      mesh: the device mesh.
      shapes: optional nested dict (same layout) of arrays / ShapeDtypeStructs / shape tuples;
        when given, every sharded dimension is checked to divide its mesh axes.
    Raises:
      ShardingError: listing every non-dividing dimension (param, dim, logical axis, mesh axes)
        and mesh shapes over the same device count under which all params divide.
    """
    rules = LOGICAL_AXIS_RULES if rules is None else rules
    if shapes is not None:
        mesh_shape = dict(mesh.shape)
        problems = _divisibility_problems(shapes, axes, mesh_shape, rules)
        if problems:
            n = mesh.devices.size
            good = suggest_mesh_shapes(shapes, axes, n, rules)
            hint = (", ".join(f"data={d} x fsdp={f} x tensor={t}" for d, f, t in good)
                    if good else "none (use fewer devices)")
            raise ShardingError(
                f"cannot shard params over mesh data={mesh_shape['data']} x fsdp={mesh_shape['fsdp']} x "
                f"tensor={mesh_shape['tensor']}:\n  " + "\n  ".join(problems)
                + f"\nmesh shapes over {n} devices that divide every param: {hint}")
    return _unflatten((p, NamedSharding(mesh, logical_to_spec(a, rules))) for p, a in _flatten(axes))


def with_memory_kind(shardings, memory_kind: str | None):
    """A tree of NamedShardings with ``memory_kind`` set on every leaf (``'pinned_host'`` keeps
    the arrays in host memory, e.g. the CPU memory of a GH200 superchip; ``'device'``); ``None``
    returns the tree unchanged.

    Raises:
      ValueError: when the devices do not offer that memory kind (named in the message).
    """
    if memory_kind is None:
        return shardings
    leaves = jax.tree.leaves(shardings)
    if leaves:
        kinds = {m.kind for m in leaves[0].mesh.devices.flat[0].addressable_memories()}
        if memory_kind not in kinds:
            raise ValueError(f"memory kind {memory_kind!r} is not offered by {leaves[0].mesh.devices.flat[0]} "
                             f"(it has {sorted(kinds)}); use trainer.optimizer.offload='none' on this backend")
    return jax.tree.map(lambda s: s.with_memory_kind(memory_kind), shardings)


def opt_state_shardings(opt_state, params, param_sharding, mesh: Mesh, memory_kind: str | None = None):
    """Shardings for an optax state: every subtree with the params' tree structure (Adam mu/nu,
    EMA copies, ...) gets ``param_sharding``; every other leaf (step counts, scalars) is replicated.
    ``memory_kind`` (e.g. ``'pinned_host'``) places the whole state there (see :func:`with_memory_kind`).

    ``opt_state`` / ``params`` may be abstract (``jax.eval_shape``) or concrete.
    """
    if memory_kind is not None:
        return with_memory_kind(opt_state_shardings(opt_state, params, param_sharding, mesh), memory_kind)
    pstruct = jax.tree.structure(params)
    replicated = NamedSharding(mesh, P())

    def is_params_like(x):
        return jax.tree.structure(x) == pstruct

    return jax.tree.map(
        lambda s: param_sharding if is_params_like(s) else jax.tree.map(lambda _: replicated, s),
        opt_state, is_leaf=is_params_like)


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """``P(('data', 'fsdp'), None, ...)``: the leading (sequence-in-batch) axis over data × fsdp."""
    return NamedSharding(mesh, P(BATCH_AXES, *([None] * (ndim - 1))))


def shard_batch(batch: Mapping[str, Any], mesh: Mesh) -> dict:
    """Puts a dict of host arrays (leading axis = batch) on the mesh with :func:`batch_sharding`.

    In a multi-process run each process passes its local slice (``make_array_from_process_local_data``).
    Raises ValueError naming the field when the batch does not divide data × fsdp.
    """
    n = mesh.shape["data"] * mesh.shape["fsdp"]
    out = {}
    for k, v in batch.items():
        v = np.asarray(v)
        if v.ndim == 0:
            out[k] = jax.device_put(v, NamedSharding(mesh, P()))
            continue
        sh = batch_sharding(mesh, v.ndim)
        if jax.process_count() == 1:
            if v.shape[0] % n:
                raise ValueError(f"batch field {k!r} has {v.shape[0]} rows, not divisible by "
                                 f"data x fsdp = {n}; pad the batch to a multiple of {n}")
            out[k] = jax.device_put(v, sh)
        else:
            out[k] = jax.make_array_from_process_local_data(sh, v)
    return out


def constrain(x, logical_axes: Sequence[str | None], rules: Mapping[str, Any] | None = None):
    """``with_sharding_constraint`` by logical axes when a mesh with our axis names is active
    (``jax.set_mesh``) and every constrained dim divides; otherwise returns ``x`` unchanged."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or getattr(mesh, "empty", True) or not set(MESH_AXES) <= set(mesh.axis_names):
        return x
    rules = LOGICAL_AXIS_RULES if rules is None else rules
    spec = logical_to_spec(logical_axes, rules)
    ms = dict(mesh.shape)
    if any(size % _axis_size(ms, e) for size, e in zip(x.shape, spec)):
        return x
    return jax.lax.with_sharding_constraint(x, spec)


def maybe_initialize_distributed(coordinator_address: str | None = None, num_processes: int | None = None,
                                 process_id: int | None = None) -> bool:
    """Calls ``jax.distributed.initialize`` for multi-process runs; returns True if it did.

    Arguments default to the env vars ``JAXRL_COORDINATOR_ADDRESS`` (host:port),
    ``JAXRL_NUM_PROCESSES`` and ``JAXRL_PROCESS_ID``. Without them, a SLURM job with more than one
    task (``SLURM_NTASKS`` > 1) uses JAX's SLURM auto-detection; a single process does nothing.
    Must run before any other JAX call.
    """
    coordinator_address = coordinator_address or os.environ.get("JAXRL_COORDINATOR_ADDRESS")
    if num_processes is None and os.environ.get("JAXRL_NUM_PROCESSES"):
        num_processes = int(os.environ["JAXRL_NUM_PROCESSES"])
    if process_id is None and os.environ.get("JAXRL_PROCESS_ID"):
        process_id = int(os.environ["JAXRL_PROCESS_ID"])
    if coordinator_address:
        if num_processes is None or process_id is None:
            raise ValueError("a coordinator address was given; set JAXRL_NUM_PROCESSES and JAXRL_PROCESS_ID too")
        jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                                   process_id=process_id)
        return True
    if int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        jax.distributed.initialize()
        return True
    return False
