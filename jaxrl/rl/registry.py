"""Name → function registries for advantage estimators, policy losses and loss reductions.

Configs select the objective by string (`advantage_estimator`, `policy_loss_type`,
`loss_reduction`, as in SkyRL). A researcher adds a variant without editing the package:

    from jaxrl.rl import register_policy_loss

    @register_policy_loss("my_loss")
    def my_loss(logprobs, old_logprobs, advantages, loss_mask, config, rollout_logprobs):
        ...
        return per_token_loss, {"my_metric": per_token_values}

The expected signature of each kind of function is documented on its `register_*` decorator.
Registering a name that already exists raises unless `override=True`; looking up an unknown
name raises `ValueError` listing the valid names.

The tables are plain module-level dicts (the only mutable state in `jaxrl.rl`). They live in one
Python process: a function registered in a notebook or driver script is visible to everything
traced in that process, which is where the jitted train step is built.
"""
from __future__ import annotations

from typing import Callable, Dict, List

ADVANTAGE_ESTIMATORS: Dict[str, Callable] = {}
# Estimator kinds (names in ADVANTAGE_ESTIMATORS): token-level ones take per-token rewards and
# return (advantages, returns); those in NEEDS_VALUES also need a value model's predictions.
TOKEN_LEVEL_ESTIMATORS: set = set()
NEEDS_VALUES: set = set()
POLICY_LOSSES: Dict[str, Callable] = {}
LOSS_REDUCTIONS: Dict[str, Callable] = {}

_DECORATORS = {
    "advantage estimator": "register_advantage_estimator",
    "policy loss": "register_policy_loss",
    "loss reduction": "register_loss_reduction",
}


def _register(table: Dict[str, Callable], kind: str, name: str, override: bool):
    if not isinstance(name, str) or not name:
        raise ValueError(f"A {kind} name must be a non-empty string, got {name!r}.")

    def decorator(fn: Callable) -> Callable:
        if not callable(fn):
            raise TypeError(f"{_DECORATORS[kind]}({name!r}) must decorate a function, got {fn!r}.")
        if name in table and table[name] is not fn and not override:
            raise ValueError(
                f"{kind} {name!r} is already registered ({table[name].__module__}."
                f"{getattr(table[name], '__qualname__', table[name])}); pass override=True to "
                "replace it, or pick another name."
            )
        table[name] = fn
        return fn

    return decorator


def _lookup(table: Dict[str, Callable], kind: str, name: str) -> Callable:
    if name not in table:
        raise ValueError(
            f"Unknown {kind} {name!r}. Valid names: {', '.join(sorted(table))}. "
            f"Register a new one with @{_DECORATORS[kind]}({name!r})."
        )
    return table[name]


def register_advantage_estimator(name: str, *, override: bool = False, token_level: bool = False,
                                 needs_values: bool = False):
    """Decorator registering an advantage estimator.

    Outcome estimators (the default): `fn(rewards, group_ids, baseline_mask, config) -> advantages`.
    rewards: float32 [N] (one scalar per trajectory: the sum of its token rewards); group_ids:
    int [N]; baseline_mask: bool [N] (never None when called through `compute_advantages`);
    config: `AdvantageConfig`. Returns float32 [N]; `compute_advantages_and_returns` places it on
    the loss tokens and pairs it with the discounted reward-to-go as the returns.

    Token-level estimators (`token_level=True`): `fn(token_rewards, response_mask, loss_mask,
    group_ids, baseline_mask, values, config) -> (advantages, returns)`, every per-token array
    float32 / bool [N, T] target-aligned, already sanitised (0 where masked, rows with
    baseline_mask False removed from both masks); `values` is None unless `needs_values=True`
    (the estimator needs a value model: the trainer then creates a critic). Returns two float32
    [N, T] arrays, 0 outside the response.

    Either kind must be jittable for static shapes.
    """
    if needs_values and not token_level:
        raise ValueError(f"advantage estimator {name!r}: needs_values=True requires token_level=True.")

    def decorator(fn: Callable) -> Callable:
        fn = _register(ADVANTAGE_ESTIMATORS, "advantage estimator", name, override)(fn)
        (TOKEN_LEVEL_ESTIMATORS.add if token_level else TOKEN_LEVEL_ESTIMATORS.discard)(name)
        (NEEDS_VALUES.add if needs_values else NEEDS_VALUES.discard)(name)
        return fn

    return decorator


def register_policy_loss(name: str, *, override: bool = False):
    """Decorator registering a per-token policy loss.

    Signature: `fn(logprobs, old_logprobs, advantages, loss_mask, config, rollout_logprobs)
    -> (per_token_loss [N, T], metrics)`. All arrays are target-aligned float32 [N, T]; masked
    entries of the inputs have already been replaced by 0 (they are finite); loss_mask is bool;
    rollout_logprobs may be None; config is a `LossConfig`. `metrics` maps a name to a per-token
    float32 [N, T] array: `micro_batch_loss` reduces names ending in `_max` / `_min` by a max / min
    over loss tokens and every other name by the mini-batch token mean, so custom metrics combine
    over micro-batches like the built-in ones. The per-token loss must be finite everywhere; the
    reduction, the off-policy correction and the masking are applied by `micro_batch_loss`.
    """
    return _register(POLICY_LOSSES, "policy loss", name, override)


def register_loss_reduction(name: str, *, override: bool = False):
    """Decorator registering `fn(loss_mask, sequence_mask, config) -> weights`.

    loss_mask: float32 [N, T] of the WHOLE mini-batch (0/1); sequence_mask: float32 [N] (1 for
    a real sequence, 0 for a padding row); config: `LossConfig`. Returns float32 [N, T] per-token
    weights w, zero where loss_mask is 0, such that the mini-batch policy loss is Σ w·ℓ.
    """
    return _register(LOSS_REDUCTIONS, "loss reduction", name, override)


def get_advantage_estimator(name: str) -> Callable:
    """The advantage estimator registered as `name`; ValueError listing valid names if unknown."""
    return _lookup(ADVANTAGE_ESTIMATORS, "advantage estimator", name)


def is_token_level_estimator(name: str) -> bool:
    """True when the registered estimator `name` takes per-token rewards (ValueError if unknown)."""
    _lookup(ADVANTAGE_ESTIMATORS, "advantage estimator", name)
    return name in TOKEN_LEVEL_ESTIMATORS


def estimator_needs_values(name: str) -> bool:
    """True when the registered estimator `name` needs a value model (a critic); ValueError if unknown."""
    _lookup(ADVANTAGE_ESTIMATORS, "advantage estimator", name)
    return name in NEEDS_VALUES


def get_policy_loss(name: str) -> Callable:
    """The policy loss registered as `name`; ValueError listing valid names if unknown."""
    return _lookup(POLICY_LOSSES, "policy loss", name)


def get_loss_reduction(name: str) -> Callable:
    """The loss reduction registered as `name`; ValueError listing valid names if unknown."""
    return _lookup(LOSS_REDUCTIONS, "loss reduction", name)


def list_advantage_estimators() -> List[str]:
    return sorted(ADVANTAGE_ESTIMATORS)


def list_policy_losses() -> List[str]:
    return sorted(POLICY_LOSSES)


def list_loss_reductions() -> List[str]:
    return sorted(LOSS_REDUCTIONS)
