"""Harbor's terminus-2 texts, read at run time from Harbor's own files (never re-worded here).

`terminus2_style(wheel="")` builds the `PromptStyle` of the `terminus-2` prompt style from the
`harbor` package: the installed one (`pip install harbor==0.26.0`, Python >= 3.12), or a harbor wheel
named by `wheel` (config key `harbor.harbor_wheel`; the wheel is a zip file and is only read, so
it serves a Python 3.11 trainer too:
`pip download --no-deps --python-version 3.12 --only-binary=:all: harbor==0.26.0`).

What is read, from Harbor 0.26's `harbor/agents/terminus_2/`:

* `templates/terminus-json-plain.txt`: the first user message (`{instruction}`, `{terminal_state}`);
* `terminus_2.py`, parsed with `ast` (nothing is imported or run): the f-strings of the agent loop
  that become observations: the completion confirmation (`_get_completion_confirmation_message`,
  its JSON branch), the parse-error and warning observations (`_run_agent_loop`), the feedback lines
  (`_handle_llm_interaction`), and the output-length re-prompt (`_query_llm`);
* `tmux_session.py`, the same way: the two framings of the terminal state
  (`get_incremental_output`: the visible screen, or the new output).

Each f-string becomes a `str.format` template whose fields are named by the expression they held
(`ast.unparse`), mapped to this module's field names; a text that cannot be found (another Harbor
version) is a `HarborFilesError` naming the file and the piece.
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import os
import zipfile
from typing import Callable, Optional

HARBOR_VERSION = "0.26.0"
PIP_DOWNLOAD = (f"pip download --no-deps --python-version 3.12 --only-binary=:all: harbor=={HARBOR_VERSION} -d DIR")
_BASE = "harbor/agents/terminus_2/"


class HarborFilesError(ValueError):
    """Harbor's files cannot be found or read (one line with the fix)."""


class HarborSource:
    """Reads files of the `harbor` package from a wheel or an installed package (module docstring)."""

    def __init__(self, wheel: str = ""):
        self.wheel = wheel
        if wheel:
            if os.path.isdir(wheel):
                inside = sorted(f for f in os.listdir(wheel) if f.startswith("harbor-") and f.endswith(".whl"))
                raise HarborFilesError(f"harbor wheel {wheel!r} is a directory, not a wheel file: set "
                                       f"harbor.harbor_wheel to the .whl "
                                       + (f"inside it ({os.path.join(wheel, inside[-1])})" if inside
                                          else f"that `{PIP_DOWNLOAD}` writes into it"))
            if not os.path.isfile(wheel):
                raise HarborFilesError(f"harbor wheel {wheel!r} does not exist: set harbor.harbor_wheel to a harbor "
                                       f"wheel ({PIP_DOWNLOAD})")
            try:
                with zipfile.ZipFile(wheel) as z:
                    self._names = set(z.namelist())
            except (zipfile.BadZipFile, OSError) as e:
                raise HarborFilesError(f"harbor wheel {wheel!r} cannot be read ({e}): download it again "
                                       f"({PIP_DOWNLOAD})") from None
            self.where = wheel
        else:
            spec = importlib.util.find_spec("harbor")
            locs = list(spec.submodule_search_locations or []) if spec is not None else []
            if not locs:
                raise HarborFilesError("the terminus-2 prompt style needs Harbor's files: pip install "
                                       f"harbor=={HARBOR_VERSION} (Python >= 3.12), or set harbor.harbor_wheel to a "
                                       f"harbor wheel ({PIP_DOWNLOAD})")
            self.where = os.path.dirname(locs[0])

    def read(self, path: str) -> str:
        """The text of `path` (relative to the site-packages root, e.g. `harbor/agents/...`)."""
        try:
            if self.wheel:
                if path not in self._names:
                    raise KeyError(path)
                with zipfile.ZipFile(self.wheel) as z:
                    return z.read(path).decode("utf-8")
            with open(os.path.join(self.where, path), encoding="utf-8") as f:
                return f.read()
        except (KeyError, OSError, UnicodeDecodeError):
            raise HarborFilesError(f"{self.where} has no readable {path}: use harbor {HARBOR_VERSION} "
                                   f"({PIP_DOWNLOAD})") from None


def _function(tree: ast.AST, name: str) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    raise LookupError(name)


