"""One-line errors for the paths the commands are given (--workdir, --model, --output, --json,
--trials-dir, --extract-dir, model.path) and for a recipe file that does not load (its file and
line), and for a `config show` prefix or `--config.KEY` that matches no key (the nearest one, or
the top-level keys), checked in-process (no subprocess, no training)."""
import os
import re
import sys
import types

import pytest

from jaxrl import cli, fileio, policy
from jaxrl import config as config_lib
from jaxrl.config import ConfigError, base_config, validate
from jaxrl.envs import DEFAULT_POLICY_DIR


@pytest.fixture
def paths(tmp_path):
    """A regular file, an empty folder, and a folder with config.json but no weights."""
    f = tmp_path / "file.txt"
    f.write_text("x")
    empty = tmp_path / "empty"
    empty.mkdir()
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text("{}")
    return types.SimpleNamespace(file=str(f), empty=str(empty), no_weights=str(no_weights), tmp=str(tmp_path))


def test_output_path_problems(paths):
    under_file = os.path.join(paths.file, "sub")
    assert fileio.output_dir_problem(under_file) == f"{under_file} cannot be created: {paths.file} is a file, " \
                                                    "not a directory"
    assert fileio.output_dir_problem(os.path.join(under_file, "deeper")).endswith(f"{paths.file} is a file, "
                                                                                  "not a directory")
    assert fileio.output_dir_problem(paths.file) == f"{paths.file} exists and is a file, not a directory"
    assert fileio.output_dir_problem(os.path.join(paths.tmp, "new", "run")) is None
    assert fileio.output_dir_problem(paths.empty) is None
    assert fileio.output_file_problem(paths.empty) == f"{paths.empty} is a directory, not a file"
    out = os.path.join(paths.file, "result.json")
    assert fileio.output_file_problem(out) == f"{out} cannot be created: {paths.file} is a file, not a directory"
    assert fileio.output_file_problem(os.path.join(paths.tmp, "new", "result.json")) is None


def test_hf_checkpoint_problems(paths):
    missing = os.path.join(paths.tmp, "missing")
    assert fileio.hf_checkpoint_problem(missing) == f"{missing!r} does not exist"
    assert fileio.hf_checkpoint_problem(paths.file) == f"{paths.file!r} is a file, not a directory"
    assert "has no config.json" in fileio.hf_checkpoint_problem(paths.empty)
    assert fileio.hf_checkpoint_problem(paths.no_weights) == (f"{paths.no_weights!r} has a config.json but no "
                                                              "*.safetensors weights")
    assert fileio.hf_checkpoint_problem(DEFAULT_POLICY_DIR) is None
    c = base_config()
    for path, problem in ((missing, "does not exist"), (paths.no_weights, "has a config.json but no *.safetensors")):
        c.model.path = path
        with pytest.raises(ConfigError, match=re.escape(f"model.path`: '{path}' {problem}")) as e:
            validate(c)
        assert "Fix: point it at an HF-format checkpoint directory (config.json + *.safetensors" in str(e.value)


def test_workdir_under_a_file_is_one_line_naming_the_flag(paths, capsys, monkeypatch):
    """`python -m jaxrl.main --workdir=FILE/sub` (was a NotADirectoryError traceback from makedirs)."""
    from jaxrl import main as main_cmd

    c = base_config()
    monkeypatch.setattr(main_cmd, "_CONFIG", types.SimpleNamespace(value=c))
    from jaxrl import gpu_memory

    for key, value in gpu_memory.trainer_env(c).items():  # main() sets these; restored after the test
        monkeypatch.setenv(key, value)
    for wd, problem in ((os.path.join(paths.file, "sub"), f"cannot be created: {paths.file} is a file"),
                        (paths.file, "exists and is a file, not a directory")):
        monkeypatch.setattr(main_cmd, "_WORKDIR", types.SimpleNamespace(value=wd))
        with pytest.raises(SystemExit) as e:
            main_cmd.main(["jaxrl.main"])
        err = capsys.readouterr().err
        assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
        assert err.startswith(f"error: --workdir: {wd} {problem}") and "Fix: pass a directory path" in err, err
    assert not os.path.exists(os.path.join(paths.tmp, "sub"))


