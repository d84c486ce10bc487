"""Session-id resolution and error-budget arithmetic (DESIGN §5).

Pure functions over a request's headers and body: which session a request belongs to, when a
session's budget is spent, and which `role: tool` messages report an error. No I/O, no clock.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from typing import Any, Final, NamedTuple, TypeGuard

from proxy.errors import BadRequestError
from proxy.session.history import History

MAX_SESSION_ID_LENGTH = 200
FINGERPRINT_PREFIX = "fp-"
SCOPE_SEPARATOR = ":"
"""Between a client key's name and its session id in a stored session id (see `scoped`)."""
DEFAULT_SESSION_HEADER = "x-session-id"
DEFAULT_SESSION_HEADERS = ("x-session-id", "session-id", "x-claude-code-session-id")
"""The session headers tried in order: the proxy's own, Codex CLI's, Claude Code's."""


class ExhaustionPolicy(enum.StrEnum):
    """What happens to a request whose session has used its error budget."""

    REJECT = "reject"  # HTTP 429, error type error_budget_exhausted
    FINISH = "finish"  # a normal completion that says the session ended
    OBSERVE = "observe"  # count, report, change nothing


class SessionTracking(enum.StrEnum):
    """How the session of a request that names none is found (`resolve_session`'s last step)."""

    HISTORY = "history"  # the conversation its history continues (proxy.session.history)
    FINGERPRINT = "fingerprint"  # "fp-" + a hash of (model, first system text, first user text)


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

    def spent_by(self, errors: int, added: int) -> bool:
        """Whether the `added` failures that brought a session to `errors` spent its budget: it
        was not exhausted before them and is now. Of the additions to one session (each one
        atomic step of its store, whatever the replica) exactly one returns True per budget."""
        return added > 0 and self.exhausted(errors) and not self.exhausted(errors - added)

    def remaining(self, errors: int) -> int:
        """How many more failures the session may experience before it is exhausted (never < 0)."""
        return max(0, self.max_errors - errors)


class SessionHints(NamedTuple):
    """What a request's body says about its session, read by its protocol's adapter.

    `opening`: (model, first system or instructions content, first user content), the contents
    as texts, or as sent when `read` is given: `read` makes a content's text, and is called only
    when the session falls back to the fingerprint (a Messages body that names its session is
    not read for it; Claude Code resends 16 kB of opening text every turn). `declared`: the
    session id the body names itself (chat and Responses `metadata.session_id`, the one inside
    Claude Code's `metadata.user_id`), any JSON value as sent, with `declared_param` naming
    where it was for an error message; `previous_response_id`: the Responses response this
    request continues; `user`: the body's `user` as sent; `history`: reads the digests of the
    body's history (`proxy.session.history`), called only for a request that names no session
    (so a request that does pays nothing for it).

    A named tuple (one a request), immutable and made in a quarter of a frozen dataclass's time.
    """

    opening: tuple[str, Any, Any] = ("", "", "")
    declared: object = None
    declared_param: str = "metadata.session_id"
    previous_response_id: str | None = None
    user: object = None
    read: Callable[[Any], str] | None = None
    history: Callable[[Mapping[str, Any]], History] | None = None

    @property
    def fingerprint(self) -> tuple[str, str, str]:
        """(model, first system or instructions text, first user text)."""
        model, system, user = self.opening
        if self.read is None:
            return model, system, user
        return model, self.read(system), self.read(user)


def resolve_session(
    headers: Mapping[str, str],
    hints: SessionHints,
    *,
    header_names: Sequence[str] = DEFAULT_SESSION_HEADERS,
    chained: str | None = None,
    owner: str | None = None,
) -> str:
    """The session a request belongs to, as stored: scoped to `owner` (see `scoped`), the
    name of the client key that sent it. The first source that has one wins (DESIGN §5).

    1. the headers `header_names` in order (lower-case names, as `headers` is keyed by them);
    2. `hints.declared` (the body's own session id);
    3. `chained`: the session (as stored) of the response `hints.previous_response_id` names,
       when the caller found it and it is `owner`'s;
    4. `hints.user`; a value that is not a valid id (too long, non-ASCII) is replaced by
       `"user-" + hash`, so one end user still maps to one session;
    5. `"fp-" + 16 hex digits` of `hints.fingerprint`. Clients that resend the history keep the
       same fingerprint on every turn; two conversations that open with the same words share it.
       That is `session_tracking: fingerprint`; under `history` (the default) the pipeline
       takes steps 1-4 from `named_session` and finds the conversation the request's history
       continues instead (`proxy.session.tracking`).

    Blank values count as absent. A valid id is 1 to 200 printable ASCII characters after
    surrounding whitespace is stripped.

    Raises:
        BadRequestError: a session header or the declared id holds an invalid id.
    """
    named = named_session(headers, hints, header_names=header_names, chained=chained, owner=owner)
    return named if named is not None else scoped(owner, fingerprint_of(*hints.fingerprint))


def named_session(
    headers: Mapping[str, str],
    hints: SessionHints,
    *,
    header_names: Sequence[str] = DEFAULT_SESSION_HEADERS,
    chained: str | None = None,
    owner: str | None = None,
) -> str | None:
    """The session a request names, as stored: `resolve_session`'s steps 1 to 4; None when it
    names none (the caller then finds it by the request's history, `proxy.session.tracking`,
    or its fingerprint).

    Raises:
        BadRequestError: a session header or the declared id holds an invalid id.
    """
    session = _named(headers, hints, header_names)
    if session is None:
        if chained is not None and owned(owner, chained) is not None:
            return chained  # this key's response: the request continues its session
        session = _user(hints.user)
        if session is None:
            return None
    return scoped(owner, session)


