"""The wrong tool names a simulated model calls, per domain: fixed, weighted, plausible.

A real model that hallucinates a tool name does not pick one at random: it reaches for the few
names its training made likely (`cancel_order` for `cancel_pending_order`), and a quantized model
reaches for the same names more often. So every profile draws from the same list with the same
weights; only how often it draws differs. Names the request does declare are never drawn (a
domain may have a real tool of that name).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Final

# (name, weight), most likely first.
WRONG_TOOL_NAMES: Final[dict[str, tuple[tuple[str, int], ...]]] = {
    "retail": (
        ("cancel_order", 30),
        ("get_order_status", 22),
        ("refund_order", 16),
        ("lookup_user", 12),
        ("get_customer_info", 9),
        ("update_shipping_address", 7),
        ("exchange_items", 5),
        ("search_products", 4),
        ("return_order", 3),
        ("check_inventory", 2),
    ),
    "telecom": (
        ("check_network_status", 30),
        ("reset_device", 22),
        ("enable_roaming", 16),
        ("get_account_info", 12),
        ("toggle_airplane_mode", 9),
        ("check_data_usage", 7),
        ("restart_phone", 5),
        ("update_apn_settings", 4),
        ("get_bill_details", 3),
        ("activate_sim", 2),
    ),
}

# For a domain without its own list: names any customer-service model might reach for.
GENERIC_WRONG_TOOL_NAMES: Final[tuple[tuple[str, int], ...]] = (
    ("lookup_customer", 30),
    ("get_status", 22),
    ("search", 16),
    ("update_record", 12),
    ("get_details", 9),
    ("cancel_request", 7),
)


def vocabulary(domain: str) -> tuple[tuple[str, int], ...]:
    """The weighted wrong names of `domain` (the generic list for a domain without one)."""
    return WRONG_TOOL_NAMES.get(domain, GENERIC_WRONG_TOOL_NAMES)


def wrong_tool_name(
    domain: str,
    declared: Collection[str],
    draw: float,
    names_of_profile: Mapping[str, int] | None = None,
) -> str | None:
    """The wrong name a uniform `draw` in [0, 1) picks from `domain`'s vocabulary, or from
    `names_of_profile` (weighted names) when a profile brings its own.

    Names in `declared` are left out and the rest keep their relative weights. Returns None
    when every name of the vocabulary is declared.
    """
    weighted = tuple(names_of_profile.items()) if names_of_profile else vocabulary(domain)
    names = [(name, weight) for name, weight in weighted if name not in declared]
    total = sum(weight for _, weight in names)
    if total == 0:
        return None
    point = draw * total
    for name, weight in names:
        if point < weight:
            return name
        point -= weight
    return names[-1][0]
