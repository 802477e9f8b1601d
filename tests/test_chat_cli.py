"""Using a trained policy: the export's chat template and generation config reproduce the training
prompt format in transformers, and `python -m jaxrl.chat` answers in that format (checked against
HF PyTorch greedy generation on the training prompt tokens)."""
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from jaxrl import config as config_lib
from jaxrl.envs import DEFAULT_POLICY_DIR, ChatTemplate
from jaxrl.envs.chat import PromptFormat
from jaxrl.envs.tasks.arithmetic import ANSWER_INSTRUCTION
from jaxrl.train.prompts import training_prompt_format
from jaxrl.models import hf_io

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**{k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}, "JAX_PLATFORMS": "cpu",
       "TOKENIZERS_PARALLELISM": "false"}
QUESTION = "What is 37 + 48?"
TRAINING_MESSAGES = [{"role": "system", "content": ANSWER_INSTRUCTION}, {"role": "user", "content": QUESTION}]


def _export(path, params=None):
    """An export of the embedded policy (or of `params`) as the trainer writes best/: weights,
    tokenizer, the run's rl_config.json, the baked prompt format and generation config."""
    from jaxrl.models import qwen3

    cfg = qwen3.Qwen3Config.from_pretrained(DEFAULT_POLICY_DIR)
    if params is None:
        _, params = hf_io.load_hf_checkpoint(DEFAULT_POLICY_DIR, cfg)
    hf_io.save_hf_checkpoint(params, cfg, str(path), dtype="float32", tokenizer_dir=DEFAULT_POLICY_DIR)
    c = config_lib.base_config()
    config_lib.write_json_atomic(os.path.join(path, "rl_config.json"), config_lib.to_json_dict(c))
    hf_io.write_prompt_format(str(path), ANSWER_INSTRUCTION, False,
                              {"do_sample": False, "temperature": None, "top_p": None, "top_k": None,
                               "max_new_tokens": 16})
    return params


def _hf_greedy(model_dir, ids, **kw):
    """HF PyTorch greedy generation from token ids (float32); the new token ids."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), **kw)
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def best(tmp_path_factory):
    path = tmp_path_factory.mktemp("run") / "best"
    _export(path)
    return str(path)


def _ids(x):
    return list(x["input_ids"] if hasattr(x, "keys") else x)


def test_export_reproduces_the_training_prompt_in_transformers(best):
    from transformers import AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(best)
    training = ChatTemplate.from_pretrained(DEFAULT_POLICY_DIR, enable_thinking=False)
    want = training.encode_prompt(TRAINING_MESSAGES)
    # A user who knows nothing about the training prompt: one user message, no kwargs.
    got = _ids(tok.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True))
    assert got == want
    # What the user asks for explicitly is kept: their system message, thinking on.
    own = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}]
    thinking = ChatTemplate.from_pretrained(DEFAULT_POLICY_DIR, enable_thinking=True).encode_prompt(own)
    assert _ids(tok.apply_chat_template(own, add_generation_prompt=True, enable_thinking=True)) == thinking
    gen = GenerationConfig.from_pretrained(best)
    assert (gen.do_sample, gen.max_new_tokens) == (False, 16)
    assert set(training.stop_token_ids) <= set(np.atleast_1d(gen.eos_token_id).tolist())
    # The format is recorded in the template and a second export replaces (not stacks) it.
    assert hf_io.read_prompt_format(tok.chat_template) == {"system_prompt": ANSWER_INSTRUCTION,
                                                           "enable_thinking": False}
    again = hf_io.bake_prompt_format(tok.chat_template, None, True)
    assert hf_io.strip_prompt_format(again) == hf_io.strip_prompt_format(tok.chat_template)
    assert again.count("{#- jaxrl prompt format ") == 1


def test_baked_system_prompt_survives_template_syntax_quotes_and_unicode(tmp_path):
    """A system prompt with Jinja syntax, quotes, backslashes, control characters and non-BMP
    characters renders verbatim (it is a string literal in the template, not template code)."""
    from transformers import AutoTokenizer

    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(DEFAULT_POLICY_DIR, f), tmp_path / f)
    system = 'Tags: <answer></answer> {{ x }} {% if %} {# c #} #} "q" \'s\' \\ back\nline\ttab é 😀 %}'
    hf_io.write_prompt_format(str(tmp_path), system, False)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    got = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert got == ChatTemplate.from_pretrained(DEFAULT_POLICY_DIR).render(
        [{"role": "system", "content": system}, {"role": "user", "content": "hi"}])
    assert hf_io.read_prompt_format(tok.chat_template)["system_prompt"] == system


def test_transformers_generate_on_the_export_answers_like_the_training_prompt(best):
    """transformers with only the export's defaults (template + generation config) generates what
    the policy generates on the training prompt."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(best)
    training_ids = ChatTemplate.from_pretrained(DEFAULT_POLICY_DIR, enable_thinking=False).encode_prompt(
        TRAINING_MESSAGES)
    default = _hf_greedy(best, _ids(tok.apply_chat_template([{"role": "user", "content": QUESTION}],
                                                            add_generation_prompt=True)))
    explicit = _hf_greedy(DEFAULT_POLICY_DIR, training_ids, do_sample=False, max_new_tokens=16,
                          eos_token_id=[505, 503], pad_token_id=503)
    assert default == explicit and len(default) >= 2


