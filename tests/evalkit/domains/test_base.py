"""Toolkits describe their tools from signatures and docstrings; databases hash canonically."""

from __future__ import annotations

from typing import Any

import pytest

from evalkit.domains.base import DomainDB, Toolkit, tool, tool_schema, update_db


class Counter(DomainDB):
    counts: dict[str, int]


class CounterTools(Toolkit):
    db: Counter

    @tool(mutates=True)
    def bump(self, name: str, by: int = 1, tags: list[str] | None = None) -> int:
        """Add to a counter.

        Args:
            name: The counter's name.
            by: How much to add,
                a whole number.
            tags: Labels to log.

        Returns:
            The new value.
        """
        self.db.counts[name] = self.db.counts.get(name, 0) + by
        return self.db.counts[name]

    @tool()
    def read(self, name: str) -> int:
        """Read a counter.

        Args:
            name: The counter's name.
        """
        return self.db.counts[name]

    def is_zero(self, name: str) -> bool:
        return self.db.counts.get(name, 0) == 0


def test_schema_comes_from_signature_and_docstring() -> None:
    schema = tool_schema(CounterTools.bump)
    function: dict[str, Any] = schema["function"]
    assert function["name"] == "bump"
    assert function["description"] == "Add to a counter."
    assert function["parameters"] == {
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "The counter's name."},
            "by": {"type": "integer", "description": "How much to add, a whole number."},
            "tags": {"type": "array", "items": {"type": "string"}, "description": "Labels to log."},
        },
        "required": ["name"],
    }


def test_only_marked_methods_are_tools_and_other_methods_run_by_name() -> None:
    tools = CounterTools(Counter(counts={"a": 0}))
    assert CounterTools.tool_names() == ["bump", "read"]
    assert CounterTools.mutates("bump")
    assert not CounterTools.mutates("read")
    assert tools.run_function("is_zero", {"name": "a"}) is True
    with pytest.raises(ValueError, match="is_zero"):
        tools.call("is_zero", {"name": "a"})
    with pytest.raises(ValueError, match="Function _secret not found"):
        tools.run_function("_secret", {})


def test_hash_ignores_key_order_but_not_values() -> None:
    first = Counter(counts={"a": 1, "b": 2})
    second = Counter(counts={"b": 2, "a": 1})
    assert first.canonical_hash() == second.canonical_hash()
    assert first.canonical_hash() != Counter(counts={"a": 1, "b": 3}).canonical_hash()


def test_update_db_merges_nested_data_into_a_copy() -> None:
    db = Counter(counts={"a": 1, "b": 2})
    updated = update_db(db, {"counts": {"b": 5}})
    assert updated.counts == {"a": 1, "b": 5}
    assert db.counts == {"a": 1, "b": 2}
