"""A chat-completion stream assembled for the turn, without I/O (DESIGN §7).

`ChatAssembly` is the turn's side of one stream (`proxy.protocols.base.StreamAssembly`). Inside
it one `ChunkAssembler` forwards content as it arrives, holds tool-call deltas until their choice
finishes, hands the assembled message over for validation, and re-emits the (possibly repaired)
tool calls, so that the client's accumulated message is the non-streamed one. `ChatAssembly`
drives it from the decoded events (`proxy.sse`)::

    for chunk in assembler.add(event.payload):         # forward each at once
        ...
    for done in assembler.take_finished():             # validate done.message, repair it
        assembler.emit_tool_calls(done.index, message, reason)
    assembler.close()                                  # at [DONE] or the end of the body

Errors raised after the first byte went out are sent as the protocol's error event, an error
chunk then `[DONE]`, as vLLM ends a failed stream; the OpenAI SDK raises `APIError` on the chunk.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from proxy.errors import ToolsentryError, UpstreamProtocolError, UpstreamStatusError
from proxy.protocols.base import Choice, Settled
from proxy.sse import DONE, SSEEvent, encode_event, excerpt
from proxy.usage import sum_usage

Chunk = dict[str, Any]

_CHOICE_KEYS: Final = ("index", "delta", "logprobs", "finish_reason")


def _sent(what: str) -> UpstreamProtocolError:
    return UpstreamProtocolError(f"upstream sent {what}")


@dataclass(frozen=True, slots=True)
class FinishedChoice:
    """A choice whose `finish_reason` arrived, with its message assembled in the shape of a
    non-streamed `choices[index].message`, ready for validation."""

    index: int
    message: dict[str, Any]
    finish_reason: str


class _Text:
    """A text streamed in pieces, joined once when read: `+=` on an attribute or a dict's item
    copies the whole text at every delta, quadratic in a long answer, thought or argument."""

    __slots__ = ("_pieces",)

    def __init__(self, first: str = "") -> None:
        self._pieces = [first] if first else []

    def add(self, piece: str) -> None:
        self._pieces.append(piece)

    def __str__(self) -> str:
        pieces = self._pieces
        if len(pieces) > 1:
            pieces[:] = ["".join(pieces)]
        return pieces[0] if pieces else ""


@dataclass(slots=True)
class _Call:
    """A tool call assembled from its deltas (`full` is its whole shape)."""

    id: Any = None
    type: str = "function"
    name: _Text = field(default_factory=_Text)
    arguments: _Text = field(default_factory=_Text)

    def full(self) -> dict[str, Any]:
        function = {"name": str(self.name), "arguments": str(self.arguments)}
        return {"id": self.id, "type": self.type or "function", "function": function}


@dataclass(slots=True)
class _Choice:
    role: str | None = None
    text: _Text = field(default_factory=_Text)  # the content
    sent_text: _Text = field(default_factory=_Text)  # the content the client has received
    fields: dict[str, Any] = field(default_factory=dict)  # other delta fields (refusal, reasoning)
    tool_calls: dict[int, _Call] = field(default_factory=dict)
    logprobs: Any = None
    finish_reason: str | None = None
    finish_fields: dict[str, Any] = field(default_factory=dict)  # e.g. vLLM's stop_reason
    opened: bool = False  # the client has seen this choice
    delivered: dict[str, Any] | None = None  # what the client accumulated, once released

    @property
    def content(self) -> str:
        return str(self.text)

    @property
    def sent(self) -> str:
        return str(self.sent_text)

    def message(self, content: str, tool_calls: list[dict[str, Any]]) -> dict[str, Any]:
        fields = {key: _plain(value) for key, value in self.fields.items()}
        message = {"role": self.role or "assistant", "content": content or None, **fields}
        return {**message, "tool_calls": tool_calls} if tool_calls else message

    def assembled(self) -> dict[str, Any]:
        return self.message(self.content, [c.full() for _, c in sorted(self.tool_calls.items())])


class ChunkAssembler:
    """Assembles one upstream chat-completion stream and decides what the client gets when.

    `add` forwards content, role, logprobs and every other delta field (refusal, reasoning) as
    they arrive; tool-call deltas and each choice's finish wait until the caller takes the choice
    from `take_finished` and releases it with `emit_tool_calls`. `hold_content=True` holds
    content too, so that a repair may replace it entirely. For the OpenAI SDK's accumulator the
    client stream is normalised: a choice's first delta, and only that one, carries `role`;
    choices open in index order; null and empty-string fields are not sent; upstream `event:`
    and `id:` fields are not re-emitted.
    """

    def __init__(self, *, hold_content: bool = False) -> None:
        self._hold_content = hold_content
        self._envelope: dict[str, Any] | None = None
        self._choices: dict[int, _Choice] = {}
        self._finished: list[int] = []
        self._usage: dict[str, Any] | None = None
        self._extra_usage: dict[str, Any] = {}
        self._usage_on_choices = False  # upstream writes `usage` (null or running) on every chunk

    def add(self, chunk: Mapping[str, Any]) -> list[Chunk]:
        """Absorb one upstream chunk; return the chunks to forward to the client now.

        A chunk that only carried tool-call deltas or a finish forwards nothing. Raises
        `UpstreamStatusError` for an upstream error event, and `UpstreamProtocolError` for a
        chunk that is not a chat-completion chunk or a delta after its choice's finish.
        """
        _raise_if_error(chunk)
        choices, usage = chunk.get("choices"), chunk.get("usage")
        if not isinstance(choices, list) or not isinstance(usage, dict | None):
            raise _sent(f"a chunk that is not a chat-completion chunk: {excerpt(str(chunk))}")
        if self._envelope is None:
            self._envelope = {k: v for k, v in chunk.items() if k not in ("choices", "usage")}
        out = {k: v for k, v in chunk.items() if k != "choices"}
        if usage is not None:
            self._usage = usage
            out["usage"] = self._total_usage()
        if not choices:  # the usage chunk, or a provider's own (filter results)
            return [{**out, "choices": []}]
        self._usage_on_choices = self._usage_on_choices or "usage" in chunk
        staged: dict[int, dict[str, Any]] = {}
        for raw in sorted(choices, key=_choice_index):
            if raw["index"] in staged:
                raise _sent(f"choice {raw['index']} twice in one chunk")
            forwarded = self._absorb(raw)
            if forwarded is not None:
                self._stage(forwarded, staged)
        return [{**out, "choices": [staged[i] for i in sorted(staged)]}] if staged else []

    def take_finished(self) -> list[FinishedChoice]:
        """Return the choices whose `finish_reason` arrived since the last call, in arrival order.

        Each must then be released with `emit_tool_calls`, with or without tool calls.
        """
        taken = [(i, self._choices[i]) for i in self._finished]
        self._finished.clear()
        return [FinishedChoice(i, c.assembled(), c.finish_reason or "") for i, c in taken]

    def emit_tool_calls(
        self, index: int, message: Mapping[str, Any] | None = None, finish_reason: str | None = None
    ) -> list[Chunk]:
        """Release a finished choice; return chunks carrying its tool calls, then its finish.

        `message` (default: as assembled) is the message to deliver, e.g. a repaired one, and
        `finish_reason` (default: the upstream's) its finish. Each tool call goes out whole in one
        delta (`index`, `id`, `type`, `function.name`, `function.arguments`). Content the client
        already has stays: when `message.content` extends it, the rest is sent; when it differs,
        the sent content stands and only the tool calls are replaced. Raises ValueError if the
        choice has not finished or was already released.
        """
        state = self._choices.get(index)
        if state is None or state.finish_reason is None or state.delivered is not None:
            raise ValueError(f"choice {index} is not finished and waiting to be emitted")
        message = state.assembled() if message is None else message
        reason = finish_reason or state.finish_reason
        content, deltas = message.get("content"), list[dict[str, Any]]()
        if isinstance(content, str) and content.startswith(state.sent) and content != state.sent:
            deltas.append({"content": content[len(state.sent) :]})
            state.sent_text = _Text(content)
        calls = [full_tool_call(call) for call in message.get("tool_calls") or []]
        deltas += [{"tool_calls": [{"index": i, **call}]} for i, call in enumerate(calls)]
        chunks = [self._synthesise(index, delta) for delta in deltas]
        chunks.append(self._synthesise(index, {}, reason, state.finish_fields))
        state.delivered = state.message(state.sent, calls)
        state.finish_reason = reason
        return chunks

    def add_usage(self, usage: Mapping[str, Any]) -> None:
        """Count another attempt's usage (a repair's) in every usage sent from now on.

        Call it before `add` receives the upstream's final usage chunk.
        """
        self._extra_usage = sum_usage([self._extra_usage, usage])

    def close(self) -> None:
        """Declare the upstream stream over (`[DONE]` or end of body).

        Raises `UpstreamProtocolError` if it carried no chunk or a choice never finished, and
        ValueError if a finished choice was never released with `emit_tool_calls`.
        """
        if self._envelope is None:
            raise UpstreamProtocolError("upstream stream ended without any chunk")
        for index, state in sorted(self._choices.items()):
            if state.finish_reason is None:
                raise UpstreamProtocolError(f"upstream stream ended before choice {index} finished")
            if state.delivered is None:
                raise ValueError(f"choice {index} finished but was never emitted")

    def to_completion(self) -> dict[str, Any]:
        """The non-streamed `chat.completion` equivalent of the stream, for logs and accounting.

        Released choices carry the message the client accumulated, the others the message as
        assembled so far. `usage` sums the upstream's and `add_usage`'s; None if the upstream
        sent none.
        """
        choices = [
            {
                "index": index,
                "message": state.assembled() if state.delivered is None else state.delivered,
                "logprobs": _plain(state.logprobs),
                "finish_reason": state.finish_reason,
                **state.finish_fields,
            }
            for index, state in sorted(self._choices.items())
        ]
        envelope = {**(self._envelope or {}), "object": "chat.completion"}
        return {**envelope, "choices": choices, "usage": self._total_usage()}

    def _absorb(self, raw: dict[str, Any]) -> dict[str, Any] | None:
        """Record one upstream choice; return the part to forward now, or None."""
        index: int = raw["index"]
        state = self._choices.setdefault(index, _Choice())
        delta, logprobs = raw.get("delta") or {}, raw.get("logprobs")
        if state.finish_reason is not None or not isinstance(delta, dict):
            raise _sent(f"an invalid or late delta for choice {index}: {excerpt(str(raw))}")
        forwarded: dict[str, Any] = {}
        for key, value in delta.items():
            if key == "tool_calls" and value is not None:
                _absorb_tool_calls(state, value, index)
            elif key == "role":
                state.role = state.role or value
            elif value is None or value == "":
                continue
            elif key == "content":
                if not isinstance(value, str):
                    raise _sent(f"a non-string `content` delta for choice {index}")
                state.text.add(value)
                if not self._hold_content:
                    state.sent_text.add(value)
                    forwarded[key] = value
            else:
                state.fields[key] = _merge(state.fields.get(key), value)
                forwarded[key] = value
        state.logprobs = _merge(state.logprobs, logprobs)
        others = {k: v for k, v in raw.items() if k not in _CHOICE_KEYS}
        if raw.get("finish_reason") is not None:
            state.finish_reason, state.finish_fields, others = str(raw["finish_reason"]), others, {}
            self._finished.append(index)
        if not forwarded and logprobs is None and (state.opened or delta.get("role") is None):
            return None
        return _choice(index, forwarded, logprobs, **others)

    def _stage(self, choice: dict[str, Any], staged: dict[int, dict[str, Any]]) -> None:
        """Add `choice` to a chunk being built, opening it (and any lower choice) with `role`."""
        index: int = choice["index"]
        for lower in range(index + 1):
            state = self._choices.setdefault(lower, _Choice())
            if state.opened or lower in staged:
                continue
            state.opened = True
            role = {"role": state.role or "assistant"}
            if lower == index:
                choice["delta"] = {**role, **choice["delta"]}
            else:
                staged[lower] = _choice(lower, role)
        staged[index] = choice

    def _synthesise(
        self, index: int, delta: dict[str, Any], reason: str | None = None, fields: Any = None
    ) -> Chunk:
        staged: dict[int, dict[str, Any]] = {}
        self._stage(_choice(index, delta, None, reason, **(fields or {})), staged)
        chunk = {**(self._envelope or {}), "choices": [staged[i] for i in sorted(staged)]}
        if self._usage_on_choices:
            chunk["usage"] = self._total_usage()
        return chunk

    def _total_usage(self) -> dict[str, Any] | None:
        return None if self._usage is None else sum_usage([self._usage, self._extra_usage])


class ChatAssembly:
    """One chat-completion stream (see `proxy.protocols.base.StreamAssembly`)."""

    response_id = None  # chat completions do not chain

    def __init__(self) -> None:
        self._chunks = ChunkAssembler()
        self.done = False

    def add(self, event: SSEEvent) -> list[bytes]:
        if event.payload is None:
            self.done = True
            return []
        return [encode_event(chunk) for chunk in self._chunks.add(event.payload)]

    def take_finished(self) -> list[Choice]:
        return [Choice(c.index, c.message, c.finish_reason) for c in self._chunks.take_finished()]

    def release(self, settled: Settled) -> list[bytes]:
        for usage in settled.usage:
            self._chunks.add_usage(usage)
        chunks = self._chunks.emit_tool_calls(settled.index, settled.message, settled.finish_reason)
        return [encode_event(chunk) for chunk in chunks]

    def end(self) -> bytes:
        self._chunks.close()  # an upstream that ends without [DONE] is fine if every choice finished
        return DONE

    def error_event(self, error: ToolsentryError) -> bytes:
        return encode_event(error.body()) + DONE


def _raise_if_error(chunk: Mapping[str, Any]) -> None:
    error = chunk.get("error")
    if isinstance(error, dict):
        detail, code, body = error.get("message"), error.get("code"), {"error": error}
    elif chunk.get("object") == "error":  # older vLLM: the error fields at the top level
        detail, code, body = chunk.get("message"), chunk.get("code"), None
    else:
        return
    status = code if isinstance(code, int) and 400 <= code < 600 else 502
    message = f"upstream failed during the stream: {detail}"
    raise UpstreamStatusError(message, status=status, body=body)


def _choice_index(raw: object) -> int:
    if not isinstance(raw, dict) or type(raw.get("index")) is not int:
        raise _sent(f"a choice without an integer `index`: {excerpt(str(raw))}")
    return int(raw["index"])


def _absorb_tool_calls(state: _Choice, value: object, index: int) -> None:
    for entry in value if isinstance(value, list) else [None]:
        if not isinstance(entry, dict) or type(entry.get("index")) is not int:
            raise _sent(f"a tool-call delta without an integer `index` for choice {index}")
        call = state.tool_calls.get(entry["index"])
        if call is None:
            call = state.tool_calls[entry["index"]] = _Call()
        call.id = call.id or entry.get("id")  # some servers repeat the id on every delta
        call.type = entry.get("type") or call.type
        function = entry.get("function") or {}
        for key in ("name", "arguments"):  # the OpenAI SDK concatenates name fragments too
            fragment = function.get(key)
            if fragment is not None and not isinstance(fragment, str):
                raise _sent(f"a tool-call `{key}` that is not a string for choice {index}")
            if fragment:
                (call.name if key == "name" else call.arguments).add(fragment)


def full_tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    """A tool call in the shape of a non-streamed message's, whatever the input leaves out."""
    function = call.get("function") or {}
    name, arguments = function.get("name") or "", function.get("arguments") or ""
    function = {"name": name, "arguments": arguments}
    return {"id": call.get("id"), "type": call.get("type") or "function", "function": function}


