"""The proxy's one exception hierarchy, and its rendering as OpenAI error JSON.

    ToolsentryError                   500 internal_error
    ├── BadRequestError               400 invalid_request_error
    │   └── PayloadTooLargeError      413 invalid_request_error
    ├── AuthenticationError           401 authentication_error
    ├── PermissionDeniedError         403 permission_error
    ├── NotFoundError                 404 not_found_error
    ├── BudgetExhaustedError          `exhaustion_status` (429; 400 on /v1/responses) error_budget_exhausted
    ├── UnrepairedToolCallError       422 invalid_tool_call   (on_unrepaired: reject)
    ├── ConfigError                   (exit code 2; never reaches a client)
    ├── SessionStoreError             503 session_store_unavailable
    └── UpstreamError                 502 upstream_error
        ├── UpstreamTimeoutError      504 upstream_timeout
        ├── UpstreamConnectError      502 upstream_connect_error
        ├── UpstreamBusyError         503 upstream_busy (every pooled connection busy; retry-after)
        ├── UpstreamStatusError       the upstream's own status, its error body passed through
        └── UpstreamProtocolError     502 upstream_protocol_error (a 200 that is not what it should be)

Every error a client can see is rendered by `error_body` as
`{"error": {"message", "type", "param", "code"}}`, the shape the OpenAI SDK parses.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Final


class ToolsentryError(Exception):
    """Root of every error the proxy raises on purpose."""

    status_code: ClassVar[int] = 500
    error_type: ClassVar[str] = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        """The OpenAI-shaped JSON body for this error."""
        return error_body(self.message, self.error_type, param=self.param, code=self.code)


class BadRequestError(ToolsentryError):
    status_code = 400
    error_type = "invalid_request_error"


class PayloadTooLargeError(BadRequestError):
    status_code = 413


class AuthenticationError(ToolsentryError):
    status_code = 401
    error_type = "authentication_error"


class PermissionDeniedError(ToolsentryError):
    status_code = 403
    error_type = "permission_error"


class NotFoundError(ToolsentryError):
    status_code = 404
    error_type = "not_found_error"


class BudgetExhaustedError(ToolsentryError):
    """The session has used its error budget and the policy is `reject` (DESIGN §5). Its status
    is the `exhaustion_status` of the request's protocol (`EXHAUSTION_STATUS` by default); it
    always carries `x-should-retry: false`."""

    status_code = 429
    error_type = "error_budget_exhausted"

    def __init__(self, message: str, *, status: int = 429, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.status = status
        self.headers["x-should-retry"] = "false"  # the openai and anthropic SDKs obey it


EXHAUSTION_STATUS: Final[Mapping[str, int]] = {"chat": 429, "responses": 400, "messages": 429}
"""The status of a refusal for a spent budget, per protocol: one that each protocol's tested
clients show with its message, once, without retrying (docs/clients.md). Codex CLI (Responses)
shows a 429's status alone and a 400's body; other 4xx statuses it retries five times. Claude Code
(Messages) retries a 400 five times (it drops a beta header at each try) and shows a 429 that says
`x-should-retry: false`; the openai SDK (Chat, and Responses outside Codex) obeys that header at
any status."""


class UnrepairedToolCallError(ToolsentryError):
    """Repair failed and `on_unrepaired` is `reject` (DESIGN §6)."""

    status_code = 422
    error_type = "invalid_tool_call"


class ConfigError(ToolsentryError):
    """Invalid settings or configuration file; raised at start-up, before any request."""

    error_type = "config_error"


class SessionStoreError(ToolsentryError):
    """The session store (Redis) cannot be reached or answered with an error."""

    status_code = 503
    error_type = "session_store_unavailable"


class UpstreamError(ToolsentryError):
    """The upstream failed after retries. The message names the upstream and the cause."""

    status_code = 502
    error_type = "upstream_error"


class UpstreamTimeoutError(UpstreamError):
    status_code = 504
    error_type = "upstream_timeout"


class UpstreamConnectError(UpstreamError):
    error_type = "upstream_connect_error"


class UpstreamBusyError(UpstreamError):
    """Every connection the proxy may open to the upstream stayed busy for `pool_timeout`: the
    proxy's own back-pressure, answered 503 with `retry-after`, never charged to a session."""

    status_code = 503
    error_type = "upstream_busy"

    def __init__(self, message: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.headers.setdefault("retry-after", "1")  # a connection frees as any answer ends


class UpstreamProtocolError(UpstreamError):
    error_type = "upstream_protocol_error"


class UpstreamStatusError(UpstreamError):
    """The upstream answered with an error status; its body reaches the client unchanged."""

    def __init__(self, message: str, *, status: int, body: dict[str, Any] | None = None) -> None:
        super().__init__(message, code=status)
        self.status = status
        self.upstream_body = body

    def body(self) -> dict[str, Any]:
        if self.upstream_body is not None and isinstance(self.upstream_body.get("error"), dict):
            return self.upstream_body
        return super().body()


def error_body(
    message: str, error_type: str, *, param: str | None = None, code: str | int | None = None
) -> dict[str, Any]:
    """Build `{"error": {message, type, param, code}}`."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def status_of(exc: ToolsentryError) -> int:
    """The HTTP status a client sees for `exc` (an upstream's own status for status errors)."""
    if isinstance(exc, UpstreamStatusError | BudgetExhaustedError):
        return exc.status
    return exc.status_code
