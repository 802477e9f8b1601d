"""Talk to a trained policy, with the prompt format it was trained with.

  python -m jaxrl.chat --model runs/rloo/best                          # interactive
  python -m jaxrl.chat --model runs/rloo/best --prompt "What is 37 + 48?"   # one answer, for scripts
  python -m jaxrl.chat --model runs/rloo/sync/60                       # a published policy version
  python -m jaxrl.chat --model runs/rloo/checkpoints/60                # a training checkpoint
  python -m jaxrl.chat --model /ckpt/Qwen3-8B --run_config runs/r1/rl_config.json

The prompt format comes from the run's rl_config.json (best/rl_config.json, or WORKDIR's for a
published version or a training checkpoint; --run_config names another): the system message every training prompt began
with (the task's instruction, e.g. the arithmetic task's answer-tag instruction) and the thinking
mode (generator.enable_thinking). Without a run config, the format a jaxrl export baked into its
chat template, or (any other checkpoint) no system message and thinking on, Qwen3's default.
--system and --thinking override these. Generation runs on the JAX engine
(greedy unless --temperature is given) and stops at the end-of-turn token or --max_new_tokens.

Interactive commands: /reset starts a new conversation, /exit (or Ctrl-D) leaves.
"""
from __future__ import annotations

import os
import sys
from typing import Optional

from absl import flags

from jaxrl import cli

# The command's flags are registered by its entry point only (define_flags), so that several
# jaxrl commands (main, plan, evaluate, chat) can be imported into one process without absl's
# DuplicateFlagError on their shared names (--config, --model).
_MODEL = None
_RUN_CONFIG = None
_PROMPT = None
_SYSTEM = None
_THINKING = None
_MAX_NEW = None
_TEMPERATURE = None
_TOP_P = None
_TOP_K = None
_SEED = None
_DTYPE = None
_MAX_SEQ = None
_SHOW_PROMPT = None


def define_flags() -> None:
    """Registers this command's absl flags (called once, by `python -m` of this module)."""
    global _MODEL, _RUN_CONFIG, _PROMPT, _SYSTEM, _THINKING, _MAX_NEW, _TEMPERATURE, _TOP_P, _TOP_K, _SEED, _DTYPE, _MAX_SEQ, _SHOW_PROMPT
    _MODEL = flags.DEFINE_string("model", None, "Policy: an HF checkpoint directory (a run's best/), a published "
                                 "version WORKDIR/sync/<version> or a training checkpoint "
                                 "WORKDIR/checkpoints/<step>.")
    _RUN_CONFIG = flags.DEFINE_string("run_config", None, "The run's rl_config.json (default: next to --model).")
    _PROMPT = flags.DEFINE_string("prompt", None, "Answer this one message and exit (prints only the answer).")
    _SYSTEM = flags.DEFINE_string("system", None, "System message (default: the run's; '' = none).")
    _THINKING = flags.DEFINE_enum("thinking", None, ["true", "false"], "Thinking mode (default: the run's "
                                  "generator.enable_thinking).")
    _MAX_NEW = flags.DEFINE_integer("max_new_tokens", 0, "Tokens per answer (0: the run's "
                                    "generator.sampling_params.max_generate_length, or 512 without a run config).")
    _TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Sampling temperature; 0 = greedy (argmax).")
    _TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus mass when sampling.")
    _TOP_K = flags.DEFINE_integer("top_k", -1, "Top-k when sampling (-1: off).")
    _SEED = flags.DEFINE_integer("seed", 0, "Sampling seed (the k-th answer uses seed + k).")
    _DTYPE = flags.DEFINE_enum("dtype", None, ["float32", "bfloat16"], "Engine compute dtype (default: the run's "
                               "model.compute_dtype, float32 without a run config).")
    _MAX_SEQ = flags.DEFINE_integer("max_seq_len", 4096, "Longest conversation in tokens (prompt + answer).")
    _SHOW_PROMPT = flags.DEFINE_bool("show_prompt", False, "Print each rendered prompt to stderr.")


