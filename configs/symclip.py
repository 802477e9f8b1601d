"""Symmetric clip 0.2 / 0.2 with `seq_mean_token_sum_norm` (Dr. GRPO normalisation) and token TIS.

`max_seq_len` is the explicit per-sequence token budget the sum is normalised by (never the
padded width); token-level truncated importance sampling caps pi_old / mu at 2.0.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rloo  # noqa: E402


def get_config(scale: str = ""):
    c = rloo.get_config(scale)
    c.name = "symclip"
    a = c.trainer.algorithm
    a.eps_clip_low = 0.2
    a.eps_clip_high = 0.2
    a.loss_reduction = "seq_mean_token_sum_norm"
    a.max_seq_len = 128 if c.scale == "cpu" else 32768
    a.off_policy_correction.tis_ratio_type = "token"
    a.off_policy_correction.token_tis_ratio_clip_high = 2.0
    a.temperature = 1.0
    c.generator.sampling_params.temperature = 1.0  # the symclip seed run sampled at 1.0 / top-p 1 / no top-k
    c.generator.sampling_params.top_p = 1.0
    c.generator.sampling_params.top_k = -1
    return c
