"""The terminus-2 screen from a real tmux pane in the sandbox (jaxrl/envs/harbor/terminal.py
`TmuxTerminal`, TrialConfig(terminal="tmux")): Harbor's 160 x 40 pane, tmux's own wrapping and
full-screen rendering, and an agent-loop episode whose observations are Harbor's framing of tmux's
captures. Expected screens by hand (a 200-character line wraps into 160 + 40 on a 160-column pane)."""
from __future__ import annotations

import json
import time

from envs_fakes import ScriptedGenerator
from harbor_helpers import make_task
from harbor_wheel import harbor_wheel
from jaxrl.envs import RolloutConfig, run_rollouts
from jaxrl.envs.harbor import Trial, TrialConfig
from jaxrl.envs.harbor.agent import AgentConfig, TerminusEnvFactory, rollout_tasks
from jaxrl.rollout.types import SamplingParams


def _screen_when(term, ready, timeout: float = 120.0) -> list[str]:
    """The pane's rows once `ready(rows)` holds (polled: how long the shell takes does not decide the test;
    the timeout only bounds how long a failure takes to show)."""
    deadline = time.monotonic() + timeout
    while not ready(rows := term.screen().split("\n")):
        assert time.monotonic() < deadline, rows
        time.sleep(0.05)
    return rows


def test_pane_is_harbors_size_and_wraps_as_tmux(tmp_path):
    task = make_task(tmp_path, "t")
    with Trial(task, tmp_path / "trial", TrialConfig(keep="none", terminal="tmux")) as trial:
        term = trial.terminal
        first = term.screen().split("\n")
        assert first[0] == "agent@sandbox:/app$" and len(first) == 41 and first[-1] == ""  # 40 rows
        trial.send_keys("printf 'x%.0s' {1..200}; echo\n", 1.5)
        rows = _screen_when(term, lambda rows: rows[3] == "agent@sandbox:/app$")  # the command is done
        assert rows[1] == "x" * 160 and rows[2] == "x" * 40
        # a full-screen program: clear the pane and draw at row 10, column 5 (then wait in `read`)
        trial.send_keys("clear; printf '\\033[10;5HHELLO'; read\n", 1.5)
        rows = _screen_when(term, lambda rows: "HELLO" in rows[9])
        assert rows[9] == "    HELLO" and "x" * 40 not in "\n".join(rows)
        assert "HELLO" in term.history()


def test_episode_through_tmux_is_verified_and_framed_as_harbor(chat, tmp_path):
    tasks = [make_task(tmp_path, "t")]

    def reply(cmds, complete):
        return json.dumps({"analysis": "a", "plan": "p", "task_complete": complete,
                           "commands": [{"keystrokes": k, "duration": 1.0} for k in cmds]})

    turns = iter([reply(["echo done > /app/done.txt\n"], True), reply([], True)])
    gen = ScriptedGenerator(chat, lambda text, j: next(turns))
    trial = TrialConfig(keep="none", terminal="tmux")
    factory = TerminusEnvFactory(AgentConfig(prompt_style="terminus-2", harbor_wheel=harbor_wheel(), trial=trial))
    cfg = RolloutConfig(max_turns=4, max_tokens_per_turn=400, max_seq_len=16384)
    (t,) = run_rollouts(gen, chat, rollout_tasks(tasks), SamplingParams(), cfg, make_env=factory)
    assert (t.reward, t.info["outcome"], t.num_turns) == (1.0, "ok", 2)
    first = chat.tokenizer.decode(gen.calls[0].prompt)
    # the first capture: the visible 40-row screen, framed as Harbor's tmux session frames it
    assert "Current terminal state:\nCurrent Terminal Screen:\nagent@sandbox:/app$" + "\n" * 40 in first
    obs = t.info["episode"][0]["observation"]
    # Harbor's incremental output: the previous capture (stripped) has no line break, so from where it is found
    assert obs.startswith("Current terminal state:\nNew Terminal Output:\nagent@sandbox:/app$ echo done > "
                          "/app/done.txt\nagent@sandbox:/app$"), obs
