"""The package's import structure: no import cycle in moetune/, serving code free of the tuner.

The graph is static: every ``import`` and ``from ... import`` of a moetune module anywhere in a module
(module level and inside functions; not under ``if TYPE_CHECKING:``, which never runs), relative
imports resolved, ``from moetune.x import y`` counting as importing ``moetune.x.y`` where ``y`` is a
submodule. An edge goes to the named module only: a parent package's ``__init__`` is already being
imported when its submodules import each other.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "moetune"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = getattr(test, "id", None) or getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                for child in node.body:
                    skip.update(id(n) for n in ast.walk(child))
    return skip


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The moetune modules ``name`` imports anywhere in its source."""
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_nodes(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()

    def nearest(mod: str) -> str | None:  # the module itself, else its nearest enclosing package
        while mod and mod not in modules:
            mod = mod.rpartition(".")[0]
        return mod or None

    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod for a in node.names]
        else:
            continue
        for t in targets:
            if t == "moetune" or t.startswith("moetune."):
                hit = nearest(t)
                if hit is not None and hit != name:
                    out.add(hit)
    return out


@cache
def graph() -> dict[str, frozenset[str]]:
    modules = _modules()
    return {name: frozenset(_imports(name, path, modules)) for name, path in modules.items()}


def _cycles(g: dict[str, frozenset[str]]) -> list[list[str]]:
    """One cycle (a list of modules, the first repeated last) per strongly connected component."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[set[str]] = []
    counter = [0]

    def strong(v: str) -> None:  # Tarjan; the package is small enough for recursion
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for v in sorted(g):
        if v not in index:
            strong(v)
    out = []
    for comp in comps:  # a shortest cycle through the component's first module, by breadth-first search
        start = min(comp)
        prev: dict[str, str] = {}
        frontier = [start]
        found = None
        while frontier and found is None:
            nxt = []
            for v in frontier:
                for w in sorted(g[v] & comp):
                    if w == start:
                        found = v
                        break
                    if w not in prev:
                        prev[w] = v
                        nxt.append(w)
                if found is not None:
                    break
            frontier = nxt
        path = [found]
        while path[-1] != start:
            path.append(prev[path[-1]])
        out.append([start, *reversed(path[:-1]), start] if len(path) > 1 else [start, found, start])
    return sorted(out)


def _reach(g: dict[str, frozenset[str]], start: str) -> dict[str, str]:
    """Every module ``start`` imports, directly or not, mapped to the module that imports it."""
    seen: dict[str, str] = {}
    todo = [start]
    while todo:
        v = todo.pop()
        for w in g[v]:
            if w not in seen and w != start:
                seen[w] = v
                todo.append(w)
    return seen


def test_the_graph_sees_function_level_and_relative_imports(tmp_path):
    g = graph()
    assert len(g) > 40 and all(m == "moetune" or m.startswith("moetune.") for m in g)
    # the lazy public names resolve through the package, so the graph must hold real edges
    assert any(g.values())
    modules = {"moetune": PKG / "__init__.py", "moetune.a": tmp_path / "a.py",
               "moetune.b": tmp_path / "b", "moetune.b.c": tmp_path / "c.py"}
    (tmp_path / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import moetune.x\n"
        "def f():\n    from .b import c\n    import moetune.b\n")
    assert _imports("moetune.a", tmp_path / "a.py", modules) == {"moetune.b.c", "moetune.b"}
    assert _cycles({"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}),
                    "d": frozenset({"a"})}) == [["a", "b", "c", "a"]]


def test_no_import_cycle_in_the_package():
    cycles = _cycles(graph())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_serving_code_never_imports_the_tuner_or_the_specs():
    g = graph()
    bad = []
    for mod in sorted(g):
        if mod.startswith(("moetune.kernels", "moetune.tables")):
            via = _reach(g, mod)
            for target in sorted(via):
                if target.startswith(("moetune.specs", "moetune.tuner", "moetune.cli")):
                    chain = [target]
                    while chain[-1] != mod:
                        chain.append(via[chain[-1]])
                    bad.append(" -> ".join(reversed(chain)))
    assert not bad, "serving code reaches the tuner side:\n" + "\n".join(bad)


SERVING = """
import json, sys
import moetune.kernels.fp8_decode.layer
import moetune
for name in ("fp8_decode_moe", "fp4_prefill_moe", "gather_rows_with_scales"):
    getattr(moetune, name)
moetune.picker.pick_config
heavy = ("moetune.tuner", "moetune.specs", "moetune.cli", "typer", "rich", "pandas", "matplotlib")
print(json.dumps(sorted(m for m in sys.modules if m in heavy or m.startswith(tuple(h + "." for h in heavy)))))
"""


def test_serving_imports_load_no_tuner_cli_or_dataframes():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", SERVING], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded == [], f"serving imports loaded {loaded}"
