"""docs/ARCHITECTURE.md stays true: the import graph of ``msmon_nb`` read from its source.

Imports under ``if TYPE_CHECKING:`` do not run and are not counted. Every other import
is, wherever it sits (module, class or function level).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "msmon_nb"
DOC = ROOT / "docs" / "ARCHITECTURE.md"

# third-party packages a function-level import may defer (heavy to load, or optional)
HEAVY = {
    "mindspore", "matplotlib", "IPython", "ipywidgets", "anywidget", "mlflow", "PIL",
    "google", "tornado", "zmq", "jupyter_client", "ipykernel", "psutil", "yaml", "tqdm",
    "tensorboard", "comm", "traitlets",
}  # fmt: skip
# modules whose function-level imports are lazy entry points (start-up time)
LAZY_ENTRY = {"msmon_nb", "msmon_nb.cli"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


class Import:
    """One imported name: from where, of what, and whether it runs at import time
    (``deferred``: inside a function; ``probe``: in a ``try`` whose handler reports an
    import that fails)."""

    def __init__(
        self, source: str, target: str, name: str | None, line: int, deferred: bool, probe: bool
    ):
        self.source, self.target, self.name, self.line = source, target, name, line
        self.deferred, self.probe = deferred, probe

    def __repr__(self) -> str:
        where = "function-level " if self.deferred else ""
        return f"{self.source}:{self.line} {where}import of {self.target} ({self.name})"


def imports_of(name: str) -> list[Import]:
    path = MODULES[name]
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[Import] = []

    def visit(node: ast.AST, deferred: bool, probe: bool = False) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                visit(child, True)
            elif isinstance(child, ast.Try) and _catches_import_error(child):
                visit(child, deferred, probe=True)
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    out.append(Import(name, alias.name, None, child.lineno, deferred, probe))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - child.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    target = sub if sub in MODULES else base
                    out.append(Import(name, target, alias.name, child.lineno, deferred, probe))
            else:
                visit(child, deferred, probe)

    visit(tree, False)
    return out


def _catches_import_error(node: ast.Try) -> bool:
    names = {ast.unparse(h.type) for h in node.handlers if h.type is not None}
    return any("ImportError" in n or n == "Exception" for n in names)


IMPORTS = {name: imports_of(name) for name in MODULES}


def internal(imp: Import) -> bool:
    return imp.target == "msmon_nb" or imp.target.startswith("msmon_nb.")


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "msmon_nb"


def allowed_arrows() -> dict[str, set[str]]:
    """room -> the rooms it may import, from the table of docs/ARCHITECTURE.md."""
    text = DOC.read_text()
    table = text[text.index("| room | job | may import |") : text.index("The package root")]
    out = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3:
            continue
        name = cells[0].strip("`")
        out[name] = set(re.findall(r"`([a-z_]+)`", cells[2]))
    return out


def test_no_import_circles():
    graph = {m: {i.target for i in IMPORTS[m] if i.target in MODULES} for m in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def strong(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in graph:
        if v not in index:
            strong(v)
    assert not circles, f"import circles: {circles}"


def test_arrows_between_rooms_follow_the_table():
    allowed = allowed_arrows()
    rooms = {room(m) for m in MODULES} - {"msmon_nb"}
    assert rooms == set(allowed), "every room has a row in docs/ARCHITECTURE.md, and only they"
    bad = []
    for imps in IMPORTS.values():
        for imp in imps:
            if not internal(imp):
                continue
            a, b = room(imp.source), room(imp.target)
            if a == b or a == "msmon_nb":
                continue  # inside a room; the root re-exports anything
            if b not in allowed.get(a, set()):
                bad.append(imp)
    assert not bad, "arrows the table does not allow:\n" + "\n".join(map(repr, bad))


def test_no_private_names_across_modules():
    bad = [
        imp
        for imps in IMPORTS.values()
        for imp in imps
        if internal(imp)
        and imp.name
        and imp.name.startswith("_")
        and not imp.name.startswith("__")
        and imp.target != imp.source
    ]
    assert not bad, "private names imported from other modules:\n" + "\n".join(map(repr, bad))


def heavy(module: str, seen: set[str] | None = None) -> set[str]:
    """The heavy packages ``module`` loads when imported (through our modules too)."""
    seen = set() if seen is None else seen
    if module in seen:
        return set()
    seen.add(module)
    found = set()
    for imp in IMPORTS.get(module, ()):
        if imp.deferred:
            continue
        top = imp.target.split(".")[0]
        if top in HEAVY:
            found.add(top)
        elif internal(imp) and imp.target in MODULES:
            found |= heavy(imp.target, seen)
    return found


def test_function_level_imports_defer_something_heavy():
    bad = []
    for name, imps in IMPORTS.items():
        if name in LAZY_ENTRY:
            continue
        for imp in imps:
            if not imp.deferred or imp.probe:
                continue
            top = imp.target.split(".")[0]
            if top in HEAVY or (internal(imp) and imp.target in MODULES and heavy(imp.target)):
                continue
            bad.append(imp)
    assert not bad, (
        "function-level imports that defer nothing heavy (import them at the top):\n"
        + "\n".join(map(repr, bad))
    )


def test_the_module_table_lists_the_tree():
    text = DOC.read_text()
    listed = set(re.findall(r"^\| `(msmon_nb/[^`]+\.py)` \|", text, flags=re.M))
    files = {p.relative_to(ROOT).as_posix() for p in MODULES.values()}
    assert listed == files, (
        f"in the tree, not in docs/ARCHITECTURE.md: {sorted(files - listed)}; "
        f"listed, not in the tree: {sorted(listed - files)}"
    )


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_docstrings_cite_the_architecture_page(name):
    """A module docstring that cites a design document cites docs/ARCHITECTURE.md (the
    one in the repository), never a document outside it."""
    doc = ast.get_docstring(ast.parse(MODULES[name].read_text())) or ""
    assert "DESIGN.md" not in doc, f"{name}: cite docs/ARCHITECTURE.md"


def _private_attrs(tree: ast.AST) -> set[str]:
    """Private names a module defines: functions, classes, attributes it assigns, slots."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id == "__slots__":
                    try:
                        names.update(ast.literal_eval(node.value))
                    except ValueError:
                        pass
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


