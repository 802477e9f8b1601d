"""Chat template rendering for token-in / token-out rollouts (docs/architecture.md §1, §3).

`ChatTemplate` wraps the tokenizer and chat template of a checkpoint directory (loaded as
`transformers.AutoTokenizer.from_pretrained` loads it: `load_tokenizer`) and produces exactly three kinds of token ids:

* the prompt: `encode_prompt(messages)` renders the initial conversation once, with the
  generation prompt (`<|im_start|>assistant\\n`, plus `<think>\\n\\n</think>\\n\\n` when thinking is
  off);
* the observation after an assistant turn: `encode_observation(new_messages, last_token_id)`;
* nothing else: sampled tokens are appended by the caller exactly as the engine returned them.

How observation tokens are computed (the choice asked for in docs/architecture.md §3). Re-rendering the
whole history with the Qwen3 template is *not* a token extension of the previous turn: the
template strips `<think>` blocks from assistant turns before the last user query and renders the
last assistant turn differently from an earlier one (Qwen3 notes §2, "template stripping
breaks prefix extension"). So the history is never re-rendered. Instead the new messages are
rendered after a fixed one-message anchor conversation (`[{"role": "user", ...}]`, whose rendering
does not depend on what follows) and the tokens beyond the anchor's tokens are taken; the loop
verifies that the anchor's tokens are a prefix of the anchor+new tokens and raises otherwise.
Before them come the template's turn-closing tokens that follow an assistant message (for Qwen3
`<|im_end|>\\n`) minus the stop token the model already sampled (so `\\n`), derived once from the
template by rendering a sentinel assistant message. This is the same as SkyRL's
`use_conversation_multi_turn` path (fixed base conversation stripped), applied at token level.

Untrusted text never becomes a control token. Every string inside the messages and tool schemas
(content from users, tasks and dataset rows, tool results, sandbox observations, tool-call
arguments, tool descriptions, even roles) is text: a `<|im_end|>`, `<|im_start|>`, `<tool_call>`,
`<think>`, ... typed inside it is encoded as the characters it is made of, never as the added
token's id. Only the chat template's own markup produces those ids. How: before rendering, every
occurrence of an added-token string in those strings is replaced by a placeholder (private-use
characters around a number); the template renders the conversation; the result is split at the
added-token strings that remain (all of them written by the template), each of those becomes its
id, and every run of text between them gets its placeholders restored and is encoded with the
tokenizer's normalizer, pre-tokenizer and BPE model only (`encode_plain_text`). Consequences:
the template cannot see a control string in text either (an assistant message whose `content`
holds `<think>...</think>` is rendered as plain content; give past reasoning in
`reasoning_content` and past calls in `tool_calls`, which the template renders as markup). Text
without any added-token string is encoded exactly as before (`tokenizer.encode` of the rendering);
the constructor checks that both paths agree on a probe conversation.

Past thinking (`chat_template="keep_thinking"`, config key `generator.chat_template`). Because
rollouts are token-in/token-out, the model always sees every earlier turn exactly as it sampled it,
`<think>` block included: the view of the seed runs, whose vLLM rendered each turn with
OpenThoughts-Agent's `qwen3_thinking_acc.jinja2`, which keeps the `<think>` blocks of all past
assistant turns (so says its 24GPU_base_131k.yaml; SkyRL ships a template for the same purpose,
`qwen3_acc_thinking.jinja2`). Qwen3's own template, by contrast, drops the
reasoning of assistant turns before the last user message and renders a turn without reasoning
with no `<think>` block. Whenever a conversation is rendered from messages instead (task prompts
that hold earlier assistant turns, `jaxrl.chat`, `jaxrl.evaluate`, and the template exported with a
trained policy, which vLLM and transformers serve it with), `keep_thinking` renders every assistant
turn the way the template renders the live one: `<think>\n{reasoning}\n</think>\n\n{content}`
(an empty block when there is no reasoning, which is what the model emits, or is prompted with in
non-thinking mode). So the rendering of a conversation equals the token-in/token-out ids of its
turns (tests/test_qwen3_vocab.py). The template is the checkpoint's own, changed at load time
(`keep_thinking_template`): no template text is shipped.
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Optional, Sequence

Message = dict[str, Any]

DEFAULT_POLICY_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                  "assets", "default_policy")
"""Folder of the embedded default policy (its tokenizer files; weights are added later)."""

_ANCHOR: list[Message] = [{"role": "user", "content": "x"}]
_SENTINEL = "\x00jaxrl-assistant-sentinel\x00"
# Placeholders for control strings found in untrusted text: "\ue000<k>\ue001" (Unicode private-use
# characters, which JSON (`tojson`) and the templates pass through unchanged).
_PH_OPEN, _PH_CLOSE = "\ue000", "\ue001"
_PH_RE = re.compile(_PH_OPEN + r"(\d+)" + _PH_CLOSE)


def load_tokenizer(path: str):
    """Loads the tokenizer (with its chat template) of a checkpoint directory, offline.

    Args:
      path: folder with `tokenizer.json` / `tokenizer_config.json` (a HF checkpoint or
        `DEFAULT_POLICY_DIR`).
    Raises:
      FileNotFoundError: `path` is not a directory.
      ValueError: no tokenizer files (`jaxrl.fileio.tokenizer_problem`), or no chat template.
    """
    from jaxrl.fileio import tokenizer_problem

    if not os.path.isdir(path):
        raise FileNotFoundError(f"tokenizer directory {path!r} does not exist")
    problem = tokenizer_problem(path)
    if problem:
        raise ValueError(f"{problem}. Fix: copy the tokenizer files of the model it was trained from into it")
    tokenizer = _tokenizer_class(path).from_pretrained(path, local_files_only=True)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"tokenizer in {path!r} has no chat_template; add one to tokenizer_config.json "
                         "(or chat_template.jinja)")
    return tokenizer


# Tokenizer classes loaded by name, as `AutoTokenizer` resolves them for these checkpoints (Qwen3's
# tokenizer_config.json names Qwen2Tokenizer, and its config's model_type maps to the same class).
# `transformers.AutoTokenizer` imports the model-config machinery and with it torch when torch is
# installed (2 s per process); the class itself needs neither.
_DIRECT_TOKENIZER_CLASSES = ("Qwen2Tokenizer", "Qwen2TokenizerFast")


def _tokenizer_class(path: str):
    """The class `AutoTokenizer.from_pretrained(path)` returns an instance of: for a tokenizer_config.json
    naming one of `_DIRECT_TOKENIZER_CLASSES` its fast class, else `AutoTokenizer` itself, which resolves
    every other checkpoint."""
    import json

    import transformers

    name = None
    config_path = os.path.join(path, "tokenizer_config.json")
    if os.path.isfile(config_path):  # checked to be a JSON object by `jaxrl.fileio.tokenizer_problem`
        with open(config_path, encoding="utf-8") as f:
            name = json.load(f).get("tokenizer_class")
    if name in _DIRECT_TOKENIZER_CLASSES:
        base = name.removesuffix("Fast")
        # The fast class where the library has one (transformers 4.x: Qwen2TokenizerFast, what AutoTokenizer
        # picks; 4.x's Qwen2Tokenizer is the slow one that needs vocab.json + merges.txt). In transformers 5
        # Qwen2TokenizerFast is another name of Qwen2Tokenizer, the only (fast) class.
        cls = getattr(transformers, base + "Fast", None) or getattr(transformers, base, None)
        if cls is not None:
            return cls
    return transformers.AutoTokenizer


def split_thinking(text: str) -> tuple[str, str]:
    """Splits an assistant output into (reasoning, content) the way the Qwen3 template does.

    If `</think>` occurs, reasoning is the text before the first `</think>` (after the last
    `<think>` preceding it), with newlines stripped at its ends, and content is the text after the
    last `</think>` with leading newlines stripped; otherwise reasoning is "" and content is `text`.
    """
    if "</think>" not in text:
        return "", text
    reasoning = text.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
    content = text.split("</think>")[-1].lstrip("\n")
    return reasoning, content


CHAT_TEMPLATES = ("", "keep_thinking")
"""Values of `generator.chat_template`: "" the checkpoint's chat template as it is; "keep_thinking"
that template rendering every past assistant turn with its `<think>` block (module docstring)."""

# The two conditions of Qwen3's template that decide whether an assistant turn is rendered with its
# reasoning: after the last real user query, and (for a turn that is not the last message) only when
# it has reasoning. `keep_thinking` makes both true.
_REASONING_CONDITIONS = (re.compile(r"loop\.index0\s*>\s*ns\.last_query_index"),
                         re.compile(r"loop\.last\s+or\s+\(\s*not\s+loop\.last\s+and\s+reasoning_content\s*\)"))


class ChatTemplateOptionError(ValueError):
    """`generator.chat_template` cannot be applied to a checkpoint's template: `problem`, `fix`."""

    def __init__(self, problem: str, fix: str):
        super().__init__(f"generator.chat_template=keep_thinking: {problem}; {fix}")
        self.problem, self.fix = problem, fix


