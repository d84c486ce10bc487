"""Chat completions (`POST /v1/chat/completions`) as a wire protocol of the turn.

The guard's neutral message is chat's own assistant message, so reading a reply is taking its
choices and writing one is putting the settled messages back. A re-ask appends the assistant's
message and one `role: tool` answer per call (DESIGN §6); streams are assembled by
`proxy.protocols.chat.stream.ChunkAssembler`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.errors import ToolsentryError, UpstreamProtocolError
from proxy.guard.toolcheck import ToolIndex
from proxy.protocols.base import (
    API,
    Adapter,
    Choice,
    Finish,
    Reply,
    Settled,
    ToolResult,
    TurnView,
)
from proxy.protocols.chat.answer import completion_chunks
from proxy.protocols.chat.request import history
from proxy.protocols.chat.stream import ChatAssembly
from proxy.session.budget import content_text, message_hints
from proxy.sse import DONE, encode_event


class ChatProtocol(Adapter):
    """The chat-completions adapter (see `proxy.protocols.base.WireProtocol`)."""

    api = API.CHAT
    path = "chat/completions"
    not_reasked = frozenset({"stream", "stream_options", "n"})

    def view(self, body: dict[str, Any], index: ToolIndex | None) -> TurnView:
        messages = self.conversation(body)
        return TurnView(
            body.get("model"),
            self.tool_index(self.declared_tools(body), index),
            body.get("tool_choice"),
            message_hints(body, history),
            tool_results(messages),
            bool(body.get("stream")),
        )

    def read(self, data: Any, upstream: str) -> Reply:
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(data, dict) or not isinstance(choices, list):
            raise UpstreamProtocolError(
                f"upstream '{upstream}' answered 200 with a body that is not a chat completion"
            )
        read = []
        for position, choice in enumerate(choices):
            if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
                raise UpstreamProtocolError(
                    f"upstream '{upstream}' sent a choice without a message"
                )
            index = choice.get("index")
            read.append(
                Choice(
                    index if isinstance(index, int) else position,
                    choice["message"],
                    choice.get("finish_reason"),
                )
            )
        return Reply(data, read)

    def write(
        self, reply: Reply, settled: Sequence[Settled], usage: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        body = reply.body
        choices = body["choices"]
        for position, done in enumerate(settled):
            if done.changed:
                choices[position]["message"] = done.message
                choices[position]["finish_reason"] = done.finish_reason
        if usage is not None:
            body["usage"] = dict(usage)
        return body

    def finish(self, body: dict[str, Any], text: str) -> dict[str, Any]:
        model = body.get("model")
        return {
            "id": f"chatcmpl-toolsentry-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model if isinstance(model, str) else "",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "tool_calls": None},
                    "finish_reason": Finish.STOP,
                    "logprobs": None,
                }
            ],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }

    def finish_stream(self, answer: dict[str, Any], body: dict[str, Any]) -> tuple[bytes, bytes]:
        options = body.get("stream_options")
        include_usage = bool(options.get("include_usage")) if isinstance(options, dict) else False
        chunks = completion_chunks(answer, include_usage=include_usage)
        return b"".join(encode_event(chunk) for chunk in chunks), DONE

    def error(self, error: ToolsentryError) -> dict[str, Any]:
        return error.body()

    def assembly(self, body: dict[str, Any]) -> ChatAssembly:
        return ChatAssembly()


def tool_results(messages: list[Any]) -> list[ToolResult]:
    """The `role: tool` messages of a conversation that carry a `tool_call_id`, in order."""
    return [
        ToolResult(m["tool_call_id"], content_text(m.get("content")))
        for m in messages
        if isinstance(m, dict)
        and m.get("role") == "tool"
        and isinstance(m.get("tool_call_id"), str)
        and m["tool_call_id"]
    ]
