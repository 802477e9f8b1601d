"""Differential tests against Harbor 0.26 itself (its wheel from PyPI, tests/harbor_wheel.py):

* jaxrl's Terminus-2 parser (jaxrl/envs/harbor/parser.py) and Harbor's `TerminusJSONPlainParser` on
  the same responses (written here, the kinds a policy emits: clean, prose around the object, `{` in
  the prose, stray quotes, truncation, NaN, odd `task_complete` values, bad commands, ...) give the
  same commands, completion, error verdict, error message and warnings; strict mode rejects exactly
  the responses Harbor errors or warns on;
* the terminus-2 prompt style's texts are read from the wheel, and the first prompt and each
  observation kind rendered by jaxrl equal Harbor's own template / f-string output for the same
  screen."""
from __future__ import annotations

import json
import math

import pytest

from harbor_wheel import harbor_parser, harbor_wheel, harbor_module
from jaxrl.envs.harbor.parser import parse_response


def obj(commands=(), complete=None, analysis="Look at the files.", plan="List them.", **extra):
    d = {"analysis": analysis, "plan": plan, "commands": [{"keystrokes": k, "duration": t} for k, t in commands]}
    if complete is not None:
        d["task_complete"] = complete
    d.update(extra)
    return json.dumps(d)


OK = obj([("ls -la\n", 0.1), ("cat notes.txt\n", 0.5)])

