"""The main job: train a policy with a recipe.

  python -m jaxrl.main --config=configs/rloo.py [--config.KEY=VALUE ...] [--workdir=DIR]
  python -m jaxrl.main --config=configs/rloo.py:qwen3_8b --config.model.path=/ckpt/Qwen3-8B ...

Validates the config before any work starts, writes `workdir/rl_config.json` (default workdir:
runs/<recipe name>), and runs the RL loop (jaxrl.train.trainer). Rerunning the same command with
the same workdir resumes from the latest committed checkpoint. At the end it prints a summary
(best step, held-out success, wall time) and the paths of report.md and best/ (the HF export).
Usage errors (a bad key or value, a missing recipe file) print one line naming the problem and
exit with status 2.
"""
from __future__ import annotations

import os
import sys

from absl import flags
from ml_collections import config_flags

from jaxrl import cli

# The command's flags are registered by its entry point only (define_flags), so that several
# jaxrl commands (main, plan, evaluate, chat) can be imported into one process without absl's
# DuplicateFlagError on their shared names (--config, --model).
_CONFIG = None
_WORKDIR = None


def define_flags() -> None:
    """Registers this command's absl flags (called once, by `python -m` of this module)."""
    global _CONFIG, _WORKDIR
    _CONFIG = config_flags.DEFINE_config_file("config", None, "Recipe file, e.g. configs/rloo.py[:scale].",
                                              lock_config=True)
    _WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default: runs/<recipe name>).")


def main(argv):
    cli.handle_sigterm()  # SIGTERM ends the run like Ctrl-C: cleaned up, one line on how to resume
    try:
        _main(argv)
    except KeyboardInterrupt:  # before the run started (imports, config checks): nothing to clean up
        cli.interrupted_exit("the run")


def _main(argv):
    if len(argv) > 1:
        cli.usage_error(f"unexpected arguments: {argv[1:]}")
    if _CONFIG.value is None:
        cli.usage_error("--config is required, e.g. --config=configs/rloo.py")
    from jaxrl.config import ConfigError, check_inputs_first

    config = _CONFIG.value
    try:  # the inputs (model, data) and key types, before JAX is imported: a bad path fails in a second
        check_inputs_first(config)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except OSError:
        pass  # a recipe file that cannot be loaded is reported below
    from jaxrl import gpu_memory, parallel

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
        cli.recipe_load_error(e)
    workdir = _WORKDIR.value or os.path.join("runs", name)
    try:
        summary = _run_or_report_full_disk(trainer, config, workdir)
        import jax

        if jax.process_index() == 0:
            from jaxrl.train.report import summary_text

            print(summary_text(summary, workdir), flush=True)
    except (ConfigError, DatasetError, trainer.RunDirError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except SidecarError as e:
        from jaxrl.train.fleet import sidecar_fix_text

        print(f"error: rollout sidecar failed: {trainer.sidecar_error_text(e)}\n{sidecar_fix_text(e)}",
              file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (cli.Terminated) from a scheduler, on every process
        cli.interrupted_exit(f"{workdir} from its last checkpoint")


def _run_or_report_full_disk(trainer, config, workdir: str):
    """`trainer.run`; a write that fails for a full disk (anywhere: checkpoint, sync version, log,
    rollout, export) ends the run with one line naming the path and the fix, exit 1, after the
    trainer's own cleanup (sidecars and the producer stopped, checkpoints closed) and with every
    partial write of the run directory removed; committed checkpoints stay, so a rerun resumes."""
    from jaxrl import fileio

    try:
        return trainer.run(config, workdir)
    except Exception as e:  # noqa: BLE001 - anything else is re-raised unchanged
        path = fileio.disk_full_path(e, os.path.abspath(workdir))
        if path is None:
            raise
        import jax

        from jaxrl.train import rundir

        if jax.process_index() == 0:
            rundir.remove_partial_writes(os.path.abspath(workdir))
        hint = ("rerun the same command: it resumes from the last checkpoint" if _has_checkpoint(workdir)
                else "rerun the same command")
        print(f"error: {fileio.disk_full_message(path, os.path.abspath(workdir), hint, e)}", file=sys.stderr, flush=True)
        sys.exit(1)


def _has_checkpoint(workdir: str) -> bool:
    ckpts = os.path.join(workdir, "checkpoints")
    return os.path.isdir(ckpts) and any(name.isdigit() for name in os.listdir(ckpts))


if __name__ == "__main__":
    define_flags()
    cli.run(main, __doc__)
