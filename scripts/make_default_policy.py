"""Builds the weights of the embedded default policy: `jaxrl/assets/default_policy/`.

A small Qwen3 (see `MODEL`) gets a short supervised warm start on the built-in tasks with
jaxrl's own model code (`jaxrl.models.qwen3.logprobs` + optax, jitted, float32 on CPU), and is
written as a Hugging Face checkpoint with `jaxrl.models.hf_io` (`config.json`,
`model.safetensors`, `generation_config.json`; the tokenizer files already in the folder are
left alone).

Training data (train splits only, so the eval splits stay held out):

* `arithmetic` (the default RL task): the prompt rendered by the chat template exactly as the
  rollout renders it (`ChatTemplate.encode_prompt`, thinking off) followed by the answer
  `<answer>N</answer>` and `<|im_end|>`;
* `calculator` (multi-turn tool use), a few episodes per step: prompt with the tool schema,
  a `<tool_call>` turn, the tool-response observation exactly as the rollout appends it
  (`ChatTemplate.encode_observation`), and the final `<answer>` turn.

The loss is the next-token cross-entropy on the assistant tokens only (the rollout's
`loss_mask`), averaged over the tokens of the step (token mean).

The warm start is stopped early on purpose: the policy answers in the right format, is right
on about a third of held-out problems with greedy decoding and unsure on the rest (its
temperature-1 samples are right on a good fraction of the others), so RL with 8 samples per
prompt has a learning signal from the first step. It is never trained on wrong answers.

    python scripts/make_default_policy.py              # trains and writes jaxrl/assets/default_policy
    python scripts/make_default_policy.py --check      # retrains into a temp dir, compares with the shipped files
    python scripts/make_default_policy.py --eval       # success rates of the shipped policy on 200 held-out prompts

Everything is seeded (`--seed`, default 0): the same seed on the same software stack gives the
same file bytes; `--check` also accepts logits equal to 1e-6 (`CHECK_ATOL`) so that a
different CPU's float rounding order does not count as a change.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Optional, Sequence

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from jaxrl.envs.chat import DEFAULT_POLICY_DIR, ChatTemplate, load_tokenizer  # noqa: E402
from jaxrl.envs.tasks import get_task_suite  # noqa: E402
from jaxrl.envs.verifiable import make_env  # noqa: E402
from jaxrl.models import hf_io, qwen3, qwen3_kv_cache  # noqa: E402

# ---- the architecture ---------------------------------------------------------------------------
EOS_ID, PAD_ID = 505, 503  # <|im_end|>, <|endoftext|> (see scripts/make_default_tokenizer.py)
MODEL = qwen3.Qwen3Config(
    vocab_size=512, hidden_size=128, intermediate_size=384, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    max_position_embeddings=2048, rope_theta=10_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
    bos_token_id=None, eos_token_id=EOS_ID, dtype="float32", remat="none",
)
def generation_config(eos_id: int, pad_id: int) -> dict:
    """The `generation_config.json` of an embedded policy: stop on `<|im_end|>` or `<|endoftext|>`,
    sample at temperature 1 with no top-p / top-k (what RL rollouts do)."""
    return {"eos_token_id": [eos_id, pad_id], "pad_token_id": pad_id, "do_sample": True,
            "temperature": 1.0, "top_p": 1.0, "top_k": 0}


GENERATION_CONFIG = generation_config(EOS_ID, PAD_ID)
WEIGHT_FILES = ("config.json", "model.safetensors", "generation_config.json")
CHECK_ATOL = 1e-6

ARITH_LEN = 26  # tokens of an arithmetic example after the shared prefix (question, header, answer)
CALC_LEN = 96  # tokens of a calculator episode after the shared prefix (question, two turns, observation)


@dataclasses.dataclass(frozen=True)
class Settings:
    """Hyper-parameters of the warm start (the defaults build the shipped policy).

    Attributes:
      seed: seeds the init (`qwen3.init_params`) and the example order (`numpy` Generator).
      steps: optimizer steps.
      batch_size: arithmetic examples per step.
      calculator_batch_size: calculator episodes per step (0 = none).
      lr: peak AdamW learning rate (linear warm-up for `warmup_steps`, then constant).
      warmup_steps: warm-up length.
      weight_decay: AdamW decoupled weight decay.
      max_grad_norm: global-norm gradient clip.
    """

    seed: int = 0
    steps: int = 560
    batch_size: int = 64
    calculator_batch_size: int = 4
    lr: float = 1e-3
    warmup_steps: int = 20
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0


# ---- examples -----------------------------------------------------------------------------------

def arithmetic_example(chat: ChatTemplate, task) -> tuple[list[int], list[int]]:
    """(token ids, per-token loss flags) of one arithmetic task answered correctly.

    The ids are the rollout's prompt (`encode_prompt`) + `<answer>N</answer>` + `<|im_end|>`;
    flags are 1 on the answer tokens (what the policy generates), 0 on the prompt.
    """
    prompt = chat.encode_prompt(task.messages)
    answer = chat.encode_text(f"<answer>{task.reward_spec['answer']}</answer>") + [chat.turn_end_id]
    return prompt + answer, [0] * len(prompt) + [1] * len(answer)


def calculator_example(chat: ChatTemplate, task) -> tuple[list[int], list[int]]:
    """(token ids, loss flags) of one calculator episode solved with one tool call.

    Turn 1 calls the calculator with `"a op b"`; the observation is the real tool output, rendered
    exactly as the rollout loop appends it (`encode_observation` after `<|im_end|>`); turn 2
    answers `<answer>result</answer>`. Flags are 1 on the two assistant turns only.
    """
    env = make_env(task)
    messages = env.reset(task)
    meta = task.metadata
    call = json.dumps({"name": "calculator", "arguments": {"expression": f"{meta['a']} {meta['op']} {meta['b']}"}})
    step = env.step(f"<tool_call>\n{call}\n</tool_call>")
    if step.done or [o["content"] for o in step.observations] != [task.reward_spec["answer"]]:
        raise RuntimeError(f"calculator example {task.task_id}: unexpected tool result {step.observations}")
    prompt = chat.encode_prompt(messages, env.tools)
    turn1 = chat.encode_text(f"<tool_call>\n{call}\n</tool_call>") + [chat.turn_end_id]
    obs = chat.encode_observation(step.observations, chat.turn_end_id, env.tools)
    turn2 = chat.encode_text(f"<answer>{task.reward_spec['answer']}</answer>") + [chat.turn_end_id]
    ids = prompt + turn1 + obs + turn2
    flags = [0] * len(prompt) + [1] * len(turn1) + [0] * len(obs) + [1] * len(turn2)
    return ids, flags


def common_prefix(sequences: Sequence[Sequence[int]]) -> list[int]:
    """The longest token prefix shared by all `sequences`."""
    first = list(sequences[0])
    n = len(first)
    for seq in sequences[1:]:
        n = min(n, len(seq))
        for i in range(n):
            if seq[i] != first[i]:
                n = i
                break
    return first[:n]


def make_batch(examples: Sequence[tuple[list[int], list[int]]], length: int,
               prefix: Sequence[int] = ()) -> dict[str, np.ndarray]:
    """Right-padded batch of the examples' tokens after a shared `prefix`.

    Every example must start with `prefix` (a part of the prompt shared by the whole batch, on
    which nothing is trained); its tokens are stored once, the rest of each example is the row.

    Returns:
      `prefix [P0]` int32, and `[B, length]` arrays: `tokens` int32 (the examples' tokens after the
      prefix, padded with `<|endoftext|>`), `positions` int32 (`P0 + column`), `segment_ids` int32
      (1 on tokens, 0 on padding) and the target-aligned `loss_mask` float32 whose column t refers to
      predicting `tokens[:, t + 1]` (`[B, length - 1]`).
    Raises:
      ValueError: an example does not start with `prefix`, has a loss flag inside it, or is
        longer than `len(prefix) + length`.
    """
    P0, B = len(prefix), len(examples)
    tokens = np.full((B, length), PAD_ID, np.int32)
    seg = np.zeros((B, length), np.int32)
    mask = np.zeros((B, length), np.float32)
    for i, (ids, flags) in enumerate(examples):
        if list(ids[:P0]) != list(prefix) or any(flags[:P0 + 1]):
            raise ValueError("make_batch: every example must start with the shared prefix and have no loss "
                             "flag on it or on the first token after it")
        rest = ids[P0:]
        if len(rest) > length:
            raise ValueError(f"make_batch: an example has {len(rest)} tokens after the prefix > length {length}; "
                             "raise ARITH_LEN / CALC_LEN")
        tokens[i, :len(rest)] = rest
        seg[i, :len(rest)] = 1
        mask[i, :len(rest) - 1] = flags[P0 + 1:]
    positions = P0 + np.broadcast_to(np.arange(length, dtype=np.int32), (B, length))
    return {"prefix": np.asarray(prefix, np.int32), "tokens": tokens, "positions": positions.copy(),
            "segment_ids": seg, "loss_mask": mask[:, :-1]}


def task_prefix(chat: ChatTemplate, task: str) -> list[int]:
    """The prompt tokens shared by every example of `task` ("arithmetic" or "calculator"): the
    common prefix of two examples whose questions differ in their first character."""
    suite = get_task_suite(task)
    if task == "arithmetic":
        pair = [arithmetic_example(chat, suite.make_task(a, "+", 1))[0] for a in (1, 2)]
    else:
        pair = [calculator_example(chat, suite.make_task(a, "*", 10))[0] for a in (100, 200)]
    return common_prefix(pair)


class ExampleStream:
    """Seeded stream of training batches: epochs over a shuffled train split, no repeats within one.

    Prompts are rendered lazily (only the problems a run uses).
    """

    def __init__(self, chat: ChatTemplate, tasks, build, rng: np.random.Generator):
        self.chat, self.tasks, self.build, self.rng = chat, tasks, build, rng
        self.order: list[int] = []
        self.cache: dict[int, tuple[list[int], list[int]]] = {}

    def take(self, n: int) -> list[tuple[list[int], list[int]]]:
        out = []
        while len(out) < n:
            if not self.order:
                self.order = list(self.rng.permutation(len(self.tasks)))
            i = int(self.order.pop())
            if i not in self.cache:
                self.cache[i] = self.build(self.chat, self.tasks[i])
            out.append(self.cache[i])
        return out


# ---- training -----------------------------------------------------------------------------------

def masked_nll(params, cfg: qwen3.Qwen3Config, batch) -> tuple[jax.Array, jax.Array]:
    """(Σ -log p(target) over the loss-mask tokens, number of those tokens) of a `make_batch` batch.

    The shared prefix is run once (batch 1) into a KV cache that every row then attends to
    (`qwen3_kv_cache.forward_with_cache`): the same function of the tokens as `qwen3.forward` on the
    full sequences, at a fraction of the cost, since the prefix is most of each prompt.
    Gradients flow through the cache into the prefix computation. float32.
    """
    prefix, tokens = batch["prefix"], batch["tokens"]
    B, S = tokens.shape
    P0 = prefix.shape[0]
    cache = qwen3_kv_cache.init_cache(cfg, 1, P0 + S)
    cache_mask = jnp.zeros((1, P0 + S), bool)
    if P0:
        out = qwen3_kv_cache.forward_with_cache(params, cfg, prefix[None], jnp.arange(P0, dtype=jnp.int32)[None],
                                                jnp.ones((1, P0), bool), cache, cache_mask, 0)
        cache, cache_mask = out.cache, out.cache_mask
    cache = jax.tree.map(lambda x: jnp.broadcast_to(x, (x.shape[0], B) + x.shape[2:]), cache)
    cache_mask = jnp.broadcast_to(cache_mask, (B, P0 + S))
    logits = qwen3_kv_cache.forward_with_cache(params, cfg, tokens, batch["positions"], batch["segment_ids"] > 0,
                                               cache, cache_mask, P0).logits[:, :-1]
    lp = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), tokens[:, 1:, None], axis=-1)[..., 0]
    m = batch["loss_mask"] > 0
    return -jnp.sum(jnp.where(m, lp, 0.0)), jnp.sum(m.astype(jnp.float32))


def make_optimizer(s) -> optax.GradientTransformation:
    """Global-norm clip, then AdamW with a linear warm-up to `s.lr` and a constant rate after it
    (`s`: a `Settings`, or any settings with `lr`, `warmup_steps`, `weight_decay`, `max_grad_norm`)."""
    schedule = optax.join_schedules(
        [optax.linear_schedule(0.0, s.lr, max(s.warmup_steps, 1)), optax.constant_schedule(s.lr)],
        [max(s.warmup_steps, 1)])
    return optax.chain(optax.clip_by_global_norm(s.max_grad_norm),
                       optax.adamw(schedule, b1=0.9, b2=0.98, eps=1e-8, weight_decay=s.weight_decay))


def make_train_step(cfg: qwen3.Qwen3Config, opt: optax.GradientTransformation):
    """Jitted `(params, opt_state, batches) -> (params, opt_state, loss)`; `batches` is a tuple of
    batch dicts whose loss is the token mean over all of their loss-mask tokens."""

    def loss_fn(params, batches):
        total, count = 0.0, 0.0
        for b in batches:
            s, n = masked_nll(params, cfg, b)
            total, count = total + s, count + n
        return total / count

    @jax.jit
    def step(params, opt_state, batches):
        loss, grads = jax.value_and_grad(loss_fn)(params, batches)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def warm_start(cfg: qwen3.Qwen3Config, settings, next_batches, steps: int, log_every: int = 0) -> tuple[dict, list[float]]:
    """The supervised warm start shared by the embedded policies' build scripts.

    Args:
      cfg: the architecture; its params are initialized with `qwen3.init_params(cfg, settings.seed)`.
      settings: `seed` and the optimizer's hyper-parameters (`make_optimizer`).
      next_batches: `() -> tuple of make_batch batches`, the next step's batches (their loss is the
        token mean over all of them, `make_train_step`).
      steps: optimizer steps.
      log_every: print the mean loss every this many steps (0 = silent).
    Returns:
      `(params, losses)`: fp32 params in the `qwen3` layout (host), the loss of every step.
    """
    opt = make_optimizer(settings)
    with jax.default_matmul_precision("highest"):
        params = qwen3.init_params(cfg, seed=settings.seed)
        opt_state = opt.init(params)
        step_fn = make_train_step(cfg, opt)
        losses: list[float] = []
        t0 = time.perf_counter()
        for i in range(steps):
            params, opt_state, loss = step_fn(params, opt_state, next_batches())
            losses.append(float(loss))
            if log_every and (i + 1) % log_every == 0:
                print(f"step {i + 1:4d}  loss {np.mean(losses[-log_every:]):.4f}  "
                      f"{time.perf_counter() - t0:6.1f}s", flush=True)
    return jax.device_get(params), losses


def train(settings: Settings = Settings(), steps: Optional[int] = None, log_every: int = 0) -> tuple[dict, list[float]]:
    """Runs the warm start; returns `(params, losses)` (fp32 params in the `qwen3` layout).

    Args:
      settings: hyper-parameters (`Settings()` builds the shipped policy).
      steps: overrides `settings.steps` (tests run a few steps).
      log_every: print the mean loss every this many steps (0 = silent).
    """
    chat = ChatTemplate.from_pretrained(DEFAULT_POLICY_DIR, enable_thinking=False)
    rng = np.random.default_rng(settings.seed)
    arith = ExampleStream(chat, get_task_suite("arithmetic").dataset("train"), arithmetic_example, rng)
    calc = ExampleStream(chat, get_task_suite("calculator").dataset("train"), calculator_example, rng)
    arith_prefix, calc_prefix = task_prefix(chat, "arithmetic"), task_prefix(chat, "calculator")

    def next_batches():
        batches = (make_batch(arith.take(settings.batch_size), ARITH_LEN, arith_prefix),)
        if settings.calculator_batch_size:
            batches += (make_batch(calc.take(settings.calculator_batch_size), CALC_LEN, calc_prefix),)
        return batches

    return warm_start(MODEL, settings, next_batches, settings.steps if steps is None else steps, log_every)


# ---- writing / checking -------------------------------------------------------------------------

def write_weights(params: dict, cfg: qwen3.Qwen3Config, out_dir: str, generation: dict,
                  tokenizer_dir: Optional[str] = None) -> list[str]:
    """Writes `config.json`, `model.safetensors` (float32, mode 0644) and `generation_config.json`
    (`generation`) to `out_dir`; with `tokenizer_dir` also copies its tokenizer files. Returns the
    written file names."""
    written = hf_io.save_hf_checkpoint(params, cfg, out_dir, dtype="float32", tokenizer_dir=tokenizer_dir)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(generation, f, indent=2)
        f.write("\n")
    os.chmod(os.path.join(out_dir, hf_io.SAFE_SINGLE), 0o644)
    return list(dict.fromkeys(written + ["generation_config.json"]))


def write_policy(params: dict, out_dir: str, with_tokenizer: bool = False) -> list[str]:
    """Writes `config.json`, `model.safetensors` (float32) and `generation_config.json` to
    `out_dir`; with `with_tokenizer` also copies the tokenizer files of `DEFAULT_POLICY_DIR`.
    Returns the written file names."""
    return write_weights(params, MODEL, out_dir, GENERATION_CONFIG, DEFAULT_POLICY_DIR if with_tokenizer else None)


def file_sha256(path: str) -> str:
    """Hex sha256 of a file's bytes."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def logits_on(policy_dir: str, examples: Sequence[tuple[list[int], list[int]]], length: int) -> np.ndarray:
    """float32 logits `[len(examples), length, V]` of the policy in `policy_dir` on `examples`
    (`make_batch` rows, no prefix; jaxrl forward at full matmul precision)."""
    batch = make_batch(examples, length)
    cfg, params = hf_io.load_hf_checkpoint(policy_dir, dtype="float32", remat="none")
    with jax.default_matmul_precision("highest"):
        logits = qwen3.forward(params, cfg, batch["tokens"], batch["positions"], batch["segment_ids"])
    return np.asarray(logits)


