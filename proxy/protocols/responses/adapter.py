"""The Responses API (`POST /v1/responses`: Codex CLI, the OpenAI Agents SDK) as a wire protocol
of the turn: the adapter that puts together the request's reading (`request.py`, `tools.py`), the
answer's (`reply.py`) and the stream's assembly (`stream.py`)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from itertools import repeat
from typing import Any, Final

import proxy.protocols.responses.answer as wire
from proxy.errors import BadRequestError, ToolsentryError, UpstreamProtocolError
from proxy.guard.channels import Violation
from proxy.guard.toolcheck import ToolIndex
from proxy.protocols.base import API, Adapter, Choice, Message, Reply, Settled, TurnView
from proxy.protocols.responses.reply import (
    RESPONSE_ID,
    failed,
    finish_of,
    guard_message,
    output_items,
    set_status,
)
from proxy.protocols.responses.request import (
    first_text,
    history,
    input_items,
    reask_items,
    tool_results,
)
from proxy.protocols.responses.stream import EventWriter, ResponsesAssembly
from proxy.protocols.responses.tools import chat_tools, guard_tool_choice
from proxy.session.budget import SessionHints

_DICT: Final = repeat(dict)  # `map(isinstance, items, _DICT)`: every item checked in C


class ResponsesProtocol(Adapter):
    """The Responses adapter (see `proxy.protocols.base.WireProtocol`)."""

    api = API.RESPONSES
    path = "responses"
    reasked = "input"
    not_reasked = frozenset({"stream", "stream_options", "background"})

    def guard_tools(self, tools: list[Any]) -> list[Any]:
        return chat_tools(tools)

    def view(self, body: dict[str, Any], index: ToolIndex | None) -> TurnView:
        items = input_items(body.get("input"))
        tools = self.declared_tools(body)
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise BadRequestError("'instructions' must be a string", param="instructions")
        previous = body.get("previous_response_id")
        if previous is not None and not isinstance(previous, str):
            raise BadRequestError(
                "'previous_response_id' must be a string", param="previous_response_id"
            )
        index = self.tool_index(tools, index)
        model = body.get("model")
        metadata = body.get("metadata")
        system = instructions or first_text(items, ("system", "developer"))
        # Positional: the named tuple's keyword arguments cost a third of its making.
        hints = SessionHints(
            (model if isinstance(model, str) else "", system, first_text(items, ("user",))),
            metadata.get("session_id") if isinstance(metadata, Mapping) else None,
            "metadata.session_id",
            previous,
            body.get("user"),
            None,
            history,
        )
        return TurnView(
            model,
            index,
            guard_tool_choice(body.get("tool_choice")),
            hints,
            tool_results(items),
            bool(body.get("stream")),
        )

    def read(self, data: Any, upstream: str) -> Reply:
        output = data.get("output") if isinstance(data, dict) else None
        if not isinstance(output, list):
            raise UpstreamProtocolError(
                f"upstream '{upstream}' answered 200 with a body that is not a response"
            )
        if not all(map(isinstance, output, _DICT)):
            raise UpstreamProtocolError(
                f"upstream '{upstream}' sent an output item that is not an object"
            )
        if data.get("status") == "failed":
            raise failed(data, upstream)
        response_id = data.get("id")
        if not isinstance(response_id, str):
            response_id = None
        message = guard_message(output, response_id)
        return Reply(data, [Choice(0, message, finish_of(data, message))], response_id)

    def write(
        self, reply: Reply, settled: Sequence[Settled], usage: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        body = dict(reply.body)
        for done in settled[:1]:
            if done.changed:
                body["output"] = output_items(done.message)
                response_id = done.message.get(RESPONSE_ID)
                if isinstance(response_id, str):
                    body["id"] = response_id
                set_status(body, done.finish_reason)
        if usage is not None:
            body["usage"] = dict(usage)
        return body

    def reask_history(self, body: dict[str, Any]) -> list[Any]:
        return input_items(body.get("input"))

    def reask_continuation(
        self, message: Message, violations: Sequence[Violation], index: ToolIndex
    ) -> list[dict[str, Any]]:
        return reask_items(message, violations, index)

    def finish(self, body: dict[str, Any], text: str) -> dict[str, Any]:
        model = body.get("model")
        return {
            "id": f"resp_toolsentry_{uuid.uuid4().hex[:24]}",
            "object": "response",
            "created_at": int(time.time()),
            "model": model if isinstance(model, str) else "",
            "status": "completed",
            "incomplete_details": None,
            "error": None,
            "output": [_text_item(text)],
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "usage": {
                "input_tokens": 0,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": 0,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 0,
            },
        }

    def finish_stream(self, answer: dict[str, Any], body: dict[str, Any]) -> tuple[bytes, bytes]:
        writer = EventWriter()
        started = {**answer, "status": "in_progress", "output": [], "usage": None}
        *events, completed = wire.stream(started, answer, None)
        return b"".join(map(writer.forward, events)), writer.forward(completed)

    def error(self, error: ToolsentryError) -> dict[str, Any]:
        return error.body()

    def assembly(self, body: dict[str, Any]) -> ResponsesAssembly:
        return ResponsesAssembly()


def _text_item(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"msg_toolsentry_{uuid.uuid4().hex[:24]}",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
