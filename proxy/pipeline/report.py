"""What a turn reports, and the one place it is written out: headers, the stream's summary
comment and the request's log line (the metrics are counted where the turn closes). The header
names are `proxy.headers`'.

    x-toolsentry-session: s1            : x-toolsentry {"session": "s1", "errors": 1,
    x-toolsentry-errors: 1                "max_errors": 10, "repairs": 0,
    x-toolsentry-max-errors: 10           "violations": ["unknown_tool"]}
    x-toolsentry-repairs: 0
    x-toolsentry-violations: unknown_tool
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple

import orjson

from proxy.headers import (
    ERRORS_HEADER,
    MAX_ERRORS_HEADER,
    REPAIRS_HEADER,
    SESSION_HEADER,
    VIOLATIONS_HEADER,
)
from proxy.sse import encode_comment

SUMMARY_COMMENT: Final = "x-toolsentry"
"""The name that starts the summary comment sent before a stream's terminal event."""


class TurnReport(NamedTuple):
    """A turn's accounting as it stands (`final`: the turn has closed, and `status` is its own).

    `violations`: the channels found in this request, in the order first found (an upstream
    failure that ended the request included); `errors`: the session's count after it.

    A named tuple, immutable as a frozen dataclass is, and made in a quarter of the time (one
    or two a request).
    """

    api: str
    model: str
    session: str
    errors: int
    max_errors: int
    repairs: int
    violations: tuple[str, ...]
    status: int = 200
    final: bool = False

    def headers(self) -> dict[str, str]:
        """The `x-toolsentry-*` response headers."""
        return {
            SESSION_HEADER: self.session,
            ERRORS_HEADER: str(self.errors),
            MAX_ERRORS_HEADER: str(self.max_errors),
            REPAIRS_HEADER: str(self.repairs),
            VIOLATIONS_HEADER: ",".join(self.violations),
        }

    def summary(self) -> dict[str, Any]:
        """The stream summary's JSON object."""
        return {
            "session": self.session,
            "errors": self.errors,
            "max_errors": self.max_errors,
            "repairs": self.repairs,
            "violations": list(self.violations),
        }

    def comment(self) -> bytes:
        """The SSE comment that reports the turn: `: x-toolsentry {json}`."""
        return encode_comment(f"{SUMMARY_COMMENT} {orjson.dumps(self.summary()).decode()}")

    def log_fields(self) -> dict[str, Any]:
        """The turn's fields of the request's log line."""
        return {
            "session": self.session,
            "status": self.status,
            "channels": ",".join(self.violations) or None,
            "errors": self.errors,
        }
