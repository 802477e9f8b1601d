"""The SkyRL differential tier: jaxrl.rl against SkyRL 0.3.0's own functions on seeded inputs.

One test per compared pair (cases.py) over all its cases, values and gradients; every intentional difference of
differences.py (listed in docs/recipes.md) asserted AS a difference, with both sides' values. SkyRL runs in its own environment (install_env.py, built on first use and
cached under ~/.cache/jaxrl/), once for all cases, in float32 and float64.
"""
from __future__ import annotations

import collections
import pickle
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from skyrl_diff import cases as cases_mod
from skyrl_diff import compare, differences, install_env, jaxrl_side

AGREEMENT = cases_mod.build_cases()
DIFFERENCES = differences.build()
PAIRS = sorted({c["pair"] for c in AGREEMENT})
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def skyrl(tmp_path_factory):
    """SkyRL's outputs of every case: {case id: {"float32": {...}, "float64": {...}}}."""
    try:
        python = install_env.ensure_env()
    except install_env.EnvError as e:
        pytest.fail(str(e), pytrace=False)
    tmp = tmp_path_factory.mktemp("skyrl_diff")
    (tmp / "cases.pkl").write_bytes(pickle.dumps(AGREEMENT + [d["case"] for d in DIFFERENCES]))
    proc = subprocess.run([str(python), str(Path(__file__).with_name("skyrl_side.py")), str(tmp / "cases.pkl"),
                           str(tmp / "results.pkl")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return pickle.loads((tmp / "results.pkl").read_bytes())


def compare_case(case, sky, include):
    """[(key, ok, how, err)] over the compared outputs of `case` that `include(case, key)` selects."""
    jax_out = jaxrl_side.run(case)
    s32, s64 = sky[case["id"]]["float32"], sky[case["id"]]["float64"]
    assert "error" not in s32, f"{case['id']}: SkyRL raised {s32['error']}"
    rows = []
    for key, where in compare.compared_keys(case, jax_out, s32):
        if not include(case, key):
            continue
        assert key in jax_out, f"{case['id']}: jaxrl does not report {key} (SkyRL: {s32[key]})"
        ok, how, err = compare.agree(jax_out[key], compare.skyrl_value(case, key, s32),
                                     compare.skyrl_value(case, key, s64), where, compare.condition_scale(case))
        rows.append((key, ok, how, err))
    return rows


@pytest.mark.parametrize("pair", PAIRS)
def test_pair(pair, skyrl):
    """Every case of the pair agrees within float32 rounding (values, gradients, metrics)."""
    failures, counts = [], collections.Counter()
    for case in (c for c in AGREEMENT if c["pair"] == pair):
        for key, ok, how, err in compare_case(case, skyrl, lambda c, k: True):
            counts[how] += 1
            if not ok:
                opts = {k: v for k, v in case["opts"].items() if k not in ("jaxrl_cfg", "skyrl_cfg")}
                opc = case["opts"].get("skyrl_cfg", {}).get("off_policy_correction")
                failures.append(f"{case['id']} {key}: max error {err:.3g} ({opts}{', ' + str(opc) if opc else ''})")
    assert counts, f"{pair}: nothing compared"
    assert not failures, f"{len(failures)} of {sum(counts.values())} comparisons differ:\n" + "\n".join(failures[:20])


def _flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def skyrl_algorithm_defaults(raw):
    """SkyRL's AlgorithmConfig defaults, flattened like jaxrl's keys (sub-configs as `name.field`)."""
    def build(cls):
        return {k: build(v[1]) if isinstance(v, tuple) and v[0] == "factory" else v for k, v in raw[cls].items()}

    return _flat(build("AlgorithmConfig"))


def jaxrl_algorithm_defaults():
    from jaxrl.config import base_config, flatten

    none_as = {"": None}
    out = {}
    for k, v in flatten(base_config().trainer.algorithm).items():
        if isinstance(v, str) and v in none_as:
            v = None
        elif k == "max_seq_len" and v == 0 or (k.split(".")[-1].endswith(("threshold_low", "threshold_high"))
                                                and v == 0.0):
            v = None
        out[k] = v
    return out


DIFFERENCE_NAMES = [d["name"] for d in DIFFERENCES if d["kind"] != "default"]


@pytest.mark.parametrize("name", DIFFERENCE_NAMES)
def test_difference(name, skyrl):
    """Each listed difference on its minimal input: jaxrl's and SkyRL's values are the written ones, and differ."""
    d = next(d for d in DIFFERENCES if d["name"] == name)
    case, key = d["case"], d["key"]
    j = jaxrl_side.run(case)
    s32, s64 = skyrl[case["id"]]["float32"], skyrl[case["id"]]["float64"]
    pick = (lambda a: np.ravel(np.asarray(a, np.float64)[d["where"]])) if d["where"] is not None else (
        lambda a: np.ravel(np.asarray(a, np.float64)))
    if d["jaxrl"] is None:
        assert key not in j, f"jaxrl now reports {key} = {j[key]}"
    else:
        np.testing.assert_allclose(pick(j[key]), np.ravel(d["jaxrl"]), rtol=1e-5, atol=1e-6)
    if isinstance(d["skyrl"], str):
        assert s32.get("error") == d["skyrl"], f"SkyRL no longer raises: {s32}"
        return
    assert "error" not in s32, s32["error"]
    np.testing.assert_allclose(pick(s32[key]), np.ravel(d["skyrl"]), rtol=d["skyrl_rtol"], atol=1e-6)
    if d["skyrl_float64"] is not None:
        np.testing.assert_allclose(pick(s64[key]), np.ravel(d["skyrl_float64"]), atol=1e-9)
    if d["jaxrl"] is not None:
        where = d["where"]
        reference = np.asarray(s32[key], np.float64) if where is None else np.asarray(s32[key], np.float64)[where]
        assert compare.error(j[key], s32[key], where) > compare.tolerance(reference), "the two sides now agree"


def test_defaults(skyrl):
    """Every trainer.algorithm default jaxrl shares with SkyRL's config is equal, except the listed ones."""
    d = next(d for d in DIFFERENCES if d["name"] == "defaults")
    sky = skyrl_algorithm_defaults(skyrl[d["case"]["id"]]["float32"]["defaults"])
    jax_defaults = jaxrl_algorithm_defaults()
    shared = sorted(set(sky) & set(jax_defaults))
    differing = {k: (jax_defaults[k], sky[k]) for k in shared if jax_defaults[k] != sky[k]}
    assert differing == d["differing"]
    assert len(shared) - len(differing) >= 25, shared  # the agreeing keys (clip, KL, TIS, masks, critic, ...)


def test_differences_listed_in_docs():
    """docs/recipes.md lists every difference of differences.py (by name) and no other."""
    text = (ROOT / "docs" / "recipes.md").read_text()
    section = text[text.index("## Differences from SkyRL's code"):]
    section = section[:section.find("\n## ", 4)] if "\n## " in section[4:] else section
    listed = set(re.findall(r"^\| `([a-z0-9_]+)` \| (?:SkyRL bug|convention) \|", section, flags=re.M))
    assert listed == set(DIFFERENCE_NAMES), listed ^ set(DIFFERENCE_NAMES)
    for key in differences.DIFFERING_DEFAULTS:
        assert f"`{key}`" in section, key
