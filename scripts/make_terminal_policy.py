"""Builds the embedded terminal policy: `jaxrl/assets/terminal_policy/` (tokenizer and weights).

A small Qwen3 (`MODEL`) learns the Terminus-style agent loop (`jaxrl/envs/harbor/agent.py`, prompt
style "compact") on the `write-file` task family by a short, seeded supervised warm start on
ORACLE TRANSCRIPTS, with jaxrl's own model code, and is written as a Hugging Face checkpoint.

Tokenizer: a byte-level BPE (`VOCAB_SIZE` ids) with the Qwen2/Qwen3 pre-tokenizer, the Qwen3 special
tokens and the Qwen3 chat template of the default policy (scripts/make_default_tokenizer.py), trained
on the agent's texts: the prompts, JSON responses and terminal outputs of write-file and py-return
episodes, and the Terminus prompt.

Training data (train seeds only: `TRAIN_SEEDS` of write-file; the held-out seeds `HELD_OUT_SEEDS`
are never seen): each example is one whole episode exactly as the rollout loop assembles it
(`ChatTemplate.encode_prompt`, then `encode_observation` for the observation turn):

1. the prompt: one user message, `initial_prompt(instruction, "agent@sandbox:/app$ ", COMPACT)`;
2. the model's first turn: JSON with the oracle's keystrokes (`solution/transcript.json`) and
   `"task_complete": true`;
3. the observation: the confirmation prompt around "New Terminal Output:" with the shell's echo of
   the keystrokes and its next prompt (what the persistent shell prints for commands without
   output; tests/test_terminal_policy.py checks it against a real trial);
4. the model's second turn: `"task_complete": true` again, with no commands.

The loss is the next-token cross-entropy on the two assistant turns only (the rollout's
`loss_mask`), token mean over the step. The warm start is stopped early on purpose, so that the
policy solves some held-out tasks but not most at the recipe's sampling temperature 0.7 (held-out
success between 15% and 60%; `--eval` prints it, docs/terminal_tasks.md records it), and RL has room
to improve it.

    python scripts/make_terminal_policy.py            # builds jaxrl/assets/terminal_policy
    python scripts/make_terminal_policy.py --check    # rebuilds into a temp dir and compares
    python scripts/make_terminal_policy.py --eval     # held-out success through the real agent loop

Everything is seeded (`--seed`): the same seed on the same software stack gives the same bytes;
`--check` also accepts logits equal to `CHECK_ATOL` (another CPU's rounding order).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time
from typing import Optional, Sequence

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
for p in (REPO, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

import jax  # noqa: E402
import make_default_policy as mdp  # noqa: E402  (batching, the prefix-cached loss, the optimizer)
import make_default_tokenizer as mdt  # noqa: E402  (pre-tokenizer, added tokens, chat template)

from jaxrl.envs.chat import ChatTemplate, load_tokenizer  # noqa: E402
from jaxrl.envs.harbor.agent import COMPACT, INITIAL_SCREEN, initial_prompt  # noqa: E402
from jaxrl.envs.harbor.families import make_task  # noqa: E402
from jaxrl.models import hf_io, qwen3  # noqa: E402

TERMINAL_POLICY_DIR = os.path.join(REPO, "jaxrl", "assets", "terminal_policy")
FAMILY = "write-file"
TRAIN_SEEDS = range(0, 1600)
HELD_OUT_SEEDS = range(1600, 2000)
"""write-file has 2,000 distinct tasks (20 file names x 100 words); seeds 0-1599 train, 1600-1999 held out."""

VOCAB_SIZE = 1024
SEED = 0
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
WEIGHT_FILES = ("config.json", "model.safetensors", "generation_config.json")
CHECK_ATOL = mdp.CHECK_ATOL
EVAL_TEMPERATURE = 0.7  # configs/terminal.py samples (and evaluates) at the seed runs' temperature
ANALYSIS_1, PLAN_1 = "New task.", "Run the commands."
ANALYSIS_2, PLAN_2 = "Done.", "Confirm."


def model_config(vocab_size: int, eos_id: int) -> qwen3.Qwen3Config:
    """The architecture: 3 layers, hidden 128, 4 query / 2 KV heads of 32, tied embeddings, fp32."""
    return qwen3.Qwen3Config(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=384, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048,
        rope_theta=10_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=None, eos_token_id=eos_id,
        dtype="float32", remat="none")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Hyper-parameters of the warm start (the defaults build the shipped policy).

    Attributes:
      seed: seeds the init (`qwen3.init_params`) and the example order.
      steps: optimizer steps.
      batch_size: episodes per step.
      lr: peak AdamW learning rate (linear warm-up for `warmup_steps`, then constant).
      warmup_steps: warm-up length.
    """

    seed: int = SEED
    steps: int = 150
    batch_size: int = 32
    lr: float = 1e-3
    warmup_steps: int = 20
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0


