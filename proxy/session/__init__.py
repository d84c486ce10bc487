"""Sessions and their error budgets: which session a request belongs to, and where its counts live."""

from proxy.session.budget import ErrorBudget, ExhaustionPolicy, resolve_session_id, tool_errors_in
from proxy.session.sqlite_store import SqliteStore
from proxy.session.stores import MemoryStore, SessionRecord, SessionStore, open_store

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
