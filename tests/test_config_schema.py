"""The config schema (jaxrl/config/schema.py, algorithm.py): every key declared once, as a Field;
base_config(), the per-key checks, KEY_DOCS, docs/config.md and the objective's dataclasses all
come from those declarations; an rl_config.json written before the schema still resumes."""
import dataclasses
import json
import os
import re
import shutil

import pytest

from jaxrl import config as config_lib
from jaxrl.config import ConfigError
from jaxrl.config.field import Field, schema_dataclass
from jaxrl.config.schema import FIELDS, FIELDS_BY_KEY, field_problems
from jaxrl.rl import AdvantageConfig, LossConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEFORE = os.path.join(ROOT, "tests", "data", "rl_config_before_schema.json")  # written by the pre-schema code


def test_base_config_has_exactly_the_declared_keys_with_their_defaults():
    flat = config_lib.flatten(config_lib.base_config())
    assert sorted(flat) == sorted(FIELDS_BY_KEY) and len(FIELDS) == len(FIELDS_BY_KEY)
    for f in FIELDS:
        assert flat[f.key] == f.default and type(flat[f.key]) is type(f.default), f.key
        assert f.problem_with(f.default) is None, f"{f.key}: its default fails its own check"
        assert f.doc and "\n" not in f.doc, f.key
    assert config_lib.KEY_DOCS == {f.key: f.doc for f in FIELDS}
    assert field_problems(config_lib.base_config()) == []


def test_the_two_keys_of_the_issue_are_declared_once_and_reach_their_use_as_the_same_object():
    """eps_clip_high had two defaults (0.05 config, 0.2 LossConfig) and two validators; now the
    LossConfig field's metadata is the schema's Field object, whose default is the config's."""
    eps = FIELDS_BY_KEY["trainer.algorithm.eps_clip_high"]
    assert [f.key for f in FIELDS].count(eps.key) == 1
    (field,) = [f for f in dataclasses.fields(LossConfig) if f.name == "eps_clip_high"]
    assert field.metadata["schema"] is eps and field.default == eps.default == 0.05
    assert LossConfig().eps_clip_high == 0.05 == config_lib.base_config().trainer.algorithm.eps_clip_high
    assert config_lib.loss_config(config_lib.base_config()).eps_clip_high == 0.05
    stale = FIELDS_BY_KEY["trainer.async_rl.max_staleness_steps"]
    assert [f.key for f in FIELDS].count(stale.key) == 1 and stale.default == 4
    # every dataclass field comes from a Field of trainer.algorithm, and each Field sets one field
    seen = []
    for cls in (LossConfig, AdvantageConfig):
        for f in dataclasses.fields(cls):
            spec = f.metadata["schema"]
            assert spec is FIELDS_BY_KEY[spec.key] and spec.key.startswith("trainer.algorithm.")
            seen.append(spec.key)
    assert len(seen) == len(set(seen)) == len([f for f in FIELDS if f.owner in ("loss", "advantage")])


@pytest.mark.parametrize("value,ok", [(0.0, False), (1e-9, True), (1.0, True), (1.0000001, False), (-1, True),
                                      (float("nan"), False), ("x", False), (True, False)])
def test_field_bounds_open_closed_and_sentinels(value, ok):
    f = Field("a.b", 0.5, "a share", bounds="(0, 1]", also=(-1,))
    assert (f.problem_with(value) is None) == ok, (value, f.problem_with(value))


def test_field_messages_and_off_values():
    f = Field("a.n", 2, "a count", bounds=">= 1")
    assert f.problem_with(0) == "0 must be >= 1" and f.problem_with(2.0) == "2.0 is not an integer"
    assert f.fix_text() == "use a value >= 1, e.g. 2"
    g = Field("a.kind", "", "a kind", choices=("token", "sequence"), off="", noun="type")
    assert g.problem_with("") is None and g.problem_with("tok") == "unknown type 'tok'"
    assert g.problem_with("", as_object=True) == "unknown type ''" and g.problem_with(None, as_object=True) is None
    assert g.to_object("") is None and g.to_object("token") == "token"
    assert g.fix_text() == "use 'token' or 'sequence'"
    t = Field("a.t", (), "names", item=str)
    assert t.type_name == "tuple[str]" and t.problem_with(("a", 1)) == "('a', 1) holds 1, which is not a str"
    with pytest.raises(ValueError, match="bounds"):
        Field("a.x", 1.0, "x", bounds="0..1")


def test_a_dataclass_cannot_declare_a_second_default():
    with pytest.raises(TypeError, match="must not declare fields"):
        @schema_dataclass(FIELDS, "loss")
        class Again:  # noqa: F841
            eps_clip_high: float = 0.2