# ---- episodes -----------------------------------------------------------------------------------

def response(commands: Sequence[dict], complete: bool, analysis: str, plan: str) -> str:
    """The JSON text of one model turn (the key order of the Terminus schema)."""
    return json.dumps({"analysis": analysis, "plan": plan,
                       "commands": [{"keystrokes": c["keystrokes"], "duration": c["duration"]} for c in commands],
                       "task_complete": complete})


def shell_echo(commands: Sequence[dict]) -> str:
    """What the persistent shell prints for commands that print nothing: each command echoed, then
    the prompt (jaxrl/envs/harbor/terminal.py)."""
    return "".join(c["keystrokes"] + INITIAL_SCREEN for c in commands)


def episode_messages(spec) -> tuple[list[dict], str, str, list[dict]]:
    """(prompt messages, first turn, second turn, observation messages) of the oracle episode of a
    `TaskSpec`, with the compact prompt style."""
    prompt = [{"role": "user", "content": initial_prompt(spec.instruction, INITIAL_SCREEN, COMPACT)}]
    turn1 = response(spec.transcript, True, ANALYSIS_1, PLAN_1)
    obs = [{"role": "user", "content": COMPACT.confirm.format(output=COMPACT.new_output.format(
        output=shell_echo(spec.transcript)))}]
    turn2 = response([], True, ANALYSIS_2, PLAN_2)
    return prompt, turn1, turn2, obs


def episode_example(chat: ChatTemplate, spec) -> tuple[list[int], list[int]]:
    """(token ids, loss flags) of the oracle episode of `spec`, assembled like `run_rollouts`:
    prompt, turn 1 + `<|im_end|>`, observation tokens, turn 2 + `<|im_end|>`; flags 1 on the turns."""
    prompt, turn1, turn2, obs = episode_messages(spec)
    p = chat.encode_prompt(prompt)
    t1 = chat.encode_text(turn1) + [chat.turn_end_id]
    o = chat.encode_observation(obs, chat.turn_end_id)
    t2 = chat.encode_text(turn2) + [chat.turn_end_id]
    return p + t1 + o + t2, [0] * len(p) + [1] * len(t1) + [0] * len(o) + [1] * len(t2)


# ---- tokenizer ----------------------------------------------------------------------------------


