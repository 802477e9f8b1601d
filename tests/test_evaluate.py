"""A short run on a user's JSONL file: held-out success from a seeded share of the file, the
end-of-run console summary, report.md's start / best / final numbers, and `python -m
jaxrl.evaluate` reproducing the report's numbers for best/, a published version and the starting
model. Also the held-out sets of PromptSource (eval file, eval task, fraction)."""
import csv
import json
import os
import re
import subprocess
import sys

import pytest

from jaxrl.config import ConfigError, base_config, validate
from jaxrl.envs import DEFAULT_POLICY_DIR, ChatTemplate, get_task_suite
from jaxrl.envs.splits import prompt_key
from jaxrl.train.prompts import PromptSource

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**{k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAXRL_KILL_AT")}, "JAX_PLATFORMS": "cpu",
       "TOKENIZERS_PARALLELISM": "false"}
# test_trainer's `RUN` shape and objective (KL loss, 2 epochs), so the run loads its compiled programs
# from the session's compile cache (tests/conftest.py).
SMALL = ["--config.trainer.train_batch_size=8", "--config.trainer.mini_batch_size=4",
         "--config.trainer.micro_batch_size=16", "--config.trainer.eval_interval=0", "--config.trainer.num_steps=2",
         "--config.trainer.algorithm.kl_loss_coef=0.01", "--config.trainer.update_epochs_per_batch=2"]


def _write_dataset(path, n=160):
    """Arithmetic problems as JSONL rows (system instruction + question, answer-tag reward)."""
    with open(path, "w") as f:
        for t in get_task_suite("arithmetic").dataset("train", num=n, seed=3):
            f.write(json.dumps({"id": t.task_id, "messages": t.messages, "reward_spec": t.reward_spec}) + "\n")