@pytest.mark.parametrize("command", ["evaluate", "chat"])
def test_model_path_errors_say_what_is_wrong_and_what_a_model_is(paths, capsys, monkeypatch, command):
    """A missing --model said "is not a directory" (chat, evaluate --config) or "no rl_config.json
    next to --model" (evaluate without --config); a folder without weights was a traceback."""
    import importlib

    cmd = importlib.import_module(f"jaxrl.{command}")
    flags = dict(_CONFIG=None, _OUTPUT=None) if command == "evaluate" else dict(
        _RUN_CONFIG=None, _DTYPE=None, _MAX_SEQ=64, _MAX_NEW=0, _TEMPERATURE=0.0, _TOP_P=1.0, _TOP_K=-1, _PROMPT=None)
    for name, value in flags.items():
        monkeypatch.setattr(cmd, name, types.SimpleNamespace(value=value))
    missing = os.path.join(paths.tmp, "missing")
    # A directory named like a training checkpoint but without params/: evaluate asked for
    # --config first, then said it is not an HF directory (regression; the directory's problem
    # comes first now).
    workdir = os.path.join(paths.tmp, f"run_{command}")
    ckpt = os.path.join(workdir, "checkpoints", "10")
    os.makedirs(os.path.join(ckpt, "state"))
    open(os.path.join(ckpt, "_CHECKPOINT_METADATA"), "w").close()
    open(os.path.join(workdir, "rl_config.json"), "w").write("{}")
    for model, problem in ((missing, f"--model {missing!r} does not exist"),
                           (paths.file, f"--model {paths.file!r} is a file, not a directory"),
                           (paths.no_weights, f"--model: {paths.no_weights!r} has a config.json but no *.safetensors"),
                           (ckpt, f"--model: {ckpt!r} has no config.json")):
        monkeypatch.setattr(cmd, "_MODEL", types.SimpleNamespace(value=model))
        with pytest.raises(SystemExit) as e:
            cmd.main([command])
        err = capsys.readouterr().err
        assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
        assert err.startswith(f"error: {problem}"), err
        if model == paths.no_weights:  # an HF checkpoint missing a file
            assert "Fix: restore the checkpoint's files (copy or export it again), or pass another checkpoint" in err
        else:
            assert "Fix: pass an HF-format checkpoint directory (config.json + *.safetensors" in err, err
        if model == ckpt:
            assert (f"(a training checkpoint 10 that has no params/: not a committed jaxrl checkpoint; "
                    f"{os.path.join(workdir, 'checkpoints')} holds none)") in err, err


def test_recipe_files_are_checked_before_they_run(tmp_path):
    """Regression (fresh-user review): `--config=setup.py` ran setup.py (setuptools' usage), a
    directory was said not to exist, and a .py without get_config() named neither file nor fix."""
    from jaxrl.config import recipe_file_problem

    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "helper.py").write_text("def get_configuration():\n    return 1\n")
    fix = "Fix: pass a recipe such as configs/rloo.py"
    for path, problem in ((str(tmp_path), "is a directory, not a recipe file"),
                          (str(tmp_path / "notes.txt"), "is not a Python recipe file (.py with get_config())"),
                          (str(tmp_path / "helper.py"), "defines no get_config(), so it is not a recipe")):
        assert f"{path!r} {problem}" in recipe_file_problem(path) and fix in recipe_file_problem(path)
    for recipe in os.listdir(os.path.join(ROOT, "configs")):
        assert recipe_file_problem(os.path.join(ROOT, "configs", recipe)) is None, recipe
    assert recipe_file_problem(str(tmp_path / "missing.py")) is None  # reported where it is loaded
    # tests/test_config_cli.py runs `jaxrl.main --config=<a setup.py>` and checks it is not executed.