# jaxrl's earlier wording of a Terminus-style prompt, kept only as tokenizer training text so that the
# embedded policy's tokenizer rebuilds byte for byte (--check); no prompt uses it.
_TOKENIZER_PROMPT = """You are an AI assistant that solves command-line tasks in a Linux environment. You are given \
a task description and the output of the commands run so far, and you solve the task by sending batches of \
shell commands to a terminal.

Format your response as one JSON object with this structure:

{{
  "analysis": "What the current terminal output shows: what has been done and what remains to do.",
  "plan": "The next steps: which commands you will run and what each one should achieve.",
  "commands": [
    {{
      "keystrokes": "ls -la\\n",
      "duration": 0.1
    }},
    {{
      "keystrokes": "cd project\\n",
      "duration": 0.1
    }}
  ],
  "task_complete": true
}}

Required fields:
- "analysis": your reading of the current situation
- "plan": your plan for the next steps
- "commands": an array of commands to run (it may be empty)

Optional fields:
- "task_complete": true once the task is done (default false)

Each command has:
- "keystrokes": the exact text sent to the terminal; it is typed verbatim. End a command with a newline \
("\\n") to run it. Special keys use tmux names, such as "C-c" for Ctrl+C and "C-d" for Ctrl+D, given alone \
as the keystrokes.
- "duration": how many seconds to wait for the command before the next one is sent (default 1.0, at most \
60). Use short waits (0.1) for quick commands such as cd, ls, echo or cat, and longer ones for compilers, \
tests or downloads. Never wait longer than needed: an empty command ("keystrokes": "") with a duration just \
waits, and you can always wait again later.

The text inside "keystrokes" must be valid JSON string content: escape newlines as \\n and quotes as \\".

Task Description:
{instruction}

Current terminal state:
{terminal_state}
"""

def build_corpus(seed: int = SEED) -> list[str]:
    """Texts the BPE is trained on: rendered oracle episodes of write-file (train seeds) and py-return,
    the Terminus prompt, and the loop's feedback texts."""
    import jinja2

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(mdt.CHAT_TEMPLATE)
    rng = random.Random(seed)
    texts = [_TOKENIZER_PROMPT.format(instruction="Create the file /app/notes.txt containing the word apple.",
                                      terminal_state=INITIAL_SCREEN)] * 5
    texts += [COMPACT.parse_error.format(feedback="ERROR: No valid JSON object found in the response"),
              COMPACT.warnings.format(feedback="WARNINGS: - Extra text detected after JSON object", output="")] * 5
    specs = [make_task(FAMILY, s) for s in TRAIN_SEEDS] + [make_task("py-return", rng.randrange(16000))
                                                           for _ in range(400)]
    for spec in specs:
        prompt, turn1, turn2, obs = episode_messages(spec)
        messages = prompt + [{"role": "assistant", "content": turn1}] + obs + [{"role": "assistant", "content": turn2}]
        texts.append(template.render(messages=messages, add_generation_prompt=False, enable_thinking=False))
    return texts


