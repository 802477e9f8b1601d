"""Unit tests of a step's run-log metrics (jaxrl/train/step_stats.py) and the held-out score
(jaxrl/train/evaluation.py): success thresholds and the excluded-trajectory accounting (issue 9
§3, §7). Expected values are worked out by hand in each test."""
import types

import numpy as np
import pytest

from jaxrl.envs import Trajectory
from jaxrl.train import evaluation
from jaxrl.train.step_stats import batch_metrics


def _cfg(n: int, success_threshold: float = 1.0):
    return types.SimpleNamespace(
        generator=types.SimpleNamespace(n_samples_per_prompt=n),
        trainer=types.SimpleNamespace(success_threshold=success_threshold, logprob_diff_warn_threshold=0.0),
        model=types.SimpleNamespace(compute_dtype="float32"))


def _traj(reward=0.0, stop_reason="stop", group_id=0, **info):
    return Trajectory(prompt_ids=np.array([1, 2], np.int32), response_ids=np.array([3], np.int32),
                      loss_mask=np.array([1], np.int32), rollout_logprobs=np.array([-0.5], np.float32),
                      reward=float(reward), stop_reason=stop_reason, group_id=group_id, policy_version=0,
                      num_turns=1, info=dict(info))


def _metrics(c, rewards, trajs=None, step=7, is_main=True):
    rewards = np.asarray(rewards, np.float32)
    n = len(rewards)
    excluded = np.array([t.stop_reason in ("env_error", "invalid_output") for t in trajs or []] or [False] * n)
    batch = {"loss_mask": np.where(excluded[:, None], 0, np.ones((n, 3), np.int32)), "is_truncated": np.zeros(n, bool),
             "tokens": np.zeros((n, 4), np.int32), "sequence_mask": ~excluded}
    return batch_metrics(c, step, trajs, rewards, np.zeros(n, np.float32), batch, [(0.0, 1.0, 0.0)], is_main)


