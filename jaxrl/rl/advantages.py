"""Advantage estimators: group-relative outcome estimators and token-level ones with returns.

Two kinds (see `register_advantage_estimator`):
  * outcome estimators (rloo, rloo_n, grpo, maxrl) map one scalar per trajectory to one
    advantage per trajectory (`compute_advantages`);
  * token-level estimators (reinforce_pp / "reinforce++", gae) take per-token rewards (and for gae
    a value model's predictions) and return per-token advantages AND returns.
`compute_advantages_and_returns` runs either kind on target-aligned token arrays and is what the
trainer calls; for outcome estimators it sums each row's token rewards into its score.

Inputs of the outcome estimators:
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

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.config.algorithm import ALGORITHM
from jaxrl.config.field import schema_dataclass
from jaxrl.rl import registry
from jaxrl.rl.registry import get_advantage_estimator, register_advantage_estimator

GRPO_EPSILON = 1e-6  # SkyRL's hard-coded epsilon in (std + eps)
MAXRL_EPSILON = 1e-6  # SkyRL's epsilon in (mean + eps)
WHITEN_EPSILON = 1e-8  # SkyRL masked_whiten: (x - mean) * rsqrt(var + 1e-8)


@schema_dataclass(ALGORITHM, "advantage")
class AdvantageConfig:
    """Options of the advantage estimators (hashable, so it can be a static jit argument).

    Its fields, defaults and per-field checks are the `trainer.algorithm` keys declared with owner
    "advantage" in jaxrl/config/algorithm.py (`schema_dataclass`); none is declared here.

    Attributes:
      advantage_estimator: registry name: "rloo", "rloo_n", "grpo", "maxrl", "reinforce_pp" (alias
        "reinforce++"), "gae" (needs a value model) or a custom one (`register_advantage_estimator`).
      grpo_norm_by_std: GRPO divides by (group std + 1e-6) when True (SkyRL default); False is
        Dr. GRPO (mean-centring only).
      group_advantage_min_size: `rloo_n` gives A = 0 to every member of a group with fewer than
        this many baseline-eligible members. Must be >= 2 (RLOO needs one other member).
      gamma: discount γ in [0, 1] of the returns (reinforce_pp, gae, and the returns reported for
        outcome estimators); SkyRL `gamma`, default 1.
      lambd: GAE's λ in [0, 1] (bias/variance trade-off; 1 = Monte-Carlo returns minus V, 0 = one-step
        TD); SkyRL `lambd`, default 1.
    """


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


@register_advantage_estimator("maxrl")
def maxrl(rewards, group_ids, baseline_mask=None, config: AdvantageConfig = AdvantageConfig()):
    """MaxRL: group advantage normalised by the group's MEAN reward (Tajwar et al. 2026,
    "Maximum Likelihood Reinforcement Learning", arXiv 2602.02710; SkyRL `maxrl`, PR #1126).

    A_i = (r_i − mean_G) / (mean_G + 1e-6) for a group with n >= 2 eligible members; with binary
    rewards mean_G is the group's success rate p̂, so successes get (1 − p̂)/p̂ and failures −1: the
    gradient of log p (maximum likelihood of success) rather than of p. A group with one eligible
    member gets A = r_i (SkyRL: mean := 0); all-equal rewards (e.g. all 0) give A = 0 exactly.
    Excluded members (baseline_mask False) get A = 0 and are not in the statistics.

    Rewards must be >= 0 (success rates): a negative eligible reward raises ValueError outside jit
    (the normaliser mean_G + 1e-6 could be 0 or negative); use grpo or rloo for signed rewards.

    Args: rewards float [N]; group_ids int [N]; baseline_mask optional bool [N]; config unused.
    Returns: float32 [N].
    """
    rewards, group_ids, eligible = _validate(rewards, group_ids, baseline_mask)
    _check_non_negative(rewards, eligible, "maxrl")
    count, centred, sum_c, _ = _group_stats(rewards, group_ids, eligible)
    mean_c = sum_c / jnp.maximum(count, 1.0)
    shift = rewards - centred  # the group's largest eligible reward, on eligible members
    mean = shift + mean_c
    adv = (centred - mean_c) / (mean + MAXRL_EPSILON)
    return jnp.where(eligible, jnp.where(count < 2, rewards, adv), 0.0)


def _check_non_negative(rewards, baseline_mask, name):
    try:
        r = np.asarray(rewards, np.float64)
        eligible = np.asarray(baseline_mask, bool)
    except jax.errors.TracerArrayConversionError:
        return
    bad = np.flatnonzero(eligible & (r < 0))
    if bad.size:
        raise ValueError(f"{name} needs rewards >= 0 (it divides by the group's mean reward): reward[{bad[0]}] = "
                         f"{r[bad[0]]}; use advantage_estimator='grpo' or 'rloo' for signed rewards")


# --------------------------------------------------------------------------------------------
# Token-level estimators: per-token rewards, returns, discounting, a value model
# --------------------------------------------------------------------------------------------


def discounted_returns(token_rewards, response_mask, gamma: float):
    """Reward-to-go G_t = r_t + γ·G_{t+1} along each row's response (Sutton & Barto 2018, eq. 3.8).

    The recursion runs over `response_mask` positions only: G_t = 0 where the mask is 0, and a
    position after which the mask is 0 (the response's last token) starts the sum (G_{T} := 0).
    Computed with a log-depth associative scan over the linear recurrence x_t = a_t·x_{t+1} + b_t.

    Args: token_rewards float [N, T]; response_mask [N, T] (bool or 0/1; one contiguous response per
      row); gamma float in [0, 1].
    Returns: float32 [N, T].
    """
    m = jnp.asarray(response_mask).astype(bool)
    r = jnp.where(m, jnp.asarray(token_rewards, jnp.float32), 0.0)
    nxt = jnp.concatenate([m[:, 1:], jnp.zeros_like(m[:, :1])], axis=1)
    return _reverse_linear_scan(jnp.where(nxt, jnp.float32(gamma), 0.0), r) * m


def _reverse_linear_scan(a, b):
    """x_t = a_t·x_{t+1} + b_t over the last axis, x_T := 0 (a, b float32 [N, T])."""
    def combine(left, right):  # forward order over the flipped axis: right applies after left
        a1, b1 = left
        a2, b2 = right
        return a2 * a1, a2 * b1 + b2

    _, x = jax.lax.associative_scan(combine, (a[:, ::-1], b[:, ::-1]), axis=1)
    return x[:, ::-1]


def masked_whiten(values, mask):
    """(x − mean) · rsqrt(var + 1e-8) over the entries where `mask` is True (SkyRL masked_whiten).

    mean and var over all masked entries of the batch, var with Bessel's correction
    Σ(x − mean)² / (n − 1). Fewer than 2 masked entries give 0 (SkyRL raises). The statistics are
    taken on values shifted by their largest masked entry, so equal values whiten to exactly 0.
    Returns float32 like `values`, 0 where `mask` is False.
    """
    mask = jnp.asarray(mask).astype(bool)
    x = jnp.asarray(values, jnp.float32)
    count = jnp.sum(mask.astype(jnp.float32))
    shift = jnp.where(count > 0, jnp.max(jnp.where(mask, x, -jnp.inf)), 0.0)
    centred = jnp.where(mask, x - shift, 0.0)
    mean = jnp.sum(centred) / jnp.maximum(count, 1.0)
    dev = jnp.where(mask, centred - mean, 0.0)
    var = jnp.sum(dev * dev) / jnp.maximum(count - 1.0, 1.0)
    return jnp.where(mask & (count >= 2), dev * jax.lax.rsqrt(var + WHITEN_EPSILON), 0.0)


@register_advantage_estimator("reinforce_pp", token_level=True)
def reinforce_pp(token_rewards, response_mask, loss_mask, group_ids=None, baseline_mask=None, values=None,
                 config: AdvantageConfig = AdvantageConfig()):
    """REINFORCE++ (Hu 2025, arXiv 2501.03262, §3; SkyRL `reinforce++`): discounted returns
    whitened over the whole batch, no group baseline (group_ids are not used).

    G_t = r_t + γ·G_{t+1} over each response (`discounted_returns`, γ = config.gamma);
    A = masked_whiten(G) over the loss tokens of the batch's eligible rows (Bessel-corrected
    variance, + 1e-8); A = 0 off the loss tokens and on rows with baseline_mask False.

    Deliberate difference from SkyRL: the statistics are over LOSS tokens (SkyRL: response
    tokens, which in multi-turn also hold observation tokens); with fewer than 2 loss tokens in
    the batch A = 0 (SkyRL raises).

    Args: token_rewards float [N, T]; response_mask, loss_mask [N, T]; group_ids unused; baseline_mask
      optional bool [N]; values unused; config.gamma.
    Returns: (advantages, returns) float32 [N, T]; returns are the raw discounted G.
    """
    m, lm, r, _ = _token_inputs(token_rewards, response_mask, loss_mask, baseline_mask)
    returns = discounted_returns(r, m, config.gamma)
    return masked_whiten(returns, lm), returns


register_advantage_estimator("reinforce++", token_level=True)(reinforce_pp)  # SkyRL's name


@register_advantage_estimator("gae", token_level=True, needs_values=True)
def gae(token_rewards, response_mask, loss_mask, group_ids=None, baseline_mask=None, values=None,
        config: AdvantageConfig = AdvantageConfig()):
    """Generalised advantage estimation with a value model (Schulman et al. 2016, arXiv
    1506.02438, eq. 16; SkyRL `gae`).

    δ_t = r_t + γ·V_{t+1} − V_t and A_t = δ_t + γλ·A_{t+1} along each response, with V and A
    after the response's last token := 0 (γ = config.gamma, λ = config.lambd). returns = A + V (the
    λ-return, the critic's regression target); advantages = masked_whiten(A) over the loss tokens of
    the batch's eligible rows, 0 elsewhere.

    `values[:, t]` is the critic's value of the state that predicts token t+1 (target-aligned,
    like every per-token array): the value before the response token scored at entry t.

    Deliberate difference from SkyRL: whitening over loss tokens (SkyRL: response tokens) and the
    advantages are 0 off them (SkyRL leaves whitened values there, which no loss reads).

    Args: token_rewards, values float [N, T]; response_mask, loss_mask [N, T]; group_ids unused;
      baseline_mask optional bool [N]; config.gamma, config.lambd.
    Returns: (advantages, returns) float32 [N, T].
    Raises: ValueError when values is None.
    """
    if values is None:
        raise ValueError("gae needs values [N, T] from a value model (the trainer's critic).")
    m, lm, r, v = _token_inputs(token_rewards, response_mask, loss_mask, baseline_mask, values)
    nxt = jnp.concatenate([m[:, 1:], jnp.zeros_like(m[:, :1])], axis=1)
    next_v = jnp.where(nxt, jnp.concatenate([v[:, 1:], jnp.zeros_like(v[:, :1])], axis=1), 0.0)
    delta = jnp.where(m, r + config.gamma * next_v - v, 0.0)
    raw = _reverse_linear_scan(jnp.where(nxt, jnp.float32(config.gamma * config.lambd), 0.0), delta) * m
    returns = jnp.where(m, raw + v, 0.0)
    return masked_whiten(raw, lm), returns


def _token_inputs(token_rewards, response_mask, loss_mask, baseline_mask, values=None):
    """Sanitised masks and arrays: response/loss masks without excluded rows; r, v 0 off the response."""
    m = jnp.asarray(response_mask).astype(bool)
    lm = jnp.asarray(loss_mask).astype(bool)
    if baseline_mask is not None:
        keep = jnp.asarray(baseline_mask).astype(bool)[:, None]
        m, lm = m & keep, lm & keep
    lm = lm & m
    r = jnp.where(m, jnp.asarray(token_rewards, jnp.float32), 0.0)
    v = None if values is None else jnp.where(m, jnp.asarray(values, jnp.float32), 0.0)
    return m, lm, r, v


def compute_advantages_and_returns(token_rewards, response_mask, group_ids, *, loss_mask=None, baseline_mask=None,
                                   values=None, config: AdvantageConfig = AdvantageConfig()):
    """Advantages and returns of every registered estimator, on target-aligned token arrays.

    Outcome estimators (rloo, rloo_n, grpo, maxrl, custom ones) see one score per trajectory,
    s_i = Σ_t r_{i,t} over its response (SkyRL: `token_level_rewards.sum(-1)`), and their
    advantage is placed on the row's loss tokens; their returns are the discounted reward-to-go
    G_t (`discounted_returns`, γ = config.gamma; SkyRL returns the advantages instead). Token-level
    estimators (reinforce_pp / reinforce++, gae) compute both themselves.

    Args:
      token_rewards: float [N, T], target-aligned: the reward received after the token scored at
        entry t (an outcome reward sits on the trajectory's last generated token; a KL-in-reward
        penalty adds per-token terms).
      response_mask: [N, T] bool or 0/1: every response token (generated and observation tokens),
        one contiguous span per row; the discounting runs along it.
      group_ids: int [N], the prompt of each row (outcome estimators).
      loss_mask: [N, T], the trained tokens (subset of response_mask); None = response_mask.
      baseline_mask: optional bool [N]: False rows (failed trajectories) are left out of every
        statistic and get advantage and return 0.
      values: float [N, T] critic values (target-aligned), required iff the estimator needs them.
      config: AdvantageConfig.
    Returns: (advantages, returns), float32 [N, T]; advantages are 0 off the loss tokens, returns 0
      off the response.
    Non-finite values: a NaN/inf token reward on an eligible row's response raises ValueError
      (outside jit); NaN/inf at masked positions (off the response, excluded rows) never leak;
      non-finite critic values on the response reach the advantages (a model fault, not hidden).
    Raises: ValueError for an unknown estimator, bad shapes, missing values, non-finite rewards.
    """
    fn = get_advantage_estimator(config.advantage_estimator)
    token_rewards = jnp.asarray(token_rewards)
    response_mask = jnp.asarray(response_mask)
    if token_rewards.ndim != 2 or response_mask.shape != token_rewards.shape:
        raise ValueError(f"token_rewards and response_mask must be [N, T] of one shape, got {token_rewards.shape} "
                         f"and {response_mask.shape}.")
    loss_mask = response_mask if loss_mask is None else jnp.asarray(loss_mask)
    for name, x in (("loss_mask", loss_mask), ("values", values)):
        if x is not None and jnp.shape(x) != token_rewards.shape:
            raise ValueError(f"{name} must have the shape of token_rewards {token_rewards.shape}, got {jnp.shape(x)}.")
    n = token_rewards.shape[0]
    group_ids = jnp.asarray(group_ids)
    if group_ids.shape != (n,) or not jnp.issubdtype(group_ids.dtype, jnp.integer):
        raise ValueError(f"group_ids must be integers of shape [{n}], got {group_ids.dtype} {group_ids.shape}.")
    eligible = jnp.ones((n,), bool) if baseline_mask is None else jnp.asarray(baseline_mask).astype(bool)
    if eligible.shape != (n,):
        raise ValueError(f"baseline_mask must have shape [{n}], got {eligible.shape}.")
    _check_finite_tokens(token_rewards, response_mask, eligible)
    if registry.estimator_needs_values(config.advantage_estimator) and values is None:
        raise ValueError(f"advantage_estimator={config.advantage_estimator!r} needs values [N, T] from a value model.")
    if registry.is_token_level_estimator(config.advantage_estimator):
        m, lm, r, v = _token_inputs(token_rewards, response_mask, loss_mask, eligible, values)
        adv, ret = fn(r, m, lm, group_ids, eligible, v, config)
        return jnp.where(lm, adv, 0.0), jnp.where(m, ret, 0.0)
    m, lm, r, _ = _token_inputs(token_rewards, response_mask, loss_mask, eligible)
    scores = jnp.sum(r, axis=1)
    adv = fn(scores, group_ids, eligible, config)
    return jnp.where(lm, adv[:, None], 0.0), discounted_returns(r, m, config.gamma)


def _check_finite_tokens(token_rewards, response_mask, eligible):
    """ValueError naming the first NaN/inf token reward on an eligible row's response (outside jit)."""
    try:
        r = np.asarray(token_rewards, np.float64)
        m = np.asarray(response_mask).astype(bool) & np.asarray(eligible, bool)[:, None]
    except jax.errors.TracerArrayConversionError:
        return
    bad = np.argwhere(m & ~np.isfinite(r))
    if bad.size:
        i, t = bad[0]
        raise ValueError(f"token rewards must be finite: token_rewards[{i}, {t}] = {r[i, t]} ({len(bad)} non-finite "
                         "on eligible responses); fix the reward function, or exclude the trajectory with "
                         "baseline_mask=False")


def compute_advantages(rewards, group_ids, baseline_mask=None, config: AdvantageConfig = AdvantageConfig()):
    """Run the OUTCOME estimator named by `config.advantage_estimator` on one reward per trajectory.

    Args: rewards float [N]; group_ids int [N]; baseline_mask optional bool [N] (None = all True).
    Returns: float32 [N] per-trajectory advantages.
    Raises: ValueError for an unknown estimator name (listing the valid ones), a token-level
      estimator (reinforce_pp, gae: use `compute_advantages_and_returns`) or bad shapes.
    """
    fn = get_advantage_estimator(config.advantage_estimator)
    if registry.is_token_level_estimator(config.advantage_estimator):
        raise ValueError(f"{config.advantage_estimator!r} is a token-level estimator (per-token rewards, returns); "
                         "call compute_advantages_and_returns(token_rewards, response_mask, group_ids, ...)")
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
    "compute_advantages_and_returns",
    "discounted_returns",
    "gae",
    "gather_to_tokens",
    "grpo",
    "masked_whiten",
    "maxrl",
    "reinforce_pp",
    "rloo",
    "rloo_n",
]