@pytest.mark.parametrize("module, argv, message", [
    ("jaxrl.tasks", ["check", "--image-builder", "docker"],
     "python -m jaxrl.tasks check: argument --image-builder: invalid choice: 'docker' (choose from buildah, podman)"),
    ("jaxrl.tasks", ["lst"], "python -m jaxrl.tasks: argument cmd: invalid choice: 'lst'"),
    ("jaxrl.envs.harbor.funnel", ["/tmp", "--image-builder", "docker"],
     "python -m jaxrl.tasks funnel: argument --image-builder: invalid choice: 'docker'"),
    ("jaxrl.config_cli", ["show", "--colour"], "python -m jaxrl.config: unrecognized arguments: --colour"),
    # argparse names the missing sub-command before an unknown option: the unknown option is the mistake
    ("jaxrl.tasks", ["--bogus"], "python -m jaxrl.tasks: unrecognized arguments: --bogus"),
    ("jaxrl.rollout.sidecar", ["--backend", "sglang"],
     "python -m jaxrl.rollout.sidecar: argument --backend: invalid choice: 'sglang'"),
    # out-of-range numbers (fresh-user review: --port 99999 listened on 99999 mod 65536, --max-batch-rows=-1 and
    # --max-seq-len=0 were tracebacks from the engine's bucket code)
    ("jaxrl.rollout.sidecar", ["--port", "99999"],
     "python -m jaxrl.rollout.sidecar: argument --port: 99999: must be in [0, 65535]"),
    ("jaxrl.rollout.sidecar", ["--port", "1", "--max-batch-rows=-1"],
     "python -m jaxrl.rollout.sidecar: argument --max-batch-rows: -1: must be >= 1"),
    ("jaxrl.rollout.sidecar", ["--port", "1", "--max-seq-len=0"],
     "python -m jaxrl.rollout.sidecar: argument --max-seq-len: 0: must be >= 2"),
    ("jaxrl.rollout.sidecar", ["--port", "1", "--batch-wait-ms=nan"],
     "python -m jaxrl.rollout.sidecar: argument --batch-wait-ms: nan: must be >= 0"),
    ("jaxrl.rollout.sidecar", ["--port", "1", "--gpu-memory-utilization=1.5"],
     "python -m jaxrl.rollout.sidecar: argument --gpu-memory-utilization: 1.5: must be in (0, 1]"),
    # the sidecar's own checks of its arguments say it the same way (they printed the bare text, status 1)
    ("jaxrl.rollout.sidecar", ["--port", "1", "--backend", "vllm"],
     "python -m jaxrl.rollout.sidecar: --backend vllm needs --upstream (the loopback URL or unix socket of vLLM)"),
    ("jaxrl.rollout.sidecar", ["--port", "1"],
     "python -m jaxrl.rollout.sidecar: --backend jax needs --checkpoint (an HF checkpoint directory)"),
    ("jaxrl.rollout.sidecar", ["--port", "1", "--token-file", "/nonexistent/token"],
     "python -m jaxrl.rollout.sidecar: --token-file /nonexistent/token: cannot read it (No such file or directory)"),
])
def test_argparse_commands_say_a_usage_error_in_one_line(module, argv, message, capsys):
    """Regression (review): `python -m jaxrl.tasks check --image-builder docker` printed argparse's usage
    block. Every argparse command (jaxrl.errors.ArgumentParser, sub-commands included) prints one line
    and exits 2."""
    import importlib

    with pytest.raises(SystemExit) as e:
        importlib.import_module(module).main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "usage:" not in err, err
    assert err.startswith("error: " + message.split(": ", 1)[0]) and message.split("(choose")[0] in err, err
    assert err.rstrip().endswith("--help)"), err


def test_evaluate_output_is_checked_before_the_evaluation(paths, capsys, monkeypatch):
    from jaxrl import evaluate

    monkeypatch.setattr(evaluate, "_MODEL", types.SimpleNamespace(value=DEFAULT_POLICY_DIR))
    monkeypatch.setattr(evaluate, "_CONFIG", types.SimpleNamespace(value=base_config()))
    monkeypatch.setattr(evaluate, "_OUTPUT", types.SimpleNamespace(value=os.path.join(paths.file, "r.json")))
    with pytest.raises(SystemExit) as e:
        evaluate.main(["evaluate"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"error: --output: {paths.file}/r.json cannot be created"), err


def test_run_config_that_does_not_exist():
    with pytest.raises(policy.PolicyError, match="/missing/rl_config.json: the run config does not exist"):
        policy.read_run_config("/missing/rl_config.json")


def test_tasks_output_flags(paths):
    from jaxrl import tasks

    args = types.SimpleNamespace(json=None, trials_dir=None, extract_dir=os.path.join(paths.file, "x"))
    assert tasks.output_path_problem(args).startswith(f"--extract-dir: {paths.file}/x cannot be created")
    args.json = os.path.join(paths.file, "r.json")
    assert tasks.output_path_problem(args).startswith(f"--json: {paths.file}/r.json cannot be created")
    assert tasks.output_path_problem(types.SimpleNamespace(json=None, trials_dir=paths.tmp, extract_dir=None)) is None


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _broken_recipes(tmp_path):
    """Copies of configs/rloo.py with one bad line: {name: (path, bad line number, error kind, message)}."""
    lines = open(os.path.join(ROOT, "configs", "rloo.py")).read().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("def get_config"))
    out = {}
    for name, bad, kind, message in (
            ("syntax", ["("], "SyntaxError", "'(' was never closed"),  # a stray "(" before get_config
            ("name", ["undefined_name"], "NameError", "name 'undefined_name' is not defined"),
            ("value", [lines[at], '    int("x")'], "ValueError", "invalid literal for int() with base 10: 'x'"),
            ("oserror", [lines[at], '    open("/nonexistent/x")'], "FileNotFoundError", "No such file or directory")):
        new = lines[:at] + bad + lines[at + (1 if bad[0] == lines[at] else 0):]
        path = tmp_path / f"{name}.py"
        path.write_text("\n".join(new) + "\n")
        out[name] = (str(path), at + len(bad), kind, message)  # the bad line is the last of `bad` (1-based)
    return out