def keeps_past_thinking(tokenizer, template: str) -> bool:
    """Whether `template` renders an assistant turn followed by a user turn with its reasoning
    (`<think>\\nR\\n</think>\\n\\nC`) and one without reasoning with an empty block."""
    def render(assistant):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": "q"}, {"role": "assistant", **assistant}, {"role": "user", "content": "u"}],
            chat_template=template, tokenize=False, add_generation_prompt=True)

    try:
        with_r = render({"content": "C", "reasoning_content": "R"})
        without = render({"content": "C"})
    except Exception:  # noqa: BLE001 - a template that cannot render this is not one that keeps thinking
        return False
    return "<think>\nR\n</think>\n\nC" in with_r and "<think>\n\n</think>\n\nC" in without


def keep_thinking_template(tokenizer, template: Optional[str] = None) -> str:
    """The chat template (default: the tokenizer's) with every assistant turn rendered with its
    `<think>` block, past turns included (module docstring, "Past thinking").

    A template that already does so is returned unchanged (a jaxrl export of a `keep_thinking` run).
    Otherwise the two conditions of Qwen3's template that drop past reasoning are made true, and the
    result is checked by rendering a probe conversation.

    Raises:
      ChatTemplateOptionError: the template is not Qwen3's (it has neither condition) and does not
        keep past thinking, so it cannot be changed safely.
    """
    template = template if template is not None else tokenizer.chat_template
    if keeps_past_thinking(tokenizer, template):
        return template
    changed = template
    for pattern in _REASONING_CONDITIONS:
        changed = pattern.sub("true", changed)
    if changed == template or not keeps_past_thinking(tokenizer, changed):
        raise ChatTemplateOptionError(
            "the checkpoint's chat template is not Qwen3's (it has no 'loop.index0 > ns.last_query_index' reasoning "
            "condition) and does not keep the <think> block of past assistant turns",
            "use a Qwen3 checkpoint's tokenizer files, or generator.chat_template=''")
    return changed


