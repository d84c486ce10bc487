"""Client and admin keys: bearer tokens compared in constant time (DESIGN §9).

A client key has a name; the name, never the key, is who a request is (its sessions are scoped
by it, its log line carries it). The admin key sees every session.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Final

from proxy.config import Settings, is_loopback
from proxy.errors import AuthenticationError, PermissionDeniedError

EVERYONE: Final = None
"""Who a request is when no client keys are configured: sessions are not scoped."""


class Keys:
    """The keys a proxy accepts. With none configured every request is let through."""

    def __init__(self, settings: Settings) -> None:
        self._clients = [(k.name, k.key.get_secret_value().encode()) for k in settings.api_keys]
        self._admin = settings.admin_key.get_secret_value().encode() if settings.admin_key else None
        self._settings = settings
        # Without an admin key, who may list sessions and reset budgets: anyone on a loopback
        # bind (as always), nobody otherwise.
        self._open_admin = is_loopback(settings.host)

    def require_client(self, headers: Mapping[str, str]) -> str | None:
        """The name of the client key that is the bearer token or the `x-api-key`; None when no
        keys are configured. Raises AuthenticationError when keys exist and none is presented."""
        if not self._clients:
            return EVERYONE
        name = self._client(headers)
        if name is None:
            raise AuthenticationError("invalid or missing API key", code="invalid_api_key")
        return name

    def require_admin(self, headers: Mapping[str, str]) -> None:
        """Raise AuthenticationError unless the admin key is presented (when any key exists)."""
        if self._admin is None and not self._clients:
            return
        if not self._is_admin(headers):
            raise AuthenticationError("this endpoint needs the admin key", code="invalid_admin_key")

    def require_public(self, path: str, headers: Mapping[str, str]) -> None:
        """Let `path` through when it is public (`public_endpoints`) or the admin key is
        presented; without an admin key, on a loopback bind only.

        Raises AuthenticationError (no admin key presented) or PermissionDeniedError (none
        configured, on a non-loopback bind).
        """
        if self._settings.public(path):
            return
        if self._admin is not None:
            self.require_admin(headers)
        elif not self._open_admin:
            raise PermissionDeniedError(
                f"{path} needs an admin key on a non-loopback bind: set TOOLSENTRY_ADMIN_KEY "
                "or admin_key, or list it in public_endpoints",
                code="admin_key_not_configured",
            )

    def session_reader(self, headers: Mapping[str, str], *, open_to_all: bool) -> str | None:
        """Who reads the session API: None for the admin (every session), else the name of the
        client key presented (its own sessions only).

        Without an admin key, a request with no client key is the admin where no keys exist,
        for `open_to_all` routes (reading one session) or on a loopback bind; elsewhere the
        session list and the reset are nobody's (PermissionDeniedError).

        Raises AuthenticationError: keys exist and neither kind is presented.
        """
        if self._admin is not None and self._is_admin(headers):
            return None
        if self._clients:
            name = self._client(headers)
            if name is not None:
                return name
            what = "the admin key or a client key"
            raise AuthenticationError(f"this endpoint needs {what}", code="invalid_api_key")
        if self._admin is not None:
            raise AuthenticationError("this endpoint needs the admin key", code="invalid_admin_key")
        if open_to_all or self._open_admin:
            return None
        raise PermissionDeniedError(
            "listing sessions and resetting budgets needs an admin key on a non-loopback bind: "
            "set TOOLSENTRY_ADMIN_KEY or admin_key",
            code="admin_key_not_configured",
        )

    def _client(self, headers: Mapping[str, str]) -> str | None:
        given = _bearer(headers)
        # Compare against every key, always, so timing does not reveal which key nearly matched.
        found = None
        for name, key in self._clients:
            if given is not None and hmac.compare_digest(given, key):
                found = name
        return found

    def _is_admin(self, headers: Mapping[str, str]) -> bool:
        # Either header may carry it: a client that sends its own key as the bearer token can
        # still present the admin key in x-admin-key. Both are compared, always.
        candidates = (_bearer(headers) or b"", headers.get("x-admin-key", "").encode())
        ok = False
        for given in candidates:
            ok |= (
                self._admin is not None and bool(given) and hmac.compare_digest(given, self._admin)
            )
        return ok


def _bearer(headers: Mapping[str, str]) -> bytes | None:
    """The key a client presents: its bearer token, else its `x-api-key` (Anthropic's SDKs and
    Claude Code send the key there)."""
    value = headers.get("authorization", "")
    if value[:7].lower() == "bearer ":
        return value[7:].strip().encode()
    api_key = headers.get("x-api-key")
    return api_key.strip().encode() if api_key else None