def reference_logits(policy_dir: str) -> np.ndarray:
    """float32 logits `[4, 64, 512]` of a policy on four fixed held-out prompts + answers (jaxrl forward)."""
    chat = ChatTemplate.from_pretrained(DEFAULT_POLICY_DIR)
    tasks = get_task_suite("arithmetic").dataset("eval", num=4)
    return logits_on(policy_dir, [arithmetic_example(chat, t) for t in tasks], 64)


def compare_built(built_dir: str, policy_dir: str, same_files: Sequence[str], reference_logits_fn,
                  stop_on_file_difference: bool = False) -> bool:
    """Whether the policy rebuilt in `built_dir` reproduces `policy_dir` (prints each finding).

    Equal when the files `same_files` are identical and either the model.safetensors bytes are
    identical or `reference_logits_fn(dir)` of the two agree to `CHECK_ATOL`. With
    `stop_on_file_difference`, the logits are not compared once a file differs.
    """
    ok = True
    for fn in same_files:
        a, b = os.path.join(built_dir, fn), os.path.join(policy_dir, fn)
        if not (os.path.isfile(a) and os.path.isfile(b) and file_sha256(a) == file_sha256(b)):
            print(f"DIFFERENT: {fn}")
            ok = False
    new_hash = file_sha256(os.path.join(built_dir, "model.safetensors"))
    old_hash = file_sha256(os.path.join(policy_dir, "model.safetensors"))
    print(f"model.safetensors sha256 shipped {old_hash[:16]}  rebuilt {new_hash[:16]}")
    if new_hash != old_hash and (ok or not stop_on_file_difference):
        diff = float(np.max(np.abs(reference_logits_fn(built_dir) - reference_logits_fn(policy_dir))))
        print(f"weights differ in bytes; max |logit difference| = {diff:.3g} (tolerance {CHECK_ATOL})")
        ok = ok and diff <= CHECK_ATOL
    return ok


