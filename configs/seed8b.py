"""The seed run `56GPU_qwen3_8b.yaml` (OpenThoughts-Agent, hpc/skyrl_yaml/jupiter/) key by key: RLOO-n,
clip 0.2 / 0.05, `sequence_mean`, token TIS capped at 2, no KL, fully asynchronous with staleness 16,
Terminus-2 on Harbor tasks at temperature 1.2 / top-p 0.95 / top-k 20, 80 steps. docs/recipes.md
("The seed run key by key") maps every key of the YAML to its jaxrl key, or says why it has none.

  python -m jaxrl.main --config=configs/seed8b.py:qwen3_8b --config.model.path=/ckpt/Qwen3-8B \\
      --config.data.dataset_path=/data/pymethods2test.parquet

The CPU scale is `configs/terminal.py`'s (the embedded terminal policy) with this objective.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import terminal  # noqa: E402


def get_config(scale: str = ""):
    c = terminal.get_config(scale)
    c.name = "seed8b"
    a = c.trainer.algorithm
    a.loss_reduction = "sequence_mean"
    a.use_kl_loss, a.kl_loss_coef = False, 0.0  # use_kl_loss: false, kl_loss_coef: 0.0
    a.off_policy_correction.tis_ratio_type = "token"  # use_tis: true
    a.off_policy_correction.token_tis_ratio_clip_high = 2.0  # tis_imp_ratio_cap: 2.0
    if c.scale != "cpu":
        c.trainer.async_rl.mode = "fully_async"
        c.trainer.async_rl.max_staleness_steps = 16
        c.trainer.num_steps = 80  # max_steps
        c.trainer.ckpt_interval = 2
    return c
