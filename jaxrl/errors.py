"""Exceptions shared across layers; this module imports nothing of jaxrl.

`ConfigError` is raised by `jaxrl.config.validate` and by the modules whose checks it runs
(`jaxrl.gpu_memory`): they import it from here, so `jaxrl.config` can call them without an import
cycle. Its public name stays `jaxrl.config.ConfigError` (re-exported there).
"""
from __future__ import annotations

import argparse
import sys


class ConfigError(ValueError):
    """An invalid configuration value; the message names the key and how to fix it.

    `ConfigError(key, problem, fix)`; a single argument is taken as the whole message (libraries
    such as ml_collections re-raise an exception as `type(e)(message)`).
    """

    def __init__(self, key: str, problem: str | None = None, fix: str | None = None):
        super().__init__(key if problem is None else f"config key `{key}`: {problem}. Fix: {fix}")
        self.key = key


class Terminated(KeyboardInterrupt):
    """Raised in the main thread by SIGTERM (`jaxrl.cli.handle_sigterm`): a KeyboardInterrupt, so every
    cleanup that runs for Ctrl-C (sidecars stopped, the async producer stopped, checkpoints closed,
    partial folders removed) runs for a scheduler's stop too. Its public name stays `jaxrl.cli.Terminated`."""


_SIGTERM_RECEIVED = [False]


def note_sigterm() -> None:
    """Records that SIGTERM arrived (the handler's raise can be swallowed: see `raise_if_terminated`)."""
    _SIGTERM_RECEIVED[0] = True


def raise_if_terminated() -> None:
    """Raises `Terminated` when SIGTERM arrived and its handler's exception was swallowed: a signal handler
    runs between any two bytecodes of the main thread, also inside a garbage-collector or weakref callback
    (JAX's `_xla_gc_callback`), where Python prints "Exception ignored" and carries on. Loops call this at
    safe points (the trainer at each RL step), so a stop request is never lost."""
    if _SIGTERM_RECEIVED[0]:
        raise Terminated("SIGTERM")


class ArgumentParser(argparse.ArgumentParser):
    """`argparse.ArgumentParser` whose usage errors are one line, `error: PROG: MESSAGE (see PROG --help)`, and
    status 2, instead of argparse's usage block (an unknown option, a value outside `choices`, a missing
    argument). Its sub-parsers (`add_subparsers`) are of this class too. `--help` is argparse's."""

    def parse_known_args(self, args=None, namespace=None):
        self._argv = list(sys.argv[1:] if args is None else args)  # for `error`: what this parser was given
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        if message.startswith("the following arguments are required"):  # argparse says this before an unknown option
            unknown = [a for a in getattr(self, "_argv", []) if a.startswith("-") and a != "-"
                       and a.split("=", 1)[0] not in self._option_string_actions]
            if unknown:
                message = "unrecognized arguments: " + " ".join(unknown)
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")