def test_recipe_errors_name_the_file_and_line(tmp_path, monkeypatch, capsys):
    """A recipe with a stray "(" said only "error: '(' was never closed" (main, plan, evaluate) or
    printed a traceback (config show)."""
    from absl import flags
    from ml_collections import config_flags

    for name, (path, line, kind, message) in _broken_recipes(tmp_path).items():
        want = f"--config: recipe file {path}, line {line}: {kind}: "
        # config show / diff (config.load_recipe)
        with pytest.raises(ConfigError) as e:
            config_lib.load_recipe(path)
        assert str(e.value).startswith(want) and message in str(e.value), (name, str(e.value))
        assert str(e.value).endswith(f"Fix: correct line {line} of {path}")
        # main, plan, evaluate: the --config flag parse (cli.parse_flags -> flag_error_line), or the
        # first access of a config whose loading ml_collections deferred (cli.recipe_load_error)
        fv = flags.FlagValues()
        holder = config_flags.DEFINE_config_file("config", None, "recipe", flag_values=fv, lock_config=True)
        argv = ["jaxrl.main", f"--config={path}"]
        deferred_path = False
        try:
            fv(argv)
            holder.value.name  # noqa: B018 - raises the deferred OSError
        except OSError as deferred:
            deferred_path = True
            monkeypatch.setattr("sys.argv", argv)
            with pytest.raises(SystemExit):
                cli.recipe_load_error(deferred)
            line_out = capsys.readouterr().err
        except Exception as parse_error:  # noqa: BLE001 - what absl raised while parsing
            line_out = "error: " + cli.flag_error_line(parse_error, argv) + "\n"
        assert line_out.startswith("error: " + want) and message in line_out, (name, line_out)
        assert len(line_out.strip().splitlines()) == 1, line_out
        assert deferred_path == (name == "oserror")  # ml_collections defers only OSErrors


def test_unknown_prefix_or_key_suggests_the_nearest_or_lists_the_top_level_keys(monkeypatch):
    """`config show configs/rloo.py zzz` said nothing about where to start; a typo of a section
    name (`trainer.optimzer`) is answered with the section."""
    from jaxrl import config_cli

    monkeypatch.chdir(ROOT)
    sys.path.insert(0, os.path.join(ROOT, "configs"))
    import rloo

    top = sorted({k.split(".", 1)[0] for k in config_lib.flatten(rloo.get_config())})
    assert {"trainer", "generator", "data", "model", "seed"} <= set(top)
    for prefix, hint in (("zzz", f"no key is close to it; the top-level keys are {', '.join(top)}."),
                         ("trainer.optimzer", "did you mean `trainer.optimizer`?"),
                         ("lr", "did you mean `trainer.optimizer.lr`?"),
                         ("generater", "did you mean `generator`?")):
        with pytest.raises(ConfigError) as e:
            config_cli.show_lines("configs/rloo.py", [prefix])
        assert str(e.value) == (f"no key of configs/rloo.py starts with {prefix!r}; {hint} Fix: give the start of a "
                                "dotted key, e.g. trainer.optimizer (every key: python -m jaxrl.config show "
                                "configs/rloo.py)")
    argv = ["jaxrl.main", "--config=configs/rloo.py", "--config.zzz=1"]
    assert cli.flag_error_line(AttributeError(KeyError("zzz")), argv) == (
        f"unknown config key `zzz` (in --config.zzz=1); no key is close to it; the top-level keys are "
        f"{', '.join(top)}. List the keys with: python -m jaxrl.config show configs/rloo.py")


def test_sidecar_checkpoint_and_token_file_errors_are_one_line(paths, capsys):
    """`python -m jaxrl.rollout.sidecar --checkpoint /missing` (or a folder without weights, or a
    missing --token-file) was a FileNotFoundError traceback."""
    from jaxrl.rollout import sidecar

    missing = os.path.join(paths.tmp, "missing")
    checks = [(lambda c=c: sidecar.build_backend(sidecar.build_arg_parser().parse_args(["--port", "1", "--checkpoint", c])),
               f"--checkpoint: {c!r} {problem}. Fix: pass an HF-format checkpoint")
              for c, problem in ((missing, "does not exist"),
                                 (paths.no_weights, "has a config.json but no *.safetensors weights"))]
    checks.append((lambda: sidecar._read_token(missing),
                   f"--token-file {missing}: cannot read it (No such file or directory). Fix: pass the file"))
    for call, message in checks:  # (what main() runs before any engine is built)
        with pytest.raises(SystemExit) as e:
            call()
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1, err
        assert err.startswith(f"error: python -m jaxrl.rollout.sidecar: {message}"), err