RESPONSES = [
    OK,
    obj(),
    obj([("echo hi > /app/a.txt\n", 1)], complete=True),
    obj(complete=False),
    obj(complete="true"),
    obj(complete="Yes"),
    obj(complete="1"),
    obj(complete="no"),
    obj(complete=1),
    obj(complete=0),
    obj(complete=None) [:-1] + ', "task_complete": null}',
    obj(complete=[1]),
    "Sure, here it is:\n" + OK,
    OK + "\nLet me know if that works.",
    "I think {the answer} is this:\n" + OK,
    "Use a set like {1, 2} then:\n" + OK,
    'He said "hello and then\n' + OK,
    'The file "a.txt" exists.\n' + OK,
    "```json\n" + OK + "\n```",
    OK[:-1],
    OK[:-3],
    OK[: len(OK) // 2],
    '{"analysis": "a", "plan": "p", "commands": [{"keystrokes": "ls\\n", "duration": NaN}]}',
    '{"analysis": "a", "plan": "p", "commands": [{"keystrokes": "sleep 1\\n", "duration": Infinity}]}',
    '{"analysis": "a", "plan": "p", "commands": [{"keystrokes": "x\\n", "duration": -3}]}',
    '{"analysis": "a", "plan": "p", "commands": [{"keystrokes": "x\\n", "duration": 600}]}',
    '{"analysis": "a", "plan": "p", "commands": [{"keystrokes": "x\\n", "duration": "2"}]}',
    '{"analysis": "a", "plan": "p", "commands": [{"keystrokes": "x\\n", "duration": true}]}',
    '{"analysis": "a", "plan": "p", "commands": [{"keystrokes": "x\\n"}]}',
    '{"analysis": "a", "plan": "p", "commands": [{"keystrokes": "x\\n", "duration": 1, "note": "why"}]}',
    '{"analysis": "a", "plan": "p", "commands": [{"keystrokes": "ls", "duration": 1}, {"keystrokes": "pwd\\n", "duration": 1}]}',
    '{"analysis": "a", "plan": "p", "commands": [{"keystrokes": "", "duration": 5}, {"keystrokes": "pwd\\n", "duration": 1}]}',
    '{"analysis": "a", "plan": "p", "commands": [{"keystrokes": "C-c", "duration": 0.1}]}',
    '{"analysis": "a", "plan": "p"}',
    '{"commands": []}',
    '{"analysis": "a", "plan": "p", "commands": "ls -la"}',
    '{"analysis": "a", "plan": "p", "commands": ["ls -la"]}',
    '{"analysis": "a", "plan": "p", "commands": [{"duration": 1}]}',
    '{"analysis": "a", "plan": "p", "commands": [{"keystrokes": ["l", "s"]}]}',
    '{"analysis": "a", "plan": "p", "commands": ["ls"], "task_complete": true}',
    '{"analysis": 3, "plan": ["p"], "commands": []}',
    '{"plan": "p", "analysis": "a", "commands": []}',
    '{"commands": [], "plan": "p", "analysis": "a"}',
    '{"analysis": "a", "plan": p, "commands": []}',
    "{'analysis': 'a', 'plan': 'p', 'commands': []}",
    '{"analysis": "a", "plan": "p", "commands": [],}',
    "I will list the files first.",
    "",
    "[1, 2, 3]",
    '{"x": 1} and then ' + OK,
    'prefix {"analysis": "a", "plan": "p"} ' + OK,
    '{"analysis": "say \\"hi\\" {here}", "plan": "p}", "commands": [{"keystrokes": "echo \\"}{\\" > f\\n", "duration": 0.1}]}',
    '{"analysis": "a\\\\", "plan": "p", "commands": []}',
    'back\\slash \\" then ' + OK,
    '} oops ' + OK,
    '{"analysis": "a", "plan": "p", "commands": [{"keystrokes": "cat > f <<EOF\\nline {1}\\nEOF\\n", "duration": 0.2}], "task_complete": false}',
    '{"analysis": "a", "plan": "p", "commands": [], "task_complete": true} {"analysis": "b", "plan": "q", "commands": []}',
    '<think>hmm {</think>' + OK,
    '{"analysis": "a", "plan": "p", "commands": [{"keystrokes": "python3 -c \\"print({1: 2})\\"\\n", "duration": 1}]',
    '{"analysis": "unterminated, "plan": "p", "commands": []}',
    '{"analysis": "a", "plan": "p", "commands": [{"keystrokes": "ls\\n", "duration": 1}, 7]}',
    '{"analysis": "a", "plan": "p", "commands": [], "analysis": 5}',
]


def _outcome(commands, complete, error, warning):
    cmds = [(c.keystrokes, repr(min(float(c.duration), 60.0))) for c in commands]
    return cmds, bool(complete), error, warning


def _harbor(text):
    r = harbor_parser().parse_response(text)
    return _outcome(r.commands, r.is_task_complete, r.error, r.warning)


def _ours(text, strict=False):
    p = parse_response(text, strict=strict)
    return _outcome(p.commands, p.task_complete, p.error, p.warning_text)


def test_response_set_is_large_and_varied():
    assert len(RESPONSES) >= 40 and len(set(RESPONSES)) == len(RESPONSES)
    verdicts = [bool(harbor_parser().parse_response(t).error) for t in RESPONSES]
    assert 10 <= sum(verdicts) <= len(RESPONSES) - 10  # both verdicts are well represented


@pytest.mark.parametrize("i", range(len(RESPONSES)))
def test_parser_equals_harbor(i):
    text = RESPONSES[i]
    assert _ours(text) == _harbor(text), text


@pytest.mark.parametrize("i", range(len(RESPONSES)))
def test_strict_parser_rejects_what_harbor_errors_or_warns_on(i):
    text = RESPONSES[i]
    raw = harbor_parser()._try_parse_response(text)  # Harbor without its auto-corrections
    ours = parse_response(text, strict=True)
    assert bool(ours.error) == bool(raw.error or raw.warning), text
    if not ours.error:
        assert _outcome(ours.commands, ours.task_complete, "", "") == _outcome(raw.commands, raw.is_task_complete, "", "")


def test_nan_duration_is_kept_as_harbor_caps_it():
    # Harbor: min(nan, 60) stays nan and the wait is skipped; the terminal treats it as 0
    p = parse_response(RESPONSES[22])
    assert p.error == "" and math.isnan(p.commands[0].duration)


# ------------------------------------------------------------------------------------------------
# rendered prompts: jaxrl's terminus-2 style against Harbor's own template and f-strings, evaluated
# from the wheel's source (the expressions themselves run, with the same inputs)

import ast  # noqa: E402
import types  # noqa: E402
import zipfile  # noqa: E402


def _harbor_source(path, base="harbor/agents/terminus_2/"):
    with zipfile.ZipFile(harbor_wheel()) as z:
        return z.read(base + path).decode("utf-8")


def _harbor_fstrings(func, target):
    tree = ast.parse(_harbor_source("terminus_2.py"))
    f = next(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == func)
    out = []
    for n in ast.walk(f):
        if isinstance(n, ast.Assign) and target in [ast.unparse(t) for t in n.targets] and isinstance(n.value, ast.JoinedStr):
            out.append(compile(ast.Expression(n.value), "harbor", "eval"))
    return out


class _FakeTerminus:
    """The `self` Harbor's expressions need: JSON parser, the 10 kB output cap."""

    options = types.SimpleNamespace(parser_name="json")

    def _get_error_response_type(self):
        return "JSON response"

    def _limit_output_length(self, output, max_bytes=10000):
        from jaxrl.envs.harbor.terminal import limit_output

        assert len(output.encode()) <= max_bytes  # the test's outputs stay under the cap
        return output


def _harbor_confirm(terminal_output):
    tree = ast.parse(_harbor_source("terminus_2.py"))
    f = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_get_completion_confirmation_message")
    ns = {}
    exec(compile(ast.Module([f], []), "harbor", "exec"), ns)
    return ns["_get_completion_confirmation_message"](_FakeTerminus(), terminal_output)


def _harbor_feedback(text):
    r = harbor_parser().parse_response(text)
    feedback = ""
    if r.error:
        feedback += f"ERROR: {r.error}"
        if r.warning:
            feedback += f"\nWARNINGS: {r.warning}"
    elif r.warning:
        feedback += f"WARNINGS: {r.warning}"
    return feedback


def _harbor_incremental(buffers, screen):
    """Harbor's `TmuxSession.get_incremental_output` (run from the wheel's source) over successive
    full-history captures `buffers`, the visible screen being `screen`."""
    import asyncio

    tree = ast.parse(_harbor_source("tmux_session.py"))
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "TmuxSession")
    funcs = [n for n in cls.body if isinstance(n, ast.AsyncFunctionDef)
             and n.name in ("get_incremental_output", "_find_new_content")]
    ns = {}
    exec(compile(ast.Module(funcs, []), "harbor", "exec"), ns)
    feed = iter(buffers)

    class S:
        _previous_buffer = None

        async def capture_pane(self, capture_entire=False):
            return next(feed) if capture_entire else screen

        async def _get_visible_screen(self):
            return screen

        _find_new_content = ns["_find_new_content"]

    s = S()
    return [asyncio.run(ns["get_incremental_output"](s)) for _ in buffers]


