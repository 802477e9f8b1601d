"""Run logs, reward EMA and the checkpoint store."""
import csv
import json
import math
import os

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl.train.checkpoint import CheckpointStore
from jaxrl.train.metrics import RewardEMA, RunLogger, plot_rewards


def test_reward_ema_matches_hand_computation_and_tracks_best_and_collapse():
    ema = RewardEMA(span=5)  # alpha = 1/3
    rewards = [0.3, 0.6, 0.9, 0.0, 0.0, 0.0]
    expected, e = [], None
    for r in rewards:
        e = r if e is None else r / 3 + 2 * e / 3
        expected.append(e)
    got = [ema.update(i, r, drop=0.2)[0] for i, r in enumerate(rewards)]
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    # EMA: 0.3, 0.4, 0.5667(best, step 2), 0.3778, 0.2519, 0.1679
    assert ema.best_step == 2 and math.isclose(ema.best_value, expected[2])
    # below best - 0.2 = 0.3667: steps 4 (0.2519) and 5 (0.1679); step 3 (0.3778) is not.
    assert ema.steps_below == 2
    restored = RewardEMA.from_state_dict(json.loads(json.dumps(ema.state_dict())))
    assert restored == ema
    with pytest.raises(ValueError, match="finite"):
        ema.update(6, float("nan"))


def test_run_logger_writes_files_and_resume_drops_later_rows(tmp_path):
    wd = str(tmp_path)
    log = RunLogger(wd, resume_step=None, use_tensorboard=True)
    for step in (1, 2, 3):
        log.log_step(step, {"reward/avg_raw_reward": step / 10, "reward/ema": step / 20})
        log.log_trials(step, [{"reward": 1.0, "group_id": 0, "response": "x"}, {"reward": 0.0, "group_id": 0, "response": "y"}])
    rows = list(csv.DictReader(open(os.path.join(wd, "metrics.csv"))))
    assert [int(r["step"]) for r in rows] == [1, 2, 3]
    assert float(rows[1]["reward/avg_raw_reward"]) == 0.2
    assert len(list(csv.DictReader(open(os.path.join(wd, "trial_stats.csv"))))) == 6
    assert sorted(os.listdir(os.path.join(wd, "rollouts"))) == ["step_000001.jsonl", "step_000002.jsonl", "step_000003.jsonl"]
    assert os.listdir(os.path.join(wd, "tensorboard"))
    log.close()
    # Resume from the checkpoint of step 1: steps 2 and 3 are gone from every log.
    log = RunLogger(wd, resume_step=1, use_tensorboard=False)
    assert [r["step"] for r in log.rows] == [1]
    assert [int(r["step"]) for r in csv.DictReader(open(os.path.join(wd, "trial_stats.csv")))] == [1, 1]
    assert os.listdir(os.path.join(wd, "rollouts")) == ["step_000001.jsonl"]
    lines = open(os.path.join(wd, "trainer_log.jsonl")).read().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1]
    path = plot_rewards(wd, log.rows, best_step=1)
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def _tensorboard_scalars(logdir: str, tag: str) -> dict[int, float]:
    """What TensorBoard shows for `tag`: event files read in name order (TFRecord framing: u64
    length, u32 crc, data, u32 crc), and TensorBoard's orphan purge applied (a SessionLog.START
    event at step S drops the events already read at steps >= S)."""
    import struct

    from tensorboardX.proto import event_pb2

    seen: dict[int, float] = {}
    for name in sorted(os.listdir(logdir)):
        data = open(os.path.join(logdir, name), "rb").read()
        pos = 0
        while pos < len(data):
            (n,) = struct.unpack("<Q", data[pos:pos + 8])
            ev = event_pb2.Event.FromString(data[pos + 12:pos + 12 + n])
            pos += 12 + n + 4
            if ev.HasField("session_log") and ev.session_log.status == event_pb2.SessionLog.START:
                seen = {k: v for k, v in seen.items() if k < ev.step}
            for v in ev.summary.value:
                if v.tag == tag:
                    seen[ev.step] = v.simple_value
    return seen