class ChatTemplate:
    """Renders conversations to token ids with a checkpoint's tokenizer and chat template.

    Args:
      tokenizer: a `transformers` tokenizer with a `chat_template` (see `load_tokenizer`).
      enable_thinking: passed to the template as `enable_thinking`. With False the Qwen3 template
        appends an empty `<think>\\n\\n</think>\\n\\n` to every generation prompt (non-thinking mode).
      chat_template: "" or None (the tokenizer's chat template) or "keep_thinking"
        (`keep_thinking_template` of it); `generator.chat_template`. The tokenizer is not changed.

    Attributes:
      template: the Jinja source every rendering uses.
      stop_token_ids: ids that end an assistant turn: the tokenizer's eos (`<|im_end|>` for Qwen3)
        and, when present, `<|im_end|>` and `<|endoftext|>` (Qwen3's generation_config eos list).
    """

    def __init__(self, tokenizer, enable_thinking: bool = False, chat_template: Optional[str] = ""):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("ChatTemplate: tokenizer has no chat_template")
        chat_template = chat_template or ""  # None (the config default) = ""
        if chat_template not in CHAT_TEMPLATES:
            raise ValueError(f"chat_template={chat_template!r}; expected one of {CHAT_TEMPLATES}")
        self.tokenizer = tokenizer
        self.enable_thinking = bool(enable_thinking)
        self.chat_template = chat_template
        self.template: str = (keep_thinking_template(tokenizer) if chat_template == "keep_thinking"
                              else tokenizer.chat_template)
        stop = []
        for tok in (tokenizer.eos_token, "<|im_end|>", "<|endoftext|>"):
            tid = tokenizer.convert_tokens_to_ids(tok) if tok else None
            if tid is not None and tid != tokenizer.unk_token_id and tid not in stop:
                stop.append(tid)
        if not stop:
            raise ValueError("ChatTemplate: the tokenizer has no eos token; set eos_token in tokenizer_config.json")
        self.stop_token_ids: tuple[int, ...] = tuple(stop)
        self.turn_end_id: int = stop[0]
        if getattr(tokenizer, "backend_tokenizer", None) is None:
            raise ValueError("ChatTemplate: needs a fast (tokenizers-backed) tokenizer, to encode untrusted text "
                             "without matching control tokens; load it with AutoTokenizer (use_fast=True)")
        added = {str(t): int(i) for i, t in tokenizer.added_tokens_decoder.items()}
        # Longest first, so that a control string that contains another one wins (regex alternation).
        self.control_strings: tuple[str, ...] = tuple(sorted(added, key=lambda t: (-len(t), t)))
        self._control_ids = added
        self._control_id_set = frozenset(added.values())
        alternation = "|".join(re.escape(t) for t in self.control_strings)
        self._control_re = re.compile(alternation) if added else None
        self._defuse_re = re.compile("|".join(filter(None, [alternation, re.escape(_PH_OPEN), re.escape(_PH_CLOSE)])))
        self._turn_close = self._derive_turn_close()
        self._check_structured_encoding()

    @classmethod
    def from_pretrained(cls, path: str, enable_thinking: bool = False,
                        chat_template: Optional[str] = "") -> "ChatTemplate":
        """`ChatTemplate(load_tokenizer(path), enable_thinking, chat_template)`."""
        return cls(load_tokenizer(path), enable_thinking=enable_thinking, chat_template=chat_template)

    # ---- text ---------------------------------------------------------------------------------
    def render(self, messages: Sequence[Message], tools: Optional[Sequence[dict]] = None,
               add_generation_prompt: bool = True) -> str:
        """The chat template's text for `messages` (and `tools`, a list of JSON tool schemas)."""
        return self.tokenizer.apply_chat_template(
            list(messages), tools=list(tools) if tools else None, tokenize=False, chat_template=self.template,
            add_generation_prompt=add_generation_prompt, enable_thinking=self.enable_thinking)

    def encode_text(self, text: str) -> list[int]:
        """Token ids of TRUSTED `text`: added-token strings (`<|im_end|>`, `<tool_call>`, ...) become their
        ids; no BOS/EOS added. Use it for template markup and model output only; text from users,
        tasks, tools or a sandbox goes through `encode_prompt` / `encode_observation` /
        `encode_plain_text`."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_plain_text(self, text: str) -> list[int]:
        """Token ids of `text` as text: no added-token matching, so `<|im_end|>` typed in it is encoded
        as the characters `<`, `|`, `im`, ... (the tokenizer's normalizer, pre-tokenizer and BPE model;
        for text without added-token strings this equals `encode_text`).

        Raises:
          ValueError: the tokenizer's BPE model itself produced an added-token id (a vocabulary that
            also holds a control token as an ordinary token); such a tokenizer cannot keep text
            apart from control tokens.
        """
        backend = self.tokenizer.backend_tokenizer
        normalized = backend.normalizer.normalize_str(text) if backend.normalizer is not None else text
        pieces = ([p for p, _ in backend.pre_tokenizer.pre_tokenize_str(normalized)]
                  if backend.pre_tokenizer is not None else [normalized])
        ids = [t.id for piece in pieces for t in backend.model.tokenize(piece)]
        leaked = self._control_id_set.intersection(ids)
        if leaked:
            raise ValueError(f"encode_plain_text: the tokenizer's BPE model encodes text as the control token id(s) "
                             f"{sorted(leaked)}; it cannot keep untrusted text apart from control tokens")
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of generated ids with special tokens (`<|im_end|>`, ...) removed.

        Non-special added tokens (`<tool_call>`, `<think>`, ...) are kept, as in Qwen3.
        """
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    # ---- token ids ----------------------------------------------------------------------------
    def encode_prompt(self, messages: Sequence[Message], tools: Optional[Sequence[dict]] = None) -> list[int]:
        """Prompt ids: the template rendering of `messages` with the generation prompt.

        Raises:
          ValueError: `messages` is empty or the last message is an assistant turn.
        """
        if not messages:
            raise ValueError("encode_prompt: messages is empty; a task must start with at least one message")
        if messages[-1].get("role") == "assistant":
            raise ValueError("encode_prompt: the last message is an assistant turn; the prompt must end "
                             "with a user, system or tool message")
        return self.encode_conversation(messages, tools, add_generation_prompt=True)

    def encode_conversation(self, messages: Sequence[Message], tools: Optional[Sequence[dict]] = None,
                            add_generation_prompt: bool = True) -> list[int]:
        """Ids of the template rendering of `messages` (+ `tools`), with every string inside them
        encoded as text: only the template's own markup produces added-token ids (module docstring).

        Raises:
          ValueError: the rendering contains a placeholder character the template wrote itself, or the
            tokenizer cannot encode text apart from control tokens (`encode_plain_text`).
        """
        text, originals = self._render_defused(messages, tools, add_generation_prompt)
        return self._encode_rendered(text, originals)

    def encode_observation(self, new_messages: Sequence[Message], last_token_id: Optional[int],
                           tools: Optional[Sequence[dict]] = None) -> list[int]:
        """Ids appended after an assistant turn: its closing, `new_messages`, the next assistant header.

        Args:
          new_messages: the environment's observation messages (roles user / tool / system), >= 1.
          last_token_id: the last token the model generated in this turn. If it is the turn-end
            token (`<|im_end|>`), only the rest of the closing (`\\n`) is added; otherwise (the
            model stopped on another stop id such as `<|endoftext|>`) the full closing is added.
          tools: the tool schemas of the conversation (passed to the template for fidelity).
        Returns:
          ids whose text is `closing + render(new_messages) + generation prompt`; never empty.
        Raises:
          ValueError: no new messages, an assistant message or a non-string content among them, or the template output
            for the anchor is not a token prefix of the output with the new messages.
        """
        if not new_messages:
            raise ValueError("encode_observation: new_messages is empty")
        for m in new_messages:
            if not isinstance(m, dict) or m.get("role") not in ("user", "tool", "system"):
                raise ValueError(f"encode_observation: observation role must be user, tool or system, "
                                 f"got {m.get('role') if isinstance(m, dict) else m!r}")
            if not isinstance(m.get("content"), str):
                raise ValueError(f"encode_observation: observation content must be a string, got "
                                 f"{type(m.get('content')).__name__}")
        anchor_text, anchor_originals = self._render_defused(_ANCHOR, tools, add_generation_prompt=False)
        full_text, full_originals = self._render_defused(_ANCHOR + list(new_messages), tools,
                                                         add_generation_prompt=True)
        anchor_ids = self._encode_rendered(anchor_text, anchor_originals)
        full_ids = self._encode_rendered(full_text, full_originals)
        if not full_text.startswith(anchor_text) or full_ids[:len(anchor_ids)] != anchor_ids:
            raise ValueError("encode_observation: the chat template's rendering of the anchor conversation "
                             "is not a token prefix of its rendering with the new messages; this template "
                             "cannot be extended turn by turn")
        closing = self._turn_close
        if last_token_id == self.turn_end_id:
            closing = closing[len(self.tokenizer.convert_ids_to_tokens(self.turn_end_id)):]
        return self.encode_text(closing) + full_ids[len(anchor_ids):]

    # ---- untrusted text (module docstring) -----------------------------------------------------
    def _render_defused(self, messages: Sequence[Message], tools: Optional[Sequence[dict]],
                        add_generation_prompt: bool) -> tuple[str, list[str]]:
        """Renders with every control string inside messages / tools replaced by a placeholder.

        Returns the rendering and the replaced strings (placeholder k stands for originals[k]).
        Tools are defused first, so the same tools get the same placeholders in every call.
        """
        originals: list[str] = []

        def sub(match: re.Match) -> str:
            originals.append(match.group(0))
            return f"{_PH_OPEN}{len(originals) - 1}{_PH_CLOSE}"

        def defuse(x: Any) -> Any:
            if isinstance(x, str):
                return self._defuse_re.sub(sub, x)
            if isinstance(x, dict):
                return {defuse(k): defuse(v) for k, v in x.items()}
            if isinstance(x, (list, tuple)):
                return type(x)(defuse(v) for v in x)
            return x

        safe_tools = defuse(list(tools)) if tools else None
        safe_messages = [defuse(dict(m)) for m in messages]
        return self.render(safe_messages, safe_tools, add_generation_prompt=add_generation_prompt), originals

    def _encode_rendered(self, text: str, originals: list[str]) -> list[int]:
        """Ids of a defused rendering: template control strings -> ids, runs between them -> text."""
        if not originals:
            # Every control string in `text` is the template's: the tokenizer's own encoding is exact.
            if _PH_OPEN in text or _PH_CLOSE in text:
                raise ValueError("ChatTemplate: the chat template writes the placeholder characters U+E000/U+E001 "
                                 "itself; untrusted text cannot be kept apart from its markup")
            return self.encode_text(text)
        return self._encode_split(text, originals)

    def _encode_split(self, text: str, originals: list[str]) -> list[int]:
        ids: list[int] = []
        pos = 0
        for match in self._control_re.finditer(text) if self._control_re is not None else ():
            ids += self._encode_run(text[pos:match.start()], originals)
            ids.append(self._control_ids[match.group(0)])
            pos = match.end()
        ids += self._encode_run(text[pos:], originals)
        return ids

    def _encode_run(self, run: str, originals: list[str]) -> list[int]:
        if not run:
            return []
        bare = _PH_RE.sub("", run)
        if _PH_OPEN in bare or _PH_CLOSE in bare:
            raise ValueError("ChatTemplate: the chat template altered a placeholder (or writes U+E000/U+E001 "
                             "itself); untrusted text cannot be kept apart from its markup")
        return self.encode_plain_text(_PH_RE.sub(lambda m: originals[int(m.group(1))], run))

    def _check_structured_encoding(self) -> None:
        """The split-at-markup encoding must equal the tokenizer's own on text without untrusted control
        strings (it does when added tokens match exactly, with no lstrip/rstrip/normalization)."""
        probe = _ANCHOR + [{"role": "assistant", "content": "a b\n\n c"}, {"role": "user", "content": " y\n"}]
        text = self.render(probe, add_generation_prompt=True)
        direct = self.encode_text(text)
        split = self._encode_split(text, [])
        if split != direct:
            raise ValueError("ChatTemplate: this tokenizer matches its added tokens in a way that cannot be "
                             "reproduced when splitting at the template's markup (lstrip/rstrip/single_word/"
                             "normalized added tokens); untrusted text cannot be encoded safely with it")

    def _derive_turn_close(self) -> str:
        """Text the template puts after an assistant message's content (Qwen3: `<|im_end|>\\n`)."""
        text = self.render(_ANCHOR + [{"role": "assistant", "content": _SENTINEL}], add_generation_prompt=False)
        if _SENTINEL not in text:
            raise ValueError("ChatTemplate: the chat template does not render assistant content verbatim")
        close = text[text.rindex(_SENTINEL) + len(_SENTINEL):]
        end = self.tokenizer.convert_ids_to_tokens(self.turn_end_id)
        if not close.startswith(end):
            raise ValueError(f"ChatTemplate: the template closes an assistant turn with {close!r}, which does "
                             f"not start with the eos token {end!r}; set eos_token to the turn-end token")
        return close


