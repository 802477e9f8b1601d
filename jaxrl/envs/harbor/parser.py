"""Reading a Terminus-2 JSON response the way Harbor 0.26's `terminus-2` agent reads it.

The policy's answer to every turn is one JSON object `{"analysis", "plan", "commands": [{"keystrokes",
"duration"}], "task_complete"}`. A model trained with Harbor learned Harbor's parser, so this module
reproduces its decisions (the commands run, the completion flag, error or not, and the feedback
strings the next prompt carries), including on the malformed answers a policy emits:

1. **Object scan.** The first balanced `{...}` of the text is taken. The scan toggles "inside a
   string" at every `"` of the whole text (also before the object) and a backslash escapes the next
   character anywhere; braces count only outside strings. So a stray `"` before the object hides it,
   and a `}` before the first `{` upsets the count, as in Harbor. Text before / after the object is a
   warning.
2. **Decoding** with Python's `json.loads` (so `NaN` and `Infinity` are accepted, as in Harbor).
3. **Checks** (errors: nothing runs): an object, with `analysis`, `plan` and `commands`; `commands`
   an array; each command an object with a string `keystrokes`. Warnings: `analysis` / `plan` not
   strings, the three fields out of order, `task_complete` neither a boolean nor a string, a missing
   or non-numeric `duration` (1.0 used), unknown command fields, a non-empty command followed by
   another without a trailing newline. With `task_complete` truthy a bad command is only a warning
   (no command runs, the completion stands).
4. **Completion**: a string `task_complete` is true when it is "true", "1" or "yes" (any case);
   otherwise its truthiness counts (`1` is true, `0` / `null` false).
5. **Auto-corrections**, tried in order when the text gives an error: (a) when the error is a JSON
   one or no object was found, append the missing closing braces (`{` count minus `}` count of the
   whole text); (b) the first flat-or-once-nested `{...}` of the text that decodes. The first that
   parses without error wins, with the warning "AUTO-CORRECTED: <fix> - please fix this in future
   responses" in front.

Strict mode (`strict=True`, config `harbor.strict_json_parser`) is the stricter reading some later
Harbor builds use for RL: no auto-correction, and a response with any warning is an error (its
commands do not run); the error text lists the warnings. Harbor 0.26 itself has no strict mode.

`tests/test_terminus2_harbor.py` runs this parser and Harbor's own module (loaded from the harbor
wheel) on the same responses and requires equal results.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

MAX_COMMAND_DURATION_SEC = 60.0  # Terminus-2 caps each command's wait at 60 s
DEFAULT_DURATION_SEC = 1.0  # Terminus-2's default when "duration" is missing or not a number
REQUIRED_FIELDS = ("analysis", "plan", "commands")


@dataclasses.dataclass(frozen=True)
class Command:
    """One Terminus command: `keystrokes` sent verbatim, then a wait of `duration` seconds (already
    capped at 60; NaN or a negative value waits 0)."""

    keystrokes: str
    duration: float


@dataclasses.dataclass
class ParsedResponse:
    """What `parse_response` read from one model turn.

    Attributes:
      commands: the commands to run, in order (empty on error).
      task_complete: the model marked the task complete.
      analysis, plan: the model's text fields ("" when absent or not strings).
      error: why the response cannot be used ("" when it can); nothing runs then.
      warnings: problems that did not stop it (fed back with the next terminal output).
    """

    commands: list[Command]
    task_complete: bool
    analysis: str = ""
    plan: str = ""
    error: str = ""
    warnings: list[str] = dataclasses.field(default_factory=list)

    @property
    def warning_text(self) -> str:
        """The warnings as the feedback shows them: one `- ` line each ("" when none)."""
        return format_warnings(self.warnings)


def format_warnings(warnings) -> str:
    return "\n".join(f"- {w}" for w in warnings)


def _scan_object(text: str) -> tuple[int, int]:
    """(start, end) of the first balanced object by the rules of step 1; (-1, -1) when none closes."""
    depth, start, quoted, skip = 0, -1, False, False
    for i, ch in enumerate(text):
        if skip:
            skip = False
        elif ch == "\\":
            skip = True
        elif ch == '"':
            quoted = not quoted
        elif quoted:
            continue
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0 and start >= 0:
                return start, i + 1
    return -1, -1


def _order_warning(body: str) -> str:
    found = {}
    for name in REQUIRED_FIELDS:
        m = re.search(r'"' + name + r'"\s*:', body)
        if m:
            found[name] = m.start()
    if len(found) < 2:
        return ""
    expected = [k for k in REQUIRED_FIELDS if k in found]
    actual = sorted(expected, key=found.__getitem__)
    if actual == expected:
        return ""
    return f"Fields appear in wrong order. Found: {' → '.join(actual)}, expected: {' → '.join(expected)}"


def _truthy_complete(value: Any) -> bool:
    if isinstance(value, str):
        return value.lower() in ("true", "1", "yes")
    return bool(value)


def _read(text: str) -> ParsedResponse:
    """Steps 1-4 on `text` (no auto-correction)."""
    warnings: list[str] = []
    start, end = _scan_object(text)
    if start < 0:
        return ParsedResponse([], False, error="No valid JSON found in response", warnings=["No valid JSON object found"])
    if text[:start].strip():
        warnings.append("Extra text detected before JSON object")
    if text[end:].strip():
        warnings.append("Extra text detected after JSON object")
    body = text[start:end]
    try:
        data = json.loads(body)
    except json.JSONDecodeError as e:
        shown = f" | Content: {body!r}" if len(body) < 200 else f" | Content preview: {body[:100]!r}..."
        return ParsedResponse([], False, error=f"Invalid JSON: {e}{shown}", warnings=warnings)
    if not isinstance(data, dict):
        return ParsedResponse([], False, error="Response must be a JSON object", warnings=warnings)
    missing = [k for k in REQUIRED_FIELDS if k not in data]
    if missing:
        return ParsedResponse([], False, error=f"Missing required fields: {', '.join(missing)}", warnings=warnings)
    for name in ("analysis", "plan"):
        if not isinstance(data[name], str):
            warnings.append(f"Field '{name}' should be a string")
    raw = data["commands"]
    if not isinstance(raw, list):
        return ParsedResponse([], False, error="Field 'commands' must be an array", warnings=warnings)
    order = _order_warning(body)
    if order:
        warnings.append(order)
    flag = data.get("task_complete")
    if flag is not None and not isinstance(flag, (bool, str)):
        warnings.append("Field 'task_complete' should be a boolean or string")
    complete = _truthy_complete(data.get("task_complete", False))
    analysis = data["analysis"] if isinstance(data["analysis"], str) else ""
    plan = data["plan"] if isinstance(data["plan"], str) else ""
    commands, error = [], ""
    for n, cmd in enumerate(raw, start=1):
        if not isinstance(cmd, dict):
            error = f"Command {n} must be an object"
        elif "keystrokes" not in cmd:
            error = f"Command {n} missing required 'keystrokes' field"
        elif not isinstance(cmd["keystrokes"], str):
            error = f"Command {n} 'keystrokes' must be a string"
        if error:
            break
        keys = cmd["keystrokes"]
        if "duration" not in cmd:
            warnings.append(f"Command {n}: Missing duration field, using default {DEFAULT_DURATION_SEC}")
            duration = DEFAULT_DURATION_SEC
        elif not isinstance(cmd["duration"], (int, float)):  # bool is an int here, as in Harbor
            warnings.append(f"Command {n}: Invalid duration value, using default {DEFAULT_DURATION_SEC}")
            duration = DEFAULT_DURATION_SEC
        else:
            duration = float(cmd["duration"])
        extra = [k for k in cmd if k not in ("keystrokes", "duration")]
        if extra:
            warnings.append(f"Command {n}: Unknown fields: {', '.join(extra)}")
        if n < len(raw) and keys and not keys.endswith("\n"):
            warnings.append(f"Command {n} should end with newline when followed by another command. Otherwise the "
                            "two commands will be concatenated together on the same line.")
        # min(nan, 60) stays nan (Harbor's cap); the terminal waits 0 for it
        commands.append(Command(keys, min(duration, MAX_COMMAND_DURATION_SEC)))
    if error:
        if complete:
            return ParsedResponse([], True, analysis, plan, warnings=warnings + [error])
        return ParsedResponse([], False, analysis, plan, error=error, warnings=warnings)
    return ParsedResponse(commands, complete, analysis, plan, warnings=warnings)


# an object whose values hold at most one level of nested objects
_LOOSE_OBJECT = re.compile(r"\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}", re.DOTALL)


def _close_braces(text: str, error: str):
    if not any(k in error for k in ("Invalid JSON", "Expecting", "Unterminated", "No valid JSON found")):
        return None
    missing = text.count("{") - text.count("}")
    return text + "}" * missing if missing > 0 else None


def _first_decodable(text: str, error: str):
    for m in _LOOSE_OBJECT.findall(text):
        try:
            json.loads(m)
        except json.JSONDecodeError:
            continue
        return m
    return None


_FIXES = (("Fixed incomplete JSON by adding missing closing brace", _close_braces),
          ("Extracted JSON from mixed content", _first_decodable))


def parse_response(text: str, strict: bool = False) -> ParsedResponse:
    """Reads one Terminus-2 JSON response (module docstring).

    Args:
      text: the model's turn, reasoning already removed.
      strict: no auto-correction, and any warning is an error.
    Returns:
      a `ParsedResponse`; never raises on bad input.
    """
    first = _read(text)
    if strict:
        if not first.error and first.warnings:
            return ParsedResponse([], False, first.analysis, first.plan,
                                  error="strict JSON parsing rejects a response with warnings: "
                                        + "; ".join(first.warnings), warnings=list(first.warnings))
        return first
    if not first.error:
        return first
    for name, fix in _FIXES:
        fixed = fix(text, first.error)
        if fixed is None:
            continue
        again = _read(fixed)
        if not again.error:
            again.warnings.insert(0, f"AUTO-CORRECTED: {name} - please fix this in future responses")
            return again
    return first
