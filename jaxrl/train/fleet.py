"""The rollout fleet: the sidecar processes the trainer owns (or the external ones it is given),
the client that spreads requests over them, weight publication, and restarts.

Process 0 owns the fleet; every process writes its shards of a published version (`publish`).
A sidecar that dies during generation or during a weight load is restarted once (it loads the
newest committed version itself, `--resume-latest`) and the call is retried. With several
sidecars, one that fails to load a version is taken out of rotation (no request goes to it) until
a later load on it succeeds; the run goes on with the others. In asynchronous modes the client
accepts completions of versions newer than the one expected when the request was sent (a sidecar
loads new weights between requests while the generator keeps sending them).
"""
from __future__ import annotations

import dataclasses
import os
import re
import secrets
import signal
import sys
import threading
import time
from typing import Optional

from jaxrl import config as config_lib
from jaxrl import gpu_memory
from jaxrl.envs import RolloutConfig, run_rollouts
from jaxrl.rollout import weight_sync
from jaxrl.rollout.client import SidecarClient, SidecarError
from jaxrl.rollout.process import SidecarProcess
from jaxrl.rollout.types import SamplingParams


def sidecar_error_text(e: Exception) -> str:
    """A sidecar failure as a CLI user should read it: one line, without hints that name Python
    API (the client library suggests `SidecarProcess.restart()` to Python callers; the trainer
    has already restarted the sidecars it owns when the error reaches the user)."""
    text = " ".join(str(e).split())
    return re.sub(r"\s*\([^()]*\b[A-Z]\w*\.\w+\(\)[^()]*\)", "", text)  # "(... SidecarProcess.restart())"


def sidecar_fix_text(e: Exception) -> str:
    """The fix line under a sidecar failure. A refusal (4xx: `SidecarRefused`) does not go away on a
    rerun, so it names what to change; any other failure (a dead or unreachable sidecar, a failed
    load) is resumed by rerunning the same command."""
    from jaxrl.rollout.client import SidecarRefused

    if not isinstance(e, SidecarRefused):
        return "Rerun the same command to resume from the last checkpoint."
    if e.status == 401:
        return ("Fix: pass --config.generator.token_file=<the token file the sidecar was started with "
                "(JAXRL_TOKEN_FILE / --token-file)>, then rerun.")
    if e.status == 403 and "sync directory" in str(e):
        return ("Fix: the sidecar serves another run's sync directory: start it with SYNC_DIR=<this run's "
                "--workdir>/sync (launch/vllm_sidecar.sh MODEL PORT WORKDIR/sync), or pass the --workdir whose "
                "sync/ it serves, then rerun.")
    return "Fix: change what the sidecar refused (above), then rerun; rerunning unchanged gets the same refusal."


def _maybe_kill_sidecar(point: str, version: int, sidecars) -> None:
    """Fault injection: JAXRL_KILL_SIDECAR_AT="publish:<version>" SIGKILLs the first sidecar just
    before it is asked to load policy version <version> (a sidecar dying during weight sync)."""
    spec = os.environ.get("JAXRL_KILL_SIDECAR_AT", "")
    if sidecars and spec == f"{point}:{version}":
        sidecars[0].kill()


