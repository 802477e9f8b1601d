"""How sandbox processes are started: on one long-lived spawner thread (`_spawn`: bwrap's
--die-with-parent fires when the thread that forked it exits) and with every signal at its default
disposition and unblocked (`_with_default_signals`, `_signal_kwargs`: through `env --default-signal`
where the host's env has it, else a `preexec_fn`).
"""
from __future__ import annotations

import functools
import queue
import signal
import subprocess
import threading


_RESET_SIGNALS = ("/usr/bin/env", "--default-signal")


_SPAWN_QUEUE: "queue.Queue" = queue.Queue()
_SPAWNER: list = []
_SPAWNER_LOCK = threading.Lock()


def _spawner_loop() -> None:
    while True:
        fn, box, ev = _SPAWN_QUEUE.get()
        try:
            box.append((True, fn()))
        except BaseException as e:  # noqa: BLE001 -- handed to the caller
            box.append((False, e))
        ev.set()


def _spawn(fn):
    """Runs `fn` (a Popen) on one long-lived thread. bwrap's --die-with-parent is PR_SET_PDEATHSIG,
    which fires when the *thread* that forked it exits: a sandbox instance started from a short-lived
    agent thread (a lingering oracle, the persistent shell) would die with that thread."""
    with _SPAWNER_LOCK:
        if not _SPAWNER or not _SPAWNER[0].is_alive():
            t = threading.Thread(target=_spawner_loop, daemon=True, name="jaxrl-sandbox-spawner")
            t.start()
            _SPAWNER[:] = [t]
    box: list = []
    ev = threading.Event()
    _SPAWN_QUEUE.put((fn, box, ev))
    ev.wait()
    ok, value = box[0]
    if not ok:
        raise value
    return value


def _default_signals() -> None:
    """`preexec_fn` fallback of `_signal_kwargs`: default dispositions and an empty signal mask."""
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP, signal.SIGTSTP, signal.SIGTTIN,
                signal.SIGTTOU, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


@functools.lru_cache(maxsize=None)
def _env_resets_signals() -> bool:
    """True when this host's ``env`` has ``--default-signal`` (GNU coreutils >= 8.31), checked once."""
    try:
        return subprocess.run([*_RESET_SIGNALS, "true"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _with_default_signals(argv: list[str]) -> list[str]:
    """`argv` started through ``env --default-signal``, which execs it with every signal at its default
    disposition and unblocked.

    Why: a child inherits ignored signals and the blocked-signal mask of the thread that forks it, and
    an interactive bash cannot undo an ignored SIGINT. Started from a process that ignores or blocks
    SIGINT (nohup-like launchers, some schedulers, a host thread with a mask), the agent's Ctrl-C
    would then never stop a command in the trial's shell. ``env`` does the reset after exec, so the
    fork itself runs no Python code: a `preexec_fn` in the multithreaded trainer (JAX, env worker
    threads) could deadlock the child before exec. Hosts whose ``env`` lacks the option (coreutils
    < 8.31, e.g. RHEL 8) get the same reset from `_signal_kwargs`' `preexec_fn` instead."""
    return [*_RESET_SIGNALS, *argv] if _env_resets_signals() else list(argv)


def _signal_kwargs() -> dict:
    """Popen keyword arguments completing `_with_default_signals`: none where ``env`` resets the
    signals, else ``preexec_fn=_default_signals`` (the same reset, done in the forked child)."""
    return {} if _env_resets_signals() else {"preexec_fn": _default_signals}
