"""HF checkpoints <-> jaxrl Qwen3: config.json (:class:`Qwen3Config`) and safetensors through
one declarative mapping table.

:data:`MAPPING` lists, for every param (path in the pure-dict tree of
:mod:`jaxrl.models.qwen3`), its HF tensor name (``{i}`` = layer index for params stacked over
layers), whether the HF ``[out, in]`` matrix is transposed, and both layouts as symbolic shapes.
Conversion of one tensor is: HF -> (transpose) -> reshape to our per-layer shape, and back.

This module does **not** import JAX at module level: the vLLM worker uses :data:`MAPPING`,
:func:`hf_to_ours`, :func:`ours_to_hf` and :func:`params_to_hf_tensors` (which accepts numpy
params) inside a process without JAX; :class:`Qwen3Config` (re-exported by :mod:`jaxrl.models.qwen3`)
is defined here for the same reason. Only :func:`load_hf_checkpoint` imports JAX.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import shutil
from typing import Iterator, Mapping, Optional

import numpy as np

from jaxrl.models.rope import RopeScaling

SAFE_INDEX = "model.safetensors.index.json"
SAFE_SINGLE = "model.safetensors"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                   "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
                   "generation_config.json")
# Buffers some exporters write that are not parameters (recomputed from the config).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


# --------------------------------------------------------------------------------------------
# Config (HF config.json <-> Qwen3Config); lives here so it is importable without JAX.
# --------------------------------------------------------------------------------------------

DTYPES = ("float32", "bfloat16")
REMAT_POLICIES = ("none", "full", "save_dots", "save_attention", "save_dots_attention")
# "cudnn_no_fallback" is internal: the cuDNN kernel without the layout check, which the train step
# selects for batches it has checked (see jaxrl.models.attention.cudnn_attention).
ATTENTION_IMPLS = ("xla", "cudnn", "splash", "cudnn_no_fallback")



@dataclasses.dataclass(frozen=True)
class Qwen3Config:
    """Qwen3 architecture (HF config.json field names) plus runtime settings.

    Architecture fields mirror HF ``Qwen3Config``; ``head_dim`` is explicit (never
    hidden_size / num_attention_heads, which is wrong for 0.6B and 4B).

    Runtime fields (not part of the checkpoint):
      dtype: compute dtype, ``'float32'`` or ``'bfloat16'``; params are always fp32 masters and
        are cast to this dtype for every matmul; logits/logprobs are always float32.
      remat: ``'none'`` (keep all activations), ``'full'`` (recompute each layer in the backward
        pass; ``nothing_saveable``), ``'save_dots'`` (keep matmul outputs without batch dims;
        ``dots_with_no_batch_dims_saveable``), ``'save_attention'`` (keep only the attention
        output and log-sum-exp) or ``'save_dots_attention'`` (both); see
        ``jaxrl.models.qwen3.remat_policy``.
      attention: training/logprob attention kernel (:mod:`jaxrl.models.attention`): ``'xla'``
        (blocked flash attention in plain JAX, any backend, any dtype), ``'cudnn'`` (fused cuDNN
        flash attention on NVIDIA GPUs; 16-bit dtypes) or ``'splash'`` (Pallas TPU kernel).
      attention_block: query/key positions per block of the ``'xla'`` kernel (and the splash
        kernel's block size, rounded to a multiple of 128).

    ``rope_scaling`` is config.json's YaRN scaling (:class:`jaxrl.models.rope.RopeScaling`) or
    None for default RoPE. As in transformers and vLLM (0.32), ``max_position_embeddings`` is the
    context the model covers, YaRN's extended one included (131,072 for Qwen3 with factor 4);
    :attr:`yarn_context_hint` says when config.json sets it lower than the scaling covers.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960
    tie_word_embeddings: bool = False
    bos_token_id: int | None = 151643
    eos_token_id: int | tuple[int, ...] | None = 151645
    dtype: str = "bfloat16"
    remat: str = "full"
    attention: str = "xla"
    attention_block: int = 512
    rope_scaling: Optional[RopeScaling] = None

    def __post_init__(self):
        for f in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"):
            v = getattr(self, f)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"Qwen3Config.{f} must be a positive integer, got {v!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"Qwen3Config.num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}")
        if self.head_dim % 2:
            raise ValueError(f"Qwen3Config.head_dim={self.head_dim} must be even for rotary embeddings")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"Qwen3Config.rms_norm_eps must be > 0, got {self.rms_norm_eps}")
        if not self.rope_theta > 0:
            raise ValueError(f"Qwen3Config.rope_theta must be > 0, got {self.rope_theta}")
        if self.dtype not in DTYPES:
            raise ValueError(f"Qwen3Config.dtype={self.dtype!r}; expected one of {sorted(DTYPES)}")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"Qwen3Config.remat={self.remat!r}; expected one of {REMAT_POLICIES}")
        if self.attention not in ATTENTION_IMPLS:
            raise ValueError(f"Qwen3Config.attention={self.attention!r}; expected one of {ATTENTION_IMPLS}")
        if not isinstance(self.attention_block, (int, np.integer)) or self.attention_block <= 0:
            raise ValueError(f"Qwen3Config.attention_block must be a positive integer, got {self.attention_block!r}")
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))

    @property
    def yarn_context_hint(self) -> str:
        """"" or, when YaRN covers more positions than ``max_position_embeddings`` (Qwen's model
        card adds only rope_scaling to config.json), how to use them: one sentence."""
        if self.rope_scaling is None or self.rope_scaling.max_positions <= self.max_position_embeddings:
            return ""
        return (f"config.json's YaRN rope_scaling covers {self.rope_scaling.max_positions} positions: set "
                f"\"max_position_embeddings\": {self.rope_scaling.max_positions} there to use them (transformers "
                "and vLLM take max_position_embeddings as the extended context, and vLLM refuses a longer "
                "--max-model-len)")

    @property
    def compute_dtype(self):
        """The jnp dtype of activations and matmul inputs."""
        import jax.numpy as jnp

        return jnp.dtype(self.dtype)

    def replace(self, **kw) -> "Qwen3Config":
        """A copy with fields replaced (validated again)."""
        return dataclasses.replace(self, **kw)

    # ---- HF config.json ---------------------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, d: dict, **runtime) -> "Qwen3Config":
        """Reads an HF config.json dict (transformers v4 ``rope_theta``/``rope_scaling`` keys or
        v5 ``rope_parameters``). ``runtime`` sets dtype/remat/attention.

        Raises ValueError for a model_type other than qwen3, a missing field, biases, sliding
        window attention, a non-SiLU activation, or a RoPE scaling type other than default and
        yarn (:meth:`jaxrl.models.rope.RopeScaling.from_hf`).
        """
        mt = d.get("model_type", "qwen3")
        if mt != "qwen3":
            raise ValueError(f"config model_type={mt!r}; only dense 'qwen3' is supported")
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        if not isinstance(rope, dict):
            raise ValueError(f"config rope_scaling / rope_parameters must be a JSON object or null, got {rope!r}")
        scaling = RopeScaling.from_hf(rope, int(d.get("max_position_embeddings", 40960)))
        theta = rope.get("rope_theta", d.get("rope_theta"))
        if theta is None:
            raise ValueError("config has neither rope_theta nor rope_parameters.rope_theta")
        if d.get("attention_bias", False):
            raise ValueError("config attention_bias=true is not supported (Qwen3 has no biases)")
        if d.get("use_sliding_window", False):
            raise ValueError("config use_sliding_window=true is not supported")
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config hidden_act={d.get('hidden_act')!r}; only 'silu' is supported")
        kw = {}
        for f in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "head_dim"):
            if f not in d:
                raise ValueError(f"config.json has no {f!r} (head_dim is never derived from hidden_size)")
            kw[f] = int(d[f])
        for f in ("rms_norm_eps", "max_position_embeddings", "tie_word_embeddings", "bos_token_id",
                  "eos_token_id"):
            if f in d:
                kw[f] = d[f]
        kw["rope_theta"] = float(theta)
        kw["rope_scaling"] = scaling
        kw["tie_word_embeddings"] = bool(d.get("tie_word_embeddings", False))
        return cls(**kw, **runtime)

    @classmethod
    def from_pretrained(cls, path: str, **runtime) -> "Qwen3Config":
        """Reads ``path/config.json`` (or ``path`` itself if it is a file); see :meth:`from_hf_dict`."""
        fn = os.path.join(path, "config.json") if os.path.isdir(path) else path
        with open(fn) as f:
            try:
                d = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{fn}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}). Fix: restore "
                                 "the checkpoint's config.json") from None
        return cls.from_hf_dict(d, **runtime)

    def to_hf_dict(self, torch_dtype: str = "bfloat16") -> dict:
        """An HF config.json dict for ``Qwen3ForCausalLM`` (v4-style keys, which v5 also reads)."""
        eos = list(self.eos_token_id) if isinstance(self.eos_token_id, tuple) else self.eos_token_id
        return {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling.to_hf() if self.rope_scaling is not None else None,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": self.num_hidden_layers,
            "initializer_range": 0.02,
            "use_cache": True,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
            "torch_dtype": torch_dtype,
        }

    @classmethod
    def preset(cls, name: str, **overrides) -> "Qwen3Config":
        """The config of a released Qwen3 size: one of :data:`PRESETS` (e.g. ``'8B'``, ``'tiny'``)."""
        if name not in PRESETS:
            raise ValueError(f"unknown Qwen3 preset {name!r}; expected one of {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})


_COMMON = dict(vocab_size=151936, head_dim=128, num_key_value_heads=8, max_position_embeddings=40960,
               rope_theta=1_000_000.0, rms_norm_eps=1e-6)
# Shapes of the released Qwen/Qwen3-* config.json files.
PRESETS: dict[str, dict] = {
    "0.6B": dict(_COMMON, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, tie_word_embeddings=True),
    "1.7B": dict(_COMMON, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                 num_attention_heads=16, tie_word_embeddings=True),
    "4B": dict(_COMMON, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
               num_attention_heads=32, tie_word_embeddings=True),
    "8B": dict(_COMMON, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
               num_attention_heads=32, tie_word_embeddings=False),
    "14B": dict(_COMMON, hidden_size=5120, intermediate_size=17408, num_hidden_layers=40,
                num_attention_heads=40, tie_word_embeddings=False),
    "32B": dict(_COMMON, hidden_size=5120, intermediate_size=25600, num_hidden_layers=64,
                num_attention_heads=64, tie_word_embeddings=False),
    "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                 rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                 dtype="float32", remat="none"),
}


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


# --------------------------------------------------------------------------------------------
# The prompt format of an exported policy (chat template defaults + generation config)
# --------------------------------------------------------------------------------------------

_FORMAT_BEGIN = "{#- jaxrl prompt format "
_FORMAT_END = "{#- end of the jaxrl prompt format -#}\n"
_JINJA_UNSAFE = set('\\"{}%#') | {chr(i) for i in range(0x20)} | {"\x7f"}


def _jinja_string(text: str) -> str:
    """`text` as a double-quoted Jinja string literal that also cannot close a tag or comment.

    Jinja decodes string literals with Python's `unicode-escape` (after `backslashreplace` of
    non-ASCII characters), so backslash, quote, control and template-syntax characters are
    written as `\\xNN` and every other character as itself."""
    return '"' + "".join(f"\\x{ord(ch):02x}" if ch in _JINJA_UNSAFE else ch for ch in text) + '"'


def bake_prompt_format(template: str, system_prompt: str | None, enable_thinking: bool) -> str:
    """A chat template whose defaults are a policy's training prompt format.

    A block put in front of `template` (replacing a block an earlier export put there):
    `enable_thinking` defaults to the training value when the caller does not pass it (Qwen3's
    template treats "not passed" as thinking on), and a conversation that does not start with a
    system message gets `system_prompt` in front (none when it is None). A caller who passes
    `enable_thinking` or a system message of its own gets exactly what it asked for. The block's
    first line is a comment holding the format as JSON (`read_prompt_format`).
    """
    import re as _re

    template = strip_prompt_format(template)
    prompt = _re.sub(r"[#{}%]", lambda m: f"\\u{ord(m.group(0)):04x}", json.dumps(system_prompt))  # inside a comment
    meta = f'{{"system_prompt": {prompt}, "enable_thinking": {"true" if enable_thinking else "false"}}}'
    lines = [f"{_FORMAT_BEGIN}{meta}: defaults of the prompt format this policy was trained with -#}}\n",
             "{%- if enable_thinking is not defined %}{%- set enable_thinking = "
             f"{'true' if enable_thinking else 'false'} %}}{{%- endif %}}\n"]
    if system_prompt is not None:
        lines.append("{%- if messages and messages[0]['role'] != 'system' %}{%- set messages = [{'role': 'system', "
                     f"'content': {_jinja_string(system_prompt)}}}] + messages %}}{{%- endif %}}\n")
    return "".join(lines) + _FORMAT_END + template


def strip_prompt_format(template: str) -> str:
    """`template` without the block `bake_prompt_format` put in front of it (unchanged if none)."""
    if template.startswith(_FORMAT_BEGIN) and _FORMAT_END in template:
        return template[template.index(_FORMAT_END) + len(_FORMAT_END):]
    return template


def read_prompt_format(template: str) -> dict | None:
    """`{"system_prompt": str | None, "enable_thinking": bool}` baked into `template` by
    `bake_prompt_format`, or None for a template without that block."""
    if not template.startswith(_FORMAT_BEGIN):
        return None
    meta = template[len(_FORMAT_BEGIN):template.index("\n")]
    return json.JSONDecoder().raw_decode(meta)[0]


def write_prompt_format(out_dir: str, system_prompt: str | None, enable_thinking: bool,
                        generation: Mapping | None = None, template: str | None = None) -> list[str]:
    """Makes an exported checkpoint reproduce its training prompt format by default.

    With `template` (the chat template the run rendered with, e.g. the `keep_thinking` one of
    `jaxrl.envs.chat`), it replaces the copied checkpoint's chat templates first. Then bakes the
    format (`bake_prompt_format`) into every chat template of `out_dir` (the
    `chat_template` of tokenizer_config.json and `chat_template.jinja`, whichever exist; both
    are read by transformers and vLLM), and merges `generation` into generation_config.json
    (created if missing); keys whose value is None are removed (e.g. `temperature` for greedy
    decoding, which transformers rejects next to `do_sample=False`). Each file is replaced
    atomically. Returns the names of the files written.

    Raises:
      ValueError: `out_dir` has no chat template (an exported policy needs one to be prompted).
    """
    from jaxrl.fileio import atomic_write_json, atomic_write_text

    written = []
    tc_path = os.path.join(out_dir, "tokenizer_config.json")
    jinja_path = os.path.join(out_dir, "chat_template.jinja")
    if os.path.exists(tc_path):
        with open(tc_path) as f:
            tc = json.load(f)
        if isinstance(tc.get("chat_template"), str):
            tc["chat_template"] = bake_prompt_format(template if template is not None else tc["chat_template"],
                                                     system_prompt, enable_thinking)
            atomic_write_json(tc_path, tc)
            written.append("tokenizer_config.json")
    if os.path.exists(jinja_path):
        with open(jinja_path) as f:
            text = f.read() if template is None else template
            atomic_write_text(jinja_path, bake_prompt_format(text, system_prompt, enable_thinking))
        written.append("chat_template.jinja")
    if not written:
        raise ValueError(f"{out_dir}: no chat template (tokenizer_config.json 'chat_template' or chat_template.jinja)"
                         "; export from a checkpoint whose tokenizer has one")
    if generation is not None:
        gen_path = os.path.join(out_dir, "generation_config.json")
        gen = {}
        if os.path.exists(gen_path):
            with open(gen_path) as f:
                gen = json.load(f)
        gen.update(generation)
        atomic_write_json(gen_path, {k: v for k, v in gen.items() if v is not None})
        written.append("generation_config.json")
    return written
