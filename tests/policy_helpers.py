"""Shared checks of the embedded policies and their build scripts (tests/test_default_policy.py,
tests/test_terminal_policy.py): loading a script as a module, the shipped files, transformers vs
jaxrl logits, and deterministic training."""
from __future__ import annotations

import importlib.util
import json
import os
import sys

import jax
import numpy as np

from jaxrl.models import hf_io, qwen3

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script(name: str):
    """scripts/<name>.py as the module `name` (registered in sys.modules, where dataclasses look
    their module up; scripts/ goes on sys.path for the scripts' imports of each other)."""
    scripts = os.path.join(REPO, "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    spec = importlib.util.spec_from_file_location(name, os.path.join(scripts, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def shipped_config(policy_dir: str, required, max_mib: float) -> tuple[dict, dict]:
    """Asserts that `policy_dir` holds the `required` files, at most `max_mib` MiB in all, and a
    Qwen3 config.json; returns (config.json, generation_config.json) as dicts."""
    names = set(os.listdir(policy_dir))
    assert set(required) <= names, sorted(set(required) - names)
    total = sum(os.path.getsize(os.path.join(policy_dir, n)) for n in names)
    assert total <= max_mib * 2**20, f"{policy_dir} is {total / 2**20:.1f} MiB > {max_mib} MiB"
    with open(os.path.join(policy_dir, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["model_type"] == "qwen3" and cfg["architectures"] == ["Qwen3ForCausalLM"]
    with open(os.path.join(policy_dir, "generation_config.json")) as f:
        gen = json.load(f)
    return cfg, gen


def assert_transformers_logits_match(policy_dir: str, sequences, atol: float = 1e-4) -> None:
    """transformers' Qwen3ForCausalLM (float32) and jaxrl's forward give the same logits, to
    `atol`, on each token sequence of `sequences` (one row each, all positions)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(policy_dir, local_files_only=True).eval()
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert next(model.parameters()).dtype == torch.float32
    cfg, params = hf_io.load_hf_checkpoint(policy_dir, dtype="float32", remat="none")
    for ids in sequences:
        tokens = np.asarray([ids], np.int32)
        with torch.no_grad():
            ref = model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
        ours = np.asarray(qwen3.forward(params, cfg, tokens, np.arange(len(ids), dtype=np.int32)[None],
                                        np.ones_like(tokens)))
        assert ours.shape == ref.shape == (1, len(ids), cfg.vocab_size)
        assert np.max(np.abs(ours - ref)) <= atol


def assert_deterministic_and_learning(train) -> None:
    """`train() -> (params, losses)` run twice gives the same losses and bit-identical params, and
    its last loss is below its first."""
    p1, l1 = train()
    p2, l2 = train()
    assert l1 == l2
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)):
        np.testing.assert_array_equal(a, b)
    assert l1[-1] < l1[0]
