"""A stream's assembly is linear in the answer's size: no text is copied whole per delta.

Counted, never timed: every delta's text is a `str` subclass that counts the characters a
concatenation with it copies (Python calls a subclass's reflected `__radd__` first, so
`text += piece` lands here). Joining the pieces once copies none of them through `+`; `+=` on an
attribute copies the whole text so far at every delta, quadratic in the answer.
"""

from __future__ import annotations

from typing import Any

from proxy.protocols.chat.stream import ChunkAssembler
from proxy.protocols.responses.stream import ResponsesAssembly
from proxy.sse import SSEEvent

PIECES = 2_000
PIECE = "abcdefgh"


class Counted(str):
    """A piece of streamed text that counts what concatenations with it copy."""

    copied = 0

    def __add__(self, other: str) -> str:
        Counted.copied += len(self) + len(other)
        return str.__add__(self, other)

    def __radd__(self, other: str) -> str:
        Counted.copied += len(self) + len(other)
        return str.__add__(other, self)


def piece() -> Counted:
    return Counted(PIECE)


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def test_a_chat_stream_copies_no_text_per_delta() -> None:
    Counted.copied = 0
    assembler = ChunkAssembler()
    assembler.add(chunk({"role": "assistant"}))
    for _ in range(PIECES):
        assembler.add(chunk({"reasoning_content": piece()}))
    for _ in range(PIECES):
        assembler.add(chunk({"content": piece()}))
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f"}}
    assembler.add(chunk({"tool_calls": [{**call, "function": {"name": "f", "arguments": ""}}]}))
    for _ in range(PIECES):
        assembler.add(chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece()}}]}))
    assembler.add(chunk({}, "tool_calls"))
    (finished,) = assembler.take_finished()
    assembler.emit_tool_calls(finished.index)
    assembler.close()

    total = PIECES * len(PIECE)
    # Linear: at most a constant times the text; `+=` per delta copies ~PIECES/2 times more.
    assert Counted.copied <= 3 * 3 * total
    message = assembler.to_completion()["choices"][0]["message"]
    assert len(message["content"]) == len(message["reasoning_content"]) == total
    assert len(message["tool_calls"][0]["function"]["arguments"]) == total


def event(payload: dict[str, Any]) -> SSEEvent:
    return SSEEvent(data="", payload=payload, event=payload["type"])


def test_a_responses_stream_copies_no_arguments_per_delta() -> None:
    Counted.copied = 0
    assembly = ResponsesAssembly()
    item = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f"}
    assembly.add(event({"type": "response.output_item.added", "output_index": 0, "item": item}))
    for _ in range(PIECES):
        delta = {"type": "response.function_call_arguments.delta", "output_index": 0}
        assembly.add(event({**delta, "item_id": "fc_1", "delta": piece()}))
    response = {"id": "resp_1", "object": "response", "status": "completed", "output": []}
    assembly.add(event({"type": "response.completed", "response": response}))
    (choice,) = assembly.take_finished()

    total = PIECES * len(PIECE)
    (call,) = choice.message["tool_calls"]
    assert len(call["function"]["arguments"]) == total
    assert Counted.copied <= 3 * total
