"""HF checkpoints <-> jaxrl Qwen3: safetensors through one declarative mapping table, and
config.json through :class:`Qwen3Config` (defined in :mod:`jaxrl.models.qwen3_config`,
re-exported here).

:data:`MAPPING` lists, for every param (path in the pure-dict tree of
:mod:`jaxrl.models.qwen3`), its HF tensor name (``{i}`` = layer index for params stacked over
layers), whether the HF ``[out, in]`` matrix is transposed, and both layouts as symbolic shapes.
Conversion of one tensor is: HF -> (transpose) -> reshape to our per-layer shape, and back.

This module does **not** import JAX at module level: the vLLM worker uses :data:`MAPPING`,
:func:`hf_to_ours`, :func:`ours_to_hf` and :func:`params_to_hf_tensors` (which accepts numpy
params) inside a process without JAX; :mod:`jaxrl.models.qwen3_config` and
:mod:`jaxrl.models.chat_template` (the prompt format of an exported policy, re-exported here) do
not import it either. Only :func:`load_hf_checkpoint` imports JAX.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import shutil
from typing import Iterator, Mapping

import numpy as np

from jaxrl.models.chat_template import (  # noqa: F401 -- re-exported: the prompt format moved there
    bake_prompt_format,
    read_prompt_format,
    strip_prompt_format,
    write_prompt_format,
)
from jaxrl.models.qwen3_config import (  # noqa: F401 -- re-exported: the config moved there
    ATTENTION_IMPLS,
    DTYPES,
    PRESETS,
    REMAT_POLICIES,
    Qwen3Config,
)

SAFE_INDEX = "model.safetensors.index.json"
SAFE_SINGLE = "model.safetensors"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                   "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
                   "generation_config.json")
# Buffers some exporters write that are not parameters (recomputed from the config).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


# --------------------------------------------------------------------------------------------
# Mapping table
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TensorMap:
    """One param <-> HF tensor correspondence.

    path: key path in our params tree. hf_name: HF name, ``{i}`` = layer index when ``stacked``.
    transpose: HF stores this matrix ``[out, in]``; ours is ``[in, ...out]``.
    hf_shape / our_shape: per-layer shapes as symbols of the config (``V`` vocab, ``E`` hidden,
    ``I`` intermediate, ``D`` head_dim, ``Nq`` / ``Nkv`` heads); a tuple of symbols is their product.
    """

    path: tuple[str, ...]
    hf_name: str
    stacked: bool
    transpose: bool
    hf_shape: tuple
    our_shape: tuple


_L = "model.layers.{i}."
MAPPING: tuple[TensorMap, ...] = (
    TensorMap(("embed_tokens",), "model.embed_tokens.weight", False, False, ("V", "E"), ("V", "E")),
    TensorMap(("layers", "input_layernorm", "scale"), _L + "input_layernorm.weight", True, False, ("E",), ("E",)),
    TensorMap(("layers", "q_proj"), _L + "self_attn.q_proj.weight", True, True, (("Nq", "D"), "E"), ("E", "Nq", "D")),
    TensorMap(("layers", "k_proj"), _L + "self_attn.k_proj.weight", True, True, (("Nkv", "D"), "E"), ("E", "Nkv", "D")),
    TensorMap(("layers", "v_proj"), _L + "self_attn.v_proj.weight", True, True, (("Nkv", "D"), "E"), ("E", "Nkv", "D")),
    TensorMap(("layers", "o_proj"), _L + "self_attn.o_proj.weight", True, True, ("E", ("Nq", "D")), ("Nq", "D", "E")),
    TensorMap(("layers", "q_norm", "scale"), _L + "self_attn.q_norm.weight", True, False, ("D",), ("D",)),
    TensorMap(("layers", "k_norm", "scale"), _L + "self_attn.k_norm.weight", True, False, ("D",), ("D",)),
    TensorMap(("layers", "post_attention_layernorm", "scale"), _L + "post_attention_layernorm.weight", True, False,
              ("E",), ("E",)),
    TensorMap(("layers", "gate_proj"), _L + "mlp.gate_proj.weight", True, True, ("I", "E"), ("E", "I")),
    TensorMap(("layers", "up_proj"), _L + "mlp.up_proj.weight", True, True, ("I", "E"), ("E", "I")),
    TensorMap(("layers", "down_proj"), _L + "mlp.down_proj.weight", True, True, ("E", "I"), ("I", "E")),
    TensorMap(("norm", "scale"), "model.norm.weight", False, False, ("E",), ("E",)),
    TensorMap(("lm_head",), "lm_head.weight", False, True, ("V", "E"), ("E", "V")),
)


def mapping_for(cfg) -> tuple[TensorMap, ...]:
    """The entries that exist for ``cfg`` (no ``lm_head`` when embeddings are tied)."""
    return tuple(m for m in MAPPING if not (m.path == ("lm_head",) and cfg.tie_word_embeddings))


def _dims(cfg) -> dict[str, int]:
    return {"V": cfg.vocab_size, "E": cfg.hidden_size, "I": cfg.intermediate_size, "D": cfg.head_dim,
            "Nq": cfg.num_attention_heads, "Nkv": cfg.num_key_value_heads}


def resolve_shape(sym: tuple, cfg) -> tuple[int, ...]:
    """Concrete shape of a symbolic shape (see :class:`TensorMap`)."""
    d = _dims(cfg)
    return tuple(math.prod(d[s] for s in x) if isinstance(x, tuple) else d[x] for x in sym)


def hf_names(m: TensorMap, cfg) -> list[str]:
    """HF tensor names of an entry: one per layer when stacked."""
    if m.stacked:
        return [m.hf_name.format(i=i) for i in range(cfg.num_hidden_layers)]
    return [m.hf_name]


def hf_to_ours(m: TensorMap, arr: np.ndarray, cfg) -> np.ndarray:
    """One HF tensor (one layer's, if stacked) -> our per-layer layout. Raises ValueError on shape."""
    want = resolve_shape(m.hf_shape, cfg)
    if tuple(arr.shape) != want:
        raise ValueError(f"tensor {m.hf_name}: checkpoint shape {tuple(arr.shape)} != expected {want} from config")
    if m.transpose:
        arr = arr.T
    return np.ascontiguousarray(arr.reshape(resolve_shape(m.our_shape, cfg)))


def ours_to_hf(m: TensorMap, arr: np.ndarray, cfg) -> np.ndarray:
    """Our per-layer array -> HF layout (inverse of :func:`hf_to_ours`)."""
    hf = resolve_shape(m.hf_shape, cfg)
    if m.transpose:
        return np.ascontiguousarray(np.asarray(arr).reshape(hf[::-1]).T)
    return np.ascontiguousarray(np.asarray(arr).reshape(hf))


def _get(tree: Mapping, path: tuple[str, ...]):
    for k in path:
        tree = tree[k]
    return tree


def _np_dtype(dtype):
    if dtype is None:
        return None
    if isinstance(dtype, str):
        if dtype == "bfloat16":
            import ml_dtypes
            return np.dtype(ml_dtypes.bfloat16)
        return np.dtype(dtype)
    return np.dtype(dtype)


def _to_host(x) -> np.ndarray:
    if hasattr(x, "is_fully_addressable") and not x.is_fully_addressable:
        from jax.experimental import multihost_utils
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def params_to_hf_tensors(params: Mapping, cfg, dtype=None) -> Iterator[tuple[str, np.ndarray]]:
    """Yields ``(hf_name, numpy array)`` for every HF tensor, in HF order, one at a time.

    Args:
      params: our params tree (numpy or JAX arrays; JAX arrays are fetched one layer at a time).
      cfg: the Qwen3Config.
      dtype: output dtype (``'float32'``, ``'bfloat16'``, numpy dtype) or None to keep the params'.
    For tied configs ``lm_head.weight`` is not yielded (HF ties it to ``model.embed_tokens.weight``).
    """
    dt = _np_dtype(dtype)
    for m in mapping_for(cfg):
        x = _get(params, m.path)
        if m.stacked:
            for i, name in enumerate(hf_names(m, cfg)):
                a = ours_to_hf(m, _to_host(x[i]), cfg)
                yield name, a if dt is None else a.astype(dt)
        else:
            a = ours_to_hf(m, _to_host(x), cfg)
            yield m.hf_name, a if dt is None else a.astype(dt)


# --------------------------------------------------------------------------------------------
# Reading checkpoints
# --------------------------------------------------------------------------------------------

class HFCheckpoint:
    """Lazy tensor access to an HF safetensors directory (single file or sharded with an index).

    Use as a context manager; ``shape(name)`` reads only headers, ``get(name)`` one tensor.
    """

    def __init__(self, path: str):
        import ml_dtypes  # noqa: F401 -- registers numpy's bfloat16, so bf16 tensors can be read without JAX
        from safetensors import safe_open

        self.path = path
        idx = os.path.join(path, SAFE_INDEX)
        if os.path.exists(idx):
            with open(idx) as f:
                wm = json.load(f)["weight_map"]
            files = sorted(set(wm.values()))
        elif os.path.exists(os.path.join(path, SAFE_SINGLE)):
            files = [SAFE_SINGLE]
        else:
            found = sorted(os.path.basename(p) for p in glob.glob(os.path.join(path, "*.safetensors")))
            if not found:
                raise FileNotFoundError(f"no {SAFE_SINGLE} or {SAFE_INDEX} in {path}")
            files = found
        self._handles = {fn: safe_open(os.path.join(path, fn), framework="numpy") for fn in files}
        self._where = {}
        for fn, h in self._handles.items():
            for k in h.keys():
                self._where[k] = fn

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        for h in self._handles.values():
            if hasattr(h, "__exit__"):
                h.__exit__(None, None, None)
        self._handles = {}

    @property
    def names(self) -> list[str]:
        return list(self._where)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handles[self._where[name]].get_slice(name).get_shape())

    def get(self, name: str) -> np.ndarray:
        return self._handles[self._where[name]].get_tensor(name)

    def get_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of a tensor (reads only those rows)."""
        return self._handles[self._where[name]].get_slice(name)[start:stop]


def check_checkpoint(ckpt: HFCheckpoint, cfg) -> None:
    """Validates tensor names and shapes against ``cfg``.

    Raises ValueError naming every missing tensor, unexpected tensor, or shape mismatch
    (tensor, checkpoint shape, expected shape). An untied config requires ``lm_head.weight``.
    A tied config (``tie_word_embeddings=true``) accepts a stored ``lm_head.weight`` only if it
    equals ``model.embed_tokens.weight`` (then it is the same matrix); a stored head that differs
    is an error, because the two readers of such a checkpoint disagree: transformers unties and
    uses the stored head, vLLM ignores it and uses the embedding. The message names both fixes
    (``tie_word_embeddings: false`` in config.json to use the stored head, or delete
    ``lm_head.weight`` to tie).
    """
    names = set(ckpt.names)
    expected = {}
    for m in mapping_for(cfg):
        for n in hf_names(m, cfg):
            expected[n] = resolve_shape(m.hf_shape, cfg)
    tied_head = "lm_head.weight" if cfg.tie_word_embeddings else None
    problems = []
    missing = sorted(set(expected) - names)
    if missing:
        hint = (" (config has tie_word_embeddings=false, so lm_head.weight is required)"
                if "lm_head.weight" in missing else "")
        problems.append(f"missing tensors{hint}: {missing}")
    unexpected = sorted(n for n in names - set(expected)
                        if n != tied_head and not n.endswith(_IGNORED_SUFFIXES))
    if unexpected:
        problems.append(f"unexpected tensors (not in a Qwen3 with this config): {unexpected}")
    if tied_head in names:
        expected[tied_head] = (cfg.vocab_size, cfg.hidden_size)
    for n in sorted(names & set(expected)):
        got = ckpt.shape(n)
        if got != expected[n]:
            problems.append(f"tensor {n}: checkpoint shape {got} != expected {expected[n]} from config")
    embed = "model.embed_tokens.weight"
    if not problems and tied_head in names and embed in names:
        diff = _max_abs_difference(ckpt, tied_head, embed)
        if diff != 0.0:
            problems.append(
                f"config.json has tie_word_embeddings=true but the checkpoint stores an {tied_head} that differs "
                f"from {embed} (max |difference| {diff:.4g}); transformers would use the stored head and vLLM "
                f"the embedding. Set \"tie_word_embeddings\": false in config.json to use the stored head, or "
                f"delete {tied_head} from the checkpoint to tie it to the embedding")
    if problems:
        raise ValueError(f"checkpoint {ckpt.path} does not match its config:\n  " + "\n  ".join(problems))


def _max_abs_difference(ckpt: HFCheckpoint, a: str, b: str, rows: int = 4096) -> float:
    """max |a - b| over two same-shape tensors, read ``rows`` rows at a time (NaN if either has NaN)."""
    out = 0.0
    n = ckpt.shape(a)[0]
    for start in range(0, n, rows):
        x = ckpt.get_rows(a, start, min(start + rows, n)).astype(np.float32)
        y = ckpt.get_rows(b, start, min(start + rows, n)).astype(np.float32)
        d = np.abs(x - y)
        out = max(out, float(d.max())) if not np.isnan(d).any() else float("nan")
        if out != out:
            break
    return out


def load_hf_checkpoint(path: str, cfg=None, shardings: Mapping | None = None, **runtime):
    """Loads an HF Qwen3 checkpoint directory into fp32 params, tensor by tensor.

    Args:
      path: directory with config.json and ``model.safetensors`` or
        ``model.safetensors.index.json`` + shards (float32 or bfloat16).
      cfg: the Qwen3Config; default ``Qwen3Config.from_pretrained(path, **runtime)``.
      shardings: optional params-shaped tree of ``jax.sharding.Sharding``; default: the first
        device. Each device shard is filled by a callback that reads only the tensors (layers)
        it needs, so host memory holds about one HF tensor plus one shard at a time.
    Returns ``(cfg, params)`` with params a tree of float32 ``jax.Array``.
    Raises ValueError (naming tensors and shapes) when the checkpoint does not match the config
    (see :func:`check_checkpoint`, tied heads included), or naming the tensor when a weight holds
    NaN/inf (a damaged checkpoint; it would make every logit NaN).
    """
    import jax

    if cfg is None:
        cfg = Qwen3Config.from_pretrained(path, **runtime)
    default = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    params: dict = {}
    with HFCheckpoint(path) as ckpt:
        check_checkpoint(ckpt, cfg)
        for m in mapping_for(cfg):
            our = resolve_shape(m.our_shape, cfg)
            names = hf_names(m, cfg)
            shape = ((len(names),) if m.stacked else ()) + our
            sharding = _get(shardings, m.path) if shardings is not None else default
            cache: dict[int, np.ndarray] = {}

            def layer(i, m=m, names=names, cache=cache):
                if i not in cache:
                    cache.clear()  # keep at most one converted tensor
                    arr = hf_to_ours(m, ckpt.get(names[i]), cfg).astype(np.float32)
                    bad = arr.size - int(np.count_nonzero(np.isfinite(arr)))
                    if bad:
                        raise ValueError(f"checkpoint {path}: tensor {names[i]} holds {bad} NaN/inf values; the "
                                         "checkpoint is damaged (re-export or re-download it)")
                    cache[i] = arr
                return cache[i]

            def fill(index, m=m, names=names, layer=layer):
                if not m.stacked:
                    return layer(0)[index]
                rows = range(len(names))[index[0]]
                return np.stack([layer(i)[index[1:]] for i in rows])

            arr = jax.make_array_from_callback(shape, sharding, fill)
            d = params
            for k in m.path[:-1]:
                d = d.setdefault(k, {})
            d[m.path[-1]] = arr
    return cfg, params


# --------------------------------------------------------------------------------------------
# Writing checkpoints
# --------------------------------------------------------------------------------------------

def save_hf_checkpoint(params: Mapping, cfg, out_dir: str, dtype: str = "bfloat16",
                       max_shard_bytes: int = 5 * 2**30, tokenizer_dir: str | None = None) -> list[str]:
    """Writes params as an HF checkpoint that ``AutoModelForCausalLM.from_pretrained`` loads.

    Writes ``model.safetensors`` (one shard) or ``model-0000k-of-0000n.safetensors`` +
    ``model.safetensors.index.json`` (shards of at most ``max_shard_bytes``, a single larger
    tensor gets its own shard), ``config.json`` (``cfg.to_hf_dict``) and, from
    ``tokenizer_dir``, the tokenizer / generation config files present there.
    Tensors are converted one at a time (:func:`params_to_hf_tensors`). Returns the file names.
    """
    from safetensors.numpy import save_file

    from jaxrl.fileio import umask_mode

    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"export dtype must be 'float32' or 'bfloat16', got {dtype!r}")
    os.makedirs(out_dir, exist_ok=True)
    shards: list[list[str]] = []
    tmp_files: list[str] = []
    buf: dict[str, np.ndarray] = {}
    size = 0
    total = 0

    def flush():
        nonlocal buf, size
        if buf:
            fn = f"tmp-{len(tmp_files):05d}.safetensors"
            save_file(buf, os.path.join(out_dir, fn), metadata={"format": "pt"})
            tmp_files.append(fn)
            shards.append(list(buf))
            buf, size = {}, 0

    for name, arr in params_to_hf_tensors(params, cfg, dtype):
        if buf and size + arr.nbytes > max_shard_bytes:
            flush()
        buf[name] = arr
        size += arr.nbytes
        total += arr.nbytes
    flush()
    n = len(tmp_files)
    files = [SAFE_SINGLE] if n == 1 else [f"model-{k + 1:05d}-of-{n:05d}.safetensors" for k in range(n)]
    for tmp, fn in zip(tmp_files, files):
        os.chmod(os.path.join(out_dir, tmp), umask_mode())  # safetensors writes 0600 whatever the umask
        os.replace(os.path.join(out_dir, tmp), os.path.join(out_dir, fn))
    stale = os.path.join(out_dir, SAFE_INDEX)
    if n > 1:
        index = {"metadata": {"total_size": total},
                 "weight_map": {name: fn for fn, names in zip(files, shards) for name in names}}
        with open(stale, "w") as f:
            json.dump(index, f, indent=2)
    elif os.path.exists(stale):
        os.remove(stale)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg.to_hf_dict(torch_dtype=dtype), f, indent=2)
    written = files + (["config.json", SAFE_INDEX] if n > 1 else ["config.json"])
    if tokenizer_dir is not None:
        for fn in TOKENIZER_FILES:
            src = os.path.join(tokenizer_dir, fn)
            if os.path.exists(src):
                shutil.copyfile(src, os.path.join(out_dir, fn))
                written.append(fn)
    return written
