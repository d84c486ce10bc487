"""The Anthropic Messages API (`POST /v1/messages`) as a wire protocol of the turn (issue 15): the
adapter that puts together the request's reading (`request.py`), the answer's (`reply.py`) and the
stream's assembly (`stream.py`)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import proxy.protocols.messages.answer as wire
from proxy.errors import ToolsentryError, UpstreamProtocolError
from proxy.guard.channels import Violation
from proxy.guard.toolcheck import ToolIndex
from proxy.protocols.answer import Answer, Usage
from proxy.protocols.base import API, Adapter, Choice, Message, Reply, Settled, TurnView
from proxy.protocols.messages.reply import (
    content_blocks,
    error_body,
    finish_of,
    read_message,
    stop_reason_of,
)
from proxy.protocols.messages.request import reask_turns, session_hints, tool_results
from proxy.protocols.messages.stream import MessagesAssembly
from proxy.protocols.messages.tools import chat_tools, tool_choice
from proxy.sse import encode_typed_event


class MessagesProtocol(Adapter):
    """The Anthropic Messages adapter (see `proxy.protocols.base.WireProtocol`)."""

    api = API.MESSAGES
    path = "messages"
    resent: tuple[str, ...] = ("system",)  # Claude Code's system blocks, 7 kB

    def guard_tools(self, tools: list[Any]) -> list[Any]:
        return chat_tools(tools)

    def view(self, body: dict[str, Any], index: ToolIndex | None) -> TurnView:
        messages = self.conversation(body)
        return TurnView(
            body.get("model"),
            self.tool_index(self.declared_tools(body), index),
            tool_choice(body.get("tool_choice")),
            session_hints(body),
            tool_results(messages),
            bool(body.get("stream")),
        )

    def read(self, data: Any, upstream: str) -> Reply:
        content = data.get("content") if isinstance(data, dict) else None
        if not isinstance(content, list):
            raise UpstreamProtocolError(
                f"upstream '{upstream}' answered 200 with a body that is not a Messages message"
            )
        return Reply(data, [Choice(0, read_message(content), finish_of(data.get("stop_reason")))])

    def write(
        self, reply: Reply, settled: Sequence[Settled], usage: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        body = reply.body
        for done in settled:
            if done.changed:
                body["content"] = content_blocks(done.message)
                body["stop_reason"] = stop_reason_of(done.finish_reason, body.get("stop_reason"))
        if usage is not None:
            body["usage"] = dict(usage)
        return body

    def reask_continuation(
        self, message: Message, violations: Sequence[Violation], index: ToolIndex
    ) -> list[dict[str, Any]]:
        return reask_turns(message, violations, index)

    def finish(self, body: dict[str, Any], text: str) -> dict[str, Any]:
        return wire.body(closing_answer(body, text))

    def finish_stream(self, answer: dict[str, Any], body: dict[str, Any]) -> tuple[bytes, bytes]:
        text = "".join(b.get("text", "") for b in answer.get("content") or [])
        *events, stop = wire.events(closing_answer(body, text, answer_id=answer["id"][4:]))
        return b"".join(encode_typed_event(e) for e in events), encode_typed_event(stop)

    def error(self, error: ToolsentryError) -> dict[str, Any]:
        return error_body(error)

    def assembly(self, body: dict[str, Any]) -> MessagesAssembly:
        return MessagesAssembly()


def closing_answer(body: Mapping[str, Any], text: str, *, answer_id: str | None = None) -> Answer:
    """The `finish` policy's answer: `text`, as a normal end of turn, no tokens counted."""
    model = body.get("model")
    return Answer(
        text=text,
        usage=Usage(0, 0),
        model=model if isinstance(model, str) else "",
        id=answer_id or f"toolsentry_{uuid.uuid4().hex[:24]}",
        created=int(time.time()),
    )