def test_prompt_format_of_a_run_config():
    c = config_lib.base_config()
    assert training_prompt_format(c) == PromptFormat(ANSWER_INSTRUCTION, False, 1, ())
    c.data.task = "calculator"
    c.generator.enable_thinking = True
    assert training_prompt_format(c) == PromptFormat(None, True, 0, ("calculator",))


def _chat(*args):
    out = subprocess.run([sys.executable, "-m", "jaxrl.chat", *args], cwd=ROOT, env=ENV, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert not re.search(r"^[IW]\d{4} ", out.stderr, re.M), out.stderr  # no absl/jax/orbax log lines
    return out


def test_chat_answers_in_the_training_format(best, tmp_path):
    """`--prompt` prints the policy's greedy answer to the training prompt (system instruction,
    thinking off), decoded: the same tokens as HF PyTorch greedy generation; a published version
    (sync/<v>) is loaded onto the run's starting model."""
    from jaxrl.models import qwen3
    from jaxrl.rollout import weight_sync

    training_ids = ChatTemplate.from_pretrained(DEFAULT_POLICY_DIR, enable_thinking=False).encode_prompt(
        TRAINING_MESSAGES)
    ref = ChatTemplate.from_pretrained(DEFAULT_POLICY_DIR)
    want = _hf_greedy(DEFAULT_POLICY_DIR, training_ids, do_sample=False, max_new_tokens=16,
                      eos_token_id=[505, 503], pad_token_id=503)
    out = _chat("--model", best, "--prompt", QUESTION)
    assert out.stdout == ref.decode(want).strip() + "\n"

    # A published version: other weights (the embedded policy with its MLPs halved) in a
    # workdir whose rl_config.json names the starting model (the embedded default).
    import jax

    cfg = qwen3.Qwen3Config.from_pretrained(DEFAULT_POLICY_DIR)
    _, params = hf_io.load_hf_checkpoint(DEFAULT_POLICY_DIR, cfg)
    params = jax.tree.map(np.asarray, params)
    params["layers"]["down_proj"] = params["layers"]["down_proj"] * np.float32(0.5)
    workdir = tmp_path / "run"
    weight_sync.publish(params, str(workdir / "sync"), 3, dtype="float32")
    config_lib.write_json_atomic(str(workdir / "rl_config.json"), config_lib.to_json_dict(config_lib.base_config()))
    hf_io.save_hf_checkpoint(params, cfg, str(tmp_path / "scaled"), dtype="float32")
    base_want = want
    want = _hf_greedy(str(tmp_path / "scaled"), training_ids, do_sample=False, max_new_tokens=16,
                      eos_token_id=[505, 503], pad_token_id=503)
    assert want != base_want  # so the answer shows which weights were loaded
    out = _chat("--model", str(workdir / "sync" / "3"), "--prompt", QUESTION)
    assert out.stdout == ref.decode(want).strip() + "\n"


def test_chat_without_a_model_is_one_line():
    out = subprocess.run([sys.executable, "-m", "jaxrl.chat", "--model", "/nonexistent"], cwd=ROOT, env=ENV,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "--model '/nonexistent' does not exist" in out.stderr
    help_ = subprocess.run([sys.executable, "-m", "jaxrl.chat", "--help"], cwd=ROOT, env=ENV, capture_output=True,
                           text=True, timeout=120)
    assert help_.returncode == 0 and "--prompt" in help_.stdout


@pytest.mark.parametrize("flag, value, expected", [
    ("--max_new_tokens", "-5", "--max_new_tokens=-5: must be >= 0"),
    ("--max_seq_len", "0", "--max_seq_len=0: must be >= 2"),
    ("--temperature", "-1", "--temperature=-1: must be 0 (greedy) or a finite number >= 0.01"),
    ("--temperature", "0.001", "--temperature=0.001: must be 0 (greedy)"),
    ("--top_p", "0", "--top_p=0: must be in (0, 1]"),
    ("--top_k", "-2", "--top_k=-2: must be >= 1, or 0 or -1 (off)"),
    ("--prompt", "", "--prompt='': empty message"),  # issue 25 §6: main answered the empty message silently
    ("--prompt", "  ", "--prompt='  ': empty message"),
])
def test_bad_decoding_flags_are_one_line_naming_the_flag(flag, value, expected, monkeypatch, capsys):
    """Regression: --max_new_tokens=-5 ended in a message naming the internal
    SamplingParams.max_tokens, after the model was loaded. In process: jaxrl.chat's `main` with its
    flag values set as absl would parse them (the command line itself:
    test_chat_without_a_model_is_one_line); the model is never loaded (recorded)."""
    import types

    from jaxrl import chat as chat_cmd
    from jaxrl import policy

    values = {"--model": DEFAULT_POLICY_DIR, "--prompt": "hi", flag: value}
    holders = {"_MODEL": ("--model", None), "_RUN_CONFIG": ("--run_config", None), "_PROMPT": ("--prompt", None),
               "_SYSTEM": ("--system", None), "_THINKING": ("--thinking", None), "_MAX_NEW": ("--max_new_tokens", 0),
               "_TEMPERATURE": ("--temperature", 0.0), "_TOP_P": ("--top_p", 1.0), "_TOP_K": ("--top_k", -1),
               "_SEED": ("--seed", 0), "_DTYPE": ("--dtype", None), "_MAX_SEQ": ("--max_seq_len", 4096),
               "_SHOW_PROMPT": ("--show_prompt", False)}  # the flags' defaults (jaxrl/chat.py define_flags)
    for attr, (name, default) in holders.items():
        v = values.get(name, default)
        if name in values and isinstance(default, (int, float)) and not isinstance(default, bool):
            v = type(default)(v)  # absl's parse of an integer / float flag
        monkeypatch.setattr(chat_cmd, attr, types.SimpleNamespace(value=v))
    loads = []
    monkeypatch.setattr(policy, "load_engine", lambda *a, **k: loads.append(a) or pytest.fail("model loaded"))
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        chat_cmd.main(["jaxrl.chat"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert expected in err and "SamplingParams" not in err, err
    assert loads == []


def test_banner_of_a_checkpoint_without_a_run_says_no_system_message():
    """Regression: the interactive banner said "system message None"."""
    out = subprocess.run([sys.executable, "-m", "jaxrl.chat", "--model", DEFAULT_POLICY_DIR], cwd=ROOT, env=ENV,
                         input="", capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "system message none, thinking on" in out.stderr and "None" not in out.stderr, out.stderr
    # ... and says where the training prompt format comes from (fresh-user review: garbage answers, no hint)
    assert "pass --run_config=WORKDIR/rl_config.json" in out.stderr, out.stderr
