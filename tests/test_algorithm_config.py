"""Every option of the RL objective is a run-config key (`trainer.algorithm.*`), validated with a
one-line error naming the key, listed by `python -m jaxrl.config show` and documented in
docs/recipes.md with its source."""
import dataclasses
import os
import re
import subprocess
import sys

import pytest

from config_helpers import set_key
from jaxrl import config as config_lib
from jaxrl.config import ConfigError
from jaxrl.rl import AdvantageConfig, LossConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A valid non-default value of every trainer.algorithm key that feeds LossConfig / AdvantageConfig,
# and the field value it must produce.
CHANGES = {
    "policy_loss_type": ("sapo", "sapo"),
    "loss_reduction": ("sequence_mean", "sequence_mean"),
    "max_seq_len": (64, 64),
    "eps_clip_low": (0.3, 0.3),
    "eps_clip_high": (0.28, 0.28),
    "clip_ratio_c": (10.0, 10.0),
    "cispo.cispo_eps_clip_low": (0.5, 0.5),
    "cispo.cispo_eps_clip_high": (2.0, 2.0),
    "cispo.cispo_anchor": ("rollout", "rollout"),
    "sapo.tau_pos": (2.0, 2.0),
    "sapo.tau_neg": (3.0, 3.0),
    "clip_cov.clip_ratio": (0.01, 0.01),
    "clip_cov.clip_cov_lb": (-1.0, -1.0),
    "clip_cov.clip_cov_ub": (9.0, 9.0),
    "kl_cov.kl_cov_frac": (0.5, 0.5),
    "kl_cov.ppo_kl_coef": (0.1, 0.1),
    "use_kl_loss": (False, False),
    "kl_loss_coef": (0.01, 0.01),
    "kl_estimator_type": ("k2", "k2"),
    "entropy_loss_coef": (0.01, 0.01),
    "off_policy_correction.tis_ratio_type": ("sequence", "sequence"),
    "off_policy_correction.token_tis_ratio_clip_high": (3.0, 3.0),
    "off_policy_correction.sequence_tis_ratio_clip_high": (7.0, 7.0),
    "off_policy_correction.only_untruncated": (True, True),
    "off_policy_correction.outlier_token_is_threshold_low": (1e-4, 1e-4),
    "off_policy_correction.outlier_token_is_threshold_high": (100.0, 100.0),
    "off_policy_correction.token_mask_is_threshold_low": (0.5, 0.5),
    "off_policy_correction.token_mask_is_threshold_high": (2.0, 2.0),
    "off_policy_correction.sequence_mask_metric": ("product", "product"),
    "off_policy_correction.geo_mask_low": (0.9, 0.9),
    "off_policy_correction.geo_mask_high": (1.1, 1.1),
    "off_policy_correction.product_mask_low": (0.25, 0.25),
    "off_policy_correction.product_mask_high": (4.0, 4.0),
    "advantage_estimator": ("maxrl", "maxrl"),
    "grpo_norm_by_std": (False, False),
    "group_advantage_min_size": (3, 3),
    "gamma": (0.9, 0.9),
    "lambd": (0.8, 0.8),
}
PAIRED = {"off_policy_correction.token_mask_is_threshold_low": "off_policy_correction.token_mask_is_threshold_high",
          "off_policy_correction.token_mask_is_threshold_high": "off_policy_correction.token_mask_is_threshold_low",
          "cispo.cispo_anchor": None, "max_seq_len": None}


def _set(c, key, value):
    """Sets the dotted `key` under trainer.algorithm."""
    set_key(c, f"trainer.algorithm.{key}", value)


def _objective_field(key):
    """(dataclass, attribute, builder) of the trainer.algorithm `key` (relative), read from the
    dataclass fields' metadata: the Field each was generated from."""
    for cls, build in ((LossConfig, config_lib.loss_config), (AdvantageConfig, config_lib.advantage_config)):
        for f in dataclasses.fields(cls):
            if f.metadata["schema"].key == f"trainer.algorithm.{key}":
                return cls, f.name, build
    raise AssertionError(f"trainer.algorithm.{key} sets no LossConfig / AdvantageConfig field")


