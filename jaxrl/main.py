"""The main job: `python -m jaxrl.main --config=configs/rloo.py [--config.a.b=value] [--workdir=DIR]`.

Validates the config before any work starts, writes `workdir/rl_config.json`, and runs the RL
loop (jaxrl.train.trainer). Rerunning the same command with the same workdir resumes from the
latest committed checkpoint. Usage errors (a bad key or value, a missing recipe file) print one
line naming the problem and exit with status 2.
"""
from __future__ import annotations

import os
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Recipe file, e.g. configs/rloo.py[:scale].",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default: runs/<recipe name>).")


def parse_flags(argv):
    """absl flag parsing with one-line errors: an unknown `--config.*` key, a bad value or a
    missing recipe file exits 2 with the message instead of a traceback."""
    try:
        return flags.FLAGS(argv)
    except Exception as e:  # ml_collections raises AttributeError/KeyError/ValueError, absl flags.Error
        print(f"error: {_one_line(e)}", file=sys.stderr)
        sys.exit(2)


def _one_line(e: Exception) -> str:
    """The useful line of a flag-parsing error (ml_collections embeds tracebacks in its messages)."""
    msg = e.args[0] if e.args and isinstance(e.args[0], str) else str(e)
    if "Traceback" in msg:  # keep the final "SomeError: message" line of the embedded traceback
        last = [line for line in msg.strip().splitlines() if line.strip()][-1]
        msg = last.split(": ", 1)[1] if ": " in last else last
    msg = msg.replace("\\'", "'").replace("\\n", " ").strip().strip("'\"")
    if isinstance(e, (AttributeError, KeyError)):
        msg = f"unknown config key: {msg} (check the spelling against configs/*.py and jaxrl/config.py)"
    return msg


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _CONFIG.value is None:
        raise app.UsageError("--config is required, e.g. --config=configs/rloo.py")
    from jaxrl import gpu_memory, parallel
    from jaxrl.config import ConfigError

    try:  # the trainer's share of each GPU, before any JAX backend starts
        gpu_memory.apply_trainer_env(_CONFIG.value)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except OSError:
        pass  # a recipe file that cannot be loaded is reported below
    parallel.maybe_initialize_distributed()  # multi-host runs (JAXRL_* or SLURM env); no-op otherwise
    from jaxrl.envs import DatasetError
    from jaxrl.rollout.client import SidecarError
    from jaxrl.train import trainer

    config = _CONFIG.value
    try:
        name = config.name
    except OSError as e:  # ml_collections defers a missing/broken recipe file to the first access
        print(f"error: {str(e).splitlines()[-1].strip()}: the --config recipe file could not be loaded",
              file=sys.stderr)
        sys.exit(2)
    workdir = _WORKDIR.value or os.path.join("runs", name)
    try:
        trainer.run(config, workdir)
    except (ConfigError, DatasetError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except SidecarError as e:
        print(f"error: rollout sidecar failed: {e}\nRerun the same command to resume from the last checkpoint.",
              file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print(f"\ninterrupted; rerun the same command to resume {workdir} from its last checkpoint",
              file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
