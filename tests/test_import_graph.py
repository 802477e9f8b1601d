"""The import graph of the `jaxrl` package has no cycle, and library code never imports a command.

The graph is read from the source with `ast` (nothing is imported). Its nodes are the modules of
the package: every `.py` file under jaxrl/ whose folders are all packages (have an `__init__.py`;
so `jaxrl/assets/...` is data, not modules), a package being its `__init__.py`. An edge A -> B
means that A's source names module B in an import statement, wherever the statement is: at module
level, inside a function or a method (lazy imports count: they run as soon as the function is
called), under `if TYPE_CHECKING:`, in a `try:`. Precisely:

* `import a.b.c` -> a.b.c (the longest prefix that is a module of the package, should a.b.c not be
  one);
* `from a.b import n` -> a.b.n when a.b.n is a module (a submodule imported by name), else a.b (a
  name defined in a.b); `from a.b import *` -> a.b;
* relative imports (`from . import x`, `from ..y import z`) are resolved against A's package first;
* `importlib.import_module("a.b")` and `__import__("a.b")` with a string constant count as
  `import a.b` (an import behind a string is still an import);
* importing a.b.c runs the `__init__.py` of a and a.b first, but that is not an edge: the parent
  package's `__init__` importing its own submodules would otherwise be a cycle of every package.

Code under a module's top-level `if __name__ == "__main__":` is not part of the module: it runs
only when the file is the program (`python -m a.b`, as the module `__main__`), never when a.b is
imported. Its imports are edges of a separate node `a.b:__main__`, which nothing imports (so it
is never on a cycle) and which is a command entry point.

Commands: `jaxrl.cli` is the command-line plumbing of the commands (help, one-line usage errors,
SIGTERM, `--config.KEY` overrides); only the command modules below may import it, and no other
module may import a command module. Library modules (everything else: config, envs, rl, rollout,
train, models, ...) report errors by raising exceptions whose text they own (e.g.
`config.ConfigError`); commands turn them into one-line messages and exit statuses.
"""
from __future__ import annotations

import ast
import os
from typing import Optional

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jaxrl")

# The command modules (`python -m jaxrl.X` entry points and their shared plumbing `jaxrl.cli`):
# the only modules allowed to import `jaxrl.cli` or one another.
COMMAND_MODULES = frozenset({
    "jaxrl.cli",  # the plumbing itself
    "jaxrl.main",  # python -m jaxrl.main: training
    "jaxrl.plan",  # python -m jaxrl.plan: memory / layout plan of a recipe
    "jaxrl.evaluate",  # python -m jaxrl.evaluate
    "jaxrl.chat",  # python -m jaxrl.chat
    "jaxrl.tasks",  # python -m jaxrl.tasks: terminal-task checks
    "jaxrl.config_cli",  # python -m jaxrl.config show|diff (jaxrl/config/__main__.py's __main__ block calls it)
})
MAIN_SUFFIX = ":__main__"  # the node of a module's `if __name__ == "__main__":` block, also a command


def _modules() -> dict[str, str]:
    """{dotted module name: file path} of every module of the package."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(ROOT):
        rel = os.path.relpath(dirpath, os.path.dirname(ROOT))
        parts = rel.split(os.sep)
        # only folders that are packages all the way up (jaxrl/assets/... holds data, not modules)
        if not all(os.path.isfile(os.path.join(os.path.dirname(ROOT), *parts[:i + 1], "__init__.py"))
                   for i in range(len(parts))):
            dirnames[:] = []
            continue
        dirnames.sort()
        for f in sorted(filenames):
            if f.endswith(".py"):
                name = ".".join(parts) if f == "__init__.py" else ".".join(parts + [f[:-3]])
                out[name] = os.path.join(dirpath, f)
    return out


def _is_main_guard(node: ast.stmt) -> bool:
    """`if __name__ == "__main__":` at module level."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    t = node.test
    sides = [t.left, *t.comparators]
    return (len(t.ops) == 1 and isinstance(t.ops[0], ast.Eq)
            and any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
            and any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides))


