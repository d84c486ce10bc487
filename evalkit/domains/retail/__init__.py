"""The retail domain: a shop's customers, orders and products (τ²-bench's retail, same tools)."""

from __future__ import annotations

from evalkit.domains.retail.domain import DEFAULT_DATA_DIR, RetailDomain, load_retail

__all__ = ["DEFAULT_DATA_DIR", "RetailDomain", "load_retail"]
