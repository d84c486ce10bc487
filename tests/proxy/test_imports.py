"""The import graph of `proxy/`: one direction, no cycle, and never `evalkit`."""

from __future__ import annotations

import ast
from pathlib import Path

import proxy

PACKAGE = Path(proxy.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Each module of `proxy` and the modules it imports (any import, also under TYPE_CHECKING
    or inside a function), resolved to modules of the package."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets.add(base)
                targets.update(f"{base}.{alias.name}" for alias in node.names)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` as the list of its modules, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_proxy_package_has_no_import_cycle() -> None:
    graph = import_graph()
    assert "proxy.pipeline.turn" in graph
    assert "proxy.protocols.chat" in graph
    assert find_cycle(graph) is None


def test_the_cycle_finder_finds_a_cycle_through_a_package() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_protocol_adapters_and_the_guard_do_no_io_and_proxy_never_imports_evalkit() -> None:
    edges = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges.update((_module_name(path), a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                edges.add((_module_name(path), node.module))
    assert not [e for e in edges if e[1].split(".")[0] == "evalkit"]
    io = ("aiohttp", "fastapi", "starlette", "httpx", "redis", "sqlite3", "proxy.upstream")
    pure = [e for e in edges if e[0].startswith(("proxy.protocols", "proxy.guard"))]
    assert not [e for e in pure if e[1].startswith(io)]