def test_resumed_run_replaces_the_killed_runs_later_steps_in_tensorboard(tmp_path):
    """Regression: a resumed run wrote its steps to a new event file next to the killed run's,
    and TensorBoard showed both values for the re-run steps; two writers in one second also
    shared (and truncated) one file. A fresh run starts from no events."""
    wd = str(tmp_path)
    tb = os.path.join(wd, "tensorboard")
    log = RunLogger(wd, resume_step=None)
    for step in (1, 2, 3):
        log.log_step(step, {"reward": float(step)})
    log.close()
    assert _tensorboard_scalars(tb, "reward") == {1: 1.0, 2: 2.0, 3: 3.0}
    log = RunLogger(wd, resume_step=1)  # the checkpoint of step 1; steps 2, 3 are run again
    log.log_step(2, {"reward": 20.0})
    log.close()
    assert len(os.listdir(tb)) == 2
    assert _tensorboard_scalars(tb, "reward") == {1: 1.0, 2: 20.0}
    log = RunLogger(wd, resume_step=None)
    log.log_step(1, {"reward": 5.0})
    log.close()
    assert _tensorboard_scalars(tb, "reward") == {1: 5.0}


def test_checkpoint_store_keeps_latest_plus_protected_and_restores_exactly(tmp_path):
    store = CheckpointStore(str(tmp_path), max_to_keep=2, async_save=False)
    params = {"w": jnp.arange(12.0).reshape(4, 3), "b": {"c": jnp.ones(5, jnp.bfloat16)}}
    opt = (jnp.zeros((), jnp.int32), {"mu": params})
    for step in (1, 2, 3, 4, 5):
        p = {"w": params["w"] + step, "b": params["b"]}
        store.save(step, p, opt, {"step": step, "rng": [0, step]})
        store.wait()
        store.prune(protect=[2] if step >= 2 else [1])
    assert store.all_steps() == [2, 4, 5]  # the last two plus the protected (best) step 2
    assert store.latest_step() == 5
    p, o, ts = store.restore(2, params, opt)
    np.testing.assert_array_equal(np.asarray(p["w"]), np.asarray(params["w"] + 2))
    assert p["b"]["c"].dtype == jnp.bfloat16
    assert ts == {"step": 2, "rng": [0, 2]}
    assert store.restore_trainer_state(4) == {"step": 4, "rng": [0, 4]}
    with pytest.raises(FileNotFoundError, match="step 3"):
        store.restore(3, params, opt)
    store.close()


def test_policy_reads_a_training_checkpoints_params_and_reports_damage_in_one_line(tmp_path, capsys):
    """`jaxrl.policy` (evaluate, chat) opens WORKDIR/checkpoints/<step> directly: the params come
    back exactly as saved, in their dtypes; a damaged file is one PolicyError line, without the
    tracebacks of Orbax's abandoned reads."""
    import gc
    import shutil

    from jaxrl import policy

    store = CheckpointStore(str(tmp_path / "run"), max_to_keep=2, async_save=False)
    params = {"w": jnp.arange(12.0).reshape(4, 3), "b": {"c": jnp.arange(5, dtype=jnp.bfloat16)}}
    store.save(3, params, (jnp.zeros((), jnp.int32),), {"step": 3})
    store.wait()
    store.close()
    ckpt = str(tmp_path / "run" / "checkpoints" / "3")
    assert policy.is_training_checkpoint(ckpt) and not policy.is_training_checkpoint(str(tmp_path / "run"))
    policy.check_policy_dir(ckpt)  # accepted
    got = policy.read_checkpoint_params(ckpt)
    np.testing.assert_array_equal(np.asarray(got["w"]), np.arange(12.0).reshape(4, 3))
    assert got["b"]["c"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got["b"]["c"], np.float32), np.arange(5, dtype=np.float32))
    other = tmp_path / "other"  # readable params that are not the ones step 3 saved (checksums)
    store = CheckpointStore(str(other), max_to_keep=2, async_save=False)
    store.save(3, {"w": jnp.ones((4, 3)), "b": {"c": jnp.arange(5, dtype=jnp.bfloat16)}}, (jnp.zeros((), jnp.int32),),
               {"step": 3})
    store.wait()
    store.close()
    shutil.move(os.path.join(ckpt, "params"), str(tmp_path / "params.orig"))
    shutil.copytree(other / "checkpoints" / "3" / "params", os.path.join(ckpt, "params"))
    with pytest.raises(policy.PolicyError, match=r"1 of 2 params arrays differ from the checksums saved with them"):
        policy.read_checkpoint_params(ckpt)
    shutil.rmtree(os.path.join(ckpt, "params"))
    shutil.move(str(tmp_path / "params.orig"), os.path.join(ckpt, "params"))
    shutil.rmtree(os.path.join(ckpt, "params", "d"))  # the array data
    with pytest.raises(policy.PolicyError) as e:
        policy.read_checkpoint_params(ckpt)
    gc.collect()
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and msg.startswith(f"--model {ckpt!r}: the training checkpoint's params "
                                                         "cannot be read (") and "Fix: pass another step" in msg
    assert "Traceback" not in capsys.readouterr().err