def check(settings: Settings, policy_dir: str = DEFAULT_POLICY_DIR) -> bool:
    """Retrains into a temporary folder and compares with `policy_dir`; prints and returns the verdict.

    Equal when the config files are identical and either the safetensors bytes are identical or
    the logits on fixed prompts agree to `CHECK_ATOL`.
    """
    with tempfile.TemporaryDirectory() as tmp:
        params, _ = train(settings)
        write_policy(params, tmp)
        ok = compare_built(tmp, policy_dir, ("config.json", "generation_config.json"), reference_logits)
    print("OK: the shipped policy is reproduced" if ok else "FAILED: the shipped policy is not reproduced")
    return ok


# ---- evaluation ---------------------------------------------------------------------------------

@dataclasses.dataclass
class EvalResult:
    """Success rates on `num_prompts` held-out prompts.

    greedy: fraction of prompts whose greedy answer gets reward 1.
    sampled_mean: mean reward-1 rate of `n` temperature-1 samples per prompt.
    pass_at_n: fraction of prompts with at least one reward-1 sample among the `n`.
    well_formed: fraction of temperature-1 samples with exactly one `<answer>` block that
      ended on a stop token.
    """

    task: str
    num_prompts: int
    n: int
    greedy: float
    sampled_mean: float
    pass_at_n: float
    well_formed: float

    def line(self) -> str:
        return (f"{self.task}: {self.num_prompts} held-out prompts  greedy {100 * self.greedy:.1f}%  "
                f"temperature-1 mean {100 * self.sampled_mean:.1f}%  pass@{self.n} {100 * self.pass_at_n:.1f}%  "
                f"well-formed samples {100 * self.well_formed:.1f}%")


