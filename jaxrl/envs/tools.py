"""Qwen3 tool calls: parsing `<tool_call>{json}</tool_call>` blocks and running tools.

The Qwen3 chat template asks the model to write each call as

    <tool_call>
    {"name": <function-name>, "arguments": <args-json-object>}
    </tool_call>

and renders each result (a `{"role": "tool", "content": ...}` message) as
`<tool_response>\\n{content}\\n</tool_response>` inside one user turn (Qwen3 notes §2). Every
problem with a call (malformed JSON, unknown tool, bad arguments, a tool that raises) becomes an
error *observation* for the model, never an exception in the rollout loop.
"""
from __future__ import annotations

import ast
import dataclasses
import json
import operator
import re
from typing import Any, Callable, Mapping, Sequence, Union

_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
CALL_FORMAT = '<tool_call>\n{"name": <tool name>, "arguments": {<argument>: <value>, ...}}\n</tool_call>'


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """A well-formed call: tool `name` with JSON-object `arguments`."""

    name: str
    arguments: dict


@dataclasses.dataclass(frozen=True)
class ToolCallError:
    """A `<tool_call>` block that could not be parsed: its raw body and why."""

    raw: str
    error: str


ParsedCall = Union[ToolCall, ToolCallError]


def parse_tool_calls(text: str) -> list[ParsedCall]:
    """Parses every `<tool_call>...</tool_call>` block of an assistant message, in order.

    Args:
      text: the assistant's text (thinking already removed, see `chat.split_thinking`).
    Returns:
      one entry per block: `ToolCall` when the body is a JSON object with a string "name" and an
      object "arguments" (a JSON string holding an object is accepted too, as vLLM's hermes parser
      does), else `ToolCallError`. A `<tool_call>` without a closing tag gives a final
      `ToolCallError`. Text outside the blocks is ignored; no blocks gives [].
    """
    calls: list[ParsedCall] = []
    end = 0
    for match in _CALL_RE.finditer(text):
        calls.append(_parse_one(match.group(1).strip()))
        end = match.end()
    tail = text[end:]
    if "<tool_call>" in tail:
        raw = tail.split("<tool_call>", 1)[1].strip()
        calls.append(ToolCallError(raw, "missing closing </tool_call> tag"))
    return calls


def _parse_one(body: str) -> ParsedCall:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return ToolCallError(body, f"the call is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})")
    if not isinstance(obj, dict):
        return ToolCallError(body, f"the call must be a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCallError(body, 'the call has no "name" string')
    if "arguments" not in obj:
        return ToolCallError(body, 'the call has no "arguments" object')
    args = obj["arguments"]
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return ToolCallError(body, '"arguments" must be a JSON object')
    if not isinstance(args, dict):
        return ToolCallError(body, '"arguments" must be a JSON object')
    return ToolCall(name, args)


@dataclasses.dataclass(frozen=True)
class Tool:
    """A function the model may call.

    Attributes:
      name: the name the model writes in `"name"`.
      description: one line for the tool list in the system prompt.
      parameters: JSON schema of the arguments object (`type: object`, `properties`, `required`).
      fn: called as `fn(**arguments)`; returns the result text. Exceptions it raises become
        error observations.
    """

    name: str
    description: str
    parameters: dict
    fn: Callable[..., Any]

    def schema(self) -> dict:
        """The OpenAI-style function schema the chat template lists inside `<tools>`."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    def check_arguments(self, arguments: Mapping[str, Any]) -> None:
        """Raises ValueError naming a missing required or an unexpected argument."""
        props = self.parameters.get("properties", {})
        for key in self.parameters.get("required", []):
            if key not in arguments:
                raise ValueError(f"missing required argument {key!r}")
        for key in arguments:
            if key not in props:
                raise ValueError(f"unexpected argument {key!r}; expected arguments: {', '.join(props) or 'none'}")


def run_tool_calls(calls: Sequence[ParsedCall], tools: Mapping[str, Tool]) -> list[dict]:
    """Runs parsed calls and returns one `{"role": "tool", "content": ...}` message per call.

    Error texts (all start with "Error: "):
      * unparsable block: `Error: invalid tool call: <why>. Write each call as <CALL_FORMAT>`
      * unknown tool: `Error: unknown tool '<name>'. Available tools: <a>, <b>.`
      * bad arguments: `Error: tool '<name>': <why>.`
      * the tool raised: `Error: tool '<name>' failed: <exception message>`
    """
    available = ", ".join(sorted(tools)) or "none"
    out = []
    for call in calls:
        if isinstance(call, ToolCallError):
            content = f"Error: invalid tool call: {call.error}. Write each call as {CALL_FORMAT}"
        elif call.name not in tools:
            content = f"Error: unknown tool {call.name!r}. Available tools: {available}."
        else:
            tool = tools[call.name]
            try:
                tool.check_arguments(call.arguments)
            except ValueError as e:
                content = f"Error: tool {call.name!r}: {e}."
            else:
                try:
                    content = str(tool.fn(**call.arguments))
                except Exception as e:  # noqa: BLE001 -- any tool failure is an observation
                    content = f"Error: tool {call.name!r} failed: {e}"
        out.append({"role": "tool", "content": content})
    return out


# ---- the built-in calculator ---------------------------------------------------------------------
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_UNOPS = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPRESSION_CHARS = 200


def evaluate_arithmetic(expression: str) -> str:
    """Evaluates `+ - * / // %`, unary signs and parentheses on int/float literals (no names, no `**`).

    Returns:
      the value as text: integers (and floats with an integral value) without a decimal point,
      other floats with up to 12 significant digits (`format(x, ".12g")`).
    Raises:
      ValueError: empty or over-long expression, syntax error, a disallowed construct, or
        division by zero.
    """
    if not isinstance(expression, str) or not expression.strip():
        raise ValueError("expression must be a non-empty string")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"cannot parse expression {expression!r}") from None

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
                raise ValueError("division by zero")
            return _BINOPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNOPS:
            return _UNOPS[type(node.op)](ev(node.operand))
        raise ValueError(f"unsupported syntax in expression {expression!r}; use numbers, + - * / // % and ( )")

    value = ev(tree)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError("result is not a finite number")
        if value.is_integer():
            return str(int(value))
        return format(value, ".12g")
    return str(value)


CALCULATOR = Tool(
    name="calculator",
    description="Evaluate an arithmetic expression with numbers, + - * / // % and parentheses.",
    parameters={
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "The expression, e.g. 12 * (3 + 4)."}},
        "required": ["expression"],
    },
    fn=evaluate_arithmetic,
)

BUILTIN_TOOLS: dict[str, Tool] = {CALCULATOR.name: CALCULATOR}
"""Tools a task can name in its `tools` field."""