def test_checkpoint_retention_follows_the_trainer_after_ties_and_restarts(tmp_path):
    """Regression (issue 9 §2): Orbax's own best-metric policy kept the LAST of tied EMAs while
    the trainer records the FIRST, and after a restart it had no metric for the old best and
    deleted it. Retention now protects exactly the step the trainer names, across a restart."""
    params = {"w": jnp.zeros(3)}
    opt = {"m": jnp.zeros(3)}
    store = CheckpointStore(str(tmp_path), max_to_keep=2, async_save=False)
    for step in (1, 5):  # equal EMAs (0.0): the trainer keeps step 1 as best
        store.save(step, params, opt, {"best_ckpt_step": 1})
        store.prune(protect=[1])
    store.close()
    store = CheckpointStore(str(tmp_path), max_to_keep=2, async_save=False)  # a resumed run
    for step in (10, 15):
        store.save(step, params, opt, {"best_ckpt_step": 1})
        store.prune(protect=[1])
    assert store.all_steps() == [1, 10, 15]
    store.close()


def _checkpoints(workdir, max_to_keep, params, opt):
    """The trainer's `Checkpoints` over tiny arrays (no model, learner or mesh is needed to save,
    resume and re-choose the best)."""
    import types

    from jaxrl.train.persistence import Checkpoints

    c = types.SimpleNamespace(trainer=types.SimpleNamespace(max_ckpts_to_keep=max_to_keep))
    learner = types.SimpleNamespace(abstract_state=lambda: (params, opt), critic=None)  # no value model
    return Checkpoints(c, str(workdir), learner, mesh=None, model_dir="", model_cfg=None, state_param_sharding=None)


def _save_steps(ck, emas: dict):
    """Saves step s with params w = s and reward EMA emas[s] (the trainer's `save`: best = highest EMA)."""
    from jaxrl.train.rundir import TrainerState

    state = TrainerState()
    for step, ema in emas.items():
        ck.save(step, {"w": jnp.full(3, float(step))}, {"m": jnp.zeros(3)}, state, RewardEMA(value=ema))
    return state


