"""jaxrl.rl: RL objectives as pure jax.numpy functions of arrays.

advantages.py  outcome estimators (rloo, rloo_n, grpo, maxrl) and token-level ones with returns
               (reinforce_pp / reinforce++ with a discount, gae with a value model)
losses.py      the micro-batch loss and its metric rules; re-exports the five modules below
loss_config.py LossConfig (the objective's options) and what the trainer asks of it
reductions.py  mini-batch reductions (token_mean, sequence_mean, seq_mean_token_sum_norm) as loss
               weights, clip_cov / kl_cov's token selection
policy_losses.py  policy losses (regular, dual_clip, gspo, cispo, sapo, clip_cov, kl_cov)
kl_entropy.py  the KL (k1, k2, k3, abs) and entropy terms
off_policy.py  off-policy correction (TIS, outlier / token / sequence masks)
value.py       the critic's clipped value loss and explained variance
kl_control.py  KL penalty in the reward, fixed and adaptive KL controllers
registry.py    name → function tables; `register_*` decorators for custom variants

Nothing here imports jaxrl.train, jaxrl.rollout or jaxrl.envs.
"""
from jaxrl.rl.registry import (
    estimator_needs_values,
    get_advantage_estimator,
    is_token_level_estimator,
    get_loss_reduction,
    get_policy_loss,
    list_advantage_estimators,
    list_loss_reductions,
    list_policy_losses,
    register_advantage_estimator,
    register_loss_reduction,
    register_policy_loss,
)
from jaxrl.rl.advantages import (
    AdvantageConfig,
    broadcast_to_tokens,
    compute_advantages,
    compute_advantages_and_returns,
    discounted_returns,
    gae,
    gather_to_tokens,
    grpo,
    masked_whiten,
    maxrl,
    reinforce_pp,
    rloo,
    rloo_n,
)
from jaxrl.rl.losses import (
    LossConfig,
    LossWeights,
    combine_metrics,
    compute_loss_weights,
    covariance_selection,
    entropy_from_logits,
    kl_penalty,
    micro_batch_loss,
    minibatch_loss,
    needs_reference_model,
    off_policy_correction,
    split_rows,
)
from jaxrl.rl.value import explained_variance, value_loss
from jaxrl.rl.kl_control import kl_penalized_rewards, update_kl_coef
