"""Training checkpoints (Orbax): params, optimizer state and the trainer state, committed atomically.

Layout: `workdir/checkpoints/<step>/{params, opt_state, trainer_state}` written by an Orbax
`CheckpointManager`. Orbax writes each step into a temporary directory and renames it when
complete, so a run killed mid-save leaves the previous step as the latest committed one.
Retention: the last `max_to_keep` steps plus the step with the best reward EMA.

`trainer_state` is JSON: step, data-iterator position, reward-EMA state, policy version,
learning-rate scale, rollbacks, the best checkpoint — everything a resumed run needs to continue
exactly (all randomness derives from the seed and the step, so no RNG state is needed).
"""
from __future__ import annotations

import os
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp

_BEST_METRIC = "reward_ema"


class CheckpointStore:
    """Saves and restores training state under `workdir/checkpoints`.

    Args:
      workdir: the run directory.
      max_to_keep: the most recent steps to keep (the best-EMA step is kept in addition).
      async_save: write in a background thread (call `wait()` before reading the files).
    """

    def __init__(self, workdir: str, max_to_keep: int = 2, async_save: bool = True):
        self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
        pp = ocp.checkpoint_managers.preservation_policy
        policy = pp.AnyPreservationPolicy([
            pp.LatestN(n=max_to_keep),
            pp.BestN(get_metric_fn=lambda m: m[_BEST_METRIC], reverse=False, n=1,
                     keep_checkpoints_without_metrics=False),
        ])
        options = ocp.CheckpointManagerOptions(
            preservation_policy=policy,
            enable_async_checkpointing=async_save,
            create=True,
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options,
                                             item_names=("params", "opt_state", "trainer_state"))

    def latest_step(self) -> Optional[int]:
        """The newest committed step, or None when there is none."""
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def save(self, step: int, params: Any, opt_state: Any, trainer_state: dict[str, Any], reward_ema: float) -> None:
        """Starts saving one step (returns before the write finishes when async).

        Args:
          step: RL step number (the directory name).
          params, opt_state: pytrees of jax arrays (sharded arrays are written shard by shard).
          trainer_state: JSON-serializable dict.
          reward_ema: the metric that decides which checkpoint is the best.
        """
        self.manager.save(
            step,
            args=ocp.args.Composite(
                params=ocp.args.StandardSave(params),
                opt_state=ocp.args.StandardSave(opt_state),
                trainer_state=ocp.args.JsonSave(trainer_state),
            ),
            metrics={_BEST_METRIC: float(reward_ema)},
        )

    def wait(self) -> None:
        """Blocks until any pending asynchronous save is committed."""
        self.manager.wait_until_finished()

    def restore(self, step: int, abstract_params: Any, abstract_opt_state: Any) -> tuple[Any, Any, dict[str, Any]]:
        """Restores (params, opt_state, trainer_state) of `step` into the given shapes/shardings.

        `abstract_*` are pytrees of `jax.ShapeDtypeStruct` carrying shardings (or concrete arrays,
        whose shape, dtype and sharding are used).

        Raises:
          FileNotFoundError: when `step` has no committed checkpoint.
        """
        if step not in self.manager.all_steps():
            raise FileNotFoundError(f"no committed checkpoint for step {step} in {self.directory}; "
                                    f"available: {self.all_steps()}")

        def as_abstract(tree):
            return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
                                tree)

        out = self.manager.restore(
            step,
            args=ocp.args.Composite(
                params=ocp.args.StandardRestore(as_abstract(abstract_params)),
                opt_state=ocp.args.StandardRestore(as_abstract(abstract_opt_state)),
                trainer_state=ocp.args.JsonRestore(),
            ),
        )
        return out["params"], out["opt_state"], dict(out["trainer_state"])

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