def _damage(workdir, step):
    """Truncates the array data files of checkpoint `step`'s params (the `d/` chunks) to half."""
    d = os.path.join(workdir, "checkpoints", str(step), "params")
    files = [os.path.join(r, n) for r, _, ns in os.walk(d) for n in ns if os.path.basename(r) == "d"]
    assert files
    for f in files:
        os.truncate(f, os.path.getsize(f) // 2)


def test_a_damaged_best_checkpoint_is_re_chosen_among_the_intact_ones_by_ema(tmp_path, capsys):
    """Issue 9 §2: the best checkpoint itself (here the latest, step 4, EMA 0.9) is damaged. The
    resume falls back to step 3, whose state names best = step 1, pruned since; the best is then
    re-chosen among the steps on disk by the EMA each recorded: step 2 (0.45) over step 3 (0.4)."""
    params, opt = {"w": jnp.zeros(3)}, {"m": jnp.zeros(3)}
    ck = _checkpoints(tmp_path, 3, params, opt)
    state = _save_steps(ck, {1: 0.5, 2: 0.45, 3: 0.4, 4: 0.9})
    assert (state.best_ckpt_step, ck.store.all_steps()) == (4, [2, 3, 4])  # 1 pruned once 4 became best
    ck.close()
    _damage(tmp_path, 4)
    capsys.readouterr()
    ck = _checkpoints(tmp_path, 3, params, opt)
    step, p, _, state = ck.resume()
    assert step == 3
    np.testing.assert_array_equal(np.asarray(p["w"]), np.full(3, 3.0))
    assert (state.best_ckpt_step, state.best_ckpt_ema) == (2, 0.45)
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Exception ignored" not in err, err[-2000:]
    lines = [line for line in err.splitlines() if line.startswith("jaxrl: warning:")]
    assert len(lines) == 2, err[-2000:]
    assert "checkpoint 4 " in lines[0] and "damaged" in lines[0] and "resumed from step 3" in lines[0]
    # The cause, without TensorStore's JSON specs (regression: the line was cut before the cause).
    assert "is not valid for value of size" in lines[0] and "tensorstore_spec" not in err, lines[0]
    assert "the best checkpoint 1 is gone; the best is now step 2 (EMA 0.4500)" in lines[1]
    assert os.path.isdir(tmp_path / "checkpoints_damaged" / "4")
    assert ck.store.all_steps() == [2, 3]
    ck.close()


def test_a_checkpoint_changed_without_a_read_error_is_damaged(tmp_path, capsys):
    """Regression (fresh-user review): a checkpoint whose data bytes were flipped (same file sizes) was
    resumed without a word; the run trained on NaN/inf weights and exported a NaN best/. Every save now
    records a checksum of each array (`tree_checksums`), checked at restore: here step 3's params are
    replaced by step 2's (readable, but not what step 3 saved), and the resume falls back to step 2.
    A checkpoint written before checksums is checked for NaN/inf instead (step 2 made so below)."""
    import json
    import shutil

    from jaxrl.train import checkpoint

    params, opt = {"w": jnp.zeros(3)}, {"m": jnp.zeros(3)}
    ck = _checkpoints(tmp_path, 3, params, opt)
    _save_steps(ck, {1: 0.1, 2: 0.2, 3: 0.3})
    ck.close()
    ckpts = tmp_path / "checkpoints"
    shutil.rmtree(ckpts / "3" / "params")
    shutil.copytree(ckpts / "2" / "params", ckpts / "3" / "params")
    capsys.readouterr()
    ck = _checkpoints(tmp_path, 3, params, opt)
    step, p, _, state = ck.resume()
    assert step == 2 and state.step == 2
    np.testing.assert_array_equal(np.asarray(p["w"]), np.full(3, 2.0))
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("jaxrl: warning: checkpoint 3 "))
    assert "1 of 1 params arrays differ from the checksums saved with them" in line and "resumed from step 2" in line
    ck.close()
    # The checksum itself, by hand: float32 1.0 is 0x3F800000; three of them sum to 3 * 0x3F800000 mod 2**32.
    assert checkpoint.tree_checksums({"w": jnp.ones(3)}) == ([(3 * 0x3F800000) % 2 ** 32], True)
    assert checkpoint.tree_checksums({"w": jnp.array([1.0, float("nan")])})[1] is False
    # A checkpoint without checksums (written before them) whose params hold NaN: damaged too.
    ck = _checkpoints(tmp_path, 3, params, opt)
    ck.save(4, {"w": jnp.array([1.0, float("nan"), 2.0])}, {"m": jnp.zeros(3)}, state, RewardEMA(value=0.5))
    ck.close()
    meta = ckpts / "4" / "trainer_state" / "metadata"
    ts = json.loads(meta.read_text())
    del ts[checkpoint.CHECKSUMS_KEY]
    meta.write_text(json.dumps(ts))
    ck = _checkpoints(tmp_path, 3, params, opt)
    step, _, _, _ = ck.resume()
    assert step == 2, step
    assert "checkpoint 4: params hold NaN/inf values" in capsys.readouterr().err
    ck.close()


def test_every_checkpoint_damaged_is_one_clear_error(tmp_path):
    """Issue 9 §2: when no committed checkpoint is readable, the resume stops with a
    CheckpointError naming the directory, each step and the fix; nothing is moved."""
    from jaxrl.train.rundir import CheckpointError

    params, opt = {"w": jnp.zeros(3)}, {"m": jnp.zeros(3)}
    ck = _checkpoints(tmp_path, 2, params, opt)
    _save_steps(ck, {1: 0.1, 2: 0.2})
    ck.close()
    for s in (1, 2):
        _damage(tmp_path, s)
    ck = _checkpoints(tmp_path, 2, params, opt)
    with pytest.raises(CheckpointError) as e:
        ck.resume()
    msg = str(e.value)
    assert msg.startswith(f"every checkpoint in {tmp_path / 'checkpoints'} is damaged (step 2: "), msg
    assert "; step 1: " in msg and msg.endswith(". Fix: restore the files, or start over with a new --workdir")
    assert "\n" not in msg and "tensorstore_spec" not in msg and msg.count("is not valid for value of size") == 2
    assert ck.store.all_steps() == [1, 2] and not os.path.exists(tmp_path / "checkpoints_damaged")
    ck.close()


