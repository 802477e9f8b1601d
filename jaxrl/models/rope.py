"""Rotary position embeddings: the default RoPE tables and YaRN context extension.

Imports no JAX at module level (`RopeScaling` is part of `jaxrl.models.qwen3_config.Qwen3Config`,
which the vLLM worker uses without JAX); `cos_sin` imports jax.numpy.

Default RoPE (Su et al. 2021, "RoFormer", eq. 15): the pair of dimensions (j, j + D/2) of a query
or key at position m is rotated by the angle m·θ_j with θ_j = base^(-2j/D), j = 0 .. D/2 - 1.

YaRN (Peng, Quesnelle, Fan, Shippole 2023, "YaRN: Efficient Context Window Extension of Large
Language Models", arXiv:2309.00071) extends a model trained on L = `original_max_position_embeddings`
positions by a scale s = `factor`:

* "NTK-by-parts" interpolation (§3.2): a dimension pair whose wavelength λ_j = 2π/θ_j fits
  many times into L (r = L/λ_j > β, high frequencies) keeps θ_j; one that fits less than α times
  (r < α, low frequencies) is interpolated to θ_j / s; in between the ramp γ blends the two:
  θ'_j = (1 - γ_j)·θ_j/s + γ_j·θ_j. As in the paper's reference code and in transformers
  (`_compute_yarn_parameters`), the ramp is linear in the dimension index j between the
  dimensions where r = β (`beta_fast`, default 32) and r = α (`beta_slow`, default 1):
  d(r) = D·ln(L / (2π r)) / (2 ln base), rounded outward (floor / ceil) when `truncate` (the
  default), clipped to [0, D - 1]; γ_j = 1 - clip((j - d(β)) / (d(α) - d(β)), 0, 1).
* attention temperature (§3.4): softmax(q·k / (t·√D)) with √(1/t) = 0.1·ln(s) + 1. It is applied
  by multiplying cos and sin by √(1/t) (`attention_factor`), which scales q·k by 1/t. transformers'
  `mscale` / `mscale_all_dim` variant (DeepSeek): √(1/t) = (0.1·mscale·ln s + 1) / (0.1·mscale_all_dim·ln s + 1).

Conventions checked against transformers 5.x (`modeling_rope_utils._compute_yarn_parameters`):
defaults beta_fast 32 and beta_slow 1 (a 0 or missing value takes the default), truncate True,
`attention_factor` overrides the formula, original_max_position_embeddings missing =
max_position_embeddings; `factor` is required (transformers' validation requires it too).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Optional

import numpy as np

ROPE_TYPES = ("default", "yarn")
_YARN_KEYS = {"rope_type", "type", "rope_theta", "factor", "original_max_position_embeddings", "attention_factor",
              "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"}


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """YaRN parameters (HF `rope_scaling` / `rope_parameters` with `rope_type: yarn`).

    Attributes:
      factor: s, the context extension (e.g. 4.0: 32,768 -> 131,072 positions); >= 1.
      original_max_position_embeddings: L, the context the model was trained on (Qwen3: 32,768).
      attention_factor: √(1/t); None = from `factor` (and `mscale` / `mscale_all_dim`).
      beta_fast, beta_slow: β and α of the ramp (rotations per L); beta_fast > beta_slow > 0.
      mscale, mscale_all_dim: transformers' optional attention-factor variant (module docstring).
      truncate: round the ramp's end dimensions outward to integers (transformers' default).
    """

    factor: float
    original_max_position_embeddings: int
    attention_factor: Optional[float] = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: Optional[float] = None
    mscale_all_dim: Optional[float] = None
    truncate: bool = True
    rope_type: str = "yarn"

    def __post_init__(self):
        def number(name, v, low, strict):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (
                    v <= low if strict else v < low):
                raise ValueError(f"rope_scaling.{name} must be a finite number {'>' if strict else '>='} {low}, "
                                 f"got {v!r}")
            return float(v)

        if self.rope_type != "yarn":
            raise ValueError(f"RopeScaling holds YaRN parameters; rope_type={self.rope_type!r}")
        object.__setattr__(self, "factor", number("factor", self.factor, 1.0, False))
        L = self.original_max_position_embeddings
        if isinstance(L, bool) or not isinstance(L, (int, np.integer)) or L <= 0:
            if not (isinstance(L, float) and L.is_integer() and L > 0):
                raise ValueError(f"rope_scaling.original_max_position_embeddings must be a positive integer, got {L!r}")
        object.__setattr__(self, "original_max_position_embeddings", int(L))
        object.__setattr__(self, "beta_fast", number("beta_fast", self.beta_fast, 0.0, True))
        object.__setattr__(self, "beta_slow", number("beta_slow", self.beta_slow, 0.0, True))
        if self.beta_fast <= self.beta_slow:
            raise ValueError(f"rope_scaling.beta_fast={self.beta_fast} must be greater than beta_slow={self.beta_slow}")
        for name in ("attention_factor", "mscale", "mscale_all_dim"):
            v = getattr(self, name)
            if v is not None:
                object.__setattr__(self, name, number(name, v, 0.0, True))
        if not isinstance(self.truncate, bool):
            raise ValueError(f"rope_scaling.truncate must be true or false, got {self.truncate!r}")

    @property
    def max_positions(self) -> int:
        """s·L: the positions the extended model covers (131,072 for Qwen3 with factor 4)."""
        return int(self.factor * self.original_max_position_embeddings)

    @classmethod
    def from_hf(cls, rope: Mapping, max_position_embeddings: int) -> Optional["RopeScaling"]:
        """The scaling of an HF config's `rope_scaling` (v4) or `rope_parameters` (v5) dict: None
        for default RoPE. Missing values as transformers fills them (module docstring).

        Raises:
          ValueError: a RoPE type other than default / yarn, an unknown YaRN key, a bad value.
        """
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ROPE_TYPES:
            raise ValueError(f"config rope type {rope_type!r} is not implemented (only {' and '.join(ROPE_TYPES)}); "
                             "fix rope_scaling / rope_parameters.rope_type in config.json")
        if rope_type == "default":
            return None
        unknown = sorted(set(rope) - _YARN_KEYS)
        if unknown:
            raise ValueError(f"config rope_scaling has key(s) {unknown} that YaRN does not take (it takes "
                             f"{sorted(_YARN_KEYS - {'type', 'rope_theta'})}); remove them from config.json")
        L = rope.get("original_max_position_embeddings") or max_position_embeddings
        factor = rope.get("factor")
        if factor is None:
            raise ValueError("config rope_scaling of type yarn has no 'factor' (transformers requires it); add e.g. "
                             "\"factor\": 4.0 (131,072 positions for Qwen3's 32,768)")
        kw = {k: rope[k] for k in ("attention_factor", "mscale", "mscale_all_dim") if rope.get(k) is not None}
        return cls(factor=factor, original_max_position_embeddings=L, beta_fast=rope.get("beta_fast") or 32.0,
                   beta_slow=rope.get("beta_slow") or 1.0, truncate=rope.get("truncate", True), **kw)

    def to_hf(self) -> dict:
        """The `rope_scaling` dict of config.json (transformers v4 keys; v5 and vLLM read them)."""
        d = {"rope_type": "yarn", "factor": self.factor,
             "original_max_position_embeddings": self.original_max_position_embeddings}
        if self.attention_factor is not None:
            d["attention_factor"] = self.attention_factor
        if self.beta_fast != 32.0:
            d["beta_fast"] = self.beta_fast
        if self.beta_slow != 1.0:
            d["beta_slow"] = self.beta_slow
        for k in ("mscale", "mscale_all_dim"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        if not self.truncate:
            d["truncate"] = False
        return d


def _yarn_mscale(s: float, m: float = 1.0) -> float:
    return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0


def yarn_attention_factor(scaling: RopeScaling) -> float:
    """√(1/t) of YaRN §3.4: 0.1·ln(s) + 1 (1 for s <= 1), or `attention_factor` when set, or the
    mscale / mscale_all_dim ratio when both are set."""
    if scaling.attention_factor is not None:
        return scaling.attention_factor
    if scaling.mscale and scaling.mscale_all_dim:
        return _yarn_mscale(scaling.factor, scaling.mscale) / _yarn_mscale(scaling.factor, scaling.mscale_all_dim)
    return _yarn_mscale(scaling.factor)


def yarn_ramp_range(head_dim: int, theta: float, scaling: RopeScaling) -> tuple[float, float]:
    """(low, high): the dimension indexes where r = L/λ equals beta_fast and beta_slow (module
    docstring), rounded outward when `truncate`, clipped to [0, head_dim - 1]."""
    L = scaling.original_max_position_embeddings

    def dim_of(rotations):  # d with L / λ_d = rotations, λ_d = 2π·theta^(2d/D)
        return head_dim * math.log(L / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(scaling.beta_fast), dim_of(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, head_dim - 1)


def inverse_frequencies(head_dim: int, theta: float, scaling: Optional[RopeScaling] = None) -> tuple[np.ndarray, float]:
    """RoPE inverse frequencies θ_j and the factor cos/sin are multiplied by.

    Args:
      head_dim: D (even). theta: the RoPE base (`rope_theta`). scaling: YaRN parameters or None.
    Returns:
      `(inv_freq [D/2] float32, attention_factor float)`: θ_j = theta^(-2j/D) and 1.0 without
      scaling; YaRN's blended θ'_j and √(1/t) with it (module docstring). Computed in float64,
      rounded once to float32.
    """
    j = np.arange(0, head_dim, 2, dtype=np.float64)
    base = theta ** (j / head_dim)
    inv = 1.0 / base
    if scaling is None:
        return inv.astype(np.float32), 1.0
    low, high = yarn_ramp_range(head_dim, theta, scaling)
    if low == high:
        high += 0.001  # a one-dimension ramp (as transformers does)
    ramp = np.clip((np.arange(head_dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    keep = 1.0 - ramp  # γ_j: 1 keeps θ_j (high frequency), 0 interpolates to θ_j / s
    inv = inv / scaling.factor * (1.0 - keep) + inv * keep
    return inv.astype(np.float32), float(yarn_attention_factor(scaling))


def cos_sin(positions, head_dim: int, theta: float, dtype, scaling: Optional[RopeScaling] = None):
    """RoPE tables for integer `positions [B, S]` -> `cos, sin [B, S, head_dim]` in `dtype`.

    Angles `pos · inv_freq` in float32, duplicated over the two halves (HF `cat(freqs, freqs)`),
    cos and sin multiplied by the attention factor in float32 (1 without scaling), then cast to
    the compute dtype, as transformers' Qwen3RotaryEmbedding does.
    """
    import jax.numpy as jnp

    inv, attention_factor = inverse_frequencies(head_dim, theta, scaling)
    ang = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv)
    emb = jnp.concatenate([ang, ang], axis=-1)
    cos, sin = jnp.cos(emb), jnp.sin(emb)
    if attention_factor != 1.0:
        cos, sin = cos * np.float32(attention_factor), sin * np.float32(attention_factor)
    return cos.astype(dtype), sin.astype(dtype)
