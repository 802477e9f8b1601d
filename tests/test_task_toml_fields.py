"""Every Harbor 0.26 task.toml field is honoured or refused with one line naming it
(jaxrl/envs/harbor/task.py). The defaults are read from Harbor's own `TaskConfig` source in the
harbor wheel (tests/harbor_wheel.py); honoured fields are checked inside real sandboxed trials."""
from __future__ import annotations

import ast
import zipfile

import pytest

from harbor_helpers import make_task, write_task_dir
from harbor_wheel import harbor_wheel
from jaxrl.envs.harbor import HarborTaskError, Trial, TrialConfig, load_task
from jaxrl.envs.harbor.errors import SandboxError
from jaxrl.envs.harbor.task import TASK_TOML_FIELDS, parse_task_toml


def _harbor_models():
    with zipfile.ZipFile(harbor_wheel()) as z:
        return ast.parse(z.read("harbor/models/task/config.py").decode())


def _harbor_fields(cls_name):
    """{field: default source} of a pydantic model class in Harbor's config.py, with its bases'."""
    tree = _harbor_models()
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    out = {}

    def walk(name):
        c = classes.get(name)
        if c is None:
            return
        for b in c.bases:
            walk(ast.unparse(b))
        for st in c.body:
            if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                v = st.value
                if isinstance(v, ast.Call) and ast.unparse(v.func) == "Field":
                    kw = {k.arg: k.value for k in v.keywords}
                    v = kw.get("default", v.args[0] if v.args else None)
                out[st.target.id] = None if v is None else ast.unparse(v)

    walk(cls_name)
    return out


def test_every_harbor_field_is_known():
    tables = {"": "TaskConfig", "task": "PackageInfo", "agent": "AgentConfig", "verifier": "VerifierConfig",
              "solution": "SolutionConfig", "environment": "EnvironmentConfig"}
    for table, cls in tables.items():
        harbor = set(_harbor_fields(cls))
        if table == "":
            harbor |= {"version"}  # the old name of schema_version (Harbor renames it)
        if table == "environment":
            harbor |= {"memory", "storage"}  # deprecated, migrated by Harbor's validator
        assert harbor <= TASK_TOML_FIELDS[table], (table, sorted(harbor - TASK_TOML_FIELDS[table]))


def test_defaults_are_harbors():
    d = parse_task_toml("")
    agent, verifier, env = _harbor_fields("AgentConfig"), _harbor_fields("VerifierConfig"), _harbor_fields(
        "EnvironmentConfig")
    assert agent["timeout_sec"] == "None" and d.agent_timeout_sec is None  # main made it 600 s
    assert float(verifier["timeout_sec"]) == d.verifier_timeout_sec == 600.0
    assert float(env["build_timeout_sec"]) == d.build_timeout_sec == 600.0


@pytest.mark.parametrize("text,field", [
    ('[environment]\nhealthcheck = { command = "true" }\n', "[environment] healthcheck"),
    ('[environment]\nnetwork_mode = "public"\n', "[environment] network_mode"),
    ('[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n', "[environment] network_mode"),
    ('[agent]\nnetwork_mode = "public"\n', "[agent] network_mode"),
    ('[verifier]\nallowed_hosts = ["x.org"]\n', "[verifier] allowed_hosts"),
    ('[agent]\nuser = "root"\n', "[agent] user"),
    ('[verifier]\nuser = 0\n', "[verifier] user"),
    ('[verifier]\nenvironment_mode = "elsewhere"\n', "[verifier] environment_mode"),
    ('[verifier]\nenvironment = { docker_image = "x" }\n', "[verifier] environment"),
    ('artifacts = ["relative/out"]\n[verifier]\nenvironment_mode = "separate"\n', "artifacts"),
    ('[[verifier.collect]]\ncommand = "true"\nservice = "main"\n', "[verifier] collect"),
    ('[environment]\ngpus = 1\n', "[environment] gpus"),
    ('[environment]\ngpu_types = ["H100"]\n', "[environment] gpu_types"),
    ('[environment]\ntpu = { type = "v5" }\n', "[environment] tpu"),
    ('[environment]\nos = "windows"\n', "[environment] os"),
    ('[[environment.mcp_servers]]\nname = "m"\nurl = "http://x"\n', "[environment] mcp_servers"),
    ('[environment]\nskills_dir = "/skills"\n', "[environment] skills_dir"),
    ('[[steps]]\nname = "one"\n', "steps"),
    ('multi_step_reward_strategy = "mean"\n', "multi_step_reward_strategy"),
    ('artifacts = ["/app/out"]\n', "artifacts"),
    ('[environment]\nworkdir = "app/x"\n', "[environment] workdir"),
    ('[environment]\nworkdir = "/app/../etc"\n', "[environment] workdir"),
    ('[environment]\nmemory = "1G"\nmemory_mb = 512\n', "[environment] memory"),
    ('[verifier]\nenv = { TOKEN = "${JAXRL_SURELY_UNSET_VAR}" }\n', "env.TOKEN"),
])
def test_unsupported_fields_are_refused_by_name(text, field):
    with pytest.raises(HarborTaskError) as e:
        parse_task_toml(text, "t/task.toml")
    msg = str(e.value)
    assert field in msg and "\n" not in msg and msg.startswith("t/task.toml"), msg


