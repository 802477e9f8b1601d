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