def test_every_loss_and_advantage_field_is_a_config_key():
    keys = set(config_lib.flatten(config_lib.base_config()))
    reached = set()
    for cls in (LossConfig, AdvantageConfig):
        for f in dataclasses.fields(cls):
            spec = f.metadata["schema"]
            assert spec is config_lib.FIELDS_BY_KEY[spec.key], f"{cls.__name__}.{f.name} is not the schema's Field"
            assert spec.key in keys, spec.key
            reached.add(spec.key.removeprefix("trainer.algorithm."))
    assert set(CHANGES) == reached


def test_objective_dataclasses_have_the_schema_defaults_and_nothing_else():
    """One default per key: the dataclass default of every LossConfig / AdvantageConfig field is the
    schema default in dataclass form (an off value '' / 0 is None there), and base_config() holds
    the schema default; the values below are today's config defaults, written out by hand."""
    by_hand = {"eps_clip_high": 0.05, "eps_clip_low": 0.2, "max_seq_len": None, "sapo_tau_neg": 1.05,
               "tis_ratio_type": None, "clip_cov_ratio": 2e-4, "group_advantage_min_size": 2, "lambd": 1.0}
    base = config_lib.flatten(config_lib.base_config())
    for cls in (LossConfig, AdvantageConfig):
        made = cls()
        for f in dataclasses.fields(cls):
            spec = f.metadata["schema"]
            assert base[spec.key] == spec.default
            assert getattr(made, f.name) == f.default == (None if spec.has_off and spec.default == spec.off
                                                          else spec.default), f.name
            if f.name in by_hand:
                assert f.default == by_hand[f.name], f.name
    with pytest.raises(TypeError, match="must not declare fields"):
        from jaxrl.config.field import schema_dataclass

        @schema_dataclass(config_lib.FIELDS, "loss")
        class Twice:  # noqa: F841 - a second default for eps_clip_high
            eps_clip_high: float = 0.2


def test_one_validator_per_key_config_and_dataclass_agree():
    """The config check and the dataclass check of a key are the same Field: a value rejected by
    one is rejected by the other, for the bounds of eps_clip_high [0, 10] and eps_clip_low [0, 1)."""
    for key, attr, good, bad in (("eps_clip_high", "eps_clip_high", (0.0, 0.28, 10.0), (-0.1, 10.5)),
                                 ("eps_clip_low", "eps_clip_low", (0.0, 0.2), (1.0, -0.01))):
        for v in good:
            LossConfig(**{attr: v})
            c = config_lib.base_config()
            _set(c, key, v)
            config_lib.validate(c)
        for v in bad:
            with pytest.raises(ValueError, match=attr):
                LossConfig(**{attr: v})
            c = config_lib.base_config()
            _set(c, key, v)
            with pytest.raises(ConfigError, match=f"trainer.algorithm.{key}"):
                config_lib.validate(c)


@pytest.mark.parametrize("key", sorted(CHANGES))
def test_each_key_reaches_its_field(key):
    c = config_lib.base_config()
    value, expected = CHANGES[key]
    _set(c, key, value)
    if PAIRED.get(key):
        _set(c, PAIRED[key], CHANGES[PAIRED[key]][0])
    config_lib.validate(c)
    cls, field, build = _objective_field(key)
    built = build(c)
    assert getattr(built, field) == expected
    default = getattr(cls(), field)
    assert getattr(built, field) != default or key == "use_kl_loss", key  # the change is not the default