def scoped(owner: str | None, session: str) -> str:
    """The stored id of a client's session `session`: `owner:session`, where `owner` is the
    name of the client key (letters, digits, `._-`, so the first `:` ends it); the id as is
    where no keys are configured (`owner` None). Every store keys sessions by this id, so
    replicas sharing a store agree."""
    return session if owner is None else owner + SCOPE_SEPARATOR + session


def owned(owner: str | None, stored: str) -> str | None:
    """The client's id of the stored session id `stored` when it is `owner`'s, else None."""
    if owner is None:
        return stored
    prefix = owner + SCOPE_SEPARATOR
    return stored[len(prefix) :] if stored.startswith(prefix) else None


def _named(
    headers: Mapping[str, str], hints: SessionHints, header_names: Sequence[str]
) -> str | None:
    """The session a request names: a session header, else the body's declared id."""
    for name in header_names:
        header = headers.get(name)
        if header is not None and header.strip():
            return _checked(header, param=name)
    declared = hints.declared
    if isinstance(declared, str) and declared.strip():
        return _checked(declared, param=hints.declared_param)
    if declared is not None and not isinstance(declared, str):
        raise BadRequestError(
            f"{hints.declared_param} must be a string", param=hints.declared_param
        )
    return None


def _user(user: object) -> str | None:
    """The session of the body's end user `user`, None without one."""
    if isinstance(user, str) and user.strip():
        stripped = user.strip()
        if _valid(stripped):
            return stripped
        return "user-" + _short_hash(user)
    return None


def message_hints(
    body: Mapping[str, Any], history: Callable[[Mapping[str, Any]], History] | None = None
) -> SessionHints:
    """The session hints of a body that holds `messages` (chat completions): `metadata.session_id`,
    `user`, the fingerprint of the model, first system (or developer) and first user message, and
    `history`, the reader of its history (see `SessionHints`)."""
    metadata = body.get("metadata")
    declared = metadata.get("session_id") if _is_mapping(metadata) else None
    messages = body.get("messages")
    system = user = ""
    if isinstance(messages, list):
        system = _first_content(messages, ("system", "developer"))
        user = _first_content(messages, ("user",))
    model = body.get("model")
    # Positional: the named tuple's keyword arguments cost a third of its making.
    return SessionHints(
        (model if isinstance(model, str) else "", system, user),
        declared,
        "metadata.session_id",
        None,
        body.get("user"),
        None,
        history,
    )


def resolve_session_id(
    headers: Mapping[str, str],
    body: Mapping[str, Any],
    *,
    header_name: str = DEFAULT_SESSION_HEADER,
) -> str:
    """The session of a chat-completions request with one session header: `resolve_session`
    over `message_hints(body)`. Raises BadRequestError as `resolve_session` does."""
    return resolve_session(headers, message_hints(body), header_names=(header_name.lower(),))


def fingerprint(body: Mapping[str, Any]) -> str:
    """`"fp-"` + 16 hex digits of sha256 over (model, first system message, first user message).

    Message content may be a string, a list of content parts or absent; text parts are joined
    so that `"hi"` and `[{"type": "text", "text": "hi"}]` give the same fingerprint.
    """
    return fingerprint_of(*message_hints(body).fingerprint)


def fingerprint_of(model: str, system: str, user: str) -> str:
    """`"fp-"` + 16 hex digits of sha256 over a conversation's model, opening system text and
    opening user text: of `json.dumps([model, system, user])`, as it always was, for a session's
    stored records are keyed by it."""
    key = (model, system, user)
    known = _fingerprints.get(key)
    if known is not None:
        return known
    # json.dumps of a list of strings, without the encoder's machinery: the same characters.
    text = "[" + ", ".join(map(encode_basestring_ascii, key)) + "]"
    found = FINGERPRINT_PREFIX + _short_hash(text)
    if len(model) + len(system) + len(user) <= _MAX_REMEMBERED_CHARS:
        if len(_fingerprints) >= _MAX_REMEMBERED:
            _fingerprints.pop(next(iter(_fingerprints)), None)  # the oldest remembered first
        _fingerprints[key] = found
    return found


# An agent without a session id resends its conversation's opening on every turn: its
# fingerprint is remembered (by the texts themselves, so a hit is exact) instead of encoding and
# hashing them again, 20 µs a request with the process's caches cold. At most 256 openings of
# at most 32k characters each are kept, the oldest forgotten first.
_fingerprints: dict[tuple[str, str, str], str] = {}
_MAX_REMEMBERED: Final = 256
_MAX_REMEMBERED_CHARS: Final = 32_768


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
        if _is_mapping(message) and message.get("role") in roles:
            return content_text(message.get("content"))
    return ""


def _is_mapping(value: object) -> TypeGuard[Mapping[str, Any]]:
    # A parsed body's objects are dicts: those are told without the ABC's instance check (a
    # Python call each, on every request).
    return type(value) is dict or (value is not None and isinstance(value, Mapping))


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
