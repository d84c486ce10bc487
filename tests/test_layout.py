"""The repository's top-level layout: tests/ and bench/ never import each other, in either direction
(STYLE: "bench/ is a small library of its own; tests and benchmarks never import each other")."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, by absolute name (also inside functions or TYPE_CHECKING)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def crossings() -> set[tuple[str, str]]:
    """(file, module) for each import from tests/ into bench/ or from bench/ into tests/."""
    out = set()
    for tree, other in (("tests", "bench"), ("bench", "tests")):
        for path in sorted((ROOT / tree).rglob("*.py")):
            for module in imports_of(path):
                if module == other or module.startswith(f"{other}."):
                    out.add((path.relative_to(ROOT).as_posix(), module))
    return out


def test_tests_and_benchmarks_never_import_each_other() -> None:
    """What both need (the live requests and their judge, the vLLM lookup) lives in scripts/."""
    assert crossings() == set()


def test_the_scan_sees_imports_inside_functions(tmp_path: Path) -> None:
    module = tmp_path / "module.py"
    module.write_text("def f():\n    from bench.drivers import run_wrk\n    import tests.live\n")
    assert imports_of(module) == {"bench.drivers", "tests.live"}


LONGEST_FUNCTION = 79
"""Lines a function of proxy/ or evalkit/ may take: one that grows past it is cut at its steps."""
LONGEST_MODULE = 700
"""Lines a module of proxy/ or evalkit/ may take: past it, it holds more than one concept."""


def sizes() -> tuple[list[str], list[str]]:
    """The functions and the modules of proxy/ and evalkit/ over their limits, described."""
    functions, modules = [], []
    for package in ("proxy", "evalkit"):
        for path in sorted((ROOT / package).rglob("*.py")):
            text = path.read_text()
            where = path.relative_to(ROOT).as_posix()
            if (lines := len(text.splitlines())) > LONGEST_MODULE:
                modules.append(f"{where}: {lines} lines")
            for node in ast.walk(ast.parse(text, where)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    if length > LONGEST_FUNCTION:
                        functions.append(f"{where}: {node.name} ({length} lines)")
    return functions, modules


def test_no_function_of_proxy_or_evalkit_is_80_lines_or_longer() -> None:
    assert sizes()[0] == []


def test_no_module_of_proxy_or_evalkit_is_over_700_lines() -> None:
    assert sizes()[1] == []
