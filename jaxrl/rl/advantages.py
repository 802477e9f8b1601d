"""Group-relative outcome advantage estimators (one scalar reward per trajectory).

Inputs, shared by every estimator:
  rewards:       float [N], the trajectory's scalar (outcome) reward.
  group_ids:     int [N], the group (prompt) of each trajectory. Ids are arbitrary integers and a
                 group's members need not be contiguous in the batch.
  baseline_mask: optional bool [N]; False marks a trajectory that failed for infrastructure
                 reasons (sandbox crash, timeout, ...). It is excluded from every group and batch
                 statistic and gets advantage 0. None means all True.

All estimators are jittable for a static N. Groups are found with `jnp.unique(group_ids,
size=N, return_inverse=True)`, which maps the ids to dense indices in [0, N) (at most N groups),
followed by `jax.ops.segment_sum` over N segments: O(N log N), no static group count needed.

Non-finite rewards: a NaN/inf reward of a baseline-eligible trajectory raises ValueError (outside
jit; it would make its whole group NaN); excluded trajectories (baseline_mask False) never
contribute, whatever their reward.

Exactness: group statistics are computed on rewards shifted by the largest eligible reward of
the group (the batch for `reinforce_pp`). Centred statistics do not depend on the shift, and a
group whose rewards are all equal then gives exactly A = 0 (not a rounding residue).

Differences from SkyRL (skyrl_train `ppo_utils` advantage estimators), all deliberate:
  * `baseline_mask` does not exist there (a failed trajectory's reward takes part in the group
    baseline); here it removes the trajectory from the statistics of every estimator.
  * `reinforce_pp` whitens over trajectories, not over response tokens (see its docstring).
  * Advantages are per trajectory [N]; use `broadcast_to_tokens` / `gather_to_tokens` to place
    them on target-aligned token arrays.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.rl.registry import get_advantage_estimator, register_advantage_estimator

GRPO_EPSILON = 1e-6  # SkyRL's hard-coded epsilon in (std + eps)
WHITEN_EPSILON = 1e-8  # SkyRL masked_whiten: (x - mean) * rsqrt(var + 1e-8)


@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
    """Options of the advantage estimators (hashable, so it can be a static jit argument).

    Attributes:
      advantage_estimator: registry name: "rloo", "rloo_n", "grpo", "reinforce_pp" or a custom
        one registered with `register_advantage_estimator`.
      grpo_norm_by_std: GRPO divides by (group std + 1e-6) when True (SkyRL default); False is
        Dr. GRPO (mean-centring only).
      group_advantage_min_size: `rloo_n` gives A = 0 to every member of a group with fewer than
        this many baseline-eligible members. Must be >= 2 (RLOO needs one other member).
    """

    advantage_estimator: str = "rloo_n"
    grpo_norm_by_std: bool = True
    group_advantage_min_size: int = 2

    def __post_init__(self):
        if not isinstance(self.group_advantage_min_size, int) or self.group_advantage_min_size < 2:
            raise ValueError(
                f"group_advantage_min_size must be an int >= 2 (RLOO needs at least one other "
                f"eligible member for the baseline), got {self.group_advantage_min_size!r}."
            )


def _validate(rewards, group_ids, baseline_mask):
    rewards = jnp.asarray(rewards)
    group_ids = jnp.asarray(group_ids)
    if rewards.ndim != 1:
        raise ValueError(f"rewards must have shape [N], got {rewards.shape}.")
    if group_ids.shape != rewards.shape:
        raise ValueError(f"group_ids must have the shape of rewards {rewards.shape}, got {group_ids.shape}.")
    if not jnp.issubdtype(group_ids.dtype, jnp.integer):
        raise ValueError(f"group_ids must be integers, got dtype {group_ids.dtype}.")
    if baseline_mask is None:
        baseline_mask = jnp.ones(rewards.shape, bool)
    baseline_mask = jnp.asarray(baseline_mask)
    if baseline_mask.shape != rewards.shape:
        raise ValueError(
            f"baseline_mask must have the shape of rewards {rewards.shape}, got {baseline_mask.shape}."
        )
    _check_finite(rewards, baseline_mask)
    return rewards.astype(jnp.float32), group_ids, baseline_mask.astype(bool)


def _check_finite(rewards, baseline_mask):
    """Raises ValueError for a NaN/inf reward of a baseline-eligible member (it would spread to its
    whole group). Excluded members may hold anything. Skipped under jit (traced values)."""
    try:
        r = np.asarray(rewards, np.float64)
        eligible = np.asarray(baseline_mask, bool)
    except jax.errors.TracerArrayConversionError:
        return
    bad = np.flatnonzero(eligible & ~np.isfinite(r))
    if bad.size:
        raise ValueError(f"rewards must be finite: reward[{bad[0]}] = {r[bad[0]]} ({bad.size} non-finite among the "
                         "baseline-eligible trajectories); fix the reward function, or exclude the trajectory "
                         "with baseline_mask=False")


def _group_stats(rewards, group_ids, eligible):
    """Per-member statistics of its group over eligible members.

    Returns (count, centred, sum_centred, sum_sq_dev), each [N] and gathered back to members:
    count = eligible members in the group; centred = r - shift (shift = the group's largest
    eligible reward, 0 for a group without eligible members); sum_centred = Σ_eligible centred;
    sum_sq_dev = Σ_eligible (r - group mean)^2.
    """
    n = rewards.shape[0]
    _, idx = jnp.unique(group_ids, size=n, return_inverse=True)
    idx = idx.reshape(n)
    count = jax.ops.segment_sum(eligible.astype(jnp.float32), idx, num_segments=n)
    shift = jax.ops.segment_max(jnp.where(eligible, rewards, -jnp.inf), idx, num_segments=n)
    shift = jnp.where(count > 0, shift, 0.0)
    centred = jnp.where(eligible, rewards - shift[idx], 0.0)
    sum_c = jax.ops.segment_sum(centred, idx, num_segments=n)
    mean_c = sum_c / jnp.maximum(count, 1.0)
    dev = jnp.where(eligible, centred - mean_c[idx], 0.0)
    sum_sq = jax.ops.segment_sum(dev * dev, idx, num_segments=n)
    return count[idx], centred, sum_c[idx], sum_sq[idx]


@register_advantage_estimator("rloo")
def rloo(rewards, group_ids, baseline_mask=None, config: AdvantageConfig = AdvantageConfig()):
    """REINFORCE leave-one-out (Kool et al. 2019, "Buy 4 REINFORCE samples, get a baseline for
    free!"; Ahmadian et al. 2024, eq. 5): A_i = r_i − (1/(n−1)) Σ_{j≠i, j in group} r_j.

    n counts the baseline-eligible members of the group; excluded members get A = 0 and are not in
    anyone's baseline. A group with one eligible member gets A = 0 (SkyRL: [1] → [0]).

    Args: rewards float [N]; group_ids int [N]; baseline_mask optional bool [N]; config unused.
    Returns: float32 [N].
    """
    rewards, group_ids, eligible = _validate(rewards, group_ids, baseline_mask)
    return _rloo(rewards, group_ids, eligible, min_size=2)


@register_advantage_estimator("rloo_n")
def rloo_n(rewards, group_ids, baseline_mask=None, config: AdvantageConfig = AdvantageConfig()):
    """RLOO over the n baseline-eligible members of each group (RLOO-n).

    A_i = r_i − mean of the OTHER eligible members of i's group, for eligible i in a group with
    n >= `config.group_advantage_min_size` eligible members; A_i = 0 otherwise (excluded member,
    or too few eligible members for a trustworthy baseline). With min size 2 this equals `rloo`.

    Args: rewards float [N]; group_ids int [N]; baseline_mask optional bool [N];
      config.group_advantage_min_size (>= 2).
    Returns: float32 [N].
    """
    rewards, group_ids, eligible = _validate(rewards, group_ids, baseline_mask)
    return _rloo(rewards, group_ids, eligible, min_size=config.group_advantage_min_size)


def _rloo(rewards, group_ids, eligible, min_size):
    count, centred, sum_c, _ = _group_stats(rewards, group_ids, eligible)
    # r_i - (S - r_i)/(n-1), in shifted coordinates (the shift cancels).
    loo_mean = (sum_c - centred) / jnp.maximum(count - 1.0, 1.0)
    valid = eligible & (count >= min_size)
    return jnp.where(valid, centred - loo_mean, 0.0)


@register_advantage_estimator("grpo")
def grpo(rewards, group_ids, baseline_mask=None, config: AdvantageConfig = AdvantageConfig()):
    """GRPO group-normalised advantage (Shao et al. 2024, DeepSeekMath, §4.1.2).

    A_i = (r_i − mean_G) / (std_G + 1e-6), std_G the UNBIASED (n−1) sample std of the eligible
    members (torch.std, as SkyRL). `config.grpo_norm_by_std=False` gives Dr. GRPO (Liu et al.
    2025, "Understanding R1-Zero-like training", eq. 3): A_i = r_i − mean_G.

    A group with ONE eligible member follows SkyRL: mean := 0 and std := 1, so A = r/(1 + 1e-6)
    (A = r without std normalisation); it is never NaN. All-equal rewards give A = 0 exactly.
    Excluded members (baseline_mask False) get A = 0 and are not in the statistics.

    Args: rewards float [N]; group_ids int [N]; baseline_mask optional bool [N]; config.
    Returns: float32 [N].
    """
    rewards, group_ids, eligible = _validate(rewards, group_ids, baseline_mask)
    count, centred, sum_c, sum_sq = _group_stats(rewards, group_ids, eligible)
    mean_c = sum_c / jnp.maximum(count, 1.0)
    centred_adv = centred - mean_c
    single = count < 2
    if config.grpo_norm_by_std:
        std = jnp.sqrt(sum_sq / jnp.maximum(count - 1.0, 1.0))
        adv = jnp.where(single, rewards / (1.0 + GRPO_EPSILON), centred_adv / (std + GRPO_EPSILON))
    else:
        adv = jnp.where(single, rewards, centred_adv)
    return jnp.where(eligible, adv, 0.0)


@register_advantage_estimator("reinforce_pp")
def reinforce_pp(rewards, group_ids, baseline_mask=None, config: AdvantageConfig = AdvantageConfig()):
    """REINFORCE++ with an outcome reward (Hu 2025, arXiv 2501.03262, §3): batch-whitened
    returns, no group baseline (group_ids are not used).

    A_i = (r_i − mean) · rsqrt(var + 1e-8), mean and var over the eligible trajectories of the
    batch, var with Bessel's correction (Σ(r − mean)² / (n − 1)).

    Deliberate differences from SkyRL (`compute_reinforce_plus_plus_outcome_advantage`): SkyRL
    whitens the per-token returns over all response tokens, so each trajectory weighs by its
    response length; here every trajectory weighs 1 (the return of an outcome reward with γ=1 is
    the same on every token of a trajectory). SkyRL raises when the batch has one token; here a
    batch with fewer than 2 eligible trajectories gives A = 0.

    Args: rewards float [N]; group_ids int [N] (shape-checked only); baseline_mask optional bool [N].
    Returns: float32 [N].
    """
    rewards, group_ids, eligible = _validate(rewards, group_ids, baseline_mask)
    count = jnp.sum(eligible.astype(jnp.float32))
    shift = jnp.where(count > 0, jnp.max(jnp.where(eligible, rewards, -jnp.inf)), 0.0)
    centred = jnp.where(eligible, rewards - shift, 0.0)
    mean = jnp.sum(centred) / jnp.maximum(count, 1.0)
    dev = jnp.where(eligible, centred - mean, 0.0)
    var = jnp.sum(dev * dev) / jnp.maximum(count - 1.0, 1.0)
    adv = dev * jax.lax.rsqrt(var + WHITEN_EPSILON)
    return jnp.where(eligible & (count >= 2), adv, 0.0)


def compute_advantages(rewards, group_ids, baseline_mask=None, config: AdvantageConfig = AdvantageConfig()):
    """Run the estimator named by `config.advantage_estimator` (see the registry).

    Args: rewards float [N]; group_ids int [N]; baseline_mask optional bool [N] (None = all True).
    Returns: float32 [N] per-trajectory advantages.
    Raises: ValueError for an unknown estimator name (listing the valid ones) or bad shapes.
    """
    fn = get_advantage_estimator(config.advantage_estimator)
    rewards, group_ids, eligible = _validate(rewards, group_ids, baseline_mask)
    return fn(rewards, group_ids, eligible, config)


def broadcast_to_tokens(values, loss_mask):
    """Place one value per row on that row's loss tokens.

    Args: values float [N] (e.g. per-trajectory advantages); loss_mask [N, T-1] target-aligned
      (bool or 0/1), one trajectory per row.
    Returns: float32 [N, T-1]: values[i] where loss_mask[i, t], else 0.
    """
    values = jnp.asarray(values, jnp.float32)
    loss_mask = jnp.asarray(loss_mask)
    if values.ndim != 1 or loss_mask.ndim != 2 or loss_mask.shape[0] != values.shape[0]:
        raise ValueError(
            f"broadcast_to_tokens needs values [N] and loss_mask [N, T]; got {values.shape} and "
            f"{loss_mask.shape}. For rows packing several trajectories use gather_to_tokens."
        )
    return jnp.where(loss_mask.astype(bool), values[:, None], 0.0)


def gather_to_tokens(values, token_sequence_index, loss_mask):
    """Place per-trajectory values on packed rows.

    Args:
      values: float [S], one value per trajectory.
      token_sequence_index: int [N, T-1], target-aligned: the index in `values` of the trajectory
        whose token is predicted at (n, t) (e.g. built from `segment_ids[:, 1:]` and the packing
        table), or -1 where no trajectory.
      loss_mask: [N, T-1] (bool or 0/1).
    Returns: float32 [N, T-1]: values[index] on loss tokens with 0 <= index < S, else 0.
      (An index >= S cannot raise inside jit; the packer must only emit indices < S or -1.)
    """
    values = jnp.asarray(values, jnp.float32)
    index = jnp.asarray(token_sequence_index)
    loss_mask = jnp.asarray(loss_mask)
    if values.ndim != 1 or index.shape != loss_mask.shape or index.ndim != 2:
        raise ValueError(
            f"gather_to_tokens needs values [S] and token_sequence_index, loss_mask [N, T]; got "
            f"{values.shape}, {index.shape}, {loss_mask.shape}."
        )
    valid = loss_mask.astype(bool) & (index >= 0) & (index < values.shape[0])
    return jnp.where(valid, values[jnp.clip(index, 0, values.shape[0] - 1)], 0.0)


__all__ = [
    "AdvantageConfig",
    "broadcast_to_tokens",
    "compute_advantages",
    "gather_to_tokens",
    "grpo",
    "reinforce_pp",
    "rloo",
    "rloo_n",
]