class Chat:
    """A conversation with a policy on the JAX engine, rendered in its training prompt format.

    Args:
      sampler: the engine (`jaxrl.rollout.sampler.Sampler`).
      chat_template: `jaxrl.envs.ChatTemplate` of the policy's tokenizer, its `enable_thinking` set.
      system_prompt: put in front of every conversation (None: none).
      max_new_tokens, temperature (0 = greedy), top_p, top_k, seed: decoding of each answer.
    """

    def __init__(self, sampler, chat_template, system_prompt: Optional[str], max_new_tokens: int,
                 temperature: float = 0.0, top_p: float = 1.0, top_k: int = -1, seed: int = 0):
        self.sampler, self.chat = sampler, chat_template
        self.system_prompt = system_prompt
        self.max_new_tokens = int(max_new_tokens)
        self.temperature, self.top_p, self.top_k, self.seed = float(temperature), float(top_p), int(top_k), int(seed)
        self.turns = 0
        self.reset()

    def reset(self) -> None:
        """Starts a new conversation (the system message stays)."""
        self.messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt is not None else []

    def prompt_ids(self, text: str) -> list[int]:
        """The token ids the policy sees when `text` is the next user message."""
        return self.chat.encode_prompt(self.messages + [{"role": "user", "content": text}])

    def reply(self, text: str) -> str:
        """The policy's answer to the user message `text` (appended to the conversation with it).

        Raises:
          ValueError: the conversation no longer fits `max_seq_len` (start a new one).
        """
        from jaxrl.envs import split_thinking
        from jaxrl.rollout.types import SamplingParams

        ids = self.prompt_ids(text)
        room = self.sampler.max_seq_len - len(ids)
        if room < 1:
            raise ValueError(f"the conversation is {len(ids)} tokens, the engine's limit is {self.sampler.max_seq_len}"
                             "; /reset to start a new one (or raise --max_seq_len)")
        greedy = self.temperature == 0
        params = SamplingParams(max_tokens=min(self.max_new_tokens, room), greedy=greedy,
                                temperature=1.0 if greedy else self.temperature, top_p=self.top_p,
                                top_k=max(self.top_k, 0), stop_token_ids=self.chat.stop_token_ids,
                                seed=self.seed + self.turns)
        completion = self.sampler.generate([ids], params)[0][0]
        self.turns += 1
        answer = self.chat.decode(completion.token_ids)
        reasoning, content = split_thinking(answer)
        message = {"role": "assistant", "content": content}
        if reasoning:
            message["reasoning_content"] = reasoning
        self.messages += [{"role": "user", "content": text}, message]
        return answer.strip()