def test_a_workdir_outside_app_loads_only_on_the_image_backend(tmp_path):
    """Regression: task.toml's workdir had to be under /app even on the image backend, whose container
    root is writable everywhere."""
    from harbor_helpers import write_task_dir

    from jaxrl.envs.harbor import load_task

    d = write_task_dir(tmp_path, "wd", toml='[environment]\nworkdir = "/srv/work"\nallow_internet = false\n')
    with pytest.raises(HarborTaskError, match="must be /app or below it on the profile path"):
        load_task(d)
    assert load_task(d, environment_backend="image").config.workdir == "/srv/work"
    # fresh-user review: auto refused it, telling the user to use auto; auto takes the image backend
    assert load_task(d, environment_backend="auto").environment.profile == "image"


def test_a_separate_verifier_parses_with_its_artifacts():
    """Harbor's separate verifier (the math-modeling tasks' form) parses; loading it on the profile path
    is refused by `load_task` (tests/test_image_backend.py runs it on the image backend)."""
    c = parse_task_toml('artifacts = ["/root/results/r.json", { source = "/root/out/" }]\n'
                        '[verifier]\nenvironment_mode = "separate"\n')
    assert c.verifier_mode == "separate" and c.artifacts == ("/root/results/r.json", "/root/out")
    assert parse_task_toml("").verifier_mode == "shared" and parse_task_toml("").artifacts == ()


def test_a_separate_verifier_without_artifacts_is_warned_about(tmp_path, caplog):
    """A separate verifier's container gets only the listed artifacts (and /logs/artifacts): without any,
    its test.sh reads nothing of the agent's work, which a task author should hear about at load."""
    sep = '[verifier]\nenvironment_mode = "separate"\n'
    d = write_task_dir(tmp_path, "sep", toml=sep)
    with caplog.at_level("WARNING", logger="jaxrl.envs.harbor.task"):
        load_task(d, environment_backend="image")
    assert "a separate verifier and no `artifacts`" in caplog.text, caplog.text
    caplog.clear()
    d = write_task_dir(tmp_path, "sep-art", toml='artifacts = ["/root/out"]\n' + sep)
    with caplog.at_level("WARNING", logger="jaxrl.envs.harbor.task"):
        load_task(d, environment_backend="image")
    assert "no `artifacts`" not in caplog.text


def test_accepted_fields(monkeypatch):
    monkeypatch.setenv("JAXRL_TEST_TOKEN", "s3cret")
    c = parse_task_toml('source = "dcagent"\n[task]\nname = "a/b"\ndescription = "d"\nkeywords = ["k"]\n'
                        '[agent]\nuser = "agent"\n[environment]\nnetwork_mode = "no-network"\nos = "Linux"\n'
                        'build_timeout_sec = 300\ngpus = 0\n'
                        '[verifier]\nenv = { TOKEN = "${JAXRL_TEST_TOKEN}", MODE = "${JAXRL_UNSET_X:-fast}" }\n')
    assert (c.name, c.allow_internet, c.build_timeout_sec) == ("a/b", False, 300.0)
    assert c.verifier_env == {"TOKEN": "s3cret", "MODE": "fast"}  # Harbor resolves ${VAR} from the host


TOML = """schema_version = "1.1"
[task]
name = "test/{name}"
[agent]
timeout_sec = 60.0
[verifier]
timeout_sec = 30.0
{extra}
"""


def test_environment_env_and_workdir_are_honoured(tmp_path):
    extra = '[environment]\nworkdir = "/app/work"\nenv = { GREETING = "hello there" }\n'
    test_sh = ('#!/bin/bash\nif [ "$GREETING" = "hello there" ] && [ "$(pwd)" = /app/work ]; then echo 1 > '
               '/logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n')
    task = load_task(write_task_dir(tmp_path, "env", toml=TOML.format(name="env", extra=extra), test_sh=test_sh,
                                    files={"environment/work/.keep": ""},
                                    dockerfile="FROM ubuntu:24.04\nWORKDIR /app\nRUN mkdir -p /app/work\n"))
    with Trial(task, tmp_path / "trial", TrialConfig(keep="none")) as trial:
        r = trial.exec('echo "$GREETING|$(pwd)"')
        assert r.output.strip() == "hello there|/app/work"
        trial.send_keys('echo "[$GREETING]"; pwd\n', 2)
        out = trial.terminal.read_new_output()
        assert "[hello there]" in out and "/app/work" in out
        assert trial.verify().reward == 1.0  # the verifier sees [environment] env and runs in the workdir


def test_build_timeout_bounds_the_environment_start(tmp_path):
    task = load_task(write_task_dir(tmp_path, "bt", toml=TOML.format(name="bt",
                                                                      extra="[environment]\nbuild_timeout_sec = 0.001\n")))
    with Trial(task, tmp_path / "trial", TrialConfig(keep="none")) as trial:
        with pytest.raises(SandboxError, match="did not start"):
            trial.terminal


def test_canary_lines_are_not_shown(tmp_path):
    task = make_task(tmp_path, "c", instruction="<!-- BENCHMARK DATA canary GUID 1234 -->\n# canary: x\n\nDo it.")
    assert task.instruction == "Do it.\n"
