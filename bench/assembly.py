"""Stream assembly's cost by the answer's size: linear means 4 MB costs about 4 times 1 MB.

Each protocol's assembly (`proxy.protocols.*.stream`) fed one answer of 1 MB and one of 4 MB, in
deltas of a few bytes as a model streams them (chat: content, reasoning and a tool call's
arguments; Responses: a held call's arguments; Messages: text), no I/O. Prints CPU time per size
and the 4 MB / 1 MB ratio, side by side: about 4 is linear, 16 quadratic (as chat's content was
when each delta was `+=` on an attribute).

    python -m bench.assembly [--piece 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from proxy.protocols.chat.stream import ChunkAssembler
from proxy.protocols.messages.stream import MessagesAssembly
from proxy.protocols.responses.stream import ResponsesAssembly
from proxy.sse import SSEEvent

MB = 1024 * 1024


def chat(size: int, piece: int) -> None:
    assembler = ChunkAssembler()
    text = "x" * piece
    for field in ("reasoning_content", "content"):
        for _ in range(size // piece // 2):
            choice = {"index": 0, "delta": {field: text}, "finish_reason": None}
            assembler.add({"id": "c", "object": "chat.completion.chunk", "choices": [choice]})
    assembler.add({"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    for done in assembler.take_finished():
        assembler.emit_tool_calls(done.index)


def _event(payload: dict[str, Any]) -> SSEEvent:
    return SSEEvent(data="", payload=payload, event=payload["type"])


def responses(size: int, piece: int) -> None:
    assembly = ResponsesAssembly()
    item = {"type": "function_call", "id": "fc", "call_id": "c", "name": "f", "arguments": ""}
    assembly.add(_event({"type": "response.output_item.added", "output_index": 0, "item": item}))
    delta = {"type": "response.function_call_arguments.delta", "output_index": 0, "item_id": "fc"}
    text = "x" * piece
    for _ in range(size // piece):
        assembly.add(_event({**delta, "delta": text}))
    response = {"id": "r", "object": "response", "status": "completed", "output": []}
    assembly.add(_event({"type": "response.completed", "response": response}))
    assembly.take_finished()


def messages(size: int, piece: int) -> None:
    assembly = MessagesAssembly()
    start = {"id": "m", "type": "message", "role": "assistant", "content": [], "model": "m"}
    assembly.add(_event({"type": "message_start", "message": {**start, "usage": {}}}))
    block = {"type": "text", "text": ""}
    assembly.add(_event({"type": "content_block_start", "index": 0, "content_block": block}))
    delta = {"type": "text_delta", "text": "x" * piece}
    for _ in range(size // piece):
        assembly.add(_event({"type": "content_block_delta", "index": 0, "delta": delta}))


def cpu(run: Callable[[int, int], None], size: int, piece: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        run(size, piece)
        best = min(best, time.process_time() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--piece", type=int, default=4, help="bytes per delta")
    parser.add_argument("--rounds", type=int, default=3, help="best of this many")
    args = parser.parse_args()
    print(f"{'assembly':<10} {'1 MB s':>8} {'4 MB s':>8} {'ratio':>6}")
    for name, run in (("chat", chat), ("responses", responses), ("messages", messages)):
        one = cpu(run, MB, args.piece, args.rounds)
        four = cpu(run, 4 * MB, args.piece, args.rounds)
        print(f"{name:<10} {one:>8.2f} {four:>8.2f} {four / one:>6.1f}")


if __name__ == "__main__":
    main()
