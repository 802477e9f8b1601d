"""The Qwen3 configuration: :class:`Qwen3Config` (HF config.json <-> architecture plus runtime
settings), the released sizes (:data:`PRESETS`) and the accepted runtime values (:data:`DTYPES`,
:data:`REMAT_POLICIES`, :data:`ATTENTION_IMPLS`).

This module does **not** import JAX (only :attr:`Qwen3Config.compute_dtype` does, when read): the
vLLM worker and :mod:`jaxrl.models.hf_io` use the config in a process without JAX. It is
re-exported by :mod:`jaxrl.models.hf_io` and :mod:`jaxrl.models.qwen3`.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional

import numpy as np

from jaxrl.models.rope import RopeScaling

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