def _run(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("evaluate")
    data = tmp / "problems.jsonl"
    _write_dataset(data)
    wd = tmp / "run"
    # keep_thinking (issue 23): the rollouts are the same (no prompt holds a past assistant turn), and
    # the export carries the template that keeps past <think> blocks (checked below).
    overrides = ["--config.data.task=dataset", f"--config.data.dataset_path={data}", "--config.data.eval_fraction=0.1",
                 "--config.generator.chat_template=keep_thinking", *SMALL]
    out = _run("jaxrl.main", "--config=configs/rloo.py", f"--workdir={wd}", *overrides)
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(wd=str(wd), out=out, overrides=overrides, data=str(data),
                summary=json.load(open(wd / "summary.json")))


def _pct(x, n=None):
    """As the report prints a held-out rate: with n prompts, ± one binomial standard error, by hand."""
    return f"{100 * x:.1f}%" + (f" ± {100 * (x * (1 - x) / n) ** 0.5:.1f}%" if n else "")


def test_dataset_run_reports_start_best_and_final_held_out_success(run):
    s, wd = run["summary"], run["wd"]
    rows = list(csv.DictReader(open(os.path.join(wd, "metrics.csv"))))
    evals = {int(r["step"]): float(r["eval/success_rate"]) for r in rows if r.get("eval/success_rate")}
    # 10% of the file's 160 distinct prompts are held out (16: the held-out batch of test_trainer's
    # runs, so its evaluation program is compiled once); the start and the final step are the
    # evaluations logged at steps 0 and 2.
    assert s["heldout"] == "16 prompts of 10% of data.dataset_path held out (split seed 0), greedy, success = reward >= 1"
    assert s["initial_eval"] == evals[0] and s["final_eval"] == evals[2] and s["best_eval"] is not None
    report = open(os.path.join(wd, "report.md")).read()
    n = s["eval_n"]
    assert n == 16
    assert (f"- held-out success ({s['heldout']}): start {_pct(s['initial_eval'], n)} -> best-EMA checkpoint (step "
            f"{s['best_step']}) {_pct(s['best_eval'], n)}; final step (2) {_pct(s['final_eval'], n)}") in report
    # The console summary: a few lines on stdout after the run.
    out = run["out"].stdout
    assert f"jaxrl: run finished: {wd}" in out
    assert (f"held-out success: start {_pct(s['initial_eval'], n)}, best-EMA {_pct(s['best_eval'], n)}, final step "
            f"{_pct(s['final_eval'], n)}") in out
    assert f"best step by reward EMA: {s['best_step']}" in out and re.search(r"steps: 2 in [\d.]+ min", out)
    assert f"report: {os.path.join(wd, 'report.md')}" in out and f"python -m jaxrl.chat --model {wd}/best" in out
    # No held-out prompt was trained on.
    trained = {r["task_id"] for r in csv.DictReader(open(os.path.join(wd, "trial_stats.csv")))}
    c = base_config()
    c.data.task, c.data.dataset_path, c.data.eval_fraction = "dataset", run["data"], 0.1
    heldout = {t.task_id for t in PromptSource(c).eval_batch()}
    assert len(heldout) == 16 and trained and not trained & heldout


def test_evaluate_reproduces_the_reports_numbers(run, tmp_path):
    wd, s = run["wd"], run["summary"]
    best = _run("jaxrl.evaluate", f"--model={wd}/best", f"--output={tmp_path}/best.json")
    assert best.returncode == 0, best.stderr[-3000:]
    assert f"held-out success: {_pct(s['best_eval'], 16)} (" in best.stdout
    r = json.load(open(tmp_path / "best.json"))
    assert r["success_rate"] == s["best_eval"] and r["num_prompts"] == 16
    # The success rule, checked here: the answer tag holds the task's result.
    for item in r["results"]:
        a, op, b = re.fullmatch(r"arithmetic/(\d+)([-+*])(\d+)", item["task_id"]).groups()
        value = int(a) + int(b) if op == "+" else int(a) - int(b)
        assert item["reward"] == float(f"<answer>{value}</answer>" in item["response"]), item
    assert r["num_successes"] == sum(item["reward"] >= 1 for item in r["results"])
    # In-process (one compile for both): the last published version is the best checkpoint
    # (republished for its evaluation); the starting model under the run's recipe gives the start.
    from jaxrl import evaluate, policy

    c = policy.read_run_config(os.path.join(wd, "rl_config.json"))
    last = max(int(v) for v in os.listdir(os.path.join(wd, "sync")) if os.path.isfile(
        os.path.join(wd, "sync", v, "sync.json")))
    assert evaluate.evaluate_policy(os.path.join(wd, "sync", str(last)), c)["success_rate"] == s["best_eval"]
    # The best step's training checkpoint (Orbax state, float32 params) read directly.
    assert evaluate.evaluate_policy(os.path.join(wd, "checkpoints", str(s["best_step"])), c)["success_rate"] == \
        s["best_eval"]
    assert evaluate.evaluate_policy(DEFAULT_POLICY_DIR, c)["success_rate"] == s["initial_eval"]


def test_evaluate_overrides_apply_to_the_run_config_next_to_the_model(run, tmp_path):
    """`--config.KEY=...` without `--config=` was absl's "Unknown command line flag"; now it
    changes the run config next to --model, with the same checks as a recipe's overrides."""
    wd = run["wd"]
    out = _run("jaxrl.evaluate", f"--model={wd}/best", "--config.data.num_eval_prompts=4",
               f"--output={tmp_path}/four.json")
    assert out.returncode == 0, out.stderr[-3000:]
    assert (f"on the held-out set of {wd}/best/rl_config.json with --config.data.num_eval_prompts=4: 4 prompts "
            "of 10% of data.dataset_path") in out.stdout, out.stdout
    assert json.load(open(tmp_path / "four.json"))["num_prompts"] == 4
    # A recipe given as `--config RECIPE` (a space, not "=") is named in the header (it said "--config").
    out = _run("jaxrl.evaluate", f"--model={wd}/best", "--config", "configs/rloo.py", "--config.data.num_eval_prompts=2")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "on the held-out set of configs/rloo.py: 2 prompts" in out.stdout, out.stdout
    bad = _run("jaxrl.evaluate", f"--model={wd}/best", "--config.data.num_eval_promts=4", timeout=120)
    assert bad.returncode == 2 and bad.stderr == (
        "error: unknown config key `data.num_eval_promts` (in --config.data.num_eval_promts=4); did you mean "
        f"`data.num_eval_prompts`? List the keys with: python -m jaxrl.config show {wd}/best/rl_config.json\n")


def test_exported_best_prompts_like_training_in_transformers(run):
    from transformers import AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(os.path.join(run["wd"], "best"))
    task = get_task_suite("arithmetic").dataset("eval", num=1, seed=0)[0]
    want = ChatTemplate.from_pretrained(DEFAULT_POLICY_DIR, enable_thinking=False).encode_prompt(task.messages)
    got = tok.apply_chat_template([task.messages[-1]], add_generation_prompt=True)
    assert list(got["input_ids"] if hasattr(got, "keys") else got) == want
    gen = GenerationConfig.from_pretrained(os.path.join(run["wd"], "best"))
    assert gen.do_sample is False and gen.max_new_tokens == 16
    # The run rendered with generator.chat_template=keep_thinking, so the export does too: a past
    # assistant turn keeps its reasoning in transformers' rendering, as in jaxrl's (the stock Qwen3
    # template drops it), and the training prompt defaults stay baked in.
    history = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "C", "reasoning_content": "R"},
               {"role": "user", "content": "u"}]
    text = tok.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>assistant\n<think>\nR\n</think>\n\nC<|im_end|>" in text
    keep = ChatTemplate.from_pretrained(DEFAULT_POLICY_DIR, enable_thinking=False, chat_template="keep_thinking")
    system = [{"role": "system", "content": task.messages[0]["content"]}]
    got = tok.apply_chat_template(history, add_generation_prompt=True)
    assert list(got["input_ids"] if hasattr(got, "keys") else got) == keep.encode_prompt(system + history)
    stock = ChatTemplate.from_pretrained(DEFAULT_POLICY_DIR, enable_thinking=False).render(history)
    assert "R" not in stock