def _maybe_damage_version(version: int, path: str) -> None:
    """Fault injection: JAXRL_DAMAGE_AT="publish:<version>" truncates the largest data file of the
    committed policy version <version> to half before the sidecars are asked to load it (a version
    damaged on disk after its commit)."""
    if os.environ.get("JAXRL_DAMAGE_AT", "") != f"publish:{version}":
        return
    files = [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    biggest = max(files, key=os.path.getsize)
    with open(biggest, "r+b") as f:
        f.truncate(os.path.getsize(biggest) // 2)


def _maybe_kill_during_load(version: int, client, load) -> None:
    """Fault injection: JAXRL_KILL_AT="load:<version>" SIGKILLs the trainer while the sidecars load
    policy version <version>: the version is committed in the sync directory, the load runs in a
    thread, and the kill comes 0.01 s after its first `/v1/load_weights` request went out (the
    sidecars are then loading it or waiting for their running completions)."""
    if os.environ.get("JAXRL_KILL_AT", "") != f"load:{version}":
        return
    sent = threading.Event()
    client._http.event_hooks["request"].append(
        lambda request: sent.set() if request.url.path.endswith("/v1/load_weights") else None)
    threading.Thread(target=load, daemon=True).start()
    sent.wait(30)
    time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGKILL)


class Fleet:
    """Sidecars + client of one run. `start()` on process 0; `publish()` on every process.

    Args:
      c: the run config; workdir: the run directory (sidecar logs, token, `sync/`);
      model_dir: the policy checkpoint the sidecars start from; chat: its `ChatTemplate`;
      is_main: True on process 0 (the only one that talks to sidecars).
    """

    def __init__(self, c, workdir: str, model_dir: str, chat, is_main: bool, harbor=None):
        self.c = c
        # Harbor runs (`jaxrl.train.harbor.HarborTasks`): each trajectory a sandboxed terminal trial.
        self.harbor = harbor
        self.make_env = harbor.make_env_factory(workdir) if harbor is not None and is_main else None
        if self.make_env is not None and not c.harbor.keep_trial_logs:
            from jaxrl.train.harbor import remove_stale_trials

            if removed := remove_stale_trials(workdir):
                print(f"jaxrl: removed {removed} trial folder(s) in {workdir}/trials left by a launch that was "
                      "killed mid-trial (harbor.keep_trial_logs=False)", file=sys.stderr)
        self.workdir = workdir
        self.model_dir = model_dir
        self.chat = chat
        self.is_main = is_main
        self.sync_dir = os.path.join(workdir, "sync")
        self.sidecars: list[SidecarProcess] = []
        self.client: Optional[SidecarClient] = None
        self.last_sync_seconds = 0.0
        self.last_sync_bytes = 0
        self.in_flight_updates = c.trainer.async_rl.mode != "sync"
        self._restart_lock = threading.Lock()  # rollout units of the async producer restart concurrently

    # -- processes ------------------------------------------------------------------------------
    def start(self) -> None:
        """Starts the trainer-owned sidecars (or connects to `generator.sidecar_urls`) and waits
        until each is healthy.

        Raises:
          ConfigError: `generator.token_file` does not exist.
          SidecarError / RuntimeError / TimeoutError: a sidecar did not come up.
        """
        c = self.c
        from jaxrl.train import evaluation

        rows = evaluation.engine_batch_rows(c)  # one definition, shared with jaxrl.evaluate
        if c.generator.sidecar_urls:  # external sidecars (vLLM, or JAX ones started by launch/slurm_job.sh)
            self.client = SidecarClient(list(c.generator.sidecar_urls), token_file=self.token_file(),
                                        backend=c.generator.backend, in_flight_updates=self.in_flight_updates,
                                        max_prompts_per_request=max(1, rows // c.generator.n_samples_per_prompt))
            if c.generator.colocate_with_trainer:  # they must claim the configured share of the trainer's GPUs
                gpu_memory.check_external_sidecars(c, self.client.health())
            return
        max_seq = self.rollout_cfg().max_seq_len
        extra = ["--resume-latest", "--exit-with-parent", "--max-batch-rows", str(rows), "--max-seq-len", str(max_seq),
                 "--dtype", c.model.compute_dtype, "--log-level", "warning",
                 # request limits that admit every request this run sends (chunks of <= rows samples)
                 "--max-n", str(max(256, c.generator.n_samples_per_prompt)), "--max-prompt-tokens", str(max_seq),
                 "--max-total-tokens", str(max(1 << 25, rows * max_seq))]
        env = {"XLA_FLAGS": "", "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", ""), **gpu_memory.sidecar_env(c)}
        for i in range(c.generator.num_sidecars):
            sp = SidecarProcess(self.model_dir, sync_dir=self.sync_dir, token_file=self.token_file(), extra_args=extra,
                                env=env, log_path=os.path.join(self.workdir, f"sidecar_{i}.log"))
            self.sidecars.append(sp.start())
        for sp in self.sidecars:
            sp.wait_healthy()
        self.client = SidecarClient([sp.url for sp in self.sidecars], token_file=self.token_file(),
                                    in_flight_updates=self.in_flight_updates,
                                    max_prompts_per_request=max(1, rows // c.generator.n_samples_per_prompt))

    def token_file(self) -> str:
        """The shared sidecar token file (`generator.token_file`, or workdir/.sidecar_token, created
        0600). Raises ConfigError when a configured token file does not exist."""
        if self.c.generator.token_file:
            if not os.path.isfile(self.c.generator.token_file):
                raise config_lib.ConfigError("generator.token_file", f"{self.c.generator.token_file!r} does not exist",
                                             "point it at the token file the sidecars were started with")
            return self.c.generator.token_file
        path = os.path.join(self.workdir, ".sidecar_token")
        if not os.path.exists(path):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(16))
        return path

    def close(self) -> None:
        """Stops the trainer-owned sidecars, closes the client and removes an empty trials/ folder
        (Harbor runs that keep no trial logs)."""
        for sp in self.sidecars:
            sp.stop()
        if self.client is not None:
            self.client.close()
        if self.make_env is not None:
            from jaxrl.train.harbor import remove_empty_trials_dir

            remove_empty_trials_dir(self.workdir)

    def restart_dead(self) -> bool:
        """Restarts every trainer-owned sidecar process that has exited; True if any had.

        A restarted sidecar loads the newest committed policy version itself (--resume-latest).
        Raises:
          SidecarError: a sidecar did not come back (one line naming its log file).
        """
        with self._restart_lock:
            dead = [sp for sp in self.sidecars if not sp.alive()]
            for sp in dead:
                print(f"jaxrl: sidecar {sp.url} died (exit code {sp.returncode}); restarting", file=sys.stderr)
                try:
                    sp.restart()
                except (RuntimeError, TimeoutError) as e:
                    raise SidecarError(sp.url, f"did not restart ({str(e).splitlines()[0]}); see its log "
                                               f"{sp.log_path}") from None
            return bool(dead)

    def with_restart(self, what: str, fn):
        """Runs `fn()`; if it fails because a sidecar died, restarts the dead sidecars and runs it
        once more. Both rollouts and weight loads go through here, so a sidecar killed at any
        point is restarted the same way.

        Raises:
          SidecarError: the retry failed too, or no sidecar had died (a refusal, an external
            sidecar that is down); the message says what failed, without library internals.
        """
        try:
            return fn()
        except SidecarError as e:
            if not self.restart_dead():
                raise
            first = e
        try:
            return fn()
        except SidecarError as e:
            logs = ", ".join(sp.log_path for sp in self.sidecars)
            raise SidecarError(e.url, f"{what} failed again after restarting the sidecar that died ({first}); "
                                      f"sidecar logs: {logs}") from None

    # -- weights --------------------------------------------------------------------------------
    def publish(self, params, version: int) -> None:
        """Every process writes its shards of version `version` (`params` already in the engine's
        compute dtype, on the device, so trainer and engine hold the same weights); process 0 then
        has the sidecars load it, restarting a sidecar that died (also during the load) and loading
        again. Sets `last_sync_seconds` and `last_sync_bytes`."""
        t0 = time.perf_counter()
        stats = weight_sync.publish(params, self.sync_dir, version, keep=self.c.trainer.weight_sync_keep,
                                    dtype=self.c.model.compute_dtype)
        if self.is_main:
            path = weight_sync.version_path(self.sync_dir, version)
            _maybe_kill_sidecar("publish", version, self.sidecars)
            _maybe_damage_version(version, path)
            several = len(self.client.urls) > 1
            load = lambda: self.client.load_weights(version, path, partial_ok=several)  # noqa: E731
            _maybe_kill_during_load(version, self.client, load)
            self.with_restart(f"loading policy version {version}", load)
            if self.client.out_of_rotation and self.restart_dead():
                load()  # the restarted sidecars serve the newest version: back into rotation
            for url, why in self.client.out_of_rotation.items():
                print(f"jaxrl: warning: sidecar {url} failed to load policy version {version} and is out of "
                      f"rotation until it loads a later one ({sidecar_error_text(RuntimeError(why))})",
                      file=sys.stderr)
        self.last_sync_seconds = time.perf_counter() - t0
        self.last_sync_bytes = stats.bytes

    # -- generation -----------------------------------------------------------------------------
    def rollout_cfg(self, n: Optional[int] = None, num_tasks: int = 0) -> RolloutConfig:
        """The rollout loop's limits (generator.*; `n` samples per prompt, default the run's); Harbor
        runs drive the trials of `num_tasks` x n trajectories on `HarborTasks.concurrency` threads."""
        from jaxrl.train import evaluation  # one definition, shared with jaxrl.evaluate

        cfg = evaluation.rollout_config(self.c, n)
        if self.harbor is not None:
            cfg = dataclasses.replace(cfg, env_workers=max(1, self.harbor.concurrency(cfg.n_samples_per_prompt
                                                                                      * max(num_tasks, 1))))
        return cfg

    def generate(self, tasks, sampling: SamplingParams, n: int, chat=None):
        """`n` trajectories per task through the rollout loop (process 0), restarting a sidecar
        that dies and generating again. Harbor runs play each trajectory as a sandboxed trial.
        `chat`: the `ChatTemplate` to use (default the fleet's; threads that generate concurrently
        each pass their own, a tokenizer is not thread-safe)."""
        chat = chat or self.chat
        if self.make_env is None:
            return self.with_restart(
                "generation", lambda: run_rollouts(self.client, chat, tasks, sampling,
                                                   self.rollout_cfg(n, len(tasks)), make_env=self.make_env))
        from jaxrl.train import error_policy

        def play(ts, k, attempt):  # a retry samples with another seed (the same one would replay the same tokens)
            sp = sampling if attempt == 0 or sampling.seed is None else dataclasses.replace(
                sampling, seed=(sampling.seed + 7919 * attempt) % 2**31)
            return self.with_restart("generation", lambda: run_rollouts(self.client, chat, ts, sp,
                                                                        self.rollout_cfg(k, len(ts)),
                                                                        make_env=self.make_env))

        # Harbor trials: the error policy's retries and treatments (jaxrl/train/error_policy.py)
        return error_policy.with_retries(self.harbor.error_policy, play, list(tasks), n)
