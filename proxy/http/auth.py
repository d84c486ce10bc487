"""Client and admin keys: bearer tokens compared in constant time (DESIGN §9)."""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from proxy.config import Settings
from proxy.errors import AuthenticationError


class Keys:
    """The keys a proxy accepts. With none configured every request is let through."""

    def __init__(self, settings: Settings) -> None:
        self._clients = [k.get_secret_value().encode() for k in settings.api_keys]
        self._admin = settings.admin_key.get_secret_value().encode() if settings.admin_key else None

    def require_client(self, headers: Mapping[str, str]) -> None:
        """Raise AuthenticationError unless a client key is the bearer token or the `x-api-key`
        (when keys exist)."""
        if not self._clients:
            return
        given = _bearer(headers)
        # Compare against every key, always, so timing does not reveal which key nearly matched.
        ok = False
        for key in self._clients:
            ok |= given is not None and hmac.compare_digest(given, key)
        if not ok:
            raise AuthenticationError("invalid or missing API key", code="invalid_api_key")

    def require_admin(self, headers: Mapping[str, str]) -> None:
        """Raise AuthenticationError unless the admin key is presented (when any key exists)."""
        if self._admin is None and not self._clients:
            return
        # Either header may carry it: a client that sends its own key as the bearer token can
        # still present the admin key in x-admin-key. Both are compared, always.
        candidates = (_bearer(headers) or b"", headers.get("x-admin-key", "").encode())
        ok = False
        for given in candidates:
            ok |= (
                self._admin is not None and bool(given) and hmac.compare_digest(given, self._admin)
            )
        if not ok:
            raise AuthenticationError("this endpoint needs the admin key", code="invalid_admin_key")


def _bearer(headers: Mapping[str, str]) -> bytes | None:
    """The key a client presents: its bearer token, else its `x-api-key` (Anthropic's SDKs and
    Claude Code send the key there)."""
    value = headers.get("authorization", "")
    if value[:7].lower() == "bearer ":
        return value[7:].strip().encode()
    api_key = headers.get("x-api-key")
    return api_key.strip().encode() if api_key else None
