"""The import graph of `proxy/`: one direction, no cycle, and never `evalkit`."""

from __future__ import annotations

import ast
from pathlib import Path

import proxy
from tests.imports import find_cycle, import_graph, module_name

PACKAGE = Path(proxy.__file__).parent


def test_the_proxy_package_has_no_import_cycle() -> None:
    graph = import_graph(proxy)
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
                edges.update((module_name(PACKAGE, path), a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                edges.add((module_name(PACKAGE, path), node.module))
    assert not [e for e in edges if e[1].split(".")[0] == "evalkit"]
    io = ("aiohttp", "fastapi", "starlette", "httpx", "redis", "sqlite3", "proxy.upstream")
    pure = [e for e in edges if e[0].startswith(("proxy.protocols", "proxy.guard"))]
    assert not [e for e in pure if e[1].startswith(io)]