def _choice(
    index: int,
    delta: dict[str, Any],
    logprobs: Any = None,
    reason: str | None = None,
    /,
    **more: Any,
) -> dict[str, Any]:
    return {**more, "index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}


def _merge(old: Any, new: Any) -> Any:
    """Accumulate a delta field as the OpenAI SDK does: strings and lists concatenate, objects
    merge key by key, a null changes nothing, anything else replaces.

    Linear in what accumulates: strings gather as `_Text` (read with `_plain`), and the lists and
    objects made here are the assembler's own and grow in place, never copied per delta."""
    if new is None:
        return old
    if isinstance(new, str):
        if isinstance(old, _Text):
            old.add(new)
            return old
        return _Text(new)
    if isinstance(new, list):
        if isinstance(old, list):
            old.extend(new)
            return old
        return list(new)
    if isinstance(new, dict):
        merged = old if isinstance(old, dict) else {}
        for key, value in new.items():
            merged[key] = _merge(merged.get(key), value)
        return merged
    return new


def _plain(value: Any) -> Any:
    """An accumulated value (`_merge`) as plain JSON data: its `_Text`s joined."""
    if isinstance(value, _Text):
        return str(value)
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list) and any(isinstance(item, _Text | dict | list) for item in value):
        return [_plain(item) for item in value]
    return value