def test_config_and_dataclass_reject_the_same_values_with_the_same_check():
    """One validator: for every objective key, a value just outside its bounds is refused by
    validate() (naming the key) and by the dataclass (naming the attribute)."""
    outside = {"eps_clip_high": 10.5, "eps_clip_low": 1.0, "clip_ratio_c": 1.0, "kl_loss_coef": -0.1,
               "cispo.cispo_eps_clip_low": 1.5, "sapo.tau_neg": 0.0, "clip_cov.clip_ratio": 1.5,
               "kl_cov.kl_cov_frac": 0.0, "gamma": 1.01, "lambd": -0.5, "group_advantage_min_size": 1}
    for key, bad in outside.items():
        spec = FIELDS_BY_KEY[f"trainer.algorithm.{key}"]
        cls = LossConfig if spec.owner == "loss" else AdvantageConfig
        with pytest.raises(ValueError, match=f"{cls.__name__}.{spec.attr}"):
            cls(**{spec.attr: bad})
        c = config_lib.base_config()
        node = c.trainer.algorithm
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = bad
        with pytest.raises(ConfigError) as e:
            config_lib.validate(c)
        assert e.value.key == spec.key and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("key,bad", [
    ("trainer.weight_sync_keep", 0), ("trainer.weight_sync_keep", -3), ("seed", -1), ("data.eval_split_seed", -1),
    ("model.logprobs_chunk_size", 0), ("trainer.optimizer.weight_decay", -0.1), ("trainer.optimizer.adam_eps", 0.0),
    ("trainer.optimizer.adam_eps", float("inf")), ("trainer.async_rl.max_in_flight_trajectories", -1),
    ("trainer.optimizer.adam_betas", (0.9, 2.0)), ("trainer.optimizer.adam_betas", (1.0, 0.999)),
    ("trainer.optimizer.adam_betas", (-0.1, 0.999)), ("trainer.seq_len_buckets", (0, 4096, 32768))])
def test_numeric_keys_that_had_no_bounds_are_refused_before_the_run(key, bad):
    """Regression (fresh-user review): trainer.weight_sync_keep=0 passed validation and failed after the
    run had started, a 37-line traceback from jaxrl/rollout/weight_sync.py with the workdir already
    written; adam_betas=(0.9, 2.0) with adam_eps=-1 trained with the update's sign flipped. The same kind,
    found by listing every numeric key declared without bounds: a negative seed (numpy refuses it), a zero
    chunk size, a negative weight decay, a zero or infinite AdamW epsilon, a negative in-flight limit, AdamW
    betas outside [0, 1), a zero-length sequence bucket."""
    c = config_lib.base_config()
    *parents, leaf = key.split(".")
    node = c
    for p in parents:
        node = node[p]
    node[leaf] = bad
    with pytest.raises(ConfigError) as e:
        config_lib.validate(c)
    assert e.value.key == key and "\n" not in str(e.value) and "Fix: " in str(e.value), str(e.value)


@pytest.mark.parametrize("estimator,n,min_size,ok", [("rloo_n", 1, 2, False), ("rloo_n", 2, 2, True),
                                                      ("rloo_n", 3, 4, False), ("rloo", 1, 2, False),
                                                      ("grpo", 1, 2, True), ("reinforce_pp", 1, 2, True)])
def test_a_group_estimator_with_groups_too_small_to_train_is_refused(estimator, n, min_size, ok):
    """Regression (fresh-user review): n_samples_per_prompt=1 with rloo_n (the default) ran, and every step
    trained nothing (advantage 0 for every one-member group, grad norm 0). grpo and reinforce_pp give a
    one-sample group an advantage (SkyRL's rule: A = r), so they are accepted."""
    c = config_lib.base_config()
    c.generator.n_samples_per_prompt = n
    c.trainer.algorithm.advantage_estimator = estimator
    c.trainer.algorithm.group_advantage_min_size = min_size
    c.trainer.micro_batch_size = 1
    if ok:
        config_lib.validate(c)
        return
    with pytest.raises(ConfigError) as e:
        config_lib.validate(c)
    assert e.value.key == "generator.n_samples_per_prompt" and "no step would train" in str(e.value), str(e.value)


def test_the_meaning_of_a_registry_key_names_every_registered_name():
    """Regression (review): loss_reduction's meaning listed 3 of the 4 reductions a run accepts. Every built-in
    name in each registry (what `validate` accepts for the key, registered by jaxrl's own modules: other tests
    in the same process register their own, e.g. tests/skyrl_diff's) appears in the key's one-line meaning."""
    import jaxrl.rl.losses  # noqa: F401 (registers the built-in losses, reductions and estimators)
    from jaxrl.rl import registry

    for key, names in (("trainer.algorithm.loss_reduction", registry.LOSS_REDUCTIONS),
                       ("trainer.algorithm.policy_loss_type", registry.POLICY_LOSSES),
                       ("trainer.algorithm.advantage_estimator", registry.ADVANTAGE_ESTIMATORS)):
        doc = FIELDS_BY_KEY[key].doc
        words = set(doc.replace("(", " ").replace(")", " ").replace("=", " ").replace("|", " ").split())
        builtin = {name for name, fn in names.items() if getattr(fn, "__module__", "").startswith("jaxrl.")}
        assert len(builtin) >= 4 and builtin <= words, (key, sorted(builtin - words))