def _template(node: ast.AST, fields: dict[str, str]) -> str:
    """An f-string (or a constant) as a `str.format` template; each `{expr}` becomes `{fields[expr]}`
    (a field mapped to a value in `fields` that starts with '=' is inlined as that literal)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.replace("{", "{{").replace("}", "}}")
    if not isinstance(node, ast.JoinedStr):
        raise LookupError("not a string")
    out = []
    for part in node.values:
        if isinstance(part, ast.Constant):
            out.append(str(part.value).replace("{", "{{").replace("}", "}}"))
        elif isinstance(part, ast.FormattedValue) and part.format_spec is None and part.conversion == -1:
            expr = ast.unparse(part.value)
            if expr not in fields:
                raise LookupError(f"unexpected field {expr}")
            name = fields[expr]
            out.append(name[1:].replace("{", "{{").replace("}", "}}") if name.startswith("=") else "{" + name + "}")
        else:
            raise LookupError("formatted field with a spec")
    return "".join(out)


def _strings(func: ast.AST, target: Optional[str]) -> list[ast.AST]:
    """The string values assigned (`target`) or returned (`target=None`) in `func`, in source order."""
    found = []
    for node in ast.walk(func):
        if target is None and isinstance(node, ast.Return) and node.value is not None:
            found.append(node.value)
        elif target is not None and isinstance(node, (ast.Assign, ast.AugAssign)):
            names = [ast.unparse(t) for t in (node.targets if isinstance(node, ast.Assign) else [node.target])]
            if target in names:
                found.append(node.value)
    found = [n for n in found if isinstance(n, ast.JoinedStr) or (isinstance(n, ast.Constant) and isinstance(n.value, str))]
    return sorted(found, key=lambda n: (n.lineno, n.col_offset))


def _pick(func: ast.AST, target: Optional[str], fields: dict[str, str], want: Callable[[str], bool],
          what: str, path: str) -> str:
    for node in _strings(func, target):
        try:
            t = _template(node, fields)
        except LookupError:
            continue
        if want(t):
            return t
    raise HarborFilesError(f"{path}: the {what} text was not found (this reads harbor {HARBOR_VERSION}; "
                           f"{PIP_DOWNLOAD})")


@functools.lru_cache(maxsize=8)
def terminus2_texts(wheel: str = "") -> dict[str, str]:
    """The terminus-2 texts as `str.format` templates (keys as `PromptStyle`'s fields; module docstring).

    Raises:
      HarborFilesError: Harbor's files cannot be found, read, or do not hold a text.
    """
    src = HarborSource(wheel)
    agent_path, tmux_path = _BASE + "terminus_2.py", _BASE + "tmux_session.py"
    try:
        agent = ast.parse(src.read(agent_path))
        tmux = ast.parse(src.read(tmux_path))
        f_type = _function(agent, "_get_error_response_type")
        f_confirm = _function(agent, "_get_completion_confirmation_message")
        f_loop = _function(agent, "_run_agent_loop")
        f_handle = _function(agent, "_handle_llm_interaction")
        f_query = _function(agent, "_query_llm")
        f_screen = _function(tmux, "get_incremental_output")
    except SyntaxError as e:
        raise HarborFilesError(f"{src.where}: Harbor's terminus-2 sources do not parse ({e})") from None
    except LookupError as e:
        raise HarborFilesError(f"{src.where}: Harbor's terminus-2 sources have no {e} (this reads harbor "
                               f"{HARBOR_VERSION})") from None
    kind = _pick(f_type, None, {}, lambda t: "JSON" in t, "JSON response type", agent_path)
    has = lambda *names: (lambda t: all("{" + n + "}" in t for n in names))  # noqa: E731
    texts = {
        "initial": src.read(_BASE + "templates/terminus-json-plain.txt"),
        "confirm": _pick(f_confirm, None, {"terminal_output": "output"}, has("output"), "completion confirmation",
                         agent_path),
        "parse_error": _pick(f_loop, "prompt", {"feedback": "feedback", "self._get_error_response_type()": "=" + kind},
                             has("feedback"), "parse-error observation", agent_path),
        "warnings": _pick(f_loop, "observation", {"feedback": "feedback",
                                                  "self._limit_output_length(terminal_output)": "output"},
                          has("feedback", "output"), "warnings observation", agent_path),
        "error_feedback": _pick(f_handle, "feedback", {"result.error": "error"}, has("error"), "error feedback",
                                agent_path),
        "error_warning_feedback": _pick(f_handle, "feedback", {"result.warning": "warning"},
                                        lambda t: t.startswith("\n") and "{warning}" in t, "error warnings feedback",
                                        agent_path),
        "warning_feedback": _pick(f_handle, "feedback", {"result.warning": "warning"},
                                  lambda t: not t.startswith("\n") and "{warning}" in t, "warnings feedback",
                                  agent_path),
        "output_length": _pick(f_query, "error_msg", {"limit_str": "limit"}, has("limit"), "output-length re-prompt",
                               agent_path),
        "output_limit": _pick(f_query, "limit_str", {"output_limit": "tokens"}, has("tokens"), "output limit",
                              agent_path),
        "output_limit_unknown": _pick(f_query, "limit_str", {}, lambda t: "{" not in t, "unknown output limit",
                                      agent_path),
        "truncated_warnings": _pick(f_query, "warnings_text", {"parse_result.warning": "warning"}, has("warning"),
                                    "truncated-response warnings", agent_path),
        "screen": _pick(f_screen, None, {"visible_screen": "screen"}, has("screen"), "visible-screen framing",
                        tmux_path),
        "new_output": _pick(f_screen, None, {"new_content": "output"}, has("output"), "new-output framing", tmux_path),
    }
    if "{instruction}" not in texts["initial"] or "{terminal_state}" not in texts["initial"]:
        raise HarborFilesError(f"{src.where}: templates/terminus-json-plain.txt has no {{instruction}} / "
                               "{terminal_state} field")
    return texts
