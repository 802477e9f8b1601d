"""A JAX sidecar run as a child process (``python -m jaxrl.rollout.sidecar``), for the trainer."""
from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Optional, Sequence

log = logging.getLogger("jaxrl.sidecar")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to port 0, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def exit_with_parent() -> None:
    """Exits this process as soon as its parent dies (e.g. the trainer was killed with SIGKILL)."""
    parent = os.getppid()

    def watch():
        while True:
            if os.getppid() != parent:
                log.warning("parent process %d is gone; exiting", parent)
                os._exit(0)
            time.sleep(0.5)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


class SidecarProcess:
    """A JAX sidecar run as a child process (``python -m jaxrl.rollout.sidecar``).

    The port is fixed at construction (a free one if `port` is 0), so `url` stays valid across
    restarts. Output goes to `log_path` (default: /tmp/jaxrl_sidecar_<port>.log).

    Args:
      checkpoint: HF checkpoint directory.
      sync_dir, token_file: passed through (needed for weight loads).
      extra_args: further command-line arguments (e.g. ["--max-seq-len", "512"]).
      env: extra environment variables for the child (e.g. the XLA memory share,
        `jaxrl.gpu_memory.sidecar_env`).
    """

    def __init__(self, checkpoint: str, *, port: int = 0, host: str = "127.0.0.1", sync_dir: Optional[str] = None,
                 token_file: Optional[str] = None, extra_args: Sequence[str] = (), env: Optional[dict] = None,
                 log_path: Optional[str] = None):
        self.host = host
        self.port = port or free_port(host)
        self.cmd = [sys.executable, "-m", "jaxrl.rollout.sidecar", "--checkpoint", checkpoint, "--host", host,
                    "--port", str(self.port)]
        if sync_dir:
            self.cmd += ["--sync-dir", sync_dir]
        if token_file:
            self.cmd += ["--token-file", token_file]
        self.cmd += list(extra_args)
        self.env = {**os.environ, **(env or {})}
        self.log_path = log_path or os.path.join("/tmp", f"jaxrl_sidecar_{self.port}.log")
        self.proc: Optional[subprocess.Popen] = None
        self._log = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "SidecarProcess":
        """Starts the process (no-op if running). Call `wait_healthy` before sending requests."""
        if self.alive():
            return self
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> Optional[int]:
        return None if self.proc is None else self.proc.poll()

    def _log_tail(self, n: int = 2000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - n))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def wait_healthy(self, timeout_s: float = 300.0) -> dict:
        """Blocks until ``GET /health`` answers 200; returns its JSON.

        Raises:
          RuntimeError: the process exited (with the tail of its log) or was never started.
          TimeoutError: not healthy within `timeout_s`.
        """
        import httpx

        deadline = time.monotonic() + timeout_s
        while True:
            if not self.alive():
                raise RuntimeError(f"sidecar {self.url} is not running (exit code {self.returncode}); "
                                   f"log {self.log_path}:\n{self._log_tail()}")
            try:
                r = httpx.get(self.url + "/health", timeout=2.0)
                if r.status_code == 200:
                    return r.json()
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"sidecar {self.url} not healthy after {timeout_s} s; log {self.log_path}")
            time.sleep(0.2)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `timeout_s`."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def kill(self) -> None:
        """SIGKILL now (what a crash looks like to the client)."""
        if self.alive():
            self.proc.kill()
            self.proc.wait()

    def restart(self, timeout_s: float = 300.0) -> dict:
        """stop + start + wait_healthy; returns the health JSON."""
        self.stop()
        return self.start().wait_healthy(timeout_s)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