def test_tasks_check_without_pytest_says_which_tasks_need_it_and_how_to_get_it(tmp_path, monkeypatch, capsys):
    """The plain `pip install -e .` has no pytest, which the `python` profile's verifiers run; the
    check said only "no Python with pytest", not which tasks need it nor that the dev extra has it."""
    from jaxrl import tasks

    no_pytest = tmp_path / "python-without-pytest"  # the running Python without site-packages
    no_pytest.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    no_pytest.chmod(0o755)
    monkeypatch.setenv("JAXRL_SANDBOX_PYTHON", str(no_pytest))
    monkeypatch.setattr(tasks, "check_sandbox", lambda config: None)  # no bubblewrap needed for this check
    assert tasks.main(["check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.match(r"error: \d+ of the 38 tasks \(e\.g\. jaxrl/\S+\) use the `python` profile, "
                                      "whose verifiers run pytest inside the sandbox; no Python with pytest", err[0])
    assert "the plain `pip install -e .` has none, `pip install -e '.[dev]'` has it" in err[0]
    assert "To check only the other tasks, pass --task NAME" in err[0]


def test_overrides_apply_to_a_run_config_with_the_recipe_checks(capsys):
    """jaxrl.evaluate without --config applies --config.KEY=VALUE to the run config next to --model
    (cli.apply_overrides; end to end in test_evaluate.py)."""
    c = base_config()
    got = cli.apply_overrides(c, ["--config.data.num_eval_prompts=4", "--config.generator.enable_thinking=True"],
                              "runs/r/rl_config.json")
    assert (got.data.num_eval_prompts, got.generator.enable_thinking) == (4, True)
    assert c.data.num_eval_prompts == 200  # the run config itself is left as it was
    for bad, line in (("--config.data.num_eval_promts=4", "error: unknown config key `data.num_eval_promts` (in "
                       "--config.data.num_eval_promts=4); did you mean `data.num_eval_prompts`? List the keys with: "
                       "python -m jaxrl.config show runs/r/rl_config.json"),
                      ("--config.data.num_eval_prompts=x", "error: config key `data.num_eval_prompts`: 'x' is not a "
                       "valid int value (the config has 200). Fix: e.g. --config.data.num_eval_prompts=200")):
        with pytest.raises(SystemExit) as e:
            cli.apply_overrides(c, [bad], "runs/r/rl_config.json")
        assert e.value.code == 2 and capsys.readouterr().err == line + "\n"


def test_tasks_check_names_every_unknown_task_and_the_fix(capsys):
    """Fresh-user review: `tasks check --task jaxrl/nope` printed a Python list and no fix, and an
    unknown name next to a known one was dropped silently (only the known task was checked)."""
    from jaxrl import tasks

    assert tasks.main(["check", "--task", "jaxrl/nope", "--task", "jaxrl/py-kata-caesar", "--task", "other"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: no task named jaxrl/nope, other in ")
    assert "Fix: pass a name that `python -m jaxrl.tasks list " in err[0] and "[" not in err[0]


@pytest.mark.parametrize("override, problem", [
    ("--config.model.path=/nonexistent", "config key `model.path`: '/nonexistent' does not exist"),
    ("--config.data.task=dataset", "config key `data.dataset_path`"),
])
def test_main_checks_model_and_data_before_importing_jax(tmp_path, override, problem):
    """Issue 25 §6: a bad model or data path was reported only after JAX (and the trainer) had been
    imported, 17-31 s on a loaded machine; the inputs are now checked first: the one-line error
    comes from a process that never imported jax."""
    import subprocess
    import sys

    code = ("import runpy, sys\n"
            f"sys.argv = ['jaxrl.main', '--config=configs/rloo.py', {override!r}, '--workdir={tmp_path}/run']\n"
            "try:\n    runpy.run_module('jaxrl.main', run_name='__main__')\n"
            "except SystemExit as e:\n    print('exit', e.code, 'jax' in sys.modules)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.stdout.strip() == "exit 2 False", (out.stdout, out.stderr[-2000:])
    assert out.stderr.startswith(f"error: {problem}") and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not os.path.exists(tmp_path / "run")