def _imports(tree: ast.AST):
    """(line, kind, module, names, level) of every import in `tree` (kind "import" or "from"; names
    for "from"), including importlib.import_module / __import__ of a string constant."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, "import", alias.name, (), 0
        elif isinstance(node, ast.ImportFrom):
            yield node.lineno, "from", node.module or "", tuple(a.name for a in node.names), node.level
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name in ("import_module", "__import__"):
                yield node.lineno, "import", node.args[0].value, (), 0


def _resolve(module: str, is_package: bool, kind: str, target: str, names, level: int,
             modules: dict[str, str]) -> list[str]:
    """The jaxrl modules one import statement of `module` names."""
    if level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (level - 1)]
        target = ".".join(base + ([target] if target else []))

    def known(name: str) -> Optional[str]:
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            if ".".join(parts[:i]) in modules:
                return ".".join(parts[:i])
        return None

    if not (target == "jaxrl" or target.startswith("jaxrl.")):
        return []
    if kind == "import":
        return [m for m in [known(target)] if m]
    out = []
    for n in names:
        sub = f"{target}.{n}"
        m = sub if n != "*" and sub in modules else known(target)
        if m:
            out.append(m)
    return out


def import_graph() -> dict[str, dict[str, int]]:
    """{module: {imported module: first line}} over the package (see the module docstring)."""
    modules = _modules()
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
        is_package = path.endswith("__init__.py")
        parts = [(name, [s for s in tree.body if not _is_main_guard(s)]),
                 (name + MAIN_SUFFIX, [s for s in tree.body if _is_main_guard(s)])]
        for node_name, body in parts:
            edges = graph.setdefault(node_name, {})
            for stmt in body:
                for line, kind, target, names, level in _imports(stmt):
                    for m in _resolve(name, is_package, kind, target, names, level, modules):
                        if m != name:
                            edges.setdefault(m, line)
        if not graph[name + MAIN_SUFFIX]:
            del graph[name + MAIN_SUFFIX]
    return graph


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """A set of cycles that covers every edge lying on a cycle: for each such edge u -> v, u -> v
    and the shortest path back from v to u (rotations of one cycle are listed once)."""
    from collections import deque

    def shortest(src: str, dst: str) -> Optional[list[str]]:
        prev = {src: None}
        q = deque([src])
        while q:
            x = q.popleft()
            if x == dst:
                path = [x]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return path[::-1]
            for y in sorted(graph.get(x, {})):
                if y not in prev:
                    prev[y] = x
                    q.append(y)
        return None

    seen, out = set(), []
    for u in sorted(graph):
        for v in sorted(graph[u]):
            back = shortest(v, u)
            if back is None:
                continue
            cycle = [u] + back  # u -> v -> ... -> u
            ring = cycle[:-1]
            i = ring.index(min(ring))
            key = tuple(ring[i:] + ring[:i])
            if key not in seen:
                seen.add(key)
                out.append(cycle)
    return out


def _chain(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    """`a (line 12) -> b (line 40) -> a`: each arrow with the line of the importing module."""
    return "".join(f"{a} (line {graph[a][b]}) -> " for a, b in zip(cycle, cycle[1:])) + cycle[-1]


def test_modules_found():
    graph = import_graph()
    assert {"jaxrl", "jaxrl.config", "jaxrl.cli", "jaxrl.envs.base", "jaxrl.train.trainer"} <= set(graph)
    assert not any(m.startswith("jaxrl.assets") for m in graph)
    # `python -m jaxrl.config` runs config_cli.main from jaxrl/config/__main__.py's __main__ block: an edge of
    # that block only; neither the package nor its __main__ module imports the command
    assert "jaxrl.config_cli" in graph["jaxrl.config.__main__" + MAIN_SUFFIX]
    assert "jaxrl.config_cli" not in graph["jaxrl.config"] and "jaxrl.config_cli" not in graph["jaxrl.config.__main__"]
    assert COMMAND_MODULES <= set(graph), COMMAND_MODULES - set(graph)


def test_resolution():
    modules = {"jaxrl": "", "jaxrl.envs": "", "jaxrl.envs.base": "", "jaxrl.envs.tasks": "",
               "jaxrl.envs.tasks.arithmetic": ""}
    r = lambda *a: _resolve(*a, modules=modules)  # noqa: E731
    assert r("jaxrl.envs.tasks", True, "from", "arithmetic", ("X",), 1) == ["jaxrl.envs.tasks.arithmetic"]
    assert r("jaxrl.envs.tasks.arithmetic", False, "from", "base", ("Task",), 2) == ["jaxrl.envs.base"]
    assert r("jaxrl.envs.base", False, "from", "", ("tasks",), 1) == ["jaxrl.envs.tasks"]
    assert r("jaxrl.envs.base", False, "from", "jaxrl.envs", ("Task", "base"), 0) == ["jaxrl.envs",
                                                                                       "jaxrl.envs.base"]
    assert r("jaxrl.envs.base", False, "import", "jaxrl.envs.tasks.arithmetic", (), 0) == [
        "jaxrl.envs.tasks.arithmetic"]
    assert r("jaxrl.envs.base", False, "import", "numpy", (), 0) == []


def test_no_import_cycles():
    graph = import_graph()
    cycles = _cycles(graph)
    report = "\n".join(_chain(c, graph) for c in cycles)
    print(report)
    assert not cycles, f"{len(cycles)} import cycles in jaxrl/ (each: importer (line) -> imported):\n{report}"


def test_library_imports_no_command():
    graph = import_graph()
    bad = [f"{a} (line {line}) imports {b}" for a, edges in sorted(graph.items()) for b, line in sorted(edges.items())
           if b in COMMAND_MODULES and a not in COMMAND_MODULES and not a.endswith(MAIN_SUFFIX)]
    report = "\n".join(bad)
    print(report)
    assert not bad, f"library modules import a command module ({sorted(COMMAND_MODULES)}):\n{report}"