def _style():
    from jaxrl.envs.harbor.agent import prompt_style

    return prompt_style("terminus-2", harbor_wheel())


def test_first_prompt_equals_harbors_template():
    from jaxrl.envs.harbor.agent import initial_prompt

    with zipfile.ZipFile(harbor_wheel()) as z:
        template = z.read("harbor/agents/terminus_2/templates/terminus-json-plain.txt").decode()
    screen = "agent@sandbox:/app$ \n\n\n"
    instruction = "Write {the} word 'apple' to /app/a.txt.\n"
    state = _harbor_incremental([screen], screen)[0]
    assert state == "Current Terminal Screen:\n" + screen
    ours = initial_prompt(instruction, _style().screen.format(screen=screen), _style())
    assert ours == template.format(instruction=instruction, terminal_state=state)


HISTORIES = [
    "agent@sandbox:/app$ \n",
    "agent@sandbox:/app$ ls\na.txt\nagent@sandbox:/app$ \n",
    "agent@sandbox:/app$ ls\na.txt\nagent@sandbox:/app$ \n",  # nothing new
    "agent@sandbox:/app$ ls\na.txt\nagent@sandbox:/app$ cat a.txt\napple\nagent@sandbox:/app$ ",
    "agent@sandbox:/app$ clear\nagent@sandbox:/app$ ",  # the history no longer holds the old one
    "agent@sandbox:/app$ clear\nagent@sandbox:/app$ python3\n>>> ",
    "",
    "one line",
    "one line and more",
]


def test_observation_framing_equals_harbors_incremental_output():
    from jaxrl.envs.harbor.agent import incremental_output

    screen = "agent@sandbox:/app$ ls\na.txt\nagent@sandbox:/app$ "
    harbor = _harbor_incremental(HISTORIES, screen)
    prev, ours = None, []
    for h in HISTORIES:
        ours.append(incremental_output(_style(), prev, h, screen))
        prev = h
    assert ours == harbor
    kinds = {o.split("\n", 1)[0] for o in harbor}
    assert kinds == {"Current Terminal Screen:", "New Terminal Output:"}  # both framings are exercised


@pytest.mark.parametrize("text", [RESPONSES[12], RESPONSES[28], RESPONSES[30], RESPONSES[33], RESPONSES[46],
                                  RESPONSES[19], RESPONSES[56]])
def test_feedback_observations_equal_harbors(text):
    st = _style()
    term = "New Terminal Output:\nagent@sandbox:/app$ ls\nagent@sandbox:/app$ "
    feedback = _harbor_feedback(text)
    p = parse_response(text)
    ns = {"self": _FakeTerminus(), "feedback": feedback, "terminal_output": term}
    if p.error:
        ours = st.parse_error.format(feedback=st.error_feedback.format(error=p.error)
                                     + (st.error_warning_feedback.format(warning=p.warning_text) if p.warnings else ""))
        harbor = eval(_harbor_fstrings("_run_agent_loop", "prompt")[0], ns)
    else:
        assert p.warnings
        ours = st.warnings.format(feedback=st.warning_feedback.format(warning=p.warning_text), output=term)
        harbor = eval(_harbor_fstrings("_run_agent_loop", "observation")[0], ns)
    assert ours == harbor


