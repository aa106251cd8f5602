"""The import graph of the product: no cycle between modules, and every import between pkb_mcp's
packages allowed by the table in docs/architecture.md ("Packages"), which this test reads. harness/
imports neither pkb_mcp nor sandbox (it runs in any image); sandbox/ does not import pkb_mcp.

Imports inside functions and `TYPE_CHECKING` blocks count: they only defer a cycle, they do not
remove it. The files are read as text (ast), never imported."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("pkb_mcp", "harness", "sandbox")
TABLE_ROW = re.compile(r"^\| `(\w+)` \| .* \| ([^|]*) \|$")


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def imported(path: Path, modules: set[str]) -> Iterator[str]:
    """Every product module `path` imports, as a module of `modules` (a name imported from a package
    counts as its submodule where there is one, and as the package itself)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


def graph() -> dict[str, set[str]]:
    files = [p for top in PRODUCT for p in (ROOT / top).rglob("*.py")]
    modules = {module_name(p) for p in files}
    return {module_name(p): set(imported(p, modules)) for p in files}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def allowed_imports() -> dict[str, set[str]]:
    """The 'may import' column of docs/architecture.md's package table, by package."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Packages", 1)[1].split("\n## ", 1)[0]
    table = {}
    for line in section.splitlines():
        if (m := TABLE_ROW.match(line)) and m.group(1) != "package":
            table[m.group(1)] = {w for w in re.findall(r"[a-z]+", m.group(2))} - {"each", "other"}
    return table


def unit(module: str) -> str | None:
    """The row of the package table a pkb_mcp module belongs to (None outside pkb_mcp)."""
    parts = module.split(".")
    if parts[0] != "pkb_mcp":
        return None
    if module == "pkb_mcp.__main__":
        return "frontends"  # `python -m pkb_mcp` is the pkb command
    if module == "pkb_mcp.service":
        return "service"
    if len(parts) > 1 and (ROOT / "pkb_mcp" / parts[1]).is_dir():
        return parts[1]
    return "root"


def test_the_product_has_no_import_cycle():
    found = cycles(graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_package_table_names_every_package_of_pkb_mcp():
    table = allowed_imports()
    packages = {p.name for p in (ROOT / "pkb_mcp").iterdir() if (p / "__init__.py").is_file()}
    assert packages | {"root", "service"} == set(table), "docs/architecture.md's table and pkb_mcp/ disagree"
    assert all(table[row] <= set(table) for row in table), "a 'may import' names no package"


def test_every_import_between_packages_is_allowed_by_the_table():
    table = allowed_imports()
    wrong = []
    for module, targets in graph().items():
        here = unit(module)
        if here is None:
            continue
        for target in targets:
            there = unit(target)
            if there is not None and there != here and there not in table[here]:
                wrong.append(f"{module} ({here}) imports {target} ({there})")
    assert not wrong, "imports docs/architecture.md's table does not allow:\n" + "\n".join(sorted(wrong))


@pytest.mark.parametrize(
    ("side", "forbidden"), [("harness", ("pkb_mcp", "sandbox")), ("sandbox", ("pkb_mcp",))]
)
def test_the_sandbox_side_imports_nothing_of_the_host(side, forbidden):
    bad = sorted(
        f"{module} imports {target}"
        for module, targets in graph().items()
        if module.split(".")[0] == side
        for target in targets
        if target.split(".")[0] in forbidden
    )
    assert not bad, bad


def test_the_checks_see_a_cycle_and_a_forbidden_import(tmp_path):
    """The checks themselves can fail: a two-module cycle is found, and an upward import is refused."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    table = allowed_imports()
    assert "frontends" not in table["runs"] and "jobs" not in table["service"]
    assert unit("pkb_mcp.runs.judge") == "runs" and unit("pkb_mcp.models") == "root"


MAX_MODULE_LINES = 700  # a module a newcomer reads in one sitting (docs/architecture.md)


def test_no_module_of_the_product_is_over_the_line_limit():
    long = {
        str(path.relative_to(ROOT)): n
        for side in PRODUCT
        for path in (ROOT / side).rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"split these (at most {MAX_MODULE_LINES} lines a module): {long}"