def main(argv):
    if len(argv) > 1:
        cli.usage_error(f"unexpected arguments: {argv[1:]}")
    if not _MODEL.value:
        cli.usage_error("--model is required, e.g. --model=runs/rloo/best")
    if _PROMPT.value is not None and not _PROMPT.value.strip():
        cli.usage_error(f"--prompt={_PROMPT.value!r}: empty message; pass the text to answer, e.g. "
                        "--prompt \"What is 37 + 48?\" (or leave --prompt out to chat interactively)")
    from jaxrl import policy
    from jaxrl.config import base_config
    from jaxrl.envs import DatasetError
    from jaxrl.envs.chat import PromptFormat
    from jaxrl.train.prompts import training_prompt_format

    for name, value, low in (("max_new_tokens", _MAX_NEW.value, 0), ("max_seq_len", _MAX_SEQ.value, 2)):
        if value < low:
            cli.usage_error(f"--{name}={value}: must be >= {low}"
                            + (" (0: the run's max_generate_length)" if name == "max_new_tokens" else ""))
    from jaxrl.rollout.types import MIN_TEMPERATURE

    if not (_TEMPERATURE.value == 0 or MIN_TEMPERATURE <= _TEMPERATURE.value < float("inf")):
        cli.usage_error(f"--temperature={_TEMPERATURE.value:g}: must be 0 (greedy) or a finite number >= "
                        f"{MIN_TEMPERATURE:g}")
    if not 0 < _TOP_P.value <= 1:
        cli.usage_error(f"--top_p={_TOP_P.value:g}: must be in (0, 1] (1 = off)")
    if _TOP_K.value < -1:
        cli.usage_error(f"--top_k={_TOP_K.value}: must be >= 1, or 0 or -1 (off)")
    model = _MODEL.value
    notes = []
    try:
        policy.check_policy_dir(model)
        run_config = _RUN_CONFIG.value or policy.find_run_config(model)
        c = policy.read_run_config(run_config) if run_config else base_config()
        dtype = _DTYPE.value or (c.model.compute_dtype if run_config else "float32")
        sampler, tokenizer_dir, what = policy.load_engine(model, c, dtype=dtype, max_seq_len=_MAX_SEQ.value,
                                                          max_batch_rows=1)
        baked = policy.baked_prompt_format(tokenizer_dir)
        fmt, source = None, ""
        if run_config:
            try:
                fmt, source = training_prompt_format(c), f"the prompt format of {run_config}"
            except DatasetError as e:
                if baked is None:
                    raise
                notes.append(f"{e}; using the prompt format baked into {tokenizer_dir}'s chat template")
        if fmt is None and baked is not None:
            fmt, source = baked, f"the prompt format baked into {tokenizer_dir}'s chat template"
        elif fmt is None:
            fmt = PromptFormat(None, enable_thinking=True)
            source = "no rl_config.json (--run_config): the checkpoint's chat template with its own defaults"
            notes.append("a policy answers best in the prompt format it was trained in (system message, thinking "
                         "mode); if a jaxrl run trained it, pass --run_config=WORKDIR/rl_config.json")
    except (policy.PolicyError, DatasetError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    system = fmt.system_prompt if _SYSTEM.value is None else (_SYSTEM.value or None)
    thinking = fmt.enable_thinking if _THINKING.value is None else _THINKING.value == "true"
    try:
        template = policy.training_chat_template(tokenizer_dir, thinking,
                                                 c.generator.chat_template if run_config else "")
    except policy.PolicyError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    max_new = _MAX_NEW.value or (c.generator.sampling_params.max_generate_length if run_config else 512)
    session = Chat(sampler, template, system, max_new, _TEMPERATURE.value, _TOP_P.value, _TOP_K.value, _SEED.value)
    if run_config and _SYSTEM.value is None and fmt.system_prompt is None and fmt.num_system_prompts > 1:
        notes.append(f"the training prompts had {fmt.num_system_prompts} different system messages; none is added "
                     "(pass --system)")
    if fmt.tools:
        notes.append(f"the policy was trained with the tools {list(fmt.tools)}, which jaxrl.chat does not offer")
    if _PROMPT.value is not None:
        for note in notes:
            print(f"jaxrl chat: note: {note}", file=sys.stderr)
        _answer(session, _PROMPT.value)
        return
    print(f"jaxrl chat: {what}; {source}: system message {'none' if system is None else policy.describe(system)}, thinking "
          f"{'on' if thinking else 'off'}, {'greedy' if session.temperature == 0 else f'T={session.temperature:g}'}, "
          f"up to {max_new} tokens per answer. /reset starts over, /exit leaves.", file=sys.stderr)
    for note in notes:
        print(f"jaxrl chat: note: {note}", file=sys.stderr)
    while True:
        try:
            text = input("> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return
        if text.strip() in ("/exit", "/quit"):
            return
        if text.strip() == "/reset":
            session.reset()
            print("(new conversation)", file=sys.stderr)
            continue
        if text.strip():
            _answer(session, text)


def _answer(session: Chat, text: str) -> None:
    if _SHOW_PROMPT.value:
        print(session.chat.tokenizer.decode(session.prompt_ids(text)), file=sys.stderr)
    try:
        print(session.reply(text), flush=True)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        if _PROMPT.value is not None:
            sys.exit(2)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    define_flags()
    cli.run(main, __doc__, keys_hint=False,
            no_config_hint="; the prompt format comes from the run's rl_config.json (--run_config, default: next "
                           "to --model) and the decoding from --temperature, --max_new_tokens, ...")
