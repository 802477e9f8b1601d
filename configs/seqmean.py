"""The loss-reduction ablation: the default RLOO recipe with `sequence_mean` instead of `token_mean`."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rloo  # noqa: E402


def get_config(scale: str = ""):
    c = rloo.get_config(scale)
    c.name = "seqmean"
    c.trainer.algorithm.loss_reduction = "sequence_mean"
    return c