@dataclasses.dataclass(frozen=True)
class PromptFormat:
    """How a run rendered its training prompts: the system message and the thinking mode
    (`of_tasks`; the format of a run config: `jaxrl.train.prompts.training_prompt_format`).

    Attributes:
      system_prompt: the system message every training prompt starts with; None when they start
        without one, or not all with the same one (`num_system_prompts` then says how many).
      enable_thinking: the chat template's `enable_thinking` (`generator.enable_thinking`).
      num_system_prompts: distinct system messages among the training prompts (0 = none).
      tools: tool names the training prompts offer (their schemas are rendered in the prompt).
      template: the chat template the run rendered with when it is not the checkpoint's own
        (`generator.chat_template=keep_thinking`: `ChatTemplate.template`), which an export writes
        in place of the checkpoint's; None = the checkpoint's.
    """

    system_prompt: Optional[str]
    enable_thinking: bool
    num_system_prompts: int = 0
    tools: tuple = ()
    template: Optional[str] = None

    @classmethod
    def of_tasks(cls, tasks: Sequence[Any], enable_thinking: bool) -> "PromptFormat":
        """The format of prompts built from `tasks` (`jaxrl.envs.Task`s): their common system
        message, if every one starts with the same."""
        systems, tools = set(), set()
        no_system = False
        for task in tasks:
            first = task.messages[0] if task.messages else {}
            if first.get("role") == "system":
                systems.add(first.get("content"))
            else:
                no_system = True
            tools.update(getattr(task, "tools", ()) or ())
        common = next(iter(systems)) if len(systems) == 1 and not no_system else None
        return cls(common, enable_thinking, len(systems), tuple(sorted(tools)))
