"""The tool mirror (`SandboxConfig.tool_mirror`, `harbor.tool_mirror`, `--tool-mirror`): a verifier that
downloads a program from a host that is not a package registry (`curl https://astral.sh/uv/... | sh`) fails
without network; with a tool mirror the program it then calls is found at the end of the verifier's PATH.
The agent never sees the mirror, and a program of the same name in the image comes first."""
from __future__ import annotations

import pytest

from harbor_helpers import SHELL_DOCKERFILE, make_task

from jaxrl.envs.harbor import SandboxConfig, TrialConfig, run_trial

# The shape of the public verifiers: fetch an installer (fails: no network), then call the tool it installs.
FETCH_THEN_CALL = """#!/bin/bash
curl -LsSf https://tools.invalid/install.sh 2>/dev/null | sh
source $HOME/.local/bin/env 2>/dev/null
if [ "$(jaxrl-probe-tool 21)" = "42" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""


def _mirror(tmp_path, name="jaxrl-probe-tool", body='echo $(( $1 * 2 ))'):
    mirror = tmp_path / "tools"
    (mirror / "bin").mkdir(parents=True)
    tool = mirror / "bin" / name
    tool.write_text(f"#!/bin/sh\n{body}\n")
    tool.chmod(0o755)
    return mirror


def test_the_verifier_finds_the_mirrored_tool_and_fails_without_it(tmp_path):
    mirror = _mirror(tmp_path)
    task = make_task(tmp_path / "tasks", "fetch-at-verify", test_sh=FETCH_THEN_CALL, dockerfile=SHELL_DOCKERFILE)
    assert not task.config.allow_internet
    with_mirror = run_trial(task, config=TrialConfig(sandbox=SandboxConfig(tool_mirror=str(mirror))),
                            agent=lambda trial: None)
    assert with_mirror.reward == 1.0, with_mirror.test_output
    without = run_trial(task, agent=lambda trial: None)
    assert without.reward == 0.0, without.test_output


def test_the_agent_does_not_see_the_mirror(tmp_path):
    mirror = _mirror(tmp_path)
    task = make_task(tmp_path / "tasks", "agent-view", test_sh=FETCH_THEN_CALL, dockerfile=SHELL_DOCKERFILE)
    seen = {}

    def agent(trial):
        seen["which"] = trial.exec("command -v jaxrl-probe-tool; ls /opt/jaxrl-tools 2>&1; echo end").output

    run_trial(task, config=TrialConfig(sandbox=SandboxConfig(tool_mirror=str(mirror))), agent=agent)
    assert "jaxrl-probe-tool" not in seen["which"].replace("/opt/jaxrl-tools", "")
    assert "No such file" in seen["which"], seen["which"]


def test_a_program_the_verifier_installs_comes_before_the_mirror(tmp_path):
    """The mirror is last on PATH: a tool the verifier (or the image) provides itself wins."""
    mirror = _mirror(tmp_path, body="echo mirror")
    test_sh = ("#!/bin/bash\nmkdir -p /tmp/own && printf '#!/bin/sh\\necho own\\n' > /tmp/own/jaxrl-probe-tool\n"
               "chmod +x /tmp/own/jaxrl-probe-tool; export PATH=/tmp/own:$PATH\n"
               "[ \"$(jaxrl-probe-tool)\" = own ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n")
    task = make_task(tmp_path / "tasks", "own-first", test_sh=test_sh, dockerfile=SHELL_DOCKERFILE)
    res = run_trial(task, config=TrialConfig(sandbox=SandboxConfig(tool_mirror=str(mirror))), agent=lambda t: None)
    assert res.reward == 1.0, res.test_output


def test_a_uv_verifier_without_a_python_in_the_image_says_so():
    """The public math-modeling fixtures on ubuntu:24.04 (no Python), with the tool mirror: curl is missing
    (the installer does not run), then the mirror's uvx finds no Python to run pytest on and cannot download
    one offline. The gate blamed the missing curl; the cause is the missing Python."""
    from jaxrl.envs.harbor import Outcome
    from jaxrl.envs.harbor.runner import _verifier_cause, verifier_cause
    from jaxrl.envs.harbor.trial import TrialResult

    out = ("/tests/test.sh: line 6: curl: command not found\n/tests/test.sh: line 7: /root/.local/bin/env: No such "
           "file or directory\nerror: No interpreter found in managed installations or search path\n\nhint: A managed "
           "Python download is available, but uv is set to offline mode\n")
    r = TrialResult("t", "t__1", Outcome.OK, 0.0, verifier_exit_code=0, test_output=out)
    assert _verifier_cause(r)[0] == "verifier needs a Python download"
    assert "finds no Python in the image" in verifier_cause(r) and "No interpreter found" in verifier_cause(r)
    # without the tool mirror the same verifier stops at the missing uvx: that stays a missing program
    r = TrialResult("t", "t__1", Outcome.OK, 0.0, verifier_exit_code=127,
                    test_output="/tests/test.sh: line 6: curl: command not found\n/tests/test.sh: line 9: uvx: "
                                "command not found\n")
    assert _verifier_cause(r)[0] == "verifier program missing"


def test_a_tool_mirror_without_bin_is_one_clear_line(tmp_path, capsys):
    from jaxrl import tasks as tasks_cli

    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="has no bin/ folder"):
        SandboxConfig(tool_mirror=str(tmp_path / "empty")).validate()
    (tmp_path / "emptybin" / "bin").mkdir(parents=True)
    (tmp_path / "afile").write_text("")
    for arg, says in ((tmp_path / "empty", "no programs in its bin/"), (tmp_path / "emptybin", "no programs in its bin/"),
                      (tmp_path / "nope", "no such folder"), (tmp_path / "afile", "a file, not a folder"), ("", "is empty")):
        code = tasks_cli.main(["check", str(tmp_path), f"--tool-mirror={arg}"])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and says in err and "make_tool_mirror.sh" in err, (arg, err)
