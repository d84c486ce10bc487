"""Sessions and their error budgets: which session a request belongs to, and where its counts
live (`open_store` picks the store a setting names)."""

import time
from collections.abc import Callable

from proxy.errors import ConfigError
from proxy.session.budget import ErrorBudget, ExhaustionPolicy, resolve_session_id, tool_errors_in
from proxy.session.redis_store import RedisStore
from proxy.session.sqlite_store import SqliteStore
from proxy.session.stores import (
    DEFAULT_TTL_SECONDS,
    MemoryStore,
    SessionRecord,
    SessionStore,
    without_password,
)

__all__ = [
    "ErrorBudget",
    "ExhaustionPolicy",
    "MemoryStore",
    "SessionRecord",
    "SessionStore",
    "SqliteStore",
    "open_store",
    "resolve_session_id",
    "tool_errors_in",
]


def open_store(
    url: str, *, ttl_seconds: float = DEFAULT_TTL_SECONDS, clock: Callable[[], float] = time.time
) -> SessionStore:
    """The store a `session_store` setting names.

    `memory`, `sqlite:///abs/path.db` (absolute), `sqlite:///./rel.db` (relative to the working
    directory), `redis://[:password@]host:port/db` or `rediss://…` (TLS).

    Raises:
        ConfigError: an unknown or unsupported form, or a database that cannot be opened.
    """
    forms = (
        "'memory', 'sqlite:///abs/path.db', 'sqlite:///./relative/path.db' "
        "or 'redis://host:port/db'"
    )
    if url in ("memory", "memory://"):
        return MemoryStore(ttl_seconds, clock)
    if url.startswith("sqlite:///"):
        rest = url.removeprefix("sqlite:///")
        if not rest or rest.endswith("/"):
            raise ConfigError(f"session store {url!r} names no database file; use {forms}")
        path = rest if rest.startswith(".") else "/" + rest
        return SqliteStore(path, ttl_seconds, clock)
    if url.startswith(("redis://", "rediss://")):
        return RedisStore(url, ttl_seconds, clock)
    raise ConfigError(f"unknown session store {without_password(url)!r}; use {forms}")