BAD = [  # (key, value, words the one-line message must contain)
    ("gamma", 1.5, "outside [0, 1]"),
    ("lambd", -0.1, "outside [0, 1]"),
    ("value_clip", -1.0, "must be >= 0"),
    ("kl_ctrl.type", "pid", "unknown controller"),
    ("kl_ctrl.kl_target", 0.0, "must be > 0"),
    ("kl_ctrl.horizon", 0, "must be > 0"),
    ("cispo.cispo_anchor", "mu", "unknown anchor"),
    ("cispo.cispo_eps_clip_low", 2.0, "cispo_eps_clip_low"),
    ("sapo.tau_pos", 0.0, "sapo_tau_pos"),
    ("clip_cov.clip_ratio", 0.0, "clip_cov_ratio"),
    ("clip_cov.clip_cov_lb", 9.0, "clip_cov_lb"),
    ("kl_cov.kl_cov_frac", 1.5, "kl_cov_frac"),
    ("kl_cov.ppo_kl_coef", -1.0, "ppo_kl_coef"),
    ("off_policy_correction.sequence_mask_metric", "harmonic", "unknown metric"),
    ("off_policy_correction.outlier_token_is_threshold_high", -1.0, "must be >= 0"),
    ("off_policy_correction.token_mask_is_threshold_low", 0.5, "needs both bounds"),
    ("off_policy_correction.geo_mask_low", 2.0, "geo_mask_low"),
    ("advantage_estimator", "ppo", "unknown name"),
    ("policy_loss_type", "cov", "unknown name"),
]


@pytest.mark.parametrize("key,value,words", BAD, ids=[b[0] for b in BAD])
def test_bad_values_name_the_key_in_one_line(key, value, words):
    c = config_lib.base_config()
    _set(c, key, value)
    with pytest.raises(ConfigError) as e:
        config_lib.validate(c)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"config key `trainer.algorithm.{key}`"), msg
    assert words in msg and "Fix:" in msg, msg


def test_kl_in_reward_and_critic_keys():
    c = config_lib.base_config()
    c.trainer.algorithm.use_kl_in_reward = True
    c.trainer.algorithm.kl_loss_coef = 0.05
    with pytest.raises(ConfigError, match=r"use_kl_in_reward`.*use_kl_loss=False"):
        config_lib.validate(c)
    c.trainer.algorithm.use_kl_loss = False
    config_lib.validate(c)
    assert config_lib.needs_reference(c) and not config_lib.loss_config(c).use_kl_loss
    c.trainer.algorithm.kl_loss_coef = 0.0
    with pytest.raises(ConfigError, match=r"kl_loss_coef`.*initial beta"):
        config_lib.validate(c)
    c = config_lib.base_config()
    assert not config_lib.needs_critic(c) and not config_lib.needs_reference(c)
    c.trainer.algorithm.advantage_estimator = "gae"
    assert config_lib.needs_critic(c)
    c.trainer.critic.model.path = "/nonexistent/critic"
    with pytest.raises(ConfigError, match=r"trainer.critic.model.path`: '/nonexistent/critic' does not exist"):
        config_lib.validate(c)
    c.trainer.critic.model.path = ""
    c.trainer.critic.optimizer.lr = 0.0
    with pytest.raises(ConfigError, match="trainer.critic.optimizer.lr"):
        config_lib.validate(c)


def _algorithm_keys():
    return sorted(k for k in config_lib.flatten(config_lib.base_config())
                  if k.startswith(("trainer.algorithm.", "trainer.critic.")))


def test_every_algorithm_key_is_listed_and_documented_with_its_source():
    out = subprocess.run([sys.executable, "-m", "jaxrl.config", "show", "configs/rloo.py", "trainer"], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = open(os.path.join(ROOT, "docs", "recipes.md"), encoding="utf-8").read()
    section = doc[doc.index("## trainer.algorithm keys"):]
    section = section[:section.find("\n## ", 3)] if "\n## " in section[3:] else section
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([a-z_.]+)` \|.*$", section, re.M)}
    for key in _algorithm_keys():
        assert key in out.stdout, f"{key} is not listed by `python -m jaxrl.config show`"
        short = key.removeprefix("trainer.algorithm.")
        assert short in rows or key in rows, f"{key} has no row in docs/recipes.md 'trainer.algorithm keys'"
        row = rows.get(short) or rows[key]
        assert row.count("|") >= 5, f"the row of {key} lacks a column (key | default | meaning | source)"
        assert row.rstrip(" |").rsplit("|", 1)[-1].strip(), f"the row of {key} names no source"
