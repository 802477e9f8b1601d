"""The value model (critic) of GAE: a Qwen3 decoder trunk with a scalar value head.

The trunk is the policy's architecture without its language-model head; the value head is a
linear map from the final-norm hidden state to one number (the usual RLHF critic: Ziegler et al.
2019, arXiv 1909.08593, §2; Ouyang et al. 2022; SkyRL's critic is an HF causal LM whose lm_head
is replaced by a `value_head`). It reuses the policy's code, layout and sharding:

* the trunk params have exactly the policy's layout and logical axes (:mod:`jaxrl.models.qwen3`
  docstring), so the same :data:`jaxrl.parallel.LOGICAL_AXIS_RULES` shard them and
  :func:`jaxrl.models.hf_io.load_hf_checkpoint` fills them from any Qwen3 HF checkpoint;
* the head adds ``value_head: {'kernel': [E] ('embed',), 'bias': [] ()}``, initialised to 0 (the
  first values are 0, so the first GAE advantages are the whitened reward-to-go);
* the forward pass is :func:`jaxrl.models.qwen3.hidden_states` (same remat, attention kernel and
  compute dtype), then the head in float32.

Param tree: ``{'embed_tokens', 'layers', 'norm'}`` as in qwen3 (no ``lm_head``) plus ``value_head``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl import parallel
from jaxrl.models import qwen3
from jaxrl.models.qwen3_config import Qwen3Config

VALUE_HEAD = "value_head"  # SkyRL's `value_head_prefix`


class ValueHead(nnx.Module):
    """``v = h · kernel + bias`` over the hidden size E; kernel ``[E]`` ('embed'), bias ``[]``."""

    def __init__(self, hidden_size: int):
        self.kernel = nnx.Param(jnp.zeros((hidden_size,), jnp.float32), logical_axes=("embed",))
        self.bias = nnx.Param(jnp.zeros((), jnp.float32), logical_axes=())


class Qwen3Critic(nnx.Module):
    """Qwen3 trunk + scalar value head. ``critic(tokens, positions, segment_ids)`` -> float32 values
    ``[B, T]``: the value of the state after each token (entry t sees tokens[:, :t+1])."""

    def __init__(self, cfg: Qwen3Config, rngs: nnx.Rngs):
        self.config = cfg
        self.embed_tokens = nnx.Param(qwen3._normal(rngs, (cfg.vocab_size, cfg.hidden_size)),
                                      logical_axes=("vocab", "embed"))
        self.layers = qwen3.Qwen3Layers(cfg, rngs)
        self.norm = qwen3.RMSNorm(cfg.hidden_size, "embed")
        setattr(self, VALUE_HEAD, ValueHead(cfg.hidden_size))

    def __call__(self, tokens, positions, segment_ids):
        return state_values(qwen3.to_params(self), self.config, tokens, positions, segment_ids)


def abstract_model(cfg: Qwen3Config) -> Qwen3Critic:
    """A critic module whose params are ShapeDtypeStructs (no memory allocated)."""
    return nnx.eval_shape(lambda: Qwen3Critic(cfg, nnx.Rngs(0)))


def abstract_params(cfg: Qwen3Config) -> dict:
    """Critic param tree of ``jax.ShapeDtypeStruct`` (float32)."""
    return nnx.state(abstract_model(cfg), nnx.Param).to_pure_dict()


def param_logical_axes(cfg: Qwen3Config) -> dict:
    """Critic param tree of logical-axis tuples (the trunk's are the policy's)."""
    return parallel.logical_axes_of(abstract_model(cfg))


def from_policy_params(policy_params: dict, cfg: Qwen3Config, head_sharding=None) -> dict:
    """Critic params whose trunk is (a reference to) ``policy_params``' trunk and whose head is 0.

    Args:
      policy_params: a Qwen3 param tree (e.g. from ``hf_io.load_hf_checkpoint``); its
        ``lm_head`` (if any) is dropped. The trunk arrays are reused as they are (same sharding);
        pass a tree loaded for the critic (the train step donates its buffers).
      cfg: the Qwen3Config of ``policy_params``.
      head_sharding: optional ``{'kernel': Sharding, 'bias': Sharding}`` for the new head.
    Returns: the critic param tree (float32).
    """
    params = {k: v for k, v in policy_params.items() if k != "lm_head"}
    shapes = abstract_params(cfg)[VALUE_HEAD]
    head = {}
    for name, s in shapes.items():
        zeros = jnp.zeros(s.shape, jnp.float32)
        head[name] = jax.device_put(zeros, head_sharding[name]) if head_sharding is not None else zeros
    params[VALUE_HEAD] = head
    return params


def state_values(params: dict, cfg: Qwen3Config, tokens, positions, segment_ids):
    """Values ``[B, T]`` float32 of the states after each token (inputs as
    :func:`jaxrl.models.qwen3.hidden_states`). The head runs in float32 on the compute-dtype hidden
    state; padding positions hold values of no state (mask them)."""
    h = qwen3.hidden_states(params, cfg, tokens, positions, segment_ids)
    head = params[VALUE_HEAD]
    return jnp.einsum("bte,e->bt", h.astype(jnp.float32), head["kernel"].astype(jnp.float32)) + head["bias"]


def values(params: dict, cfg: Qwen3Config, tokens, positions, segment_ids):
    """Target-aligned values ``[B, T-1]`` float32 (docs/architecture.md §3): entry t is the value of the state
    that predicts ``tokens[:, t+1]``, i.e. the state before the response token scored at entry t
    (SkyRL: ``values[:, :-1][:, -num_actions:]``). This is what GAE takes as V_t."""
    return state_values(params, cfg, tokens, positions, segment_ids)[:, :-1]


__all__ = ["VALUE_HEAD", "Qwen3Critic", "ValueHead", "abstract_model", "abstract_params", "from_policy_params",
           "param_logical_axes", "state_values", "values"]
