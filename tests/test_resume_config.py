"""Resuming a workdir whose rl_config.json an older jaxrl wrote: a key added since (absent from the file)
matches when this command leaves it at its default, and stops the resume when it sets another value.
Regression: every key added with a non-None default (harbor.tool_mirror, harbor.image_builder) made
every older workdir refuse to resume ("harbor.image_builder (absent) -> 'buildah'")."""
from __future__ import annotations

import json

import pytest

from jaxrl import config as config_lib
from jaxrl.train import rundir


def _old_workdir(tmp_path, drop=("harbor", "image_builder"), **values):
    """A workdir whose rl_config.json lacks one key (as an older version wrote it), other keys as given."""
    old = config_lib.to_json_dict(config_lib.base_config())
    section, key = drop
    del old[section][key]
    for dotted, v in values.items():
        s, k = dotted.split("__")
        old[s][k] = v
    (tmp_path / "rl_config.json").write_text(json.dumps(old))
    return str(tmp_path)


def test_a_key_added_since_resumes_at_its_default(tmp_path):
    c = config_lib.base_config()
    assert c.harbor.image_builder == "buildah"  # the default (what the older version did)
    rundir.check_resume_config(c, _old_workdir(tmp_path), write=False)  # no ConfigError


def test_a_key_added_since_set_to_another_value_stops_the_resume(tmp_path):
    c = config_lib.base_config()
    c.harbor.image_builder = "podman"
    with pytest.raises(config_lib.ConfigError, match=r"harbor.image_builder \(absent\) -> 'podman'"):
        rundir.check_resume_config(c, _old_workdir(tmp_path), write=False)


def test_a_key_both_have_still_must_match(tmp_path):
    c = config_lib.base_config()
    with pytest.raises(config_lib.ConfigError, match=r"1 key differs .*harbor.pip_mirror '/mirror' -> ''"):
        rundir.check_resume_config(c, _old_workdir(tmp_path, harbor__pip_mirror="/mirror"), write=False)


def test_a_finished_run_rerun_with_fewer_steps_keeps_its_config(tmp_path):
    """Regression (fresh-user review): rerunning a finished 5-step run with num_steps=4 trained nothing
    ("is complete") but rewrote rl_config.json with num_steps 4, for a run whose checkpoints, metrics and
    summary have 5 steps. A command that trains nothing leaves the file as it is; one that trains on
    (num_steps past the newest checkpoint) writes its config."""
    c = config_lib.base_config()
    c.trainer.num_steps = 5
    rundir.check_resume_config(c, str(tmp_path), write=True)  # the run's first launch
    (tmp_path / "checkpoints" / "5").mkdir(parents=True)  # committed steps are numbered directories
    (tmp_path / "checkpoints" / "6.orbax-checkpoint-tmp-1").mkdir()  # an uncommitted save is no step
    assert rundir.newest_checkpoint_step(str(tmp_path)) == 5

    def num_steps_on_disk():
        return json.loads((tmp_path / "rl_config.json").read_text())["trainer"]["num_steps"]

    for fewer in (4, 5):
        c.trainer.num_steps = fewer
        rundir.check_resume_config(c, str(tmp_path), write=True)
        assert num_steps_on_disk() == 5
    c.trainer.num_steps = 7
    rundir.check_resume_config(c, str(tmp_path), write=True)
    assert num_steps_on_disk() == 7