def evaluate(policy_dir: str = DEFAULT_POLICY_DIR, task: str = "arithmetic", num_prompts: int = 200, n: int = 8,
             seed: int = 0, params: Optional[dict] = None) -> EvalResult:
    """Scores the policy through the RL rollout path (`run_rollouts` + the JAX `Sampler`).

    Held-out prompts are `get_task_suite(task).dataset("eval", num=num_prompts, seed=seed)`;
    limits are those of the CPU recipe (16 new tokens per turn for `arithmetic`; 3 turns of 64
    for `calculator`). `params` overrides the weights in `policy_dir` (same architecture).
    """
    from jaxrl.envs.base import RolloutConfig, run_rollouts
    from jaxrl.envs.rewards import ANSWER_RE
    from jaxrl.rollout.sampler import Sampler
    from jaxrl.rollout.types import SamplingParams

    cfg, loaded = hf_io.load_hf_checkpoint(policy_dir, dtype="float32", remat="none")
    chat = ChatTemplate(load_tokenizer(policy_dir), enable_thinking=False)
    sampler = Sampler(loaded if params is None else params, cfg, max_seq_len=512, max_batch_rows=256,
                      eos_token_ids=chat.stop_token_ids)
    tasks = get_task_suite(task).dataset("eval", num=num_prompts, seed=seed)
    if task == "calculator":
        rc = dict(max_turns=3, max_tokens_per_turn=64, max_seq_len=512)
    else:
        rc = dict(max_turns=1, max_tokens_per_turn=16, max_seq_len=512)
    with jax.default_matmul_precision("highest"):
        greedy = run_rollouts(sampler, chat, tasks, SamplingParams(greedy=True, seed=seed), RolloutConfig(**rc))
        sampled = run_rollouts(sampler, chat, tasks, SamplingParams(temperature=1.0, seed=seed),
                               RolloutConfig(n_samples_per_prompt=n, **rc))
    g = np.array([t.reward == 1.0 for t in greedy])
    s = np.array([t.reward == 1.0 for t in sampled]).reshape(num_prompts, n)
    formed = [t.stop_reason == "stop" and len(ANSWER_RE.findall(chat.decode(t.response_ids))) == 1
              for t in sampled]
    return EvalResult(task, num_prompts, n, float(g.mean()), float(s.mean()), float(s.any(axis=1).mean()),
                      float(np.mean(formed)))


