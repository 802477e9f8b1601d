"""The main job: `python -m jaxrl.main --config=configs/rloo.py [--config.a.b=value] [--workdir=DIR]`.

Validates the config before any work starts, writes `workdir/rl_config.json`, and runs the RL
loop (jaxrl.train.trainer). Rerunning the same command with the same workdir resumes from the
latest committed checkpoint.
"""
from __future__ import annotations

import os
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Recipe file, e.g. configs/rloo.py[:scale].",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default: runs/<recipe name>).")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _CONFIG.value is None:
        raise app.UsageError("--config is required, e.g. --config=configs/rloo.py")
    from jaxrl import parallel
    from jaxrl.config import ConfigError

    parallel.maybe_initialize_distributed()  # multi-host runs (JAXRL_* or SLURM env); no-op otherwise
    from jaxrl.train import trainer

    config = _CONFIG.value
    workdir = _WORKDIR.value or os.path.join("runs", config.name)
    try:
        trainer.run(config, workdir)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    app.run(main)
