"""Default recipe: RLOO-n advantages, PPO-clip with asymmetric clip 0.2 / 0.05, token-mean, no KL.

  python -m jaxrl.main --config=configs/rloo.py               # CPU scale: embedded policy + arithmetic
  python -m jaxrl.main --config=configs/rloo.py:qwen3_8b \\
      --config.model.path=/ckpt/Qwen3-8B --config.generator.sidecar_urls='("http://node1:8000",)'

Any key can be overridden on the command line: --config.trainer.optimizer.lr=1e-5.
"""
from jaxrl.config import base_config, apply_scale


def get_config(scale: str = ""):
    c = base_config()
    c.name = "rloo"
    a = c.trainer.algorithm
    a.advantage_estimator = "rloo_n"
    a.policy_loss_type = "regular"
    a.loss_reduction = "token_mean"
    a.eps_clip_low = 0.2
    a.eps_clip_high = 0.05
    a.kl_loss_coef = 0.0  # no KL, no reference model
    c.trainer.optimizer.lr = 8e-6
    c.trainer.optimizer.max_grad_norm = 0.9
    c.trainer.train_batch_size = 64
    c.generator.n_samples_per_prompt = 8
    return apply_scale(c, scale)