def test_a_damaged_older_best_checkpoint_is_re_chosen_when_it_is_restored(tmp_path, capsys):
    """Regression (issue 9 §2): the best checkpoint (step 1, EMA 0.8) kept by retention beside the
    latest was damaged; the resume reads only the latest, so the trainer's final export (and a
    rollback) then failed in Orbax. `restore_best` moves it aside and re-chooses by EMA: step 3
    (0.6) over step 4 (0.5); when nothing else is readable, one CheckpointError."""
    from jaxrl.train.rundir import CheckpointError

    params, opt = {"w": jnp.zeros(3)}, {"m": jnp.zeros(3)}
    ck = _checkpoints(tmp_path, 2, params, opt)
    state = _save_steps(ck, {1: 0.8, 2: 0.1, 3: 0.6, 4: 0.5})
    assert (state.best_ckpt_step, ck.store.all_steps()) == (1, [1, 3, 4])
    ck.close()
    _damage(tmp_path, 1)
    capsys.readouterr()
    ck = _checkpoints(tmp_path, 2, params, opt)
    step, _, _, state = ck.resume()
    assert (step, state.best_ckpt_step) == (4, 1)  # the latest is intact: the resume does not read step 1
    p, _ = ck.restore_best(state)
    np.testing.assert_array_equal(np.asarray(p["w"]), np.full(3, 3.0))
    assert (state.best_ckpt_step, state.best_ckpt_ema) == (3, 0.6)
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Exception ignored" not in err, err[-2000:]
    (line,) = [line for line in err.splitlines() if line.startswith("jaxrl: warning:")]
    assert "the best checkpoint 1 " in line and "is damaged" in line and line.endswith("the best is now step 3 (EMA 0.6000)")
    assert state.events[-1] in line
    assert ck.store.all_steps() == [3, 4] and os.path.isdir(tmp_path / "checkpoints_damaged" / "1")
    # Every remaining checkpoint damaged: one clear error.
    for s in (3, 4):
        _damage(tmp_path, s)
    with pytest.raises(CheckpointError, match=r"no other checkpoint is readable\. Fix: restore the files, or start "
                                              r"over with a new --workdir$") as e:
        ck.restore_best(state)
    assert str(tmp_path / "checkpoints") in str(e.value) and "\n" not in str(e.value)
    ck.close()


def test_wall_time_counts_every_launch_of_a_resumed_run(tmp_path, capsys):
    """A run killed and resumed reported only the last process's time (report.md and the console
    summary). Two launches on fake clocks: the first runs 30 s and is killed after saving at 25 s,
    the second runs 50 s; the run's wall time is 25 + 50 s over 2 launches."""
    from jaxrl.config import base_config
    from jaxrl.train.report import report_text, summary_text
    from jaxrl.train.rundir import WALL_TIME_FILE, TrainerState, WallClock

    now = [100.0]
    first = WallClock(str(tmp_path), clock=lambda: now[0])
    assert (first.total(), first.launches) == (0.0, 1)  # a new run
    now[0] = 125.0
    first.save()  # after a step
    now[0] = 130.0  # killed here: the 5 s after the last save are not recorded
    assert json.load(open(tmp_path / WALL_TIME_FILE)) == {"seconds": 25.0, "launches": 1}
    assert [p.name for p in tmp_path.iterdir()] == [WALL_TIME_FILE]  # atomic write: no temp file left

    now[0] = 1000.0  # the second launch's clock starts anywhere
    second = WallClock(str(tmp_path), clock=lambda: now[0])
    now[0] = 1050.0
    assert (second.elapsed(), second.total(), second.launches) == (50.0, 75.0, 2)
    second.save()
    assert json.load(open(tmp_path / WALL_TIME_FILE)) == {"seconds": 75.0, "launches": 2}

    summary = {"last_step": 4, "best_step": 2, "best_ema": 0.5, "wall_s": second.total(), "launches": second.launches,
               "heldout": ""}
    assert "steps: 4 in 1.2 min over 2 launches (resumed 1 time);" in summary_text(summary, str(tmp_path))
    c = base_config()
    c.data.num_eval_prompts = 0
    report = report_text(c, summary, [], TrainerState(), collapsed=False)
    assert f"- steps run: 4 of {c.trainer.num_steps}; wall time 1.2 min over 2 launches (resumed 1 time)" in report
    assert "in 0.5 min;" in summary_text({**summary, "wall_s": 30.0, "launches": 1}, str(tmp_path))

    # A damaged file: one warning line naming it, and the time of this launch only.
    (tmp_path / WALL_TIME_FILE).write_text('{"seconds": -3, "launches": 1}')
    third = WallClock(str(tmp_path), clock=lambda: now[0])
    assert (third.total(), third.launches) == (0.0, 1)
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(tmp_path / WALL_TIME_FILE) in err, err


