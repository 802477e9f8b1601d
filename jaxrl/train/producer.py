"""The rollout producer of asynchronous RL (`trainer.async_rl.mode` one_step / fully_async; docs/async.md).

A scheduler thread admits prompts while the trainer trains and runs each admitted *unit* (the
prompts of one RL step that were admitted together) in a thread of its own, so generation never
waits for training. Groups (the n samples of one prompt) are the unit of everything else: they
are admitted, delivered, counted, dropped and trained whole.

Capacity rule (AReaL, Fu et al. 2025, as SkyRL's fully-async trainer uses it): with B prompts per
step, S = `max_staleness_steps`, t RL steps trained and W groups allowed in flight, the producer
may start a group only while

    running < W   and   accepted + running < (S + t + 1) * B   (and < the groups the run still needs)

where `accepted` counts the delivered groups that were not dropped (trained or waiting). So a
group starts at the earliest S steps before the step that would train it in order, which bounds
the groups that can go stale; the staleness filter in `take` is the guarantee: a group whose
oldest token was sampled by a policy more than S versions older than the one being trained is
never trained on. It is dropped and counted (or, with `stale_action="regenerate"`, its prompt is
generated again), and a dropped group frees its capacity.

Versions: the trainer calls `published(version, steps_done)` after every sidecar serves the new
version, so a unit admitted then is sampled by that version or a newer one. In one_step mode
(`loads_between_units`) the trainer calls `pause()` before a weight load, which waits until no
unit is running, and `resume()` after it: no episode spans a weight update and the generator is
exactly one batch ahead.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from typing import Callable, Optional, Sequence


@dataclasses.dataclass
class Group:
    """The `n` trajectories of one prompt, as generated.

    Attributes:
      prompt_index: position of the prompt in the run's prompt stream (prompt k is entry k % B of
        step k // B + 1's prompts).
      trajs: its trajectories (sample order).
      admitted_version: the policy version every serving sidecar held when its unit started.
    """

    prompt_index: int
    trajs: list
    admitted_version: int

    @property
    def first_version(self) -> int:
        """Oldest policy version that sampled a token of the group (a trajectory without any
        generated turn counts as `admitted_version`, a lower bound of what served it)."""
        return min(t.policy_version if t.num_turns > 0 else self.admitted_version for t in self.trajs)

    @property
    def last_version(self) -> int:
        """Newest policy version that sampled a token of the group."""
        return max((t.last_policy_version if t.last_policy_version is not None else t.policy_version)
                   if t.num_turns > 0 else self.admitted_version for t in self.trajs)


@dataclasses.dataclass
class TakeResult:
    """What `RolloutProducer.take` hands the trainer for one RL step.

    Attributes:
      groups: B whole groups, by increasing prompt index.
      dropped: trajectories dropped as stale (never trained) while this batch was assembled.
      regenerated: of those, trajectories whose prompt was queued to be generated again.
      in_flight: trajectories being generated when the batch was handed over.
      trainer_idle_s: seconds `take` waited for enough fresh groups.
      generator_idle_s: seconds since the previous `take` during which no unit was running.
    """

    groups: list
    dropped: int
    regenerated: int
    in_flight: int
    trainer_idle_s: float
    generator_idle_s: float


# generate_unit(step, prompt_indexes, attempts) -> [(prompt_index, trajectories, delay_s)], one entry
# per prompt: the unit's rollouts; each group is delivered `delay_s` after the unit started.
GenerateUnit = Callable[[int, Sequence[int], Sequence[int]], list]


class RolloutProducer:
    """Generates groups ahead of the trainer under the capacity rule (module docstring).

    Args:
      batch_size: B, prompts per RL step.
      n: trajectories per group (`n_samples_per_prompt`).
      max_staleness_steps: S (`trainer.async_rl.max_staleness_steps`), the largest (trained version -
        first-token version) a trained group may have.
      max_in_flight_groups: W, groups generating at once (>= 1).
      stale_action: "drop" or "regenerate".
      steps_done: RL steps already trained (a resumed run's step).
      total_steps: the run's last step; no group beyond what steps_done+1..total_steps need starts.
      version: the policy version the sidecars serve now.
      next_prompt: the first prompt index never admitted.
      pending: prompt indexes admitted before a checkpoint but not trained: generated first.
      generate_unit: runs one unit (see `GenerateUnit`); its exceptions reach `take`.
      loads_between_units: one_step mode (`pause` / `resume` around weight loads).
      clock: time source (seconds).
    """

    def __init__(self, *, batch_size: int, n: int, max_staleness_steps: int, max_in_flight_groups: int,
                 stale_action: str, steps_done: int, total_steps: int, version: int, next_prompt: int,
                 pending: Sequence[int], generate_unit: GenerateUnit, loads_between_units: bool = False,
                 clock: Callable[[], float] = time.perf_counter):
        if stale_action not in ("drop", "regenerate"):
            raise ValueError(f"stale_action must be 'drop' or 'regenerate', got {stale_action!r}")
        if max_in_flight_groups < 1 or batch_size < 1 or n < 1 or max_staleness_steps < 0:
            raise ValueError("batch_size, n and max_in_flight_groups must be >= 1 and max_staleness_steps >= 0")
        self.B, self.n, self.W = batch_size, n, max_in_flight_groups
        self.max_staleness_steps = max_staleness_steps
        self.stale_action = stale_action
        self.steps_done = self.start_steps = steps_done
        self.needed = (total_steps - steps_done) * batch_size  # groups the rest of the run trains
        self.version = version
        self.next_prompt = next_prompt
        self.queue = sorted(set(int(k) for k in pending))  # prompts to (re)generate before next_prompt
        self.attempts: dict[int, int] = {}
        self.generate_unit = generate_unit
        self.loads_between_units = loads_between_units
        self.clock = clock
        self.cond = threading.Condition()
        self.accepted = 0  # delivered, not dropped (trained or ready), since this producer started
        self.running = 0  # groups of running units
        self.running_prompts: set[int] = set()
        self.ready: list[Group] = []
        self.dropped_total = 0  # trajectories
        self.consumed_total = 0  # groups handed to the trainer
        self.error: Optional[BaseException] = None
        self.paused = False
        self.stopped = False
        self._idle_since: Optional[float] = clock()
        self._generator_idle = 0.0
        self._thread = threading.Thread(target=self._schedule, name="rollout-producer", daemon=True)

    # -- trainer side -----------------------------------------------------------------------------
    def start(self) -> "RolloutProducer":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops admitting; running units finish in their (daemon) threads and are discarded."""
        with self.cond:
            self.stopped = True
            self.cond.notify_all()

    def published(self, version: int, steps_done: int) -> None:
        """Every serving sidecar now holds `version`, and `steps_done` RL steps are trained."""
        with self.cond:
            self.version, self.steps_done = version, steps_done
            self.cond.notify_all()

    def pause(self) -> None:
        """Stops admitting and waits until no unit runs (one_step: before a weight load)."""
        with self.cond:
            self.paused = True
            self.cond.notify_all()
            while self.running and self.error is None:
                self.cond.wait()

    def resume(self) -> None:
        with self.cond:
            self.paused = False
            self.cond.notify_all()

    def take(self, version: int) -> TakeResult:
        """The next B fresh groups for the step that trains policy `version` (blocks).

        A ready group with `version - first_version > S` is dropped (or queued for
        regeneration) first. Raises the first exception of a unit (e.g. a `SidecarError`).
        """
        t0 = self.clock()
        dropped = regenerated = 0
        with self.cond:
            while True:
                if self.error is not None:
                    raise self.error
                keep = []
                for g in self.ready:
                    if version - g.first_version > self.max_staleness_steps:
                        dropped += len(g.trajs)
                        self.accepted -= 1
                        if self.stale_action == "regenerate":
                            regenerated += len(g.trajs)
                            self.attempts[g.prompt_index] = self.attempts.get(g.prompt_index, 0) + 1
                            self.queue = sorted(self.queue + [g.prompt_index])
                    else:
                        keep.append(g)
                self.ready = keep
                if dropped:
                    self.cond.notify_all()  # capacity freed
                if len(self.ready) >= self.B:
                    break
                self.cond.wait()
            self.ready.sort(key=lambda g: g.prompt_index)
            groups, self.ready = self.ready[:self.B], self.ready[self.B:]
            self.dropped_total += dropped
            self.consumed_total += len(groups)
            now = self.clock()
            idle = self._generator_idle + (now - self._idle_since if self._idle_since is not None else 0.0)
            self._generator_idle = 0.0
            if self._idle_since is not None:
                self._idle_since = now
            in_flight = self.running * self.n
        return TakeResult(groups, dropped, regenerated, in_flight, now - t0, idle)

    def snapshot(self) -> tuple[int, list[int]]:
        """(next_prompt, pending): the data position a checkpoint records. `pending` are the
        prompts admitted but not trained (running, ready or queued): a resumed run generates them
        again before `next_prompt`."""
        with self.cond:
            pending = set(self.queue) | self.running_prompts | {g.prompt_index for g in self.ready}
            return self.next_prompt, sorted(pending)

    # -- scheduler --------------------------------------------------------------------------------
    def capacity(self) -> int:
        """Groups that may start now (the capacity rule; call with `cond` held)."""
        if self.paused or self.stopped:
            return 0
        used = self.accepted + self.running  # groups delivered (not dropped) or on their way
        stale_room = (self.max_staleness_steps + self.steps_done - self.start_steps + 1) * self.B - used
        return max(0, min(self.W - self.running, stale_room, self.needed - used))

    def _next_unit(self, room: int) -> tuple[int, list[int]]:
        """Up to `room` prompts of one step: the queued ones first, then the stream."""
        if self.queue:
            step = self.queue[0] // self.B
            unit = [k for k in self.queue if k // self.B == step][:room]
            self.queue = [k for k in self.queue if k not in set(unit)]
            return step + 1, unit
        step = self.next_prompt // self.B
        end = min(self.next_prompt + room, (step + 1) * self.B)
        unit = list(range(self.next_prompt, end))
        self.next_prompt = end
        return step + 1, unit

    def _schedule(self) -> None:
        while True:
            with self.cond:
                while not self.stopped and self.error is None and self.capacity() == 0:
                    self.cond.wait()
                if self.stopped or self.error is not None:
                    return
                step, unit = self._next_unit(self.capacity())
                attempts = [self.attempts.get(k, 0) for k in unit]
                self.running += len(unit)
                self.running_prompts.update(unit)
                if self._idle_since is not None:
                    self._generator_idle += self.clock() - self._idle_since
                    self._idle_since = None
                version = self.version
            threading.Thread(target=self._run_unit, args=(step, unit, attempts, version), daemon=True,
                             name=f"rollout-unit-{unit[0]}").start()

    def _run_unit(self, step: int, unit: list[int], attempts: list[int], version: int) -> None:
        t0 = self.clock()
        try:
            results = self.generate_unit(step, unit, attempts)
            if sorted(k for k, _, _ in results) != sorted(unit):
                raise RuntimeError(f"generate_unit returned prompts {[k for k, _, _ in results]} for {unit}")
        except BaseException as e:  # noqa: BLE001 - handed to the trainer by take()
            with self.cond:
                if self.error is None and not self.stopped:
                    self.error = e
                self.running -= len(unit)
                self.running_prompts.difference_update(unit)
                self.cond.notify_all()
            return
        for k, trajs, delay in sorted(results, key=lambda r: (r[2], r[0])):
            wait = t0 + delay - self.clock()
            if wait > 0:
                time.sleep(wait)
            group = Group(k, list(trajs), version)
            with self.cond:
                self.running -= 1
                self.running_prompts.discard(k)
                if not self.stopped:
                    self.ready.append(group)
                    self.accepted += 1
                if self.running == 0 and self._idle_since is None:
                    self._idle_since = self.clock()
                self.cond.notify_all()
