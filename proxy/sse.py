"""Server-sent events, framed and parsed once for every wire protocol, without I/O (DESIGN §7).

`SSEDecoder` turns upstream bytes, however they are cut, into `SSEEvent`s and `SSEComment`s;
`encode_event`, `encode_typed_event` and `encode_comment` write the stream a client reads, and
`DONE` is the event that ends an OpenAI stream (its data, `DONE_DATA`, is what a decoder reads
as the end). What an event means is each protocol's business (`proxy.protocols.<api>`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from proxy.errors import UpstreamProtocolError

DONE_DATA: Final = "[DONE]"
"""The data of the event that ends an OpenAI stream (chat completions)."""
DONE: Final = b"data: " + DONE_DATA.encode() + b"\n\n"
"""The event that ends an OpenAI stream, encoded."""

_EOL: Final = re.compile(rb"\r\n|\r|\n")
_TEXT_EOL: Final = re.compile(r"\r\n|\r|\n")
_BOM: Final = b"\xef\xbb\xbf"
_EXCERPT: Final = 120


def _sent(what: str) -> UpstreamProtocolError:
    return UpstreamProtocolError(f"upstream sent {what}")


def excerpt(text: str | bytes) -> str:
    """The start of `text` for an error message (its repr, cut with an ellipsis)."""
    return repr(text[:_EXCERPT]) + (" …" if len(text) > _EXCERPT else "")


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event: `data` joins its `data:` lines; `payload` is that data parsed as a
    JSON object, or None for `[DONE]`. `event`, `id` and `retry` are the SSE fields as sent."""

    data: str
    payload: dict[str, Any] | None
    event: str | None = None
    id: str | None = None
    retry: int | None = None


@dataclass(frozen=True, slots=True)
class SSEComment:
    """A comment line (`: ping`), the text after the colon and one optional space."""

    text: str


class SSEDecoder:
    """Incremental SSE decoder (WHATWG event-stream rules) for OpenAI-style streams.

    Lines may end in `\\r\\n`, `\\r` or `\\n`, and `feed` may be given any cut of the stream,
    including inside a line ending or a multi-byte UTF-8 character. Comments are returned in
    stream order as `SSEComment`s. Every `data` payload must be a JSON object or `[DONE]`.
    After an `UpstreamProtocolError` the decoder's state is undefined.
    """

    def __init__(self) -> None:
        self._line = bytearray()
        self._after_cr = False
        self._at_start = True
        self._data: list[str] = []
        self._event: str | None = None
        self._id: str | None = None
        self._retry: int | None = None

    def feed(self, data: bytes) -> list[SSEEvent | SSEComment]:
        """Consume `data`; return the events and comments it completes, in stream order.

        Raises `UpstreamProtocolError` for a line that is not UTF-8 or a `data` payload that
        is neither JSON nor `[DONE]`.
        """
        out: list[SSEEvent | SSEComment] = []
        if self._after_cr and data:  # a `\r` ended the last piece: a `\n` starting this one is its
            data, self._after_cr = data[1:] if data[:1] == b"\n" else data, False
        buffer = self._line
        scan_from = len(buffer)  # the kept partial line holds no line ending
        buffer += data
        if self._at_start:
            if len(buffer) < len(_BOM) and _BOM.startswith(buffer):
                return out  # could still be a byte-order mark
            self._at_start = False
            if buffer.startswith(_BOM):
                del buffer[: len(_BOM)]
                scan_from = 0
        consumed = 0
        for match in _EOL.finditer(buffer, scan_from):
            self._process_line(bytes(buffer[consumed : match.start()]), out)
            consumed = match.end()
            if consumed == len(buffer) and match.group() == b"\r":
                self._after_cr = True
        del buffer[:consumed]
        return out

    def flush(self) -> list[SSEEvent | SSEComment]:
        """Signal the end of the stream; return what an unterminated last line completes.

        An event whose closing blank line never came is still dispatched when its payload
        parses (some servers omit it after `[DONE]`); a payload cut short raises
        `UpstreamProtocolError`.
        """
        out: list[SSEEvent | SSEComment] = []
        if self._line:
            self._process_line(bytes(self._line), out)
            self._line.clear()
        self._after_cr = False
        self._dispatch(out, at_end=True)
        return out

    def _process_line(self, raw: bytes, out: list[SSEEvent | SSEComment]) -> None:
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _sent(f"an SSE line that is not UTF-8 ({exc.reason}): {excerpt(raw)}") from exc
        if not line:
            self._dispatch(out, at_end=False)
            return
        if line.startswith(":"):
            out.append(SSEComment(line[1:].removeprefix(" ")))
            return
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self._retry = int(value)
        # the SSE standard says to ignore any other field

    def _dispatch(self, out: list[SSEEvent | SSEComment], *, at_end: bool) -> None:
        if self._data:
            data = "\n".join(self._data)
            payload = _parse_payload(data, at_end=at_end)
            out.append(SSEEvent(data, payload, self._event, self._id, self._retry))
        self._data, self._event, self._retry = [], None, None


def _parse_payload(data: str, *, at_end: bool) -> dict[str, Any] | None:
    if data == DONE_DATA:
        return None
    where = "in an event the stream ended inside" if at_end else "in an SSE data payload"
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise _sent(f"invalid JSON {where} ({exc}): {excerpt(data)}") from exc
    if not isinstance(value, dict):
        raise _sent(f"a JSON {type(value).__name__} {where}, expected an object: {excerpt(data)}")
    return value


def encode_event(data: bytes | Mapping[str, Any], event: str | None = None) -> bytes:
    """Render one SSE event carrying `data` (a mapping is written as compact JSON), named
    `event` when given.

    Line breaks inside `data` become separate `data:` lines, so any bytes round-trip.
    """
    body = data if isinstance(data, bytes) else orjson.dumps(data)
    head = b"event: " + event.encode() + b"\n" if event else b""
    if b"\n" not in body and b"\r" not in body:
        return head + b"data: " + body + b"\n\n"
    return head + b"".join(b"data: " + line + b"\n" for line in _EOL.split(body)) + b"\n"


def encode_typed_event(data: Mapping[str, Any]) -> bytes:
    """One SSE event named after its data's `type` (unnamed when it has none): Responses and
    Messages streams name every event so, as vLLM writes them."""
    kind = data.get("type")
    return encode_event(data, str(kind) if kind else None)


def encode_comment(text: str) -> bytes:
    """Render an SSE comment (`: text`), one comment line per line of `text`; clients ignore it."""
    return b"".join(b": " + line.encode() + b"\n" for line in _TEXT_EOL.split(text)) + b"\n"
