"""`python -m jaxrl.main` in this test process: the command's `main(argv)` with its --config and
--workdir flag values set (what absl's parse would give them), stderr read with capsys.

For one-line error tests that need no fresh interpreter: the message, exit status and files left
are those of the real command (the same `main`); the command line itself, its flag parsing and the
absence of a traceback under `python -m` are proven by a few subprocess tests per entry point
(tests/test_config_cli.py, tests/test_cli_errors.py::test_main_checks_model_and_data_before_importing_jax).
"""
import os
import signal
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def recipe(spec: str = "configs/rloo.py", **overrides):
    """The config `--config=spec --config.KEY=VALUE ...` gives (keys dotted, values typed)."""
    from jaxrl.config import load_recipe

    c = load_recipe(os.path.join(ROOT, spec))
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = c
        for p in parents:
            node = node[p]
        node[leaf] = value
    return c


def run_main(monkeypatch, capsys, config, workdir, env=None):
    """Runs jaxrl.main's `main` on `config` and `workdir`; returns (exit status, stderr text).

    `env` is set in os.environ for the call; the variables `main` sets (the trainer's XLA memory
    share) are restored afterwards by monkeypatch, and so is the SIGTERM handler it installs."""
    from jaxrl import gpu_memory
    from jaxrl import main as main_cmd

    for key in gpu_memory.trainer_env(config):  # noted, so that monkeypatch restores (or removes) it
        present = key in os.environ
        monkeypatch.setenv(key, os.environ.get(key, ""))
        if not present:
            monkeypatch.delenv(key)
    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(main_cmd, "_CONFIG", types.SimpleNamespace(value=config))
    monkeypatch.setattr(main_cmd, "_WORKDIR", types.SimpleNamespace(value=str(workdir)))
    monkeypatch.chdir(ROOT)
    capsys.readouterr()
    sigterm = signal.getsignal(signal.SIGTERM)  # main() installs its own (cli.handle_sigterm)
    try:
        with pytest.raises(SystemExit) as e:
            main_cmd.main(["jaxrl.main"])
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    return e.value.code, capsys.readouterr().err