TREES = {name: ast.parse(path.read_text()) for name, path in MODULES.items()}
PRIVATE = {name: _private_attrs(tree) for name, tree in TREES.items()}


def test_no_private_attributes_reached_across_modules():
    """``obj._name`` outside ``self``/``cls`` only where this module defines ``_name``:
    another module's private attribute is its own business (issue 33). Privates of
    third-party objects (ipykernel's, ``sys._getframe``) are not ours to police."""
    ours = set().union(*PRIVATE.values())
    bad = []
    for name, tree in TREES.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr in ours):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if node.attr not in PRIVATE[name]:
                bad.append(f"{name}:{node.lineno} {ast.unparse(node)}")
    assert not bad, "private attributes of other modules:\n" + "\n".join(bad)


def test_dynamic_imports_of_our_modules_are_the_lazy_table_only():
    """``importlib.import_module`` hides an arrow from the graph: ours only resolve the
    package's lazy public names (each to a module that exists); the collectors' probe
    MindSpore's modules (not ours)."""
    from msmon_nb import _LAZY

    assert set(_LAZY.values()) <= set(MODULES), set(_LAZY.values()) - set(MODULES)
    callers = {}
    for name, tree in TREES.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("import_module"):
                arg = node.args[0] if node.args else None
                literal = isinstance(arg, ast.Constant)
                if not literal or str(arg.value).startswith("msmon_nb"):
                    callers.setdefault(name, []).append(node.lineno)
    assert set(callers) <= {"msmon_nb", "msmon_nb.collect.gradtaps", "msmon_nb.collect.hooks"}, (
        callers
    )


@pytest.mark.parametrize("module", ["msmon_nb.viewer.server", "msmon_nb.clean", "msmon_nb.monitor"])
def test_starts_without_mindspore(module):
    """The viewer, the cleaner and the monitor's import load no MindSpore (a viewer box
    or a cleaning cron job may have none; a monitor pays for it only when it collects)."""
    import subprocess
    import sys

    code = (
        f"import sys, {module}; print(sorted(m for m in sys.modules if m.startswith('mindspore')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]", out
