"""jaxrl.rl: RL objectives as pure jax.numpy functions of arrays.

advantages.py  group-relative outcome estimators (rloo, rloo_n, grpo, reinforce_pp)
losses.py      policy losses (regular, dual_clip, gspo, cispo), mini-batch reductions
               (token_mean, sequence_mean, seq_mean_token_sum_norm), KL, entropy,
               off-policy correction (TIS, outlier / token / sequence masks), metrics
registry.py    name → function tables; `register_*` decorators for custom variants

Nothing here imports jaxrl.train, jaxrl.rollout or jaxrl.envs.
"""
from jaxrl.rl.registry import (
    get_advantage_estimator,
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
    gather_to_tokens,
    grpo,
    reinforce_pp,
    rloo,
    rloo_n,
)
from jaxrl.rl.losses import (
    LossConfig,
    LossWeights,
    combine_metrics,
    compute_loss_weights,
    entropy_from_logits,
    kl_penalty,
    micro_batch_loss,
    minibatch_loss,
    needs_reference_model,
    off_policy_correction,
    split_rows,
)
