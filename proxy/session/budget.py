"""Session-id resolution and error-budget arithmetic (DESIGN §5).

Pure functions over a request's headers and body: which session a request belongs to, when a
session's budget is spent, and which `role: tool` messages report an error. No I/O, no clock.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from proxy.errors import BadRequestError

MAX_SESSION_ID_LENGTH = 200
FINGERPRINT_PREFIX = "fp-"
DEFAULT_SESSION_HEADER = "x-session-id"


class ExhaustionPolicy(enum.StrEnum):
    """What happens to a request whose session has used its error budget."""

    REJECT = "reject"  # HTTP 429, error type error_budget_exhausted
    FINISH = "finish"  # a normal completion that says the session ended
    OBSERVE = "observe"  # count, report, change nothing


@dataclass(frozen=True, slots=True)
class ErrorBudget:
    """How many failures a session may experience, and what happens when it has.

    Raises:
        ValueError: `max_errors` is below 1.
    """

    max_errors: int = 10  # τ²-bench's DEFAULT_MAX_ERRORS
    policy: ExhaustionPolicy = ExhaustionPolicy.REJECT

    def __post_init__(self) -> None:
        if self.max_errors < 1:
            raise ValueError(f"max_errors must be at least 1, got {self.max_errors}")

    def exhausted(self, errors: int) -> bool:
        """Whether a session with `errors` failures has used its budget (`>=`, as τ²-bench)."""
        return errors >= self.max_errors

    def remaining(self, errors: int) -> int:
        """How many more failures the session may experience before it is exhausted (never < 0)."""
        return max(0, self.max_errors - errors)


def resolve_session_id(
    headers: Mapping[str, str],
    body: Mapping[str, Any],
    *,
    header_name: str = DEFAULT_SESSION_HEADER,
) -> str:
    """The session a chat-completions request belongs to; the first source that has one wins.

    1. the header `header_name` (any case), in `headers` keyed by lower-case names as ASGI
       servers give them (or a case-insensitive mapping such as Starlette's `Headers`);
    2. `body["metadata"]["session_id"]`;
    3. `body["user"]`; a value that is not a valid id (too long, non-ASCII) is replaced by
       `"user-" + hash`, so one end user still maps to one session;
    4. a fingerprint `"fp-" + 16 hex digits` of the model, the first system (or developer)
       message and the first user message. Clients that resend the history keep the same
       fingerprint on every turn; two conversations that open with the same words share it.

    Blank values count as absent. A valid id is 1 to 200 printable ASCII characters after
    surrounding whitespace is stripped.

    Raises:
        BadRequestError: the header or `metadata.session_id` holds an invalid id.
    """
    header = headers.get(header_name.lower())
    if header is not None and header.strip():
        return _checked(header, param=header_name)

    metadata = body.get("metadata")
    if isinstance(metadata, Mapping):
        explicit = metadata.get("session_id")
        if isinstance(explicit, str) and explicit.strip():
            return _checked(explicit, param="metadata.session_id")
        if explicit is not None and not isinstance(explicit, str):
            raise BadRequestError(
                "metadata.session_id must be a string", param="metadata.session_id"
            )

    user = body.get("user")
    if isinstance(user, str) and user.strip():
        stripped = user.strip()
        if _valid(stripped):
            return stripped
        return "user-" + _short_hash(user)

    return fingerprint(body)


def fingerprint(body: Mapping[str, Any]) -> str:
    """`"fp-"` + 16 hex digits of sha256 over (model, first system message, first user message).

    Message content may be a string, a list of content parts or absent; text parts are joined
    so that `"hi"` and `[{"type": "text", "text": "hi"}]` give the same fingerprint.
    """
    messages = body.get("messages")
    system = user = ""
    if isinstance(messages, list):
        system = _first_content(messages, ("system", "developer"))
        user = _first_content(messages, ("user",))
    model = body.get("model")
    payload = json.dumps([model if isinstance(model, str) else "", system, user])
    return FINGERPRINT_PREFIX + _short_hash(payload)


def content_text(content: Any) -> str:
    """The text of a message's `content`: a string as is, the text parts of a list joined.

    Non-text parts (images, audio) contribute their canonical JSON, so they still distinguish
    one message from another; `None` gives `""`.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                pieces.append(part["text"])
            elif isinstance(part, str):
                pieces.append(part)
            else:
                pieces.append(json.dumps(part, sort_keys=True, default=str))
        return "".join(pieces)
    return json.dumps(content, sort_keys=True, default=str)


def default_tool_error_rule(text: str) -> bool:
    """τ²-bench's form of a failed tool call: the tool message's text starts with `Error`."""
    return text.startswith("Error")


def tool_errors_in(
    messages: list[dict[str, Any]],
    *,
    rule: Callable[[str], bool] | None = None,
) -> list[str]:
    """The `tool_call_id`s of the `role: tool` messages whose content reports an error.

    `rule` receives the message's text (see `content_text`) and says whether it is an error;
    the default is `default_tool_error_rule`. Messages without a `tool_call_id` cannot be
    counted once across requests and are skipped. Each id appears once, in message order.
    """
    is_error = rule or default_tool_error_rule
    found: dict[str, None] = {}
    for message in messages:
        if not isinstance(message, Mapping) or message.get("role") != "tool":
            continue
        call_id = message.get("tool_call_id")
        if isinstance(call_id, str) and call_id and is_error(content_text(message.get("content"))):
            found.setdefault(call_id, None)
    return list(found)


def _valid(session: str) -> bool:
    return 0 < len(session) <= MAX_SESSION_ID_LENGTH and all(" " <= char <= "~" for char in session)


def _checked(raw: str, *, param: str) -> str:
    session = raw.strip()
    if not _valid(session):
        raise BadRequestError(
            f"invalid session id in {param}: use 1 to {MAX_SESSION_ID_LENGTH} printable ASCII characters",
            param=param,
        )
    return session


def _first_content(messages: list[Any], roles: tuple[str, ...]) -> str:
    for message in messages:
        if isinstance(message, Mapping) and message.get("role") in roles:
            return content_text(message.get("content"))
    return ""


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
