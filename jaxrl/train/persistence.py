"""Checkpoints of a run as the trainer uses them: save (with the best-EMA bookkeeping and
retention), restore, resume past damaged checkpoints, the initial policy, and the HF export of
the best checkpoint. Storage itself is `checkpoint.CheckpointStore` (Orbax)."""
from __future__ import annotations

import dataclasses
import os
import shutil
import sys

import jax

from jaxrl.models import chat_template, hf_io
from jaxrl.fileio import read_error_text
from jaxrl.train.checkpoint import (CheckpointStore, collect_unraisable, is_damage_error, replay_unraisable,
                                   silence_unraisable_about)
from jaxrl.train.multihost import all_processes_ok
from jaxrl.train.rundir import CheckpointError, TrainerState, maybe_kill


class Checkpoints:
    """The run's checkpoints under `workdir/checkpoints`.

    Args:
      c: the run config; workdir: the run directory; learner: gives the sharded abstract
      (params, opt_state) to restore into; mesh, model_dir, model_cfg, state_param_sharding: to
      load the initial policy placed like the training state.
    """

    def __init__(self, c, workdir: str, learner, mesh, model_dir: str, model_cfg, state_param_sharding):
        self.c = c
        self.workdir = workdir
        self.learner = learner
        self.mesh = mesh
        self.model_dir = model_dir
        self.model_cfg = model_cfg
        self.state_param_sharding = state_param_sharding
        self.store = CheckpointStore(workdir, max_to_keep=c.trainer.max_ckpts_to_keep,
                                     extra_items=("critic",) if learner.critic is not None else ())

    def save(self, step: int, params, opt_state, state: TrainerState, ema) -> None:
        """Checkpoints `step` with `state` (updated in place: step, EMA, best; the caller sets the
        data position), then prunes: the last `max_ckpts_to_keep` steps and the best stay.

        The best checkpoint is the saved step with the highest reward EMA; on a tie the earlier
        step stays best. It is recorded in the trainer state that is saved with the step, and it
        is the only step retention protects, so it is on disk whenever a checkpoint names it.
        """
        state.step = step
        state.ema = ema.state_dict()
        if ema.value is not None and ema.value > state.best_ckpt_ema:
            state.best_ckpt_step, state.best_ckpt_ema = step, float(ema.value)
        critic = self.learner.critic
        self.store.save(step, params, opt_state, dataclasses.asdict(state),
                        extras={"critic": critic.state()} if critic is not None else None)
        maybe_kill("save", step)  # the async write is in flight here
        self.store.wait()
        self.store.prune(protect=[state.best_ckpt_step])

    def restore(self, step: int, with_critic: bool = True):
        """(params, opt_state, trainer-state dict) of committed step `step`; with a critic (and
        `with_critic`), its params and optimizer state of that step go into `learner.critic`."""
        abstract_p, abstract_o = self.learner.abstract_state()
        params, opt_state, ts = self.store.restore(step, abstract_p, abstract_o)
        critic = self.learner.critic
        if critic is not None and with_critic:
            critic.set_state(self.store.restore_extra(step, "critic", critic.abstract_state()))
        return params, opt_state, ts

    def initial_params(self):
        """The starting policy (the HF checkpoint of `model.path`), sharded and placed like the
        training state."""
        with jax.set_mesh(self.mesh):
            return hf_io.load_hf_checkpoint(self.model_dir, self.model_cfg, shardings=self.state_param_sharding)[1]

    def resume(self):
        """Restores the newest readable committed checkpoint.

        A checkpoint that cannot be read (a truncated or corrupt file) is reported in one line
        and moved to `checkpoints_damaged/`, and the previous committed one is used; when none is
        readable the run stops with one line naming them. If the best checkpoint the restored
        state names is gone (it was the damaged one), the best is re-chosen among the steps on
        disk by the reward EMA each recorded.

        Returns: (step, params, opt_state, TrainerState), or None when there is no checkpoint.
        Raises:
          CheckpointError: every committed checkpoint is damaged.
        """
        steps = self.store.all_steps()
        damaged = []
        with collect_unraisable() as library_noise:  # Orbax's per-array tracebacks of a failed read
            for step in reversed(steps):
                try:
                    params, opt_state, ts = self.restore(step)
                    error = ""
                except Exception as e:  # noqa: BLE001 - classified by is_damage_error
                    if not is_damage_error(e):
                        raise
                    error = read_error_text(e)
                if all_processes_ok(not error, f"resume_{step}"):
                    break
                damaged.append((step, error or "unreadable on another process"))
        if damaged:  # their abandoned reads may still be finalized later: keep them quiet
            silence_unraisable_about(os.path.join(self.store.directory, str(s)) + os.sep for s, _ in damaged)
        else:
            replay_unraisable(library_noise)  # nothing to do with a damaged checkpoint: show it
        if len(damaged) == len(steps):
            if not steps:
                return None
            raise CheckpointError(
                f"every checkpoint in {self.store.directory} is damaged ({'; '.join(f'step {s}: {e}' for s, e in damaged)})"
                f". Fix: restore the files, or start over with a new --workdir")
        for bad, error in damaged:
            moved = self.store.set_aside(bad)
            msg = (f"checkpoint {bad} in {self.store.directory} is damaged ({error}); moved it to {moved} and "
                   f"resumed from step {step}")
            print(f"jaxrl: warning: {msg}", file=sys.stderr)
        state = TrainerState.from_dict(ts, where=f"{self.store.directory}/{step}/trainer_state")
        state.events.extend(f"checkpoint {bad} was damaged ({error}); resumed from step {step}" for bad, error in damaged)
        on_disk = self.store.all_steps()
        if state.best_ckpt_step not in on_disk:
            best, ema = self._choose_best([s for s in on_disk if s <= step])  # includes the step just restored
            print(f"jaxrl: warning: the best checkpoint {state.best_ckpt_step} is gone; the best is now step {best} "
                  f"(EMA {ema:.4f}) among the steps on disk {on_disk}", file=sys.stderr)
            state.best_ckpt_step, state.best_ckpt_ema = best, ema
        self.store.prune(protect=[state.best_ckpt_step])  # leftovers of a run killed before its prune
        return step, params, opt_state, state

    def _choose_best(self, candidates) -> tuple[int, float]:
        """(step, EMA) of the highest reward EMA recorded among the checkpoints `candidates` (the
        earlier step on a tie); a checkpoint whose trainer state cannot be read is no candidate.
        (-1, -inf) when none is readable."""
        emas = {}
        for s in candidates:
            try:
                emas[s] = float(self.store.restore_trainer_state(s)["ema"]["value"])
            except Exception as e:  # noqa: BLE001 - a damaged checkpoint is just not a candidate
                if not is_damage_error(e):
                    raise
        if not emas:
            return -1, float("-inf")
        best = max(emas, key=lambda s: (emas[s], -s))
        return best, emas[best]

    def restore_best(self, state: TrainerState, with_critic: bool = True):
        """(params, opt_state) of the best checkpoint `state` names (`state.best_ckpt_step`); with a
        critic (and `with_critic`), its state of that step goes into `learner.critic` (`restore`).

        A damaged best checkpoint (one the resume did not read: an older step kept by retention)
        is reported in one warning line, moved to `checkpoints_damaged/`, and the best is
        re-chosen among the steps on disk by the reward EMA each recorded (`state` updated, the
        event recorded in `state.events`), until a readable one is found.

        Raises:
          CheckpointError: no checkpoint on disk is readable (names the directory and the fix).
        """
        while True:
            best = state.best_ckpt_step
            with collect_unraisable() as library_noise:
                try:
                    params, opt_state, _ = self.restore(best, with_critic=with_critic)
                    error = ""
                except Exception as e:  # noqa: BLE001 - classified by is_damage_error
                    if not is_damage_error(e):
                        raise
                    error = read_error_text(e)
            if all_processes_ok(not error, f"restore_best_{best}"):
                replay_unraisable(library_noise)
                return params, opt_state
            silence_unraisable_about([os.path.join(self.store.directory, str(best)) + os.sep])
            moved = self.store.set_aside(best) if best in self.store.all_steps() else "(not on disk)"
            chosen, ema = self._choose_best(self.store.all_steps())
            if chosen < 0:
                raise CheckpointError(
                    f"the best checkpoint {best} in {self.store.directory} is damaged ({error}) and no other "
                    "checkpoint is readable. Fix: restore the files, or start over with a new --workdir")
            msg = (f"the best checkpoint {best} in {self.store.directory} is damaged ({error}); moved it to {moved}; "
                   f"the best is now step {chosen} (EMA {ema:.4f})")
            print(f"jaxrl: warning: {msg}", file=sys.stderr)
            state.events.append(msg)
            state.best_ckpt_step, state.best_ckpt_ema = chosen, ema

    def export_hf(self, params, is_main: bool, prompt_format=None, generation=None) -> None:
        """Writes `params` as an HF checkpoint (float32, with the tokenizer and rl_config.json) to
        `workdir/best/`, replacing it atomically (a temp directory, then a rename). With
        `prompt_format` (`jaxrl.envs.chat.PromptFormat`), its chat template defaults to the
        training prompt format and `generation` is merged into generation_config.json
        (`jaxrl.models.chat_template.write_prompt_format`)."""
        if jax.process_count() > 1:  # the exporter reads whole tensors on process 0
            from jax.experimental import multihost_utils

            params = multihost_utils.process_allgather(params, tiled=True)
        if is_main:
            out = os.path.join(self.workdir, "best")
            tmp = out + ".tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            hf_io.save_hf_checkpoint(params, self.model_cfg, tmp, dtype="float32", tokenizer_dir=self.model_dir)
            shutil.copy(os.path.join(self.workdir, "rl_config.json"), os.path.join(tmp, "rl_config.json"))
            if prompt_format is not None:
                chat_template.write_prompt_format(tmp, prompt_format.system_prompt, prompt_format.enable_thinking,
                                                  generation, template=prompt_format.template)
            shutil.rmtree(out, ignore_errors=True)
            os.replace(tmp, out)

    def close(self) -> None:
        self.store.close()