def test_partial_credit_below_the_success_threshold_is_a_failure(capsys):
    """Issue 9 §7: one `trainer.success_threshold` for pass@n, success_rate and eval; a partial
    reward below it is a failure, not a success."""
    rewards = [0.5, 0.9, 0.0, 0.2,     # group 0: partial credit only
               1.0, 0.0, 0.0, 0.0,     # group 1: one full success
               0.99, 0.999, 0.3, 0.0]  # group 2: close, still below 1
    trajs = [_traj(r, group_id=i // 4) for i, r in enumerate(rewards)]
    m = _metrics(_cfg(4), rewards, trajs)
    assert m["reward/avg_pass_at_4"] == pytest.approx(1 / 3)  # only group 1 passes
    assert m["reward/success_rate"] == pytest.approx(1 / 12)
    assert m["reward/avg_raw_reward"] == pytest.approx(sum(rewards) / 12, rel=1e-6)
    # At threshold 0.5, partial credit of 0.5 and above counts: groups 0, 1, 2 all pass; 5 rewards >= 0.5.
    m = _metrics(_cfg(4, 0.5), rewards, trajs)
    assert m["reward/avg_pass_at_4"] == pytest.approx(1.0)
    assert m["reward/success_rate"] == pytest.approx(5 / 12)
    assert capsys.readouterr().err == ""  # nothing excluded, no warning

    # The held-out score: one trajectory per prompt.
    held = [_traj(r) for r in (0.5, 1.0, 0.999, 0.0, 1.0)]
    s = evaluation.score(held, 1.0)
    assert s["eval/success_rate"] == pytest.approx(2 / 5)
    assert s["eval/avg_reward"] == pytest.approx(3.499 / 5)
    assert evaluation.score(held, 0.5)["eval/success_rate"] == pytest.approx(4 / 5)


def test_excluded_trajectories_are_counted_and_named_in_one_line(capsys):
    """Issue 9 §3: `env_error` / `invalid_output` trajectories are counted per reason and the step
    prints one stderr line naming their task ids, groups, samples and what went wrong."""
    trajs = [_traj(1.0, "stop", 0, task_id="t0", sample_index=0),
             _traj(0.0, "env_error", 0, task_id="t0", sample_index=1, error="sandbox  died\n  badly"),
             _traj(0.0, "invalid_output", 1, task_id="t1", sample_index=0, invalid_output="NaN logprob at token 3"),
             _traj(0.0, "length", 1, task_id="t1", sample_index=1, truncated_by="max_seq_len"),
             _traj(0.0, "env_error", 2, sample_index=0),  # no task id, no detail
             _traj(0.5, "max_turns", 2, task_id="t2", sample_index=1)]
    m = _metrics(_cfg(2), [t.reward for t in trajs], trajs, step=7)
    assert m["generate/num_excluded_env_error"] == 2
    assert m["generate/num_excluded_invalid_output"] == 1
    err = capsys.readouterr().err.splitlines()
    assert err == ["jaxrl: step 7: 3 of 6 trajectories excluded from the loss ("
                   "env_error task t0 group 0 sample 1: sandbox died badly; "
                   "invalid_output task t1 group 1 sample 0: NaN logprob at token 3; "
                   "env_error task ? group 2 sample 0: no detail recorded)"]

    # More than 4: the first 4 are named, the rest counted.
    many = [_traj(0.0, "invalid_output", i // 2, task_id=f"t{i}", sample_index=i % 2, invalid_output="oov id")
            for i in range(6)]
    m = _metrics(_cfg(2), [0.0] * 6, many, step=3)
    assert (m["generate/num_excluded_env_error"], m["generate/num_excluded_invalid_output"]) == (0, 6)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("jaxrl: step 3: 6 of 6 trajectories excluded from the loss (invalid_output task t0 ")
    assert line.count("invalid_output task") == 4 and "task t4" not in line
    assert line.endswith("; ... 2 more in trial_stats.csv)")

    # Nothing excluded: zero counts, no line; other processes (trajs None) neither count nor print.
    m = _metrics(_cfg(2), [1.0, 0.0], [_traj(1.0), _traj(0.0, "length")])
    assert (m["generate/num_excluded_env_error"], m["generate/num_excluded_invalid_output"]) == (0, 0)
    m = _metrics(_cfg(2), [1.0, 0.0], None, is_main=False)
    assert not any(k.startswith("generate/num_excluded") for k in m)
    assert capsys.readouterr().err == ""


def test_batch_metrics_do_not_count_excluded_trajectories():
    """Issue 25 §2: an excluded trajectory (env_error / invalid_output, not trained on) has reward,
    advantage and tokens as 0 placeholders; the step's means count only the trained ones.
    Group 0: [1.0, env_error]; group 1: [0.5, 0.0]; group 2: both env_error (no pass@2 evidence)."""
    trajs = [_traj(1.0, "stop", 0), _traj(0.0, "env_error", 0), _traj(0.5, "stop", 1), _traj(0.0, "length", 1),
             _traj(0.0, "env_error", 2), _traj(0.0, "invalid_output", 2)]
    rewards = np.array([t.reward for t in trajs], np.float32)
    excluded = np.array([False, True, False, False, True, True])
    lengths = np.array([3, 0, 2, 4, 0, 0])
    batch = {"loss_mask": (np.arange(5)[None] < lengths[:, None]).astype(np.int32),
             "is_truncated": np.array([False, False, False, True, False, False]),
             "tokens": np.zeros((6, 6), np.int32), "sequence_mask": ~excluded}
    adv = np.array([0.5, 0.0, 0.25, -0.25, 0.0, 0.0], np.float32)
    m = batch_metrics(_cfg(2), 3, trajs, rewards, adv, batch, [(0.0, 1.0, 0.0)], True)
    assert m["reward/avg_raw_reward"] == pytest.approx(1.5 / 3)          # main: 1.5 / 6
    assert m["reward/success_rate"] == pytest.approx(1 / 3)              # main: 1 / 6
    assert m["reward/avg_pass_at_2"] == pytest.approx(1 / 2)             # groups 0, 1 (main: 1 / 3)
    assert m["loss/avg_raw_advantages_abs"] == pytest.approx(1.0 / 3)    # main: 1.0 / 6
    assert m["generate/avg_num_tokens"] == pytest.approx(9 / 3)          # main: 9 / 6
    assert m["generate/min_num_tokens"] == 2                             # main: 0
    assert m["generate/truncated_ratio"] == pytest.approx(1 / 3)         # main: 1 / 6


def test_heldout_score_skips_excluded_trajectories_and_gives_its_standard_error():
    """Issue 25 §2/§6: an env_error held-out trajectory is not scored (main counted it a failure),
    and the success rate comes with its binomial standard error sqrt(p(1 − p)/n), by hand:
    3 of 4 scored -> p = 0.75, SE = sqrt(0.75·0.25/4) = 0.2165."""
    held = [_traj(1.0), _traj(1.0), _traj(0.0), _traj(1.0), _traj(0.0, "env_error")]
    s = evaluation.score(held, 1.0)
    assert s["eval/success_rate"] == pytest.approx(0.75)
    assert s["eval/success_rate_stderr"] == pytest.approx((0.75 * 0.25 / 4) ** 0.5)
    assert s["eval/num_excluded"] == 1
    assert s["eval/avg_reward"] == pytest.approx(0.75)


def test_report_states_the_spread_and_explains_the_lr_scale():
    """Issue 25 §6: report.md printed "lr 0.0001 (scale now 1)" unexplained, and a held-out number
    without its spread. n = 200, p = 0.36: SE = sqrt(0.36·0.64/200) = 3.4%."""
    from jaxrl.config import base_config
    from jaxrl.train.report import eval_line, report_text, summary_text
    from jaxrl.train.rundir import TrainerState

    c = base_config()
    summary = {"heldout": "200 tasks, temperature 0.7", "eval_n": 200, "initial_eval": 0.26, "best_eval": 0.36,
               "final_eval": 0.345, "best_step": 40, "best_ema": 0.3, "last_step": 60, "wall_s": 60.0}
    line = eval_line(c, summary)
    assert "start 26.0% ± 3.1% -> best-EMA checkpoint (step 40) 36.0% ± 3.4%; final step (60) 34.5% ± 3.4%" in line
    assert "36.0% ± 3.4%" in summary_text(summary, "runs/x")
    state = TrainerState()
    text = report_text(c, summary, [], state, False)
    assert "scale now" not in text and "(never lowered: no reward-collapse rollback)" in text
    state.lr_scale, state.rollbacks = 0.5, 1
    assert "(x0.5 now: 1 reward-collapse rollback, each x trainer.collapse.lr_factor)" in report_text(
        c, summary, [], state, False)


def test_eval_episodes_per_prompt_is_read_from_its_key_everywhere():
    """The report's ± counted held-out episodes through an older key name (`n_samples`), so a sampled
    evaluation of 2 episodes per prompt (configs/terminal.py) reported the spread of half as many
    episodes. Greedy evaluations roll each prompt out once whatever the key says."""
    from ml_collections import ConfigDict

    from jaxrl.train.trainer import Trainer

    def cfg(greedy, k):
        return ConfigDict({"generator": {"eval_sampling_params": {"greedy": greedy, "episodes_per_prompt": k}},
                           "data": {"num_eval_prompts": 3}})

    assert evaluation.episodes_per_prompt(cfg(False, 2)) == 2
    assert evaluation.episodes_per_prompt(cfg(True, 2)) == 1
    fake = types.SimpleNamespace(prompts=types.SimpleNamespace(eval_batch=lambda: ["a", "b", "c"]))
    assert Trainer._eval_episodes(fake, cfg(False, 2)) == 6   # main: 3 (it read `n_samples`)
    assert Trainer._eval_episodes(fake, cfg(True, 2)) == 3
