"""Dockerfile text, read without building it: logical lines, `$VAR` expansion, exec form, RUN chains.

The profile path (`profiles.resolve_environment`) reads a task's Dockerfile line by line with these.
"""
from __future__ import annotations

import json
import re
from typing import Optional


def _dockerfile_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, logical line) pairs: continuations joined, comments and blanks dropped."""
    out, buf, start = [], "", 0
    for i, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip()
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue  # comment lines inside a continuation are dropped by Docker
        if not buf:
            start = i
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        out.append((start, buf + line))
        buf = ""
    if buf.strip():
        out.append((start, buf))
    return out


_VAR_RE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def _expand(s: str, variables: dict) -> str:
    def sub(m):
        name = m.group(1) or m.group(3)
        if name in variables:
            return variables[name]
        return m.group(2) if m.group(2) is not None else ""
    return _VAR_RE.sub(sub, s)


def _split_chain(cmd: str) -> list[str]:
    """Splits a RUN shell command on top-level `&&`, `||` and `;` (quotes respected): every part must
    be one the sandbox honours, whichever of them would run."""
    parts, cur, quote, i = [], "", None, 0
    while i < len(cmd):
        c = cmd[i]
        if quote:
            cur += c
            if c == quote:
                quote = None
            elif c == "\\" and quote == '"' and i + 1 < len(cmd):
                cur += cmd[i + 1]
                i += 1
        elif c in "'\"":
            quote = c
            cur += c
        elif cmd.startswith("&&", i) or cmd.startswith("||", i):
            parts.append(cur)
            cur = ""
            i += 1
        elif c == ";":
            parts.append(cur)
            cur = ""
        else:
            cur += c
        i += 1
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def exec_form(args: str) -> Optional[list[str]]:
    """The argv of an instruction's exec form, or None when `args` is shell form.

    Docker's rule, for every instruction with both forms (RUN, CMD, ENTRYPOINT, HEALTHCHECK CMD, COPY,
    ADD): the text is exec form only if it parses as a JSON array of strings; anything else, a
    leading `[` included (`RUN [ -e /x ] || true`), is shell form.
    """
    text = args.strip()
    if not text.startswith("["):
        return None
    try:
        argv = json.loads(text)
    except ValueError:
        return None
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        return None
    return argv
