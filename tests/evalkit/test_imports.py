"""The import graph of `evalkit/`: no cycle (as `tests/proxy/test_imports.py` holds `proxy/`)."""

from __future__ import annotations

import evalkit
from tests.imports import find_cycle, import_graph


def test_the_evalkit_package_has_no_import_cycle() -> None:
    graph = import_graph(evalkit)
    assert "evalkit.replay.run" in graph
    assert "evalkit.replay" in graph["evalkit.progress"]  # a package is a module of the graph
    assert find_cycle(graph) is None


def test_the_cycle_finder_finds_a_cycle_through_a_package() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
