"""A SIGTERM whose `Terminated` is raised inside a garbage-collector callback is swallowed by Python
("Exception ignored in ..."), and the handler had already set SIGTERM to ignored: the fresh-user review saw a
run keep training and ignore every later SIGTERM (JAX's `_xla_gc_callback`). The arrival is now recorded,
and `raise_if_terminated` (called by the trainer at each RL step) raises it at the next safe point."""
from __future__ import annotations

import os
import signal

import pytest

from jaxrl import cli, errors


@pytest.fixture
def sigterm_handler():
    old = signal.getsignal(signal.SIGTERM)
    errors._SIGTERM_RECEIVED[0] = False
    cli.handle_sigterm()
    yield
    signal.signal(signal.SIGTERM, old)
    errors._SIGTERM_RECEIVED[0] = False


def test_a_sigterm_swallowed_in_a_finalizer_is_raised_at_the_next_safe_point(sigterm_handler, monkeypatch):
    import sys

    swallowed = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: swallowed.append(u.exc_type))  # "Exception ignored in"

    class Finalized:
        def __del__(self):  # as a GC callback: an exception raised in here is printed and dropped
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10_000):  # the handler runs at one of these bytecode boundaries
                pass

    obj = Finalized()
    del obj  # the handler's Terminated is raised inside __del__ and swallowed
    assert swallowed == [cli.Terminated]  # Python dropped the handler's exception
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # later SIGTERMs are ignored, as before
    with pytest.raises(cli.Terminated):
        errors.raise_if_terminated()


def test_no_sigterm_no_raise(sigterm_handler):
    errors.raise_if_terminated()  # nothing arrived: returns
    assert cli.Terminated is errors.Terminated


def test_a_sigterm_swallowed_during_an_evaluation_is_raised_when_it_ends(sigterm_handler, monkeypatch):
    """The first and the last evaluations run outside the step loop's check: a SIGTERM swallowed in one of them
    (the fresh-user review: during the starting policy's evaluation) went on to train a whole step, or, in
    the final one, to export and report as if the run had not been asked to stop."""
    import types

    from jaxrl.train import evaluation, trainer

    def evaluate_and_swallow(c, tasks, generate):
        errors.note_sigterm()  # what the handler records when its raise lands in a GC callback
        return {"eval/success_rate": 0.5}, []

    monkeypatch.setattr(evaluation, "evaluate", evaluate_and_swallow)
    fake = types.SimpleNamespace(prompts=types.SimpleNamespace(eval_batch=lambda: ["a task"]),
                                 state=types.SimpleNamespace(policy_version=3), is_main=True, progress=False,
                                 c=None, fleet=types.SimpleNamespace(generate=None), timings={})
    with pytest.raises(cli.Terminated):
        trainer.Trainer.evaluate(fake)
    assert fake._eval_result == {"eval/success_rate": 0.5}  # the result is kept for the resume's report
