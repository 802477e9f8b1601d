"""The advantage stage's computation moved to `jaxrl.train.rl_step` (the RL step, stage by stage);
this module keeps the old import path of its two functions."""
from jaxrl.train.rl_step import next_kl_coef, step_advantages

__all__ = ["next_kl_coef", "step_advantages"]
