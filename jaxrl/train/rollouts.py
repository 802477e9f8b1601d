"""Where an RL step's trajectories come from, by `trainer.async_rl.mode` (docs/async.md).

`SyncRollouts` (mode "sync"): step s generates the `train_batch_size` prompts of step s with the
policy the previous step published, then the trainer trains on them (on-policy).

`AsyncRollouts` (modes "one_step" and "fully_async"): a `producer.RolloutProducer` generates
ahead of the trainer; each step takes the next B fresh groups (staleness <= the bound), whatever
prompts they hold. Units of prompts of one step that are admitted together share one rollout
call; a unit that is a whole step's batch uses that step's sampling seed, so with
`max_staleness_steps=0` (or in one_step mode) the units are exactly the sync mode's calls.

Both modes apply `generator.episode_delay_s` (a knob of the benchmarks and tests: every episode
takes at least that long, as slow multi-turn episodes do); the delay of a group is
`episode_delay_s * (1 + episode_delay_jitter * (2u - 1))`, u uniform in [0, 1) from (seed, prompt).
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Any

import numpy as np

from jaxrl.rollout.types import SamplingParams
from jaxrl.train.producer import RolloutProducer, TakeResult
from jaxrl.train.prompts import derive_seed
from jaxrl.train.rundir import maybe_kill


def episode_delay(c, prompt_index: int) -> float:
    """Seconds the episodes of prompt `prompt_index` take at least (`generator.episode_delay_s`)."""
    g = c.generator
    if not g.episode_delay_s:
        return 0.0
    u = derive_seed(c.seed, prompt_index, 9) / 2.0**31
    return float(g.episode_delay_s) * (1.0 + float(g.episode_delay_jitter) * (2.0 * u - 1.0))


def _sampling(c, seed: int) -> SamplingParams:
    sp = c.generator.sampling_params
    return SamplingParams(temperature=sp.temperature, top_p=sp.top_p, top_k=max(sp.top_k, 0), seed=seed,
                          logprobs_mode=c.generator.logprobs_mode)


def trajectory_staleness(version: int, trajs, admitted_version: int) -> np.ndarray:
    """`[N]` int: `version` minus the policy version of each trajectory's first token (a
    trajectory with no generated turn counts as sampled by `admitted_version`)."""
    return np.array([version - (t.policy_version if t.num_turns > 0 else admitted_version) for t in trajs], np.int64)


class SyncRollouts:
    """Mode "sync": generate step s's prompts now, with the served policy."""

    def __init__(self, c, prompts, fleet):
        self.c, self.prompts, self.fleet = c, prompts, fleet

    def get(self, step: int, version: int):
        """(trajectories, per-trajectory log fields, metrics, timings) of `step` (process 0)."""
        c, B = self.c, self.c.trainer.train_batch_size
        tasks = self.prompts.train_batch(step)
        t0 = time.perf_counter()
        sampling = _sampling(c, derive_seed(c.seed, step, 3))
        trajs = self.fleet.generate(tasks, sampling, n=c.generator.n_samples_per_prompt)
        delay = max(episode_delay(c, (step - 1) * B + i) for i in range(B))
        if delay:  # the batch waits for its slowest episode
            time.sleep(max(0.0, t0 + delay - time.perf_counter()))
        maybe_kill("generate", step)
        staleness = trajectory_staleness(version, trajs, version)
        extra = [{"prompt_index": (step - 1) * B + t.group_id, "staleness": int(s)} for t, s in zip(trajs, staleness)]
        return trajs, extra, {}, {"generate": time.perf_counter() - t0}

    def before_load(self) -> None:
        pass

    def after_load(self, version: int, steps_done: int) -> None:
        pass

    def snapshot(self, step: int) -> tuple[int, list[int]]:
        """(data position, pending prompts) a checkpoint of `step` records."""
        return step * self.c.trainer.train_batch_size, []

    def stop(self) -> None:
        pass


