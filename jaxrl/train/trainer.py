"""The RL loop (docs/architecture.md §1): rollouts through the sidecar fleet, advantages, PPO updates on the
mesh, weight publication, evaluation, checkpoints, run logs, best-by-EMA selection and collapse
handling. This module builds the run's parts and runs the loop; one RL step is
`rl_step.rl_step`, a flat sequence of named stages (`rl_step.RLStages`, replaceable by passing
`stages=` a subclass):

  collect_rollouts -> compute_logprobs -> compute_advantages -> update_kl_controller
  -> optimize -> publish_weights -> compute_metrics -> evaluate -> log_metrics -> save_checkpoint

Batch semantics follow SkyRL: a step takes `train_batch_size` prompts, each sampled
`n_samples_per_prompt` times; `mini_batch_size` prompts (x n sequences) make one optimizer
step; each mini-batch is split into micro-batches of `micro_batch_size` sequences whose
gradients are accumulated; `update_epochs_per_batch` passes over the mini-batches in a fixed
order. `old_logprobs` are computed once per RL step, before any update, by the same code.

Determinism and resume: every random choice derives from (`seed`, step) — the prompts of step s,
the sampling seeds of its requests — and the checkpoint holds params, optimizer state, the
reward EMA and the data position, so a run killed at any point and restarted with the same
command continues from the last committed checkpoint and produces the same metrics. In the
asynchronous modes what is exact after a kill is stated in docs/async.md.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import time
from typing import Any, Optional

import jax
import numpy as np

from jaxrl import config as config_lib
from jaxrl import parallel
from jaxrl.config import write_json_atomic
from jaxrl.errors import raise_if_terminated
from jaxrl.envs import DEFAULT_POLICY_DIR, ChatTemplate
from jaxrl.envs.chat import ChatTemplateOptionError, PromptFormat
from jaxrl.fileio import output_dir_problem
from jaxrl.models import hf_io, qwen3
from jaxrl.rollout.types import SamplingParams
from jaxrl.train import evaluation
from jaxrl.train import harbor as harbor_run
from jaxrl.train import rl_step as rl_step_lib
from jaxrl.train.rollouts import AsyncRollouts, SyncRollouts
from jaxrl.train import step as step_lib
# Re-exported: the names callers used before the trainer was split into these modules.
from jaxrl.train.batching import EXCLUDED_STOP_REASONS, bucket_length, is_excluded, pack_trajectories  # noqa: F401
from jaxrl.train.fleet import Fleet, sidecar_error_text  # noqa: F401
from jaxrl.train.learner import Learner
from jaxrl.train.metrics import RewardEMA, RunLogger, plot_rewards, write_report
from jaxrl.train.multihost import all_processes_ok, sync
from jaxrl.train.persistence import Checkpoints
from jaxrl.train.prompts import PromptSource, derive_seed
from jaxrl.train.rl_step import training_batch  # noqa: F401
from jaxrl.train.report import NoLogger, Progress, report_text
from jaxrl.train.rundir import (RESUMABLE_CHANGES, CheckpointError, RunDirError, TrainerState, WallClock,  # noqa: F401
                                WorkdirLock, check_resume_config, maybe_kill, read_finished_summary, read_json_object)


class Trainer:
    """Owns the model, optimizer, sidecars and logs of one run directory. Use `run(config, workdir)`.

    Args:
      c: the run config; workdir: the run directory; progress: show the progress display;
      stages: the class of the RL step's stages (`rl_step.RLStages` or a subclass that replaces
        some of them), called with the trainer.
    """

    def __init__(self, c, workdir: str, *, progress: bool = True, stages: Optional[type] = None):
        self.c = c
        self.workdir = os.path.abspath(workdir)
        self.progress = progress
        self.timings: dict[str, float] = {}
        self.stages = (stages or rl_step_lib.RLStages)(self)
        # Multi-process runs (one process per host): process 0 drives the sidecars, rollouts,
        # evaluation and run logs; every process takes part in the sharded update, the weight
        # publication and the checkpoints. The run directory must be on a shared filesystem.
        self.is_main = jax.process_index() == 0
        config_lib.validate(c, num_devices=jax.device_count(), platform=jax.default_backend())
        self._check_workdir(output_dir_problem(self.workdir))
        # A workdir that exists may hold a running run: lock it now, so that a second run fails in
        # seconds, before loading anything; a new one is locked right after it is created below.
        self.workdir_lock: Optional[WorkdirLock] = None
        self._lock_workdir(only_existing=True)
        try:
            self._build(c)
        except BaseException:
            self.close()
            raise

    def _build(self, c) -> None:
        """The rest of construction: the model config, tokenizer, prompts, mesh and learner (which
        only validate), then the run directory (created, locked, its config checked)."""
        # Model and tokenizer.
        self.model_dir = c.model.path or DEFAULT_POLICY_DIR
        self.model_cfg = qwen3.Qwen3Config.from_pretrained(
            self.model_dir, dtype=c.model.compute_dtype, remat=c.model.remat, attention=c.model.attention_impl)
        need = config_lib.rollout_max_seq_len(c)
        if need > self.model_cfg.max_position_embeddings:  # YaRN's extended context included
            hint = self.model_cfg.yarn_context_hint
            raise config_lib.ConfigError(
                "generator.sampling_params.max_generate_length",
                f"a trajectory may reach {need} tokens (data.max_prompt_length + max_turns x max_generate_length), "
                f"more than the model's max_position_embeddings={self.model_cfg.max_position_embeddings}"
                + (f" ({hint})" if hint else ""),
                "lower max_generate_length / max_turns / data.max_prompt_length, or cap trajectories with "
                "trainer.algorithm.max_seq_len")
        try:
            self.chat = ChatTemplate.from_pretrained(self.model_dir, enable_thinking=c.generator.enable_thinking,
                                                     chat_template=c.generator.chat_template)
        except ChatTemplateOptionError as e:
            raise config_lib.ConfigError("generator.chat_template", e.problem, e.fix) from None
        self.prompts = PromptSource(c)
        self._check_prompt_lengths(self.prompts.train_tasks, c.data.dataset_path)
        if self.is_main and self.prompts.overlap_warning():
            print(self.prompts.overlap_warning(), file=sys.stderr)
        self._check_prompt_lengths(self.prompts.eval_batch() if not self.prompts.eval_suite else [],
                                   c.data.eval_dataset_path or c.data.dataset_path)

        # Mesh and shardings.
        self.mesh = parallel.make_mesh(c.mesh.data, c.mesh.fsdp, c.mesh.tensor)
        axes = qwen3.param_logical_axes(self.model_cfg)
        try:
            param_sharding = parallel.param_shardings(axes, self.mesh, shapes=qwen3.abstract_params(self.model_cfg))
        except parallel.ShardingError as e:
            raise config_lib.ConfigError("mesh", str(e), "set --config.mesh.data/fsdp/tensor to one of the "
                                         "mesh shapes listed above") from None
        # The fp32 master params (the training state) may live in pinned host memory.
        _, master_on_host = step_lib.offloaded(c.trainer.optimizer.offload)
        self.state_param_sharding = parallel.with_memory_kind(param_sharding, "pinned_host" if master_on_host else None)

        # Objective.
        self.loss_cfg = config_lib.loss_config(c)
        self.learner = Learner(c, self.model_cfg, self.mesh, param_sharding, self.state_param_sharding, self.loss_cfg)

        # Everything above only validates; from here on the run directory is written.
        try:
            os.makedirs(self.workdir, exist_ok=True)
        except OSError as e:  # what output_dir_problem cannot foresee (a read-only filesystem, root on /proc)
            self._check_workdir(f"{self.workdir} cannot be created ({e.strerror})")
        self._lock_workdir()
        if self.is_main:  # a disk too small for the run's first writes fails now, in seconds
            self._check_disk_space(c)
        check_resume_config(c, self.workdir, write=self.is_main)
        sync("config")
        self.ckpt = Checkpoints(c, self.workdir, self.learner, self.mesh, self.model_dir, self.model_cfg,
                                self.state_param_sharding)
        self.gate_lines: list[str] = []
        if self.prompts.harbor is not None:  # terminal tasks: the verifier gate, then sandboxed trials
            if c.data.verify_tasks and self.is_main:
                self.gate_lines = self.prompts.gate(self.workdir)
                harbor_run.print_excluded(self.gate_lines)
        self.fleet = Fleet(c, self.workdir, self.model_dir, self.chat, self.is_main,
                           harbor=self.prompts.harbor)
        self.state = TrainerState()
        self.ema = RewardEMA(span=c.trainer.ema_span)
        self.is_async = c.trainer.async_rl.mode != "sync"
        self.rollouts = None  # SyncRollouts / AsyncRollouts (process 0), made in run()

    def _check_disk_space(self, c) -> None:
        """OSError(ENOSPC) naming the workdir when its filesystem cannot hold one checkpoint
        (params + optimizer state) and one published version (params in the compute dtype): the
        first writes of every run. The sync folder is rewritten at the start, so its space counts
        as free. (Later writes check again: `weight_sync.publish`, `CheckpointStore.save`.)"""
        from jaxrl.fileio import require_free_space

        params = qwen3.abstract_params(self.model_cfg)
        itemsize = 2 if c.model.compute_dtype == "bfloat16" else 4
        n_params = sum(int(np.prod(x.shape, dtype=np.int64)) for x in jax.tree.leaves(params))
        # float32 master params + AdamW's two float32 moments, and the version in the compute dtype
        need = 12 * n_params + n_params * itemsize
        sync_dir = os.path.join(self.workdir, "sync")
        held = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(sync_dir) for f in fs
                   if os.path.isfile(os.path.join(r, f)))
        require_free_space(self.workdir, max(need - held, 0), "run's first checkpoint and policy version")

    def _lock_workdir(self, only_existing: bool = False) -> None:
        """Process 0 locks the workdir against a second run (`rundir.WorkdirLock`, kept in
        `self.workdir_lock`) unless it holds it already; every process learns whether it could, so
        that all of them stop together when another run holds it. Every process calls this at the
        same points (it is collective in a multi-host job).

        Args:
          only_existing: lock only a workdir that exists already (a missing one is locked once created).
        Raises:
          RunDirError: another run holds the workdir (process 0's message names it and the fix).
        """
        error = None
        if (self.is_main and self.workdir_lock is None
                and (not only_existing or os.path.isdir(self.workdir))):
            try:
                self.workdir_lock = WorkdirLock.acquire(self.workdir)
            except RunDirError as e:
                error = e
        if not all_processes_ok(error is None, "workdir_lock"):
            raise error or RunDirError(f"trainer process 0 could not lock the workdir {self.workdir} (another run "
                                       "uses it; process 0's error names it). Fix: wait until that run ends, or "
                                       "pass another --workdir")

    def close(self) -> None:
        """Closes the checkpoint manager (after its pending saves) and releases the workdir lock
        (idempotent; `run` closes both at its end). Call it on a trainer built but never run
        (e.g. in a notebook), or another process cannot use the workdir until this one exits."""
        try:
            ckpt = getattr(self, "ckpt", None)
            if ckpt is not None:
                ckpt.close()
        finally:
            if self.workdir_lock is not None:
                self.workdir_lock.release()

    @staticmethod
    def _check_workdir(problem: Optional[str]) -> None:
        """Raises ConfigError naming --workdir, `problem` and the fix (nothing when `problem` is None)."""
        if problem:
            raise config_lib.ConfigError(f"--workdir: {problem}. Fix: pass a directory path that can be created "
                                         "(e.g. --workdir=runs/my_run; it is created if missing)")

    def _check_prompt_lengths(self, tasks, path: str) -> None:
        """Rejects dataset prompts (training or held-out, read from `path`) whose rendering exceeds
        `data.max_prompt_length` (before any work)."""
        from jaxrl.envs import make_env

        limit = self.c.data.max_prompt_length
        harbor = self.prompts.harbor
        for i, task in enumerate(tasks):
            if harbor is not None:  # rendered without starting a sandbox
                n = len(self.chat.encode_prompt(harbor.prompt_messages(task)))
            else:
                env = make_env(task)
                n = len(self.chat.encode_prompt(env.reset(task), getattr(env, "tools", None)))
            if n > limit:
                raise config_lib.ConfigError(
                    "data.max_prompt_length", f"{path}: task {i} ({task.task_id or 'no id'}) "
                    f"renders to a {n}-token prompt, longer than max_prompt_length={limit}",
                    "raise --config.data.max_prompt_length or remove the long prompts from the dataset")

    # -- weights, evaluation, checkpoints -------------------------------------------------------
    def evaluate(self, announce: str = "") -> dict[str, float]:
        """Held-out success rate (reward >= `trainer.success_threshold`) and mean reward of the
        served policy version (`evaluation.evaluate`; process 0 only: other processes, and runs
        without eval prompts, get {}). `announce`: what is evaluated, said on stderr first (with
        the progress display on)."""
        tasks = self.prompts.eval_batch()
        self._eval_version, self._eval_result = self.state.policy_version, {}  # same on every process
        if not tasks or not self.is_main:
            return {}
        if announce and self.progress:
            print(f"jaxrl: evaluating {announce} on {len(tasks)} held-out prompts", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        result, _ = evaluation.evaluate(self.c, tasks, self.fleet.generate)
        self.timings["eval"] = time.perf_counter() - t0
        self._eval_result = result
        raise_if_terminated()  # a SIGTERM swallowed while evaluating (the first and last run outside the step loop)
        return result

    # -- main loop ----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        c = self.c
        clock = WallClock(self.workdir)  # this launch's time, plus that of the run's earlier launches
        self.learner.build(self.state.lr_scale)
        latest = self.ckpt.store.latest_step()
        summary_path = os.path.join(self.workdir, "summary.json")
        if latest is not None and latest >= c.trainer.num_steps and os.path.exists(summary_path):
            done = read_finished_summary(summary_path)  # None: damaged, written again by the finish below
            # A summary counts only if it is the finish of the newest checkpoint: one written by an
            # earlier, shorter launch (the run was continued past it since) is stale.
            if done is not None and done.get("last_step") == latest:
                print(f"jaxrl: {self.workdir} is complete (step {latest}, trainer.num_steps={c.trainer.num_steps}); "
                      "see report.md. Raise --config.trainer.num_steps to continue training.", file=sys.stderr)
                self.ckpt.close()
                return done
        if self.progress and self.is_main:  # what a launch does before its first step, which takes a while
            what = "its last checkpoint" if latest is not None else "the policy"  # "resuming" is said once, below
            print(f"jaxrl: {self.workdir} ({c.trainer.num_steps} RL steps): loading {what} and starting the "
                  "rollout engine", file=sys.stderr, flush=True)
        with jax.set_mesh(self.mesh):
            _, init_params = hf_io.load_hf_checkpoint(self.model_dir, self.model_cfg,
                                                      shardings=self.state_param_sharding)
            self.ref_params = None
            if self.learner.needs_reference:
                # The starting policy in buffers of its own (loaded again, placed like the policy):
                # the train step donates the policy's buffers, so sharing them would delete it.
                self.ref_params = self.ckpt.initial_params()
            resumed = self.ckpt.resume() if latest is not None else None
            if resumed is None:
                params, opt_state = init_params, self.learner.init_opt(init_params)
                start = 0
                if self.learner.critic is not None:
                    self.learner.critic.init()
                if self.gate_lines:
                    self.state.events.append(f"{len(self.gate_lines)} task(s) excluded by the verifier sanity "
                                             "gate (data.verify_tasks; listed in task_gate.json)")
            else:
                start, params, opt_state, self.state = resumed
                self.ema = RewardEMA.from_state_dict(self.state.ema)
                if self.state.lr_scale != 1.0:
                    self.learner.build(self.state.lr_scale)
                print(f"jaxrl: resuming {self.workdir} from step {start}", file=sys.stderr)
                if start >= c.trainer.num_steps:  # never train past num_steps: only the finish is left
                    print(f"jaxrl: step {start} reaches trainer.num_steps={c.trainer.num_steps}: nothing left to "
                          "train; finishing the run (evaluation, export, report)", file=sys.stderr)
        logger = self.logger = (RunLogger(self.workdir, resume_step=start if resumed is not None else None)
                                if self.is_main else NoLogger())
        self.clock = clock
        if self.is_main:
            shutil.rmtree(self.fleet.sync_dir, ignore_errors=True)  # versions are republished from the checkpoint
            os.makedirs(self.fleet.sync_dir, exist_ok=True)
        sync("sync_dir")
        stopped_by_collapse = False
        bar = None
        try:
            if self.is_main:
                self.fleet.start()
            self.state.step = start
            self.stages.publish_weights(params, self.state.policy_version)
            if start == 0 and c.trainer.eval_before_train:
                ev = self.evaluate(announce="the starting policy")
                if ev:
                    self.state.initial_eval = ev["eval/success_rate"]
                    logger.log_step(0, {**ev, "timing/eval": self.timings["eval"]})
            if self.is_main and start < c.trainer.num_steps:  # after the initial evaluation: the producer
                # starts generating at once; a run resumed at (or past) num_steps trains nothing, so none starts
                self.rollouts = (AsyncRollouts(c, self.prompts, self.fleet, steps_done=start,
                                               version=self.state.policy_version,
                                               next_prompt=self.state.async_next_prompt,
                                               pending=self.state.async_pending)
                                 if self.is_async else SyncRollouts(c, self.prompts, self.fleet))
            bar = Progress(start, c.trainer.num_steps, enabled=self.progress and self.is_main)
            bar.note("first step: generating, then compiling the train step")  # the slowest step of a launch
            step = start
            for step in range(start + 1, c.trainer.num_steps + 1):
                raise_if_terminated()  # a SIGTERM whose raise a GC callback swallowed (jaxrl.errors)
                result = self._rl_step(step, params, opt_state)
                params, opt_state, m = result.params, result.opt_state, result.metrics.values
                bar.update(step, m["reward/avg_raw_reward"], m["reward/ema"], self.timings["step"])
                collapse = c.trainer.collapse
                if collapse.enabled and self.ema.steps_below >= collapse.patience:
                    event = (f"step {step}: reward EMA {self.ema.value:.3f} stayed more than {collapse.drop} below "
                             f"the best {self.ema.best_value:.3f} (step {self.ema.best_step}) for "
                             f"{self.ema.steps_below} steps")
                    if collapse.action == "rollback" and self.state.rollbacks < collapse.max_rollbacks:
                        params, opt_state = self._rollback(step, event)
                        self.stages.checkpoint(step, params, opt_state)
                    else:
                        self.state.events.append(f"{event}; run stopped (collapse)")
                        self.stages.checkpoint(step, params, opt_state)
                        stopped_by_collapse = True
                        break
            bar.close()
            if self.rollouts is not None:
                self.rollouts.stop()
                self.rollouts = None
            raise_if_terminated()  # a SIGTERM swallowed in the last step: stop before the final evaluation
            summary = self._finish(logger, step, clock, stopped_by_collapse)
        finally:
            if bar is not None:  # an interrupted run's bar is closed before the resume hint is printed
                bar.close()
            if self.rollouts is not None:
                self.rollouts.stop()
            logger.close()
            self.fleet.close()
            self.ckpt.close()
        return summary

    def _rl_step(self, step: int, params, opt_state) -> rl_step_lib.StepResult:
        """One RL step with this run's stages (`rl_step.rl_step`): rollouts, logprobs, advantages,
        optimizer steps, publication, metrics, evaluation when due, logs, checkpoint when due."""
        return rl_step_lib.rl_step(self.stages, step, params, opt_state)

    def _rollback(self, step: int, event: str):
        """Restores the best checkpoint (the initial policy with a fresh optimizer when no step has
        been saved yet) and lowers the learning rate by `collapse.lr_factor`."""
        best = self.state.best_ckpt_step
        self.state.rollbacks += 1
        self.state.lr_scale *= self.c.trainer.collapse.lr_factor
        target = f"step {best}" if best >= 1 else "the initial policy (no checkpoint saved yet)"
        self.state.events.append(f"{event}; rolled back to {target} with lr x{self.state.lr_scale:g}")
        self.learner.build(self.state.lr_scale)
        if best >= 1:
            params, opt_state = self.ckpt.restore_best(self.state)  # a damaged best: the next best by EMA
        else:
            params = self.ckpt.initial_params()
            with jax.set_mesh(self.mesh):
                opt_state = self.learner.init_opt(params)
            if self.learner.critic is not None:
                self.learner.critic.init()
        self.ema.steps_below = 0
        self.stages.publish_weights(params, self.state.policy_version + 1)  # the next rollouts use the restored weights
        return params, opt_state

    def _eval_episodes(self, c) -> int:
        """Episodes one held-out evaluation scores (prompts x episodes per prompt; the report's ± uses it)."""
        if not c.data.num_eval_prompts:
            return 0
        return len(self.prompts.eval_batch()) * evaluation.episodes_per_prompt(c)

    def _finish(self, logger, last_step: int, clock: WallClock, collapsed: bool) -> dict[str, Any]:
        """Evaluates the final policy (unless its last step was) and the best checkpoint, exports
        the best, writes the plot, report.md and summary.json (wall time: every launch of the run)."""
        c = self.c
        best = self.state.best_ckpt_step
        summary: dict[str, Any] = {"last_step": last_step, "best_step": best, "best_ema": self.state.best_ckpt_ema,
                                   "initial_eval": self.state.initial_eval,
                                   "heldout": evaluation.describe(c, self.prompts),
                                   "eval_n": self._eval_episodes(c)}
        # The final step's policy: evaluated at that step, else (a collapse stop, or a resumed run
        # whose last step was checkpointed before its end) now, on the served weights of that step.
        if getattr(self, "_eval_step", None) == last_step:
            summary["final_eval"] = self._eval_result.get("eval/success_rate")
        elif self.prompts.eval_batch():
            summary["final_eval"] = self.evaluate().get("eval/success_rate")
        if best >= 1:
            params, _ = self.ckpt.restore_best(self.state, with_critic=False)  # damaged best: the next best by EMA
            best = summary["best_step"] = self.state.best_ckpt_step
            summary["best_ema"] = self.state.best_ckpt_ema
            if best == last_step and getattr(self, "_eval_version", None) == self.state.policy_version:
                ev = self._eval_result  # the served weights are the best step's and were just evaluated
            else:
                self.stages.publish_weights(params, self.state.policy_version + 1)
                ev = self.evaluate()
            summary["best_eval"] = ev.get("eval/success_rate")
            if c.trainer.export_best:
                fmt = PromptFormat.of_tasks(self.prompts.training_tasks(), c.generator.enable_thinking)
                if c.generator.chat_template:  # the exported template is the one the run rendered with
                    fmt = dataclasses.replace(fmt, template=self.chat.template)
                self.ckpt.export_hf(params, self.is_main, prompt_format=fmt,
                                    generation=evaluation.generation_config(c, self.chat))
        summary["wall_s"], summary["launches"] = clock.total(), clock.launches
        if not self.is_main:
            return summary
        clock.save()
        plot_rewards(self.workdir, logger.rows, best)
        write_report(self.workdir, report_text(c, summary, logger.rows, self.state, collapsed))
        write_json_atomic(os.path.join(self.workdir, "summary.json"), summary)
        return summary


def run(c, workdir: str, progress: bool = True, stages: Optional[type] = None) -> dict[str, Any]:
    """Validates `c`, then trains in `workdir` (resuming from its latest checkpoint if any), with
    the RL step's stages `stages` (default `rl_step.RLStages`; see `Trainer`).

    Returns the run summary (best step, EMA, held-out success before and after, wall time).
    Raises:
      ConfigError: for an invalid config, before any work starts.
    """
    import logging

    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.WARNING)  # Orbax logs every save at INFO
    logging.getLogger("httpx").setLevel(logging.WARNING)
    t = Trainer(c, workdir, progress=progress, stages=stages)
    try:
        return t.run()
    finally:
        t.close()