def test_confirm_and_output_length_equal_harbors():
    st = _style()
    term = "New Terminal Output:\nagent@sandbox:/app$ echo hi > /app/a.txt\nagent@sandbox:/app$ "
    assert st.confirm.format(output=term) == _harbor_confirm(term)
    ns = {"limit_str": "4096 tokens", "output_limit": 4096}
    assert st.output_length.format(limit=st.output_limit.format(tokens=4096)) == eval(
        _harbor_fstrings("_query_llm", "error_msg")[0], ns)
    assert st.output_limit.format(tokens=4096) == eval(_harbor_fstrings("_query_llm", "limit_str")[0], ns)


# ------------------------------------------------------------------------------------------------
# reward files: jaxrl's parse_reward against Harbor's Verifier (its reward readers and their order,
# run from the wheel's source on the same files)

REWARD_FILES = [
    {"reward.txt": "1"}, {"reward.txt": " 0.25\n"}, {"reward.txt": ""}, {"reward.txt": "\n \n"},
    {"reward.txt": "yes"}, {"reward.txt": "nan"}, {"reward.txt": "-inf"},
    {"reward.json": '{"reward": 0.5, "tests_passed": 3}'}, {"reward.json": '{"pass_ratio": 0.75}'},
    {"reward.json": "[1]"}, {"reward.json": '{"reward": true}'}, {"reward.json": "0.5"},
    {"reward.json": '{"reward": NaN}'}, {"reward.json": '{"reward": "1"}'}, {"reward.json": ""},
    {"reward.json": "{not json"}, {"reward.json": "1e999"},
    {"reward.txt": "0", "reward.json": '{"reward": 1}'}, {"reward.txt": "1", "reward.json": ""},
    {"reward.txt": "1", "reward.json": "oops"}, {},
]

HARBOR_CLASS = {"ok": None, "reward_missing": "RewardFileNotFoundError", "reward_empty": "RewardFileEmptyError",
                "reward_unparsable": "VerifierOutputParseError"}


def _harbor_reward(d):
    """Harbor's verdict on the reward files of `d`: ('ok', rewards) or (exception class name, None)."""
    from pathlib import Path

    import re

    # Python 3.12 f-strings split a replacement field over lines; join them so that 3.11 parses it
    src = re.sub(r"\{\s*\n\s*([^{}\n]*?)\s*\n\s*\}", r"{\1}", _harbor_source("harbor/verifier/verifier.py", base=""))
    tree = ast.parse(src)
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "Verifier")
    funcs = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in ("_parse_reward_text", "_parse_reward_json")]
    excs = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.endswith("Error")]
    ns = {"json": json, "math": math}
    exec(compile(ast.Module(excs + funcs, []), "harbor-verifier", "exec"), ns)
    me = types.SimpleNamespace(trial_paths=types.SimpleNamespace(reward_text_path=Path(d) / "reward.txt",
                                                                 reward_json_path=Path(d) / "reward.json"))
    try:  # the order of Verifier.verify: reward.json, then reward.txt, else not found
        if me.trial_paths.reward_json_path.exists():
            return "ok", ns["_parse_reward_json"](me)
        if me.trial_paths.reward_text_path.exists():
            return "ok", ns["_parse_reward_text"](me)
        return "RewardFileNotFoundError", None
    except Exception as e:  # noqa: BLE001
        return type(e).__name__, None


@pytest.mark.parametrize("i", range(len(REWARD_FILES)))
def test_reward_files_as_harbor_reads_them(tmp_path, i):
    from jaxrl.envs.harbor.trial import parse_reward

    for name, text in REWARD_FILES[i].items():
        (tmp_path / name).write_text(text)
    value, outcome, details = parse_reward(tmp_path)
    kind, rewards = _harbor_reward(tmp_path)
    if kind == "ok" and not isinstance(rewards, dict):
        rewards = {"reward": rewards}  # a bare number
    assert (HARBOR_CLASS[str(outcome)] or "ok") == kind, details
    if kind == "ok":
        assert details["rewards"] == {k: float(v) for k, v in rewards.items()}
        assert value == float(rewards.get("reward", next(iter(rewards.values()))))


def test_a_directory_as_the_wheel_names_the_wheel_inside_it(tmp_path):
    """harbor.harbor_wheel set to the folder `pip download -d` wrote was reported as 'does not exist'."""
    from jaxrl.envs.harbor.terminus2 import HarborFilesError, HarborSource

    with pytest.raises(HarborFilesError, match="is a directory, not a wheel file.*-d DIR"):
        HarborSource(str(tmp_path))
    (tmp_path / "harbor-0.26.0-py3-none-any.whl").write_bytes(b"")
    with pytest.raises(HarborFilesError, match=r"inside it \(.*harbor-0.26.0-py3-none-any.whl\)"):
        HarborSource(str(tmp_path))