def test_resuming_with_another_config_lists_every_differing_key_old_to_new(tmp_path):
    """The error led with the alphabetically first differing key ("config key `seed`: ...") and
    gave no values; now: every key, the run's value -> this command's, and the fix, on one line."""
    from jaxrl.config import ConfigError, base_config
    from jaxrl.train.rundir import check_resume_config

    wd = str(tmp_path)
    check_resume_config(base_config(), wd, write=True)
    before = open(os.path.join(wd, "rl_config.json")).read()
    c = base_config()
    c.seed, c.trainer.train_batch_size, c.trainer.optimizer.lr = 1, 32, 2e-4
    c.trainer.num_steps = 99  # may change on resume: not listed
    with pytest.raises(ConfigError) as e:
        check_resume_config(c, wd, write=True)
    assert str(e.value) == (
        f"the workdir {wd} holds a run with another config, so this command cannot resume it: 3 keys differ (the "
        "run's rl_config.json -> this command): seed 0 -> 1; trainer.optimizer.lr 8e-06 -> 0.0002; "
        "trainer.train_batch_size 64 -> 32. Fix: to resume, rerun with the run's values (only trainer.num_steps, "
        "generator.sidecar_urls, trainer.optimizer.offload may change); for a new run, pass another --workdir")
    assert open(os.path.join(wd, "rl_config.json")).read() == before
    c = base_config()
    c.trainer.num_steps = 99
    check_resume_config(c, wd, write=True)  # a resumable change only


@pytest.mark.parametrize("where", ["params/d", "params/ocdbt.process_0/d"])
def test_a_damaged_checkpoint_is_named_by_its_cause_under_a_long_workdir(tmp_path, capsys, where):
    """Regression (fresh-user review): the warning cut the message at 400 characters from its start,
    so under a long workdir path the cause fell off; and a truncated array chunk
    (ocdbt.process_0/d) was reported by Orbax's wrapper ("Encountered error while reading array
    index ... See full TensorStore details: <bound method ...>") without the cause."""
    from jaxrl.train.rundir import TrainerState

    wd = tmp_path / ("a_long_workdir_name_" * 8) / ("and_deeper_" * 8)
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.standard_normal((512, 128)), jnp.float32)}  # incompressible: a real chunk
    opt = {"m": jnp.zeros(3)}
    ck = _checkpoints(wd, 3, params, opt)
    for step in (1, 2):
        ck.save(step, params, opt, TrainerState(), RewardEMA(value=0.1 * step))
    ck.close()
    d = wd / "checkpoints" / "2" / where
    files = [p for p in d.iterdir() if p.is_file()]
    assert files
    for f in files:
        os.truncate(f, f.stat().st_size // 2)
    capsys.readouterr()
    ck = _checkpoints(wd, 3, params, opt)
    step, _, _, _ = ck.resume()
    ck.close()
    assert step == 1
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("jaxrl: warning: checkpoint 2 ")]
    cause = line.split(" is damaged (", 1)[1].rsplit("); moved it to ", 1)[0]
    assert len(cause) <= 400 and "is not valid for value of size" in cause, cause
    assert "tensorstore_spec" not in line and "TensorStore details" not in line and "bound method" not in line, line


def test_tensorboard_writer_imports_no_torch_and_torch_still_imports(tmp_path):
    """tensorboardX imports torch whenever it is installed (it is, in the test environment); the run's
    writer is made without it (1.4 s per trainer process), writes readable events, and torch can be
    imported afterwards. Checked in a fresh interpreter."""
    import subprocess
    import sys

    code = ("import sys; from jaxrl.train.metrics import RunLogger; "
            f"log = RunLogger({str(tmp_path / 'run')!r}, resume_step=None, use_tensorboard=True); "
            "log.tb.add_scalar('reward', 0.5, 1); log.tb.close(); print('torch' in sys.modules); "
            "import torch; print(torch.tensor([1.0]).sum().item())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "1.0"]
    assert _tensorboard_scalars(str(tmp_path / "run" / "tensorboard"), "reward") == {1: 0.5}
