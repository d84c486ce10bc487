"""The telecom domain: a carrier's customers, lines and bills, and the customer's own phone
(τ²-bench's telecom, same tools on both sides, dual control)."""

from __future__ import annotations

from evalkit.domains.telecom.domain import (
    DEFAULT_DATA_DIR,
    TelecomDomain,
    load_telecom,
    sync_device,
    telecom_policy,
)

__all__ = ["DEFAULT_DATA_DIR", "TelecomDomain", "load_telecom", "sync_device", "telecom_policy"]