def build_tokenizer(seed: int = SEED):
    """Trains the BPE and returns a `tokenizers.Tokenizer` with the Qwen3 added tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer

    tok = Tokenizer(BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
                        byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(mdt.PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    splitter = re.compile("|".join(re.escape(content) for content, _ in mdt.ADDED_TOKENS))
    corpus = [piece for text in build_corpus(seed) for piece in splitter.split(text) if piece]
    trainer = BpeTrainer(vocab_size=VOCAB_SIZE - len(mdt.ADDED_TOKENS), min_frequency=2, show_progress=False,
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(corpus, trainer=trainer)
    if tok.get_vocab_size() != VOCAB_SIZE - len(mdt.ADDED_TOKENS):
        raise RuntimeError(f"BPE trained to {tok.get_vocab_size()} ids, expected {VOCAB_SIZE - len(mdt.ADDED_TOKENS)}")
    for content, special in mdt.ADDED_TOKENS:
        token = AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special)
        (tok.add_special_tokens if special else tok.add_tokens)([token])
    return tok


def write_tokenizer(out_dir: str, seed: int = SEED) -> None:
    """Writes `tokenizer.json` and `tokenizer_config.json` (Qwen3 conventions) to `out_dir`."""
    os.makedirs(out_dir, exist_ok=True)
    tok = build_tokenizer(seed)
    tok.save(os.path.join(out_dir, "tokenizer.json"), pretty=True)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(mdt.tokenizer_config(tok), f, indent=2, ensure_ascii=False)
        f.write("\n")


# ---- training -----------------------------------------------------------------------------------

def train(tokenizer_dir: str, settings: Settings = Settings(), steps: Optional[int] = None,
          log_every: int = 0) -> tuple[dict, qwen3.Qwen3Config, list[float]]:
    """Runs the warm start (`make_default_policy.warm_start`) with the tokenizer in
    `tokenizer_dir`; returns (params, config, losses)."""
    chat = ChatTemplate(load_tokenizer(tokenizer_dir), enable_thinking=False)
    cfg = model_config(len(chat.tokenizer), chat.turn_end_id)
    rng = np.random.default_rng(settings.seed)
    stream = mdp.ExampleStream(chat, [make_task(FAMILY, s) for s in TRAIN_SEEDS], episode_example, rng)
    pair = [episode_example(chat, make_task(FAMILY, s))[0] for s in (0, 1)]
    prefix = mdp.common_prefix(pair)
    length = max(len(episode_example(chat, make_task(FAMILY, s))[0]) for s in TRAIN_SEEDS) - len(prefix)
    length = -(-length // 8) * 8
    params, losses = mdp.warm_start(cfg, settings, lambda: (mdp.make_batch(stream.take(settings.batch_size), length,
                                                                           prefix),),
                                    settings.steps if steps is None else steps, log_every)
    return params, cfg, losses


def write_policy(params: dict, cfg: qwen3.Qwen3Config, out_dir: str) -> list[str]:
    """Writes `config.json`, `model.safetensors` (float32) and `generation_config.json` to `out_dir`."""
    pad = load_tokenizer(out_dir).convert_tokens_to_ids("<|endoftext|>")
    return mdp.write_weights(params, cfg, out_dir, mdp.generation_config(cfg.eos_token_id, pad))


def build(out_dir: str, settings: Settings = Settings(), log_every: int = 0) -> dict:
    """Tokenizer, then weights, into `out_dir`; returns the final losses and timings."""
    t0 = time.perf_counter()
    write_tokenizer(out_dir, settings.seed)
    params, cfg, losses = train(out_dir, settings, log_every=log_every)
    files = write_policy(params, cfg, out_dir)
    return {"files": files, "loss": float(np.mean(losses[-10:])), "seconds": time.perf_counter() - t0}


def reference_logits(policy_dir: str) -> np.ndarray:
    """float32 logits of a policy on four held-out oracle episodes (jaxrl forward)."""
    chat = ChatTemplate(load_tokenizer(policy_dir), enable_thinking=False)
    examples = [episode_example(chat, make_task(FAMILY, s)) for s in HELD_OUT_SEEDS[:4]]
    return mdp.logits_on(policy_dir, examples, max(len(e[0]) for e in examples))


def check(settings: Settings, policy_dir: str = TERMINAL_POLICY_DIR) -> bool:
    """Rebuilds into a temporary folder and compares with `policy_dir`: tokenizer and config files
    identical, and the weights identical in bytes or in logits to `CHECK_ATOL`."""
    with tempfile.TemporaryDirectory() as tmp:
        build(tmp, settings)
        ok = mdp.compare_built(tmp, policy_dir, list(TOKENIZER_FILES) + ["config.json", "generation_config.json"],
                               reference_logits, stop_on_file_difference=True)
    print("OK: the shipped terminal policy is reproduced" if ok else "FAILED: the shipped policy is not reproduced")
    return ok


# ---- evaluation ---------------------------------------------------------------------------------

def evaluate(policy_dir: str = TERMINAL_POLICY_DIR, num_tasks: int = 200, n: int = 4, seed: int = 0,
             temperature: float = EVAL_TEMPERATURE, greedy: bool = True, max_turns: int = 4) -> dict:
    """Held-out success through the real agent loop: `run_rollouts` + the JAX `Sampler` + a sandboxed
    trial per episode (`TerminusEnv`, compact style), on the first `num_tasks` held-out write-file
    tasks, with the CPU recipe's limits (4 turns of at most 64 tokens).

    Returns `sampled_mean` (the success rate of `n` samples per task at `temperature`, what
    configs/terminal.py reports as held-out success), `pass_at_<n>`, the trial outcomes of the
    samples, and with `greedy` also the greedy success.
    """
    from jaxrl.envs.base import RolloutConfig, run_rollouts
    from jaxrl.envs.harbor import load_task_set
    from jaxrl.envs.harbor.agent import AgentConfig, TerminusEnvFactory, rollout_tasks
    from jaxrl.envs.harbor.families import generate_tasks
    from jaxrl.rollout.sampler import Sampler
    from jaxrl.rollout.types import SamplingParams

    cfg, params = hf_io.load_hf_checkpoint(policy_dir, dtype="float32", remat="none")
    chat = ChatTemplate(load_tokenizer(policy_dir), enable_thinking=False)
    out: dict = {"num_tasks": num_tasks, "temperature": temperature}
    with tempfile.TemporaryDirectory() as tmp:
        generate_tasks(FAMILY, list(HELD_OUT_SEEDS)[:num_tasks], tmp)
        tasks = rollout_tasks(load_task_set(tmp))
        sampler = Sampler(params, cfg, max_seq_len=512, max_batch_rows=256, eos_token_ids=chat.stop_token_ids)
        rc = dict(max_turns=max_turns, max_tokens_per_turn=64, max_seq_len=512, env_workers=64)
        make_env = TerminusEnvFactory(AgentConfig(prompt_style="compact"))
        with jax.default_matmul_precision("highest"):
            sampled = run_rollouts(sampler, chat, tasks, SamplingParams(temperature=temperature, seed=seed),
                                   RolloutConfig(n_samples_per_prompt=n, **rc), make_env=make_env)
            if greedy:
                g = run_rollouts(sampler, chat, tasks, SamplingParams(greedy=True, seed=seed), RolloutConfig(**rc),
                                 make_env=make_env)
                out["greedy"] = float(np.mean([t.reward == 1.0 for t in g]))
    s = np.array([t.reward == 1.0 for t in sampled]).reshape(len(tasks), n)
    outcomes: dict = {}
    for t in sampled:
        outcomes[t.info.get("outcome")] = outcomes.get(t.info.get("outcome"), 0) + 1
    out.update({"sampled_mean": float(s.mean()), f"pass_at_{n}": float(s.any(axis=1).mean()),
                "outcomes": outcomes})
    return out


# ---- command line -------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=TERMINAL_POLICY_DIR, help="output folder (default: the embedded terminal policy)")
    ap.add_argument("--seed", type=int, default=Settings.seed)
    ap.add_argument("--steps", type=int, default=Settings.steps)
    ap.add_argument("--check", action="store_true", help="rebuild into a temp dir and compare with --out")
    ap.add_argument("--eval", action="store_true", help="print the held-out success of the policy in --out")
    ap.add_argument("--num-tasks", type=int, default=200, help="held-out tasks scored by --eval")
    args = ap.parse_args(argv)
    settings = Settings(seed=args.seed, steps=args.steps)
    if args.check:
        return 0 if check(settings, args.out) else 1
    if args.eval:
        print(json.dumps(evaluate(args.out, num_tasks=args.num_tasks)), flush=True)
        return 0
    tmp = args.out.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    info = build(tmp, settings, log_every=25)
    shutil.rmtree(args.out, ignore_errors=True)
    os.replace(tmp, args.out)
    print(f"trained {settings.steps} steps in {info['seconds']:.1f}s, final loss {info['loss']:.4f}; wrote "
          f"{', '.join(list(TOKENIZER_FILES) + info['files'])} to {args.out}; model.safetensors sha256 "
          f"{mdp.file_sha256(os.path.join(args.out, 'model.safetensors'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
