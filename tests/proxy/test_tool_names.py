"""A tool call's name is matched exactly: fragments of a streamed name are joined before the check,
and a name with other case or surrounding whitespace is an unknown tool, not a valid call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from proxy.protocols.chat.answer import completion_chunks
from proxy.testing import SSE, completion, tool_call
from tests.proxy.builders import make_request
from tests.proxy.conftest import RunningProxy, RunningUpstream

ARGUMENTS = {"order_id": "#W1"}


def split_name_chunks(name: str, at: int) -> list[bytes | dict[str, Any]]:
    """The chunks of a streamed call to `name`, the name sent as two fragments cut at `at`."""
    chunks = completion_chunks(
        completion(tool_calls=[tool_call(name, ARGUMENTS, id="call_split")]), fragment=5
    )
    events: list[bytes | dict[str, Any]] = []
    for chunk in chunks:
        calls = chunk["choices"][0]["delta"].get("tool_calls") if chunk["choices"] else None
        if calls and "name" in calls[0].get("function", {}):
            head, rest = dict(chunk), dict(chunk)
            first = calls[0] | {"function": calls[0]["function"] | {"name": name[:at]}}
            tail = {"index": calls[0]["index"], "function": {"name": name[at:]}}
            head["choices"] = [chunk["choices"][0] | {"delta": {"tool_calls": [first]}}]
            rest["choices"] = [chunk["choices"][0] | {"delta": {"tool_calls": [tail]}}]
            events += [head, rest]
        else:
            events.append(chunk)
    return events


def streamed_call(proxy: RunningProxy, session: str) -> tuple[str, dict[str, Any]]:
    """The tool name the SDK assembled from the proxy's stream, and the proxy's session record."""
    with proxy.client(default_headers={"x-session-id": session}).chat.completions.stream(
        **make_request()
    ) as stream:
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert calls is not None
    return calls[0].function.name, proxy.session(session)


@pytest.mark.parametrize("at", [1, 4, 9, 16])
def test_a_declared_name_streamed_in_fragments_is_one_valid_call(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream, at: int
) -> None:
    proxy = make_proxy(repair="off")
    upstream.script.push(SSE(split_name_chunks("get_order_details", at)))

    name, record = streamed_call(proxy, f"s-split-{at}")

    assert name == "get_order_details"
    assert record["channels"] == {}, record


@pytest.mark.parametrize("at", [1, 7, 11])
def test_an_undeclared_name_streamed_in_fragments_is_an_unknown_tool(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream, at: int
) -> None:
    # Each fragment alone ("get_order", "_details_v2"...) matches nothing either: only the
    # joined name may be checked.
    proxy = make_proxy(repair="off", on_unrepaired="passthrough")
    upstream.script.push(SSE(split_name_chunks("get_order_details_v2", at)))

    name, record = streamed_call(proxy, f"s-split-unknown-{at}")

    assert name == "get_order_details_v2"
    assert record["channels"] == {"unknown_tool": 1}, record


@pytest.mark.parametrize(
    "name",
    [
        " get_order_details",
        "get_order_details ",
        "get_order_details\n",
        "Get_Order_Details",
        "GET_ORDER_DETAILS",
    ],
)
@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
def test_a_name_with_whitespace_or_another_case_is_an_unknown_tool(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream, name: str, streamed: bool
) -> None:
    proxy = make_proxy(repair="off")
    reply = completion(tool_calls=[tool_call(name, ARGUMENTS)])
    upstream.script.push(SSE.of(reply) if streamed else reply)
    client = proxy.client(default_headers={"x-session-id": "s-name"})

    if streamed:
        with client.chat.completions.stream(**make_request()) as stream:
            stream.until_done()
    else:
        raw = client.chat.completions.with_raw_response.create(**make_request())
        assert raw.headers["x-toolsentry-violations"] == "unknown_tool"

    assert proxy.session("s-name")["channels"] == {"unknown_tool": 1}
