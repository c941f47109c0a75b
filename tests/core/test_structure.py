"""The code's shape (issue 21): no module reaches into another module's private names, no
import cycle between the package's parts, and no long function without a written reason.

Walks the AST of ``src/arbormem``; nothing is imported or run.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "arbormem"

#: Reaches into other modules' private names still present, each with who removes it.
#: An entry here is a debt, not a permission: the test fails when an entry is no longer
#: needed, so the list only shrinks.
KNOWN_REACHES = {
    # eval/scale.py's synthetic-history helpers, shared with eval/bench.py's bulk loader
    "eval/scale.py": {"_ASSIST_T", "_NAMES", "_USER_T", "_db_bytes", "_pcts"},
}


def _modules() -> dict[str, ast.Module]:
    return {str(p.relative_to(SRC)): ast.parse(p.read_text(encoding="utf-8")) for p in sorted(SRC.rglob("*.py"))}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined(tree: ast.Module) -> set[str]:
    """Names a module defines itself: functions, classes, methods, assignments, attributes it
    sets on its own objects."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            out.add(node.attr)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
    return out


def _reaches(tree: ast.Module) -> set[str]:
    """Private names this module takes from elsewhere: imported, or read as an attribute of
    an object when the module does not define that name itself."""
    own = _defined(tree)
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            out.update(a.name for a in node.names if _private(a.name))
        elif isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own:
            out.add(node.attr)
    return out


def test_no_module_reaches_into_another_modules_private_names() -> None:
    found = {path: _reaches(tree) for path, tree in _modules().items()}
    new = {p: sorted(r - KNOWN_REACHES.get(p, set())) for p, r in found.items() if r - KNOWN_REACHES.get(p, set())}
    assert not new, f"add a public name to the owner instead: {new}"
    stale = {p: sorted(k - found.get(p, set())) for p, k in KNOWN_REACHES.items() if k - found.get(p, set())}
    assert not stale, f"no longer needed, remove from KNOWN_REACHES: {stale}"


def _part(module: str) -> str:
    """The part of the package a module belongs to: its subpackage, or itself at the top; a
    package's command-line module (``organize/cli.py``, ...) is a door of its own."""
    if module.endswith("/cli.py"):
        return module.removesuffix(".py").replace("/", ".")
    first = module.split("/")[0]
    return first.removesuffix(".py")


def _type_only(tree: ast.Module) -> set[int]:
    """Ids of the import nodes under ``if TYPE_CHECKING:`` (annotations only: no runtime
    dependency, so they do not order the layers)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return out


def _imports(path: str, tree: ast.Module) -> set[str]:
    """Parts of the package that ``path`` imports at run time (relative or absolute)."""
    depth = path.count("/")
    out: set[str] = set()
    skip = _type_only(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                up = node.level - 1
                if up > depth:
                    continue
                base = path.split("/")[: depth - up]
                target = [*base, *(node.module.split(".") if node.module else [])]
                if not target:  # "from . import x" at the top: x is a part
                    out.update(a.name for a in node.names)
                    continue
                out.add(target[0] if target[0] else "")
            elif node.module and node.module.startswith("arbormem."):
                out.add(node.module.split(".")[1])
    return {o for o in out if o}


#: Doors (command lines, servers) may import each other; everything else forms layers.
DOORS = {"cli", "check_cli", "server", "integrations", "__main__", "organize.cli", "eval.cli", "store.cli"}


def _graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for path, tree in _modules().items():
        me = _part(path)
        if me in ("__init__",):
            continue
        for other in _imports(path, tree):
            if other != me and other != "__init__":
                edges[me].add(other)
    return edges


def _cycles(edges: dict[str, set[str]], skip: set[str]) -> list[list[str]]:
    """Strongly connected components of more than one part (Tarjan), doors left out."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w in skip:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in skip and v not in index:
            visit(v)
    return out


def test_no_import_cycles_between_parts_of_the_package() -> None:
    assert _cycles(_graph(), DOORS) == []


#: Functions longer than this need a reason written beside them (a comment or docstring
#: line starting "Long:").
MAX_LINES = 80


#: Benchmark drivers: long linear procedures (load, time, report), exempt.
KNOWN_LONG = {"eval/scale.py", "eval/bench.py"}


def test_long_functions_say_why() -> None:
    long: list[str] = []
    for path, tree in _modules().items():
        if path in KNOWN_LONG:
            continue
        text = (SRC / path).read_text(encoding="utf-8").splitlines()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                n = node.end_lineno - node.lineno + 1
                if n <= MAX_LINES:
                    continue
                top = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                head = "\n".join(text[max(0, top - 4) : node.lineno + 12])
                if "Long:" not in head:
                    long.append(f"{path}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "split these or write why they are long ('Long: ...'): " + "; ".join(long)


def test_architecture_doc_names_every_module() -> None:
    doc = (SRC.parents[1] / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = [str(p.relative_to(SRC)) for p in sorted(SRC.rglob("*.py"))
               if p.name not in ("__init__.py", "__main__.py") and p.name not in doc]
    assert not missing, f"docs/architecture.md does not list: {missing}"
