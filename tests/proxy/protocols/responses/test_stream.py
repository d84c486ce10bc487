"""Tests for proxy/protocols/responses/stream.py: one Responses stream assembled."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.sse import SSEEvent
from tests.proxy.protocols.responses.test_adapter import LEAK, PROTOCOL, leaks_in_reasoning


@pytest.mark.parametrize(
    "delta", ["response.reasoning_text.delta", "response.reasoning_summary_text.delta"]
)
def test_a_streams_reasoning_deltas_pass_at_once_and_are_scanned_where_its_items_have_no_text(
    delta: str,
) -> None:
    assembly = PROTOCOL.assembly({})
    bare = {"type": "reasoning", "id": "rs_1", "summary": []}  # done events without the text
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {"id": "resp_1", "output": []}},
        {"type": "response.output_item.added", "output_index": 0, "item": bare},
        *({"type": delta, "output_index": 0, "item_id": "rs_1", "content_index": 0,
           "summary_index": 0, "delta": piece} for piece in ("I think. ", LEAK[:12], LEAK[12:])),
        {"type": "response.output_item.done", "output_index": 0, "item": bare},
        {"type": "response.completed", "response": {"id": "resp_1", "status": "completed"}},
    ]  # fmt: skip
    sent = [assembly.add(SSEEvent(orjson.dumps(e).decode(), e, e["type"])) for e in events]
    assert [len(out) for out in sent] == [1, 1, 1, 1, 1, 1, 0]  # each delta passed as it came
    assert orjson.loads(sent[3][0].split(b"data: ")[1])["delta"] == LEAK[:12]
    (choice,) = assembly.take_finished()
    assert choice.message["reasoning"] == "I think. " + LEAK
    assert leaks_in_reasoning(choice.message) == [("leaked_tool_call", True, "hermes")]
