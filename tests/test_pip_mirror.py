"""The local pip mirror (`SandboxConfig.pip_mirror`, `harbor.pip_mirror`, `--pip-mirror`): a verifier that
installs its tools at verification time, in a trial without network, installs them from the mirror; without
the mirror the same install fails (no network), so the reward tells which happened."""
from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

import pytest

from harbor_helpers import PY_DOCKERFILE, make_task

from jaxrl.envs.harbor import SandboxConfig, TrialConfig, run_trial

# pip install inside the trial (no network: allow_internet = false), then import what it installed.
INSTALL_TEST = """#!/bin/bash
if python3 -m pip install -q --no-cache-dir --disable-pip-version-check --target /tmp/site jaxrl-mirror-probe==1.0 \\
   && PYTHONPATH=/tmp/site python3 -c 'import jaxrl_mirror_probe as m; assert m.VALUE == 7'; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""


def _wheel(folder: Path) -> Path:
    """A minimal pure-Python wheel `jaxrl_mirror_probe-1.0` (PEP 427 layout, RECORD with sha256)."""
    files = {"jaxrl_mirror_probe/__init__.py": b"VALUE = 7\n",
             "jaxrl_mirror_probe-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: jaxrl-mirror-probe\nVersion: 1.0\n",
             "jaxrl_mirror_probe-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                      b"Tag: py3-none-any\n"}
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("jaxrl_mirror_probe-1.0.dist-info/RECORD,,")
    path = folder / "jaxrl_mirror_probe-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("jaxrl_mirror_probe-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def test_a_verifier_installs_from_the_mirror_without_network(tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    _wheel(mirror)
    task = make_task(tmp_path / "tasks", "install-at-verify", test_sh=INSTALL_TEST, dockerfile=PY_DOCKERFILE)
    assert task.environment.profile == "python" and not task.config.allow_internet
    with_mirror = run_trial(task, config=TrialConfig(sandbox=SandboxConfig(pip_mirror=str(mirror))),
                            agent=lambda trial: None)
    assert with_mirror.reward == 1.0, with_mirror.test_output
    without = run_trial(task, agent=lambda trial: None)  # the same install, no mirror: no network, reward 0
    assert without.reward == 0.0, without.test_output


def test_a_missing_mirror_is_one_clear_line(tmp_path, capsys):
    from jaxrl import tasks as tasks_cli

    with pytest.raises(ValueError, match="is not a directory"):
        SandboxConfig(pip_mirror=str(tmp_path / "nope")).validate()
    code = tasks_cli.main(["check", str(tmp_path), "--pip-mirror", str(tmp_path / "nope")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--pip-mirror" in err and "pip download" in err, err
