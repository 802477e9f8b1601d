"""The prompt format of an exported policy: its training defaults (system prompt, thinking mode)
baked into the checkpoint's chat template, read back from it, and written with the generation
config (:func:`write_prompt_format`). No JAX; re-exported by :mod:`jaxrl.models.hf_io`.
"""
from __future__ import annotations

import json
import os
from typing import Mapping

_FORMAT_BEGIN = "{#- jaxrl prompt format "
_FORMAT_END = "{#- end of the jaxrl prompt format -#}\n"
_JINJA_UNSAFE = set('\\"{}%#') | {chr(i) for i in range(0x20)} | {"\x7f"}


def _jinja_string(text: str) -> str:
    """`text` as a double-quoted Jinja string literal that also cannot close a tag or comment.

    Jinja decodes string literals with Python's `unicode-escape` (after `backslashreplace` of
    non-ASCII characters), so backslash, quote, control and template-syntax characters are
    written as `\\xNN` and every other character as itself."""
    return '"' + "".join(f"\\x{ord(ch):02x}" if ch in _JINJA_UNSAFE else ch for ch in text) + '"'


def bake_prompt_format(template: str, system_prompt: str | None, enable_thinking: bool) -> str:
    """A chat template whose defaults are a policy's training prompt format.

    A block put in front of `template` (replacing a block an earlier export put there):
    `enable_thinking` defaults to the training value when the caller does not pass it (Qwen3's
    template treats "not passed" as thinking on), and a conversation that does not start with a
    system message gets `system_prompt` in front (none when it is None). A caller who passes
    `enable_thinking` or a system message of its own gets exactly what it asked for. The block's
    first line is a comment holding the format as JSON (`read_prompt_format`).
    """
    import re as _re

    template = strip_prompt_format(template)
    prompt = _re.sub(r"[#{}%]", lambda m: f"\\u{ord(m.group(0)):04x}", json.dumps(system_prompt))  # inside a comment
    meta = f'{{"system_prompt": {prompt}, "enable_thinking": {"true" if enable_thinking else "false"}}}'
    lines = [f"{_FORMAT_BEGIN}{meta}: defaults of the prompt format this policy was trained with -#}}\n",
             "{%- if enable_thinking is not defined %}{%- set enable_thinking = "
             f"{'true' if enable_thinking else 'false'} %}}{{%- endif %}}\n"]
    if system_prompt is not None:
        lines.append("{%- if messages and messages[0]['role'] != 'system' %}{%- set messages = [{'role': 'system', "
                     f"'content': {_jinja_string(system_prompt)}}}] + messages %}}{{%- endif %}}\n")
    return "".join(lines) + _FORMAT_END + template


def strip_prompt_format(template: str) -> str:
    """`template` without the block `bake_prompt_format` put in front of it (unchanged if none)."""
    if template.startswith(_FORMAT_BEGIN) and _FORMAT_END in template:
        return template[template.index(_FORMAT_END) + len(_FORMAT_END):]
    return template


def read_prompt_format(template: str) -> dict | None:
    """`{"system_prompt": str | None, "enable_thinking": bool}` baked into `template` by
    `bake_prompt_format`, or None for a template without that block."""
    if not template.startswith(_FORMAT_BEGIN):
        return None
    meta = template[len(_FORMAT_BEGIN):template.index("\n")]
    return json.JSONDecoder().raw_decode(meta)[0]


def write_prompt_format(out_dir: str, system_prompt: str | None, enable_thinking: bool,
                        generation: Mapping | None = None, template: str | None = None) -> list[str]:
    """Makes an exported checkpoint reproduce its training prompt format by default.

    With `template` (the chat template the run rendered with, e.g. the `keep_thinking` one of
    `jaxrl.envs.chat`), it replaces the copied checkpoint's chat templates first. Then bakes the
    format (`bake_prompt_format`) into every chat template of `out_dir` (the
    `chat_template` of tokenizer_config.json and `chat_template.jinja`, whichever exist; both
    are read by transformers and vLLM), and merges `generation` into generation_config.json
    (created if missing); keys whose value is None are removed (e.g. `temperature` for greedy
    decoding, which transformers rejects next to `do_sample=False`). Each file is replaced
    atomically. Returns the names of the files written.

    Raises:
      ValueError: `out_dir` has no chat template (an exported policy needs one to be prompted).
    """
    from jaxrl.fileio import atomic_write_json, atomic_write_text

    written = []
    tc_path = os.path.join(out_dir, "tokenizer_config.json")
    jinja_path = os.path.join(out_dir, "chat_template.jinja")
    if os.path.exists(tc_path):
        with open(tc_path) as f:
            tc = json.load(f)
        if isinstance(tc.get("chat_template"), str):
            tc["chat_template"] = bake_prompt_format(template if template is not None else tc["chat_template"],
                                                     system_prompt, enable_thinking)
            atomic_write_json(tc_path, tc)
            written.append("tokenizer_config.json")
    if os.path.exists(jinja_path):
        with open(jinja_path) as f:
            text = f.read() if template is None else template
            atomic_write_text(jinja_path, bake_prompt_format(text, system_prompt, enable_thinking))
        written.append("chat_template.jinja")
    if not written:
        raise ValueError(f"{out_dir}: no chat template (tokenizer_config.json 'chat_template' or chat_template.jinja)"
                         "; export from a checkpoint whose tokenizer has one")
    if generation is not None:
        gen_path = os.path.join(out_dir, "generation_config.json")
        gen = {}
        if os.path.exists(gen_path):
            with open(gen_path) as f:
                gen = json.load(f)
        gen.update(generation)
        atomic_write_json(gen_path, {k: v for k, v in gen.items() if v is not None})
        written.append("generation_config.json")
    return written
