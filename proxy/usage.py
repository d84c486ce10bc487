"""Token usage of several upstream attempts, summed into the one usage the client gets."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def sum_usage(usages: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Add usage objects field by field (nested detail objects too, whatever the protocol names
    them); a field that is not a number keeps its first value."""
    total: dict[str, Any] = {}
    for usage in usages:
        for key, value in usage.items():
            if isinstance(value, bool) or value is None:
                total.setdefault(key, value)
            elif isinstance(value, int | float):
                current = total.get(key)
                total[key] = (current if isinstance(current, int | float) else 0) + value
            elif isinstance(value, Mapping):
                current = total.get(key)
                total[key] = sum_usage(
                    [current, value] if isinstance(current, Mapping) else [value]
                )
            else:
                total.setdefault(key, value)
    return total
