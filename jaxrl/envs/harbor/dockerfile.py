"""Dockerfile text and build contexts, read without building anything.

* The profile path (`profiles.resolve_environment`) reads a task's Dockerfile line by line with
  `_dockerfile_lines` (logical lines), `_expand` (`$VAR` / `${VAR:-default}`), `exec_form` (Docker's
  exec-form rule) and `_split_chain` (RUN's `&&` / `||` / `;` chains).
* The image backend (`images.py`) scans the external images a Dockerfile names (`dockerfile_bases`,
  `qualified`), rewrites mapped ones to local images (`rewrite_bases`), and names each build by
  `context_hash` (the build context's files and the settings that change the image) as
  `image_tag` (`localhost/jaxrl-task:<16 hex>`).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from typing import Optional

TAG_REPO = "localhost/jaxrl-task"


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


def _file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def context_hash(env_dir: str | os.PathLike, base_images: Optional[dict] = None, builder: str = "buildah",
                 docker_image: Optional[str] = None, base_ids: Optional[dict] = None) -> str:
    """The sha256 (hex) identifying one build: the context's files and the settings that change the image.

    Args:
      env_dir: the build context (the task's `environment/`).
      base_images: the `{FROM name: local image}` map in force.
      builder: the builder's name.
      docker_image: task.toml's `[environment] docker_image`, if any.
      base_ids: `{FROM name: image id}` of the local images the build starts from, so a base rebuilt
        under the same name (a new stand-in) gives new task images instead of stale ones.

    Returns:
      64 hex digits over the sorted relative paths, each entry's type and permission bits, file contents,
      symlink targets (never followed), the sorted base-image map and base ids, the builder name and
      docker_image.

    Raises:
      OSError: the context cannot be read.
    """
    root = os.fspath(env_dir)
    h = hashlib.sha256()
    h.update(f"builder={builder}\0docker_image={docker_image or ''}\0".encode())
    for k, v in sorted((base_images or {}).items()):
        h.update(f"base={k}={v}\0".encode())
    for k, v in sorted((base_ids or {}).items()):
        h.update(f"base_id={k}={v}\0".encode())
    entries = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for n in dirnames + filenames:
            entries.append(os.path.join(dirpath, n))
    for p in sorted(entries, key=lambda p: os.path.relpath(p, root)):
        rel = os.path.relpath(p, root)
        st = os.lstat(p)
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISLNK(st.st_mode):
            body = "link:" + os.readlink(p)
        elif stat.S_ISDIR(st.st_mode):
            body = "dir"
        elif stat.S_ISREG(st.st_mode):
            body = "file:" + _file_digest(p)
        else:
            body = "special"
        h.update(f"{rel}\0{mode:o}\0{body}\0".encode())
    return h.hexdigest()


def image_tag(digest: str) -> str:
    """`localhost/jaxrl-task:<first 16 hex digits>` of a `context_hash`."""
    return f"{TAG_REPO}:{digest[:16]}"


def dockerfile_bases(text: str) -> list[str]:
    """The external images a Dockerfile's `FROM` lines name (stage aliases excluded, `ARG` defaults expanded)."""
    return _scan_images(re.sub(r"\\\r?\n", " ", text), {})[2]


def qualified(name: str) -> str:
    """A short image name as the Docker Hub default would qualify it: `ubuntu:24.04` ->
    `docker.io/library/ubuntu:24.04`, `org/x` -> `docker.io/org/x`; names with a registry are kept."""
    first = name.split("/", 1)[0]
    if "/" in name and ("." in first or ":" in first or first == "localhost"):
        return name
    return f"docker.io/{name}" if "/" in name else f"docker.io/library/{name}"


def rewrite_bases(text: str, mapping: dict) -> tuple[str, list[str]]:
    """The Dockerfile with each mapped external image replaced by its local image, and the external
    images it still names.

    `FROM name` (also `FROM ${ARG}` with an ARG default before the first FROM) and `COPY --from=name`
    whose name (or its docker.io-qualified form) is a key of `mapping` get the mapped local image, so
    a build never retags a shared name in the image store; stage names and `scratch` are kept.

    Returns:
      (new text, [external image names not mapped, in order]).
    """
    new, unmapped, _ = _scan_images(text, mapping)
    return new, unmapped


def _scan_images(text: str, mapping: dict) -> tuple[str, list[str], list[str]]:
    """One pass over a Dockerfile's lines for `rewrite_bases` and `dockerfile_bases`: (the text with
    mapped images replaced, the external images not mapped, the external images of FROM lines)."""
    args: dict = {}
    stages: set = set()
    unmapped: list = []
    bases: list = []
    seen_from = False

    def expand(word: str) -> str:
        return re.sub(r"\$\{?(\w+)(?::-([^}]*))?\}?", lambda m: args.get(m.group(1), m.group(2) or ""), word)

    def local(name: str) -> Optional[str]:
        return mapping.get(name) or mapping.get(qualified(name))

    out = []
    for line in text.splitlines(keepends=True):
        op, _, rest = line.strip().partition(" ")
        op = op.upper()
        if op == "ARG" and not seen_from:
            k, eq, v = rest.strip().partition("=")
            if eq:
                args[k.strip()] = v.strip().strip('"')
        elif op == "FROM":
            seen_from = True
            words = rest.split()
            i = next((j for j, w in enumerate(words) if not w.startswith("--")), None)
            if i is not None:
                name = expand(words[i])
                alias = words[i + 2].lower() if len(words) > i + 2 and words[i + 1].lower() == "as" else None
                if name.lower() not in stages and name != "scratch":
                    if name not in bases:
                        bases.append(name)
                    if local(name):
                        words[i] = local(name)
                        line = line[:len(line) - len(line.lstrip())] + "FROM " + " ".join(words) + "\n"
                    elif name not in unmapped:
                        unmapped.append(name)
                if alias:
                    stages.add(alias)
        elif op in ("COPY", "ADD"):
            m = re.search(r"--from=(\S+)", line)
            if m:
                name = expand(m.group(1))
                if name.lower() not in stages and not name.isdigit():
                    if local(name):
                        line = line[:m.start(1)] + local(name) + line[m.end(1):]
                    elif name not in unmapped:
                        unmapped.append(name)
        out.append(line)
    return "".join(out), unmapped, bases