def test_docs_config_md_is_generated_from_the_schema():
    from jaxrl.config.docs import DOC_PATH, markdown

    with open(DOC_PATH, encoding="utf-8") as fh:
        text = fh.read()
    assert text == markdown(), "docs/config.md is stale: run python -m jaxrl.config.docs"
    for f in FIELDS:
        assert f"| `{f.key}` |" in text, f.key
    assert "| `trainer.algorithm.eps_clip_high` | float | `0.05` | [0, 10] |" in text


ADDED_SINCE = (("harbor", "image_builder"),)


def test_docs_command_help_writes_nothing(tmp_path, monkeypatch, capsys):
    """Regression (review): `python -m jaxrl.config.docs --help` rewrote docs/config.md. --help writes
    nothing, an argument is one line with status 2, no argument writes the generated text."""
    from jaxrl.config import docs

    target = tmp_path / "config.md"
    monkeypatch.setattr(docs, "DOC_PATH", str(target))
    assert docs.main(["--help"]) == 0 and not target.exists()
    assert "rewrites" in capsys.readouterr().out
    assert docs.main(["--write"]) == 2 and not target.exists()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "takes no arguments (got '--write')" in err, err
    assert docs.main([]) == 0 and target.read_text() == docs.markdown()
    assert "| `generator.chat_template` | str | `''` | `''` (empty) \\| `keep_thinking` |" in target.read_text()


def test_an_rl_config_json_written_before_the_schema_resumes_and_is_written_alike(tmp_path):
    """tests/data/rl_config_before_schema.json is what the pre-schema code (jaxrl/config.py) wrote
    for configs/rloo.py: the same recipe resumes from it, and the file written now is identical."""
    from jaxrl.train import rundir

    c = config_lib.load_recipe(os.path.join(ROOT, "configs", "rloo.py"))
    old = tmp_path / "old"
    old.mkdir()
    shutil.copy(BEFORE, old / "rl_config.json")
    rundir.check_resume_config(c, str(old), write=False)  # raises ConfigError on any differing key
    new = tmp_path / "new"
    new.mkdir()
    rundir.check_resume_config(c, str(new), write=True)
    written = json.loads((new / "rl_config.json").read_text())
    for section, key in ADDED_SINCE:  # keys added after the file was written, at their defaults
        assert written[section].pop(key) == config_lib.base_config()[section][key]
    assert written == json.load(open(BEFORE))
    before = json.load(open(BEFORE))
    assert before["trainer"]["algorithm"]["eps_clip_high"] == 0.05
    assert before["trainer"]["async_rl"]["max_staleness_steps"] == 4


def test_architecture_doc_cites_the_declaration_lines():
    """docs/architecture.md names the file and line where eps_clip_high and max_staleness_steps are
    declared; those lines are the declarations."""
    doc = open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8").read()
    for key, path in (("eps_clip_high", "jaxrl/config/algorithm.py"), ("max_staleness_steps", "jaxrl/config/schema.py")):
        m = re.search(rf"{key}`: declared at `{path}` line (\d+)", doc.replace("\n", " "))
        assert m, key
        line = open(os.path.join(ROOT, path), encoding="utf-8").read().splitlines()[int(m.group(1)) - 1]
        assert line.strip().startswith(f"F('{key}',"), (key, line)


def test_recipes_doc_states_the_schema_default_of_every_algorithm_key():
    """docs/recipes.md "trainer.algorithm keys" writes each key's default by hand (next to its
    formula): it must be the schema's, so the doc is not a second default that can drift."""
    import ast

    doc = open(os.path.join(ROOT, "docs", "recipes.md"), encoding="utf-8").read()
    section = doc[doc.index("## trainer.algorithm keys"):]
    section = section[:section.find("\n## ", 3)]
    checked = 0
    for m in re.finditer(r"^\| `([a-z_.]+)` \| `([^`]*)`", section, re.M):
        key, cell = m.group(1), m.group(2)
        spec = FIELDS_BY_KEY.get(f"trainer.algorithm.{key}") or FIELDS_BY_KEY.get(key)
        assert spec is not None, key
        try:
            value = ast.literal_eval(cell)
        except (ValueError, SyntaxError):
            value = cell  # an unquoted name: `rloo_n`
        assert value == spec.default, f"docs/recipes.md says {key} defaults to {cell}; the schema: {spec.default!r}"
        checked += 1
    assert checked >= 40, checked


@pytest.mark.parametrize("key", ["sampling_params", "eval_sampling_params"])
def test_a_zero_temperature_names_a_fix_that_exists(key):
    """The fix of a temperature-0 error named a bare `greedy`, which only the held-out sampling has
    (`generator.eval_sampling_params.greedy`); every key a fix names must be a key of the config."""
    c = config_lib.base_config()
    c.generator[key].temperature = 0.0
    with pytest.raises(ConfigError) as e:
        config_lib.validate(c)
    named = set(re.findall(r"\b(?:generator|trainer|data|model)\.[a-z_.]*[a-z_]", str(e.value)))
    assert f"generator.{key}.temperature" in named
    assert named <= set(FIELDS_BY_KEY), named - set(FIELDS_BY_KEY)
    assert ("generator.eval_sampling_params.greedy" in named) == (key == "eval_sampling_params")