# ---- command line -------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=DEFAULT_POLICY_DIR, help="output folder (default: the embedded policy)")
    ap.add_argument("--seed", type=int, default=Settings.seed)
    ap.add_argument("--steps", type=int, default=Settings.steps)
    ap.add_argument("--check", action="store_true", help="retrain into a temp dir and compare with --out")
    ap.add_argument("--eval", action="store_true", help="print success rates of the policy in --out")
    ap.add_argument("--eval-tasks", default="arithmetic,calculator", help="tasks scored by --eval")
    args = ap.parse_args(argv)
    settings = Settings(seed=args.seed, steps=args.steps)
    if args.check:
        return 0 if check(settings, args.out) else 1
    if args.eval:
        for task in args.eval_tasks.split(","):
            print(evaluate(args.out, task).line(), flush=True)
        return 0
    t0 = time.perf_counter()
    params, losses = train(settings, log_every=25)
    os.makedirs(args.out, exist_ok=True)
    files = write_policy(params, args.out, with_tokenizer=os.path.abspath(args.out) != os.path.abspath(DEFAULT_POLICY_DIR))
    print(f"trained {settings.steps} steps in {time.perf_counter() - t0:.1f}s, final loss {np.mean(losses[-10:]):.4f}")
    print(f"wrote {', '.join(files)} to {args.out}; model.safetensors sha256 "
          f"{file_sha256(os.path.join(args.out, 'model.safetensors'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
