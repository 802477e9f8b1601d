"""GRPO: group-normalised advantages (unbiased std), symmetric PPO clip 0.2 / 0.2, token-mean."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rloo  # noqa: E402


def get_config(scale: str = ""):
    c = rloo.get_config(scale)
    c.name = "grpo"
    a = c.trainer.algorithm
    a.advantage_estimator = "grpo"
    a.grpo_norm_by_std = True
    a.eps_clip_low = 0.2
    a.eps_clip_high = 0.2
    return c