def test_damaged_or_misnamed_policies_are_one_line_errors(run, tmp_path, capsys):
    """Regression (fresh-user review): a damaged published version was a 147-line Orbax
    traceback, a best/ without tokenizer.json evaluated to 0% without an error, and paths inside
    a run (its checkpoints/ folder, a step it did not keep, the run itself) got no hint of what
    the run holds."""
    import gc
    import shutil

    from jaxrl import policy

    wd = run["wd"]
    c = policy.read_run_config(os.path.join(wd, "rl_config.json"))
    versions = sorted(int(v) for v in os.listdir(os.path.join(wd, "sync")) if v.isdigit())
    steps = sorted(int(s) for s in os.listdir(os.path.join(wd, "checkpoints")) if s.isdigit())
    # A copy of the run with a damaged published version (one data file truncated) and one without params/.
    copy = tmp_path / "run"
    os.makedirs(copy / "sync")
    shutil.copy(os.path.join(wd, "rl_config.json"), copy)
    v = versions[-1]
    shutil.copytree(os.path.join(wd, "sync", str(v)), copy / "sync" / str(v))
    data = max((p for p in (copy / "sync" / str(v) / "params").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data.write_bytes(data.read_bytes()[:1000])
    shutil.copytree(copy / "sync" / str(v), copy / "sync" / str(v + 1))
    shutil.rmtree(copy / "sync" / str(v + 1) / "params")
    for version in (v, v + 1):
        model = str(copy / "sync" / str(version))
        with pytest.raises(policy.PolicyError) as e:
            policy.load_engine(model, c)
        gc.collect()
        msg = str(e.value)
        assert len(msg.splitlines()) == 1 and msg.startswith(f"--model {model!r}: published version {version} cannot "
                                                             "be read ("), msg
        assert "Fix: pass another version of WORKDIR/sync" in msg
        assert "Traceback" not in capsys.readouterr().err
    # best/ without tokenizer.json (tokenizer_config.json alone encodes text to nothing).
    best = tmp_path / "best"
    shutil.copytree(os.path.join(wd, "best"), best)
    os.remove(best / "tokenizer.json")
    with pytest.raises(policy.PolicyError, match=r"has no tokenizer files \(tokenizer.json, or vocab.json \+ "
                                                 r"merges.txt\).*Fix: copy the tokenizer files"):
        policy.load_engine(str(best), c)
    # Paths inside a run say what the run holds.
    on_disk = "steps on disk: " + ", ".join(map(str, steps))
    for model, hint in (
            (wd, "(a run directory: use its best/, sync/<version> or checkpoints/<step>)"),
            (os.path.join(wd, "checkpoints"), f"(a run's checkpoints/ folder: pass one of its entries; {on_disk})"),
            (os.path.join(wd, "checkpoints", "999"), f"(a training checkpoint 999 that does not exist; {on_disk})"),
            (os.path.join(wd, "sync"), "(a run's sync/ folder: pass one of its entries; versions on disk: " +
             ", ".join(map(str, versions)) + ")")):
        with pytest.raises(policy.PolicyError) as e:
            policy.check_policy_dir(model)
        assert hint in str(e.value) and len(str(e.value).splitlines()) == 1, str(e.value)


def test_evaluate_errors_are_one_line(tmp_path):
    out = _run("jaxrl.evaluate", f"--model={DEFAULT_POLICY_DIR}", timeout=120)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "no rl_config.json next to --model" in out.stderr and "--config=" in out.stderr
    assert _run("jaxrl.evaluate", "--help", timeout=120).returncode == 0


def _tasks_file(path, questions):
    with open(path, "w") as f:
        for q in questions:
            f.write(json.dumps({"id": q, "prompt": q, "reward_spec": {"type": "exact_match", "answer": "1"}}) + "\n")


def test_held_out_sets(tmp_path):
    train, held = tmp_path / "train.jsonl", tmp_path / "held.jsonl"
    _tasks_file(train, [f"q{i}" for i in range(30)])
    _tasks_file(held, [f"h{i}" for i in range(5)])
    c = base_config()
    c.data.task, c.data.dataset_path = "dataset", str(train)
    # An evaluation file: all of its rows (num_eval_prompts caps them), the training file untouched.
    c.data.eval_dataset_path = str(held)
    src = PromptSource(c)
    assert [t.task_id for t in src.eval_batch()] == [f"h{i}" for i in range(5)]
    assert len(src.training_tasks()) == 30
    c.data.num_eval_prompts = 3
    assert [t.task_id for t in PromptSource(c).eval_batch()] == ["h0", "h1", "h2"]
    assert src.overlap_warning() == ""
    _tasks_file(held, ["h0", "q1", "q2"])  # two held-out prompts the run also trains on
    assert PromptSource(c).overlap_warning().startswith(
        "jaxrl: warning: 2 of the 3 held-out prompts in data.eval_dataset_path")
    _tasks_file(held, [f"h{i}" for i in range(5)])
    # The default: 5% of the file's prompts (2 of 30, rounded up), never trained on.
    c.data.eval_dataset_path, c.data.num_eval_prompts = "", 200
    src = PromptSource(c)
    held_ids = {t.task_id for t in src.eval_batch()}
    assert len(held_ids) == 2 and not held_ids & {t.task_id for t in src.training_tasks()}
    served = {t.task_id for step in range(1, 20) for t in src.train_batch(step)}
    assert served == {f"q{i}" for i in range(30)} - held_ids
    assert {prompt_key(t) for t in src.eval_batch()} == {
        prompt_key(t) for t in PromptSource(c, load_train=False).eval_batch()}
    # None: no held-out set.
    c.data.eval_fraction = 0.0
    assert PromptSource(c).eval_batch() == [] and PromptSource(c).heldout_kind == ""
    # Two held-out sets, a missing file and a bad fraction are config errors.
    c.data.eval_dataset_path, c.data.eval_task = str(held), "arithmetic"
    with pytest.raises(ConfigError, match="keep one held-out set"):
        validate(c)
    c.data.eval_task, c.data.eval_dataset_path = "", str(tmp_path / "missing.jsonl")
    with pytest.raises(ConfigError, match="data.eval_dataset_path"):
        validate(c)
    c.data.eval_dataset_path, c.data.eval_fraction = "", 1.0
    with pytest.raises(ConfigError, match="data.eval_fraction"):
        validate(c)
