"""The edge: what every request passes before any route is chosen, and the pass-through's allowlist.

One rule for paths: a request is routed on its decoded path (`scope["path"]`: percent-encoded
characters decoded, as the upstream's own server decodes them), and a path that is not in normal
form — a `.` or `..` segment, an empty segment (`//`), a control character — is refused with 400.
Nothing is rewritten, so the turn routes, the proxy's own routes and the pass-through all see the
path that was matched, and the pass-through sends exactly that path: no spelling of a turn route
(`/v1/./chat/completions`, `/v1/%2E/responses`, `/v1//messages`) reaches the upstream another way.

The raw pass-through forwards only what `PassthroughRoutes` allows: by default the public
inference endpoints vLLM serves for clients, each with its methods; never its development and
control endpoints (`/collective_rpc`, `/sleep`, `/v1/load_lora_adapter`, …).

Request hygiene: a request's headers larger than `max_header_bytes` are refused with 431, and an
`x-request-id` that is long or odd is replaced (its length logged) before anything reads it.
"""

from __future__ import annotations

import operator
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

import orjson
from starlette.types import Scope, Send

from proxy.errors import error_body
from proxy.logs import get_logger
from proxy.protocols.messages.answer import error_body as anthropic_error_body

# vLLM's public client endpoints (vllm/entrypoints/openai/api_server.py and its routers:
# serve/tokenize, pooling/*, anthropic/api_router.py, instrumentator/health.py), each with
# the methods it answers. Left out on purpose: the turn routes (the proxy's own), the
# development and control endpoints (/collective_rpc, /reset_prefix_cache, /sleep, /wake_up,
# /is_sleeping, /start_profile, /stop_profile, /scale_elastic_ep, /is_scaling_elastic_ep,
# /v1/load_lora_adapter, /v1/unload_lora_adapter, /pause, /resume, /server_info, …), the
# upstream's own /metrics, and SageMaker's /invocations, which answers a chat completion
# unchecked.
DEFAULT_ALLOWED: Final[Mapping[str, frozenset[str]]] = {
    "/v1/completions": frozenset({"POST"}),
    "/v1/embeddings": frozenset({"POST"}),
    "/v1/models": frozenset({"GET"}),
    "/v1/messages/count_tokens": frozenset({"POST"}),
    "/v1/score": frozenset({"POST"}),
    "/score": frozenset({"POST"}),
    "/v1/rerank": frozenset({"POST"}),
    "/v2/rerank": frozenset({"POST"}),
    "/rerank": frozenset({"POST"}),
    "/pooling": frozenset({"POST"}),
    "/classify": frozenset({"POST"}),
    "/tokenize": frozenset({"POST"}),
    "/detokenize": frozenset({"POST"}),
    "/v1/audio/transcriptions": frozenset({"POST"}),
    "/v1/audio/translations": frozenset({"POST"}),
    "/health": frozenset({"GET"}),
    "/ping": frozenset({"GET", "POST"}),
    "/version": frozenset({"GET"}),
}

TURN_PATHS: Final = frozenset({"/v1/chat/completions", "/v1/responses", "/v1/messages"})
"""The turn routes: never passed through, whatever the configuration says."""

_METHODS: Final = frozenset({"GET", "POST", "PUT", "DELETE", "PATCH"})
_NOT_NORMAL = re.compile(r"//|/\.\.?(?:/|$)|[\x00-\x1f\x7f]")
# A request id a log line can carry as it is: short, and of the characters ids are made of.
MAX_REQUEST_ID: Final = 128
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:+=/-]{1,128}")
_REQUEST_ID_HEADER: Final = b"x-request-id"
_name = operator.itemgetter(0)
_LOGGED_PATH: Final = 256


def not_normal(path: str) -> str | None:
    """Why `path` (decoded, as routed) is not in normal form, or None when it is."""
    if not path.startswith("/"):
        return "the path must start with '/'"
    # In C, a few hundred nanoseconds: what nearly every request is.
    if "/." not in path and "//" not in path and path.isprintable():
        return None
    if _NOT_NORMAL.search(path) is None:
        return None
    return "the path is not in normal form (no '.' or '..' segments, '//' or control characters)"


def anthropic_path(path: str) -> bool:
    """Whether an error on `path` answers in Anthropic's shape (the Messages routes)."""
    return path == "/v1/messages" or path.startswith("/v1/messages/")