class AsyncRollouts:
    """Modes "one_step" and "fully_async" (module docstring). Runs on process 0.

    Args:
      c: the run config; prompts: the `PromptSource`; fleet: the `Fleet` (its client must accept
      in-flight weight updates); steps_done / version: the step and policy version the run starts
      from; next_prompt / pending: the data position of the restored checkpoint.
    """

    def __init__(self, c, prompts, fleet, *, steps_done: int, version: int, next_prompt: int, pending):
        self.c, self.prompts, self.fleet = c, prompts, fleet
        a, B, n = c.trainer.async_rl, c.trainer.train_batch_size, c.generator.n_samples_per_prompt
        one_step = a.mode == "one_step"
        self.max_staleness_steps = 1 if one_step else int(a.max_staleness_steps)
        groups = B if one_step else (a.max_in_flight_trajectories // n or (self.max_staleness_steps + 1) * B)
        self._tasks: dict[int, list] = {}
        self._tasks_lock = threading.Lock()  # units run in threads; PromptSource is not thread-safe
        self._chats: queue.SimpleQueue = queue.SimpleQueue()  # one ChatTemplate per concurrent unit
        self.producer = RolloutProducer(
            batch_size=B, n=n, max_staleness_steps=self.max_staleness_steps, max_in_flight_groups=groups,
            stale_action=a.stale_action, steps_done=steps_done, total_steps=c.trainer.num_steps, version=version,
            next_prompt=next_prompt, pending=pending, generate_unit=self._generate_unit,
            loads_between_units=one_step)
        self.started = False

    def _step_tasks(self, step: int):
        with self._tasks_lock:
            if step not in self._tasks:
                if len(self._tasks) > 64:  # steps long gone (pending prompts are few)
                    self._tasks.pop(min(self._tasks))
                self._tasks[step] = self.prompts.train_batch(step)
            return self._tasks[step]

    def _borrow_chat(self):
        """A `ChatTemplate` no other thread uses (HF tokenizers must not be shared by threads)."""
        try:
            return self._chats.get_nowait()
        except queue.Empty:
            from jaxrl.envs import ChatTemplate

            return ChatTemplate.from_pretrained(self.fleet.model_dir,
                                                enable_thinking=self.c.generator.enable_thinking,
                                                chat_template=self.c.generator.chat_template)

    def _generate_unit(self, step: int, prompt_indexes, attempts):
        """One unit's rollouts: [(prompt index, its n trajectories, its episode delay)]."""
        c, B, n = self.c, self.c.trainer.train_batch_size, self.c.generator.n_samples_per_prompt
        first = (step - 1) * B
        tasks = [self._step_tasks(step)[k - first] for k in prompt_indexes]
        whole = list(prompt_indexes) == list(range(first, first + B)) and not any(attempts)
        seed = (derive_seed(c.seed, step, 3) if whole  # the sync mode's call for this step
                else derive_seed(c.seed, step, 4, prompt_indexes[0], len(prompt_indexes), max(attempts)))
        chat = self._borrow_chat()
        try:
            trajs = self.fleet.generate(tasks, _sampling(c, seed), n=n, chat=chat)
        finally:
            self._chats.put(chat)
        return [(k, trajs[j * n:(j + 1) * n], episode_delay(c, k)) for j, k in enumerate(prompt_indexes)]

    def get(self, step: int, version: int):
        """(trajectories, per-trajectory log fields, async/* metrics, timings) of `step`: the next
        B fresh groups, group ids renumbered 0..B-1 in prompt order."""
        if not self.started:
            self.producer.start()
            self.started = True
        r: TakeResult = self.producer.take(version)
        maybe_kill("generate", step)
        trajs, extra = [], []
        for j, g in enumerate(r.groups):
            staleness = trajectory_staleness(version, g.trajs, g.admitted_version)
            for t, s in zip(g.trajs, staleness):
                t.group_id = j
                trajs.append(t)
                extra.append({"prompt_index": g.prompt_index, "staleness": int(s)})
        s = np.array([e["staleness"] for e in extra])
        spans = sum(1 for t in trajs if t.last_policy_version is not None and t.last_policy_version > t.policy_version)
        m: dict[str, Any] = {"async/staleness_mean": float(s.mean()), "async/staleness_max": float(s.max()),
                             "async/staleness_min": float(s.min()), "async/dropped_stale": r.dropped,
                             "async/regenerated": r.regenerated, "async/in_flight": r.in_flight,
                             "async/episodes_spanning_update": spans}
        timings = {"generate": r.trainer_idle_s, "trainer_idle": r.trainer_idle_s,
                   "generator_idle": r.generator_idle_s}
        return trajs, extra, m, timings

    def before_load(self) -> None:
        if self.producer.loads_between_units:  # one_step: no episode spans a weight update
            self.producer.pause()

    def after_load(self, version: int, steps_done: int) -> None:
        self.producer.published(version, steps_done)
        if self.producer.loads_between_units:
            self.producer.resume()

    def snapshot(self, step: int) -> tuple[int, list[int]]:
        next_prompt, pending = self.producer.snapshot()
        return next_prompt, pending

    def stop(self) -> None:
        self.producer.stop()


def logprob_gap_by_staleness(staleness: np.ndarray, row_sums: np.ndarray, row_counts: np.ndarray) -> dict[str, float]:
    """`async/logprob_diff_mean_staleness_<k>`: mean |trainer - engine logprob| over the loss
    tokens of the trajectories of staleness k, for every k present (the gap grows with k as the
    trainer's pi_old moves away from the sampling policy mu).

    Args: staleness, row_sums (sum of |log pi_old - log mu| over a row's loss tokens), row_counts
      (its loss tokens): `[N]`, aligned with the packed batch's rows.
    """
    out = {}
    for k in sorted(set(int(x) for x in staleness)):
        rows = staleness == k
        count = float(row_counts[rows].sum())
        if count > 0:
            out[f"async/logprob_diff_mean_staleness_{k}"] = float(row_sums[rows].sum()) / count
    return out
