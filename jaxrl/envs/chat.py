"""Chat template rendering for token-in / token-out rollouts (DESIGN.md §1, §3).

`ChatTemplate` wraps the tokenizer and chat template of a checkpoint directory (loaded with
`transformers.AutoTokenizer.from_pretrained`) and produces exactly three kinds of token ids:

* the prompt: `encode_prompt(messages)` renders the initial conversation once, with the
  generation prompt (`<|im_start|>assistant\\n`, plus `<think>\\n\\n</think>\\n\\n` when thinking is
  off);
* the observation after an assistant turn: `encode_observation(new_messages, last_token_id)`;
* nothing else: sampled tokens are appended by the caller exactly as the engine returned them.

How observation tokens are computed (the choice asked for in DESIGN.md §3). Re-rendering the
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
"""
from __future__ import annotations

import os
from typing import Any, Optional, Sequence

Message = dict[str, Any]

DEFAULT_POLICY_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                  "assets", "default_policy")
"""Folder of the embedded default policy (its tokenizer files; weights are added later)."""

_ANCHOR: list[Message] = [{"role": "user", "content": "x"}]
_SENTINEL = "\x00jaxrl-assistant-sentinel\x00"


def load_tokenizer(path: str):
    """Loads the tokenizer (with its chat template) of a checkpoint directory, offline.

    Args:
      path: folder with `tokenizer.json` / `tokenizer_config.json` (a HF checkpoint or
        `DEFAULT_POLICY_DIR`).
    Raises:
      FileNotFoundError: `path` is not a directory.
      ValueError: the tokenizer has no chat template.
    """
    if not os.path.isdir(path):
        raise FileNotFoundError(f"tokenizer directory {path!r} does not exist")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"tokenizer in {path!r} has no chat_template; add one to tokenizer_config.json "
                         "(or chat_template.jinja)")
    return tokenizer


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


class ChatTemplate:
    """Renders conversations to token ids with a checkpoint's tokenizer and chat template.

    Args:
      tokenizer: a `transformers` tokenizer with a `chat_template` (see `load_tokenizer`).
      enable_thinking: passed to the template as `enable_thinking`. With False the Qwen3 template
        appends an empty `<think>\\n\\n</think>\\n\\n` to every generation prompt (non-thinking mode).

    Attributes:
      stop_token_ids: ids that end an assistant turn: the tokenizer's eos (`<|im_end|>` for Qwen3)
        and, when present, `<|im_end|>` and `<|endoftext|>` (Qwen3's generation_config eos list).
    """

    def __init__(self, tokenizer, enable_thinking: bool = False):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("ChatTemplate: tokenizer has no chat_template")
        self.tokenizer = tokenizer
        self.enable_thinking = bool(enable_thinking)
        stop = []
        for tok in (tokenizer.eos_token, "<|im_end|>", "<|endoftext|>"):
            tid = tokenizer.convert_tokens_to_ids(tok) if tok else None
            if tid is not None and tid != tokenizer.unk_token_id and tid not in stop:
                stop.append(tid)
        if not stop:
            raise ValueError("ChatTemplate: the tokenizer has no eos token; set eos_token in tokenizer_config.json")
        self.stop_token_ids: tuple[int, ...] = tuple(stop)
        self.turn_end_id: int = stop[0]
        self._turn_close = self._derive_turn_close()

    @classmethod
    def from_pretrained(cls, path: str, enable_thinking: bool = False) -> "ChatTemplate":
        """`ChatTemplate(load_tokenizer(path), enable_thinking)`."""
        return cls(load_tokenizer(path), enable_thinking=enable_thinking)

    # ---- text ---------------------------------------------------------------------------------
    def render(self, messages: Sequence[Message], tools: Optional[Sequence[dict]] = None,
               add_generation_prompt: bool = True) -> str:
        """The chat template's text for `messages` (and `tools`, a list of JSON tool schemas)."""
        return self.tokenizer.apply_chat_template(
            list(messages), tools=list(tools) if tools else None, tokenize=False,
            add_generation_prompt=add_generation_prompt, enable_thinking=self.enable_thinking)

    def encode_text(self, text: str) -> list[int]:
        """Token ids of `text` (special-token strings become their ids; no BOS/EOS added)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

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
        return self.encode_text(self.render(messages, tools, add_generation_prompt=True))

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
          ValueError: no new messages, an assistant message among them, or the template output
            for the anchor is not a token prefix of the output with the new messages.
        """
        if not new_messages:
            raise ValueError("encode_observation: new_messages is empty")
        for m in new_messages:
            if m.get("role") not in ("user", "tool", "system"):
                raise ValueError(f"encode_observation: observation role must be user, tool or system, "
                                 f"got {m.get('role')!r}")
        anchor_text = self.render(_ANCHOR, tools, add_generation_prompt=False)
        full_text = self.render(_ANCHOR + list(new_messages), tools, add_generation_prompt=True)
        anchor_ids = self.encode_text(anchor_text)
        full_ids = self.encode_text(full_text)
        if not full_text.startswith(anchor_text) or full_ids[:len(anchor_ids)] != anchor_ids:
            raise ValueError("encode_observation: the chat template's rendering of the anchor conversation "
                             "is not a token prefix of its rendering with the new messages; this template "
                             "cannot be extended turn by turn")
        closing = self._turn_close
        if last_token_id == self.turn_end_id:
            closing = closing[len(self.tokenizer.convert_ids_to_tokens(self.turn_end_id)):]
        return self.encode_text(closing) + full_ids[len(anchor_ids):]

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
