"""Builds the tokenizer of the embedded default policy: `jaxrl/assets/default_policy/`.

A small byte-level BPE (512 ids) with the Qwen2/Qwen3 pre-tokenizer (one token per digit), the
Qwen3 special tokens and a Qwen3 chat template, written as Hugging Face files
(`tokenizer.json`, `tokenizer_config.json`) so `transformers.AutoTokenizer.from_pretrained(dir)`
loads it offline exactly like a Qwen3 checkpoint's tokenizer.

The training corpus is generated here from a fixed seed (arithmetic questions and answers,
calculator tool calls and results, the chat-template boilerplate and a little English), so the
output is byte-for-byte reproducible:

    python scripts/make_default_tokenizer.py [--out jaxrl/assets/default_policy] [--check]

`--check` rebuilds into a temporary folder and fails if the committed files differ.

Ids: 0..502 are BPE tokens (the 256 byte symbols first), 503..511 the added tokens in the
order of `ADDED_TOKENS` (`<|endoftext|>` = 503, `<|im_start|>` = 504, `<|im_end|>` = 505, ...).
As in Qwen3, `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` are special (dropped by
`decode(skip_special_tokens=True)`), the tool/think tags are added but not special.
"""
from __future__ import annotations

import argparse
import filecmp
import json
import os
import random
import re
import sys
import tempfile

VOCAB_SIZE = 512
SEED = 0

# (content, special) in id order, as in Qwen3's added_tokens (a subset of its 26 added tokens).
ADDED_TOKENS = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)

# The Qwen2/Qwen3 pre-tokenization regex (GPT-4 style, but `\p{N}` alone: one token per digit).
PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Renders conversations exactly like the chat template of the Qwen3 (2504) checkpoints:
# optional system turn (with a "# Tools" block when tools are given), user turns, assistant turns
# with `<think>` reasoning kept only after the last real user query, tool calls as
# `<tool_call>\n{json}\n</tool_call>`, consecutive `tool` messages merged into one user turn of
# `<tool_response>` blocks, and `enable_thinking=false` adding an empty think block to the
# generation prompt.
CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""

_ENGLISH = (
    "You are a helpful assistant. Answer the question. Think step by step, then give the final "
    "answer. What is the result? Compute the value of the expression. Use the calculator tool "
    "to compute it, then answer with the number. The answer is correct. The answer is wrong, "
    "please try again. Error: unknown tool. Available tools: calculator. Error: could not parse "
    "the tool call as JSON. Evaluate an arithmetic expression with integers and the operators "
    "plus, minus, times and divided by. Write your final answer inside answer tags. "
    "The expression to evaluate, for example 12 * (3 + 4). Let me add the numbers. First, "
    "then, so, therefore, because, and, or, not, the, a, an, of, to, in, is, it, that, for, "
    "with, as, on, be, at, by, this, have, from, sum, difference, product, number, result."
)

_TOOL_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with integers and + - * / ( ).",
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {"type": "string", "description": "The expression, e.g. 12 * (3 + 4)."}
            },
            "required": ["expression"],
        },
    },
}


def build_corpus(seed: int = SEED, n: int = 3000) -> list[str]:
    """Returns training texts for the BPE: task-like conversations rendered by `CHAT_TEMPLATE`."""
    import jinja2

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x: json.dumps(x, ensure_ascii=False)
    template = env.from_string(CHAT_TEMPLATE)
    rng = random.Random(seed)
    texts = [_ENGLISH] * 20
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    for i in range(n):
        op = rng.choice("+-*")
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        value = ops[op](a, b)
        question = f"What is {a} {op} {b}?"
        system = {"role": "system", "content": "Answer with the result in <answer></answer> tags."}
        if i % 3 == 0:
            messages = [
                system,
                {"role": "user", "content": question},
                {"role": "assistant", "content": f"<answer>{value}</answer>"},
            ]
            tools = None
        else:
            call = {"name": "calculator", "arguments": {"expression": f"{a} {op} {b}"}}
            messages = [
                {"role": "user", "content": f"{question} Use the calculator tool."},
                {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": call}]},
                {"role": "tool", "content": str(value)},
                {"role": "assistant", "content": f"<think>\nThe tool says {value}.\n</think>\n\n<answer>{value}</answer>"},
            ]
            tools = [_TOOL_SCHEMA]
        texts.append(template.render(messages=messages, tools=tools, add_generation_prompt=False,
                                     enable_thinking=bool(i % 2)))
    return texts


def build_tokenizer(seed: int = SEED):
    """Trains the BPE and returns a `tokenizers.Tokenizer` with the added tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer

    tok = Tokenizer(BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="",
                        fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    # The chat-template markup is added tokens, not BPE text: train on the text between them.
    splitter = re.compile("|".join(re.escape(content) for content, _ in ADDED_TOKENS))
    corpus = [piece for text in build_corpus(seed) for piece in splitter.split(text) if piece]
    trainer = BpeTrainer(
        vocab_size=VOCAB_SIZE - len(ADDED_TOKENS),
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    if tok.get_vocab_size() != VOCAB_SIZE - len(ADDED_TOKENS):
        raise RuntimeError(f"BPE trained to {tok.get_vocab_size()} ids, expected {VOCAB_SIZE - len(ADDED_TOKENS)}: "
                           "enlarge the corpus")
    for content, special in ADDED_TOKENS:
        token = AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False,
                           special=special)
        (tok.add_special_tokens if special else tok.add_tokens)([token])
    return tok


def tokenizer_config(tok) -> dict:
    """The `tokenizer_config.json` contents (Qwen3 conventions: eos `<|im_end|>`, pad `<|endoftext|>`, no BOS)."""
    decoder = {}
    for content, special in ADDED_TOKENS:
        decoder[str(tok.token_to_id(content))] = {
            "content": content, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": special,
        }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 4096,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def write(out_dir: str, seed: int = SEED) -> None:
    """Writes `tokenizer.json` and `tokenizer_config.json` to `out_dir` (created if missing)."""
    os.makedirs(out_dir, exist_ok=True)
    tok = build_tokenizer(seed)
    tok.save(os.path.join(out_dir, "tokenizer.json"), pretty=True)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(tok), f, indent=2, ensure_ascii=False)
        f.write("\n")


def main(argv=None) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    default_out = os.path.join(here, "..", "jaxrl", "assets", "default_policy")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=default_out)
    parser.add_argument("--check", action="store_true",
                        help="rebuild into a temporary folder and compare with --out")
    args = parser.parse_args(argv)
    if not args.check:
        write(args.out)
        print(f"wrote {args.out}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        write(tmp)
        names = ["tokenizer.json", "tokenizer_config.json"]
        _, mismatch, errors = filecmp.cmpfiles(args.out, tmp, names, shallow=False)
        if mismatch or errors:
            print(f"{args.out}: differs from a fresh build: {mismatch + errors}", file=sys.stderr)
            return 1
    print(f"{args.out}: matches a fresh build")
    return 0


if __name__ == "__main__":
    sys.exit(main())
