"""Builders for the tests of the turn and of its gate: a chat turn begun in a session, an
upstream answer, and a metric sample of the turn's model and protocol."""

from __future__ import annotations

import time
from typing import Any

from proxy.pipeline.gate import Pipeline
from proxy.pipeline.turn import Exchange, Turn
from proxy.protocols.base import Choice
from proxy.protocols.chat import ChatProtocol
from proxy.testing import tool_call
from tests.proxy.builders import make_request
from tests.proxy.metrics_text import metric

VALID = tool_call("get_order_details", {"order_id": "#W1"}, id="call_ok")
UNKNOWN = tool_call("lookup_order", {"order_id": "#W1"}, id="call_bad")


async def begin(
    pipeline: Pipeline, session: str, body: dict[str, Any] | None = None, /, **headers: str
) -> Turn:
    """A chat turn of `session` begun with `body` (`make_request()` by default) and `headers`."""
    exchange = Exchange("chat", time.perf_counter())
    headers = {"x-session-id": session, **headers}
    body = make_request() if body is None else body
    return await pipeline.begin(ChatProtocol(pipeline.limits), body, headers, exchange)


def answer(*calls: dict[str, Any], content: str | None = None) -> Choice:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = list(calls)
    return Choice(0, message, "tool_calls" if calls else "stop")


def counted(pipeline: Pipeline, name: str, **labels: str) -> float:
    """A sample of the turn's model and protocol (0 when not exposed)."""
    labels = {"model": "scripted-model", **labels, "api": "chat"}
    return metric(pipeline.metrics.render().decode(), name, may_be_absent=True, **labels)