def error_content(path: str, message: str, status: int, error_type: str) -> bytes:
    """An error body in the shape of the protocol `path` belongs to."""
    if anthropic_path(path):
        return orjson.dumps(anthropic_error_body(message, status))
    return orjson.dumps(error_body(message, error_type))


def normalised(path: str) -> str:
    """`path` with its dot and empty segments resolved (only to choose an error's shape: a path
    not in normal form is refused, never routed)."""
    out: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if out:
                out.pop()
        elif segment not in ("", "."):
            out.append(segment)
    return "/" + "/".join(out)


async def refuse(scope: Scope, send: Send, status: int, message: str, error_type: str) -> None:
    """Answer the request with an error, before any route ran, in the shape of the protocol its
    path (resolved) belongs to; one log line, with the path cut to `_LOGGED_PATH` characters."""
    path = scope.get("path", "/")
    get_logger().info(
        "refused_at_edge", status=status, method=scope.get("method"), path=path[:_LOGGED_PATH]
    )
    body = error_content(normalised(path), message, status, error_type)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def header_bytes(scope: Scope) -> int:
    """The size of a request's header names and values."""
    return sum(len(name) + len(value) for name, value in scope["headers"])


def bound_request_id(scope: Scope) -> None:
    """Replace a long or odd `x-request-id` in `scope` with a fresh one (the original's length
    logged), so that every reader (the log, the upstream) gets a bounded one."""
    headers: list[tuple[bytes, bytes]] = scope["headers"]
    if _REQUEST_ID_HEADER not in map(_name, headers):  # in C: most requests send none
        return
    for i, (name, value) in enumerate(headers):
        if name == _REQUEST_ID_HEADER:
            if len(value) <= MAX_REQUEST_ID and _REQUEST_ID.fullmatch(value.decode("latin-1")):
                return
            fresh = os.urandom(16).hex()
            get_logger().warning("request_id_replaced", request_id=fresh, length=len(value))
            scope["headers"] = [*headers[:i], (name, fresh.encode()), *headers[i + 1 :]]
            return


class PassthroughRoutes:
    """Which method and path the raw pass-through forwards: `DEFAULT_ALLOWED` (unless turned
    off), plus `allow`, minus `deny`; never a turn route. Entries are `"/path"` (the default's
    methods, else any) or `"METHOD /path"`; a path ending in `/*` covers what is under it."""

    def __init__(
        self,
        allow: Iterable[str] = (),
        deny: Iterable[str] = (),
        *,
        defaults: bool = True,
    ) -> None:
        self._exact: dict[str, frozenset[str]] = dict(DEFAULT_ALLOWED) if defaults else {}
        self._prefixes: list[tuple[str, frozenset[str]]] = []
        for entry in allow:
            methods, path = _entry(entry)
            if path.endswith("/*"):
                self._prefixes.append((path[:-1], methods))
            else:
                self._exact[path] = self._exact.get(path, frozenset()) | methods
        self._denied = [_entry(entry) for entry in deny]

    def allows(self, method: str, path: str) -> bool:
        """Whether `method` on `path` (in normal form) may go to the upstream."""
        if path in TURN_PATHS:
            return False
        methods = self._exact.get(path)
        allowed = methods is not None and method in methods
        if not allowed:
            allowed = any(
                path.startswith(prefix) and method in methods for prefix, methods in self._prefixes
            )
        if not allowed:
            return False
        return not any(
            method in methods and (path == denied or _under(path, denied))
            for methods, denied in self._denied
        )


def _under(path: str, pattern: str) -> bool:
    return pattern.endswith("/*") and path.startswith(pattern[:-1])


def _entry(entry: str) -> tuple[frozenset[str], str]:
    """An allow or deny entry as (methods, path). Raises ValueError when it is not one."""
    method, _, path = entry.strip().rpartition(" ")
    if not path.startswith("/") or not_normal(path.removesuffix("/*") or "/") is not None:
        raise ValueError(f"{entry!r} is not '/path' or 'METHOD /path' with a path in normal form")
    if method:
        if method.upper() not in _METHODS:
            raise ValueError(f"{entry!r}: the method must be one of {sorted(_METHODS)}")
        return frozenset({method.upper()}), path
    return DEFAULT_ALLOWED.get(path, _METHODS), path


def validate_entries(entries: Any) -> list[str]:
    """Check allow or deny entries (for the settings); raises ValueError on the first bad one."""
    for entry in entries:
        _entry(entry)
    return list(entries)
