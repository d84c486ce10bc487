"""The gate of the pipeline (`proxy/pipeline/gate.py`) driven directly: the client's overrides,
the budget gate under its policies, and the headers forwarded upstream."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from proxy.errors import BadRequestError, BudgetExhaustedError, status_of
from proxy.headers import HEADER_PREFIX, MAX_ERRORS_HEADER, REPAIR_HEADER
from proxy.pipeline.gate import Pipeline
from proxy.pipeline.turn import Exchange, Turn
from proxy.protocols.responses import ResponsesProtocol
from proxy.testing import tool_call
from tests.proxy.builders import make_request
from tests.proxy.metrics_text import metric
from tests.proxy.pipeline.turns import UNKNOWN, answer, begin, counted

RESPONSES_TOOLS = [
    {"type": "function", "name": "cancel_pending_order", "parameters": {"type": "object"}}
]


async def test_a_spent_budget_rejects_the_next_turn_with_429_and_its_report_in_the_headers(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    pipeline = make_pipeline(repair="off")
    first = await begin(pipeline, "s-budget", **{MAX_ERRORS_HEADER: "1"})
    await first.settle(answer(UNKNOWN))
    await first.close(200)
    with pytest.raises(BudgetExhaustedError) as raised:
        await begin(pipeline, "s-budget", **{MAX_ERRORS_HEADER: "1"})
    headers = raised.value.headers or {}
    assert headers["x-should-retry"] == "false"
    assert (headers["x-toolsentry-errors"], headers["x-toolsentry-max-errors"]) == ("1", "1")
    assert counted(pipeline, "toolsentry_requests_total", status="429") == 1


async def begin_responses(pipeline: Pipeline, session: str) -> Turn:
    """A Responses turn of `session`, declaring one tool."""
    exchange = Exchange("responses", time.perf_counter())
    body = {"model": "scripted-model", "input": "Cancel #W1.", "tools": RESPONSES_TOOLS}
    protocol = ResponsesProtocol(pipeline.limits)
    return await pipeline.begin(protocol, body, {"x-session-id": session}, exchange)


async def spend(pipeline: Pipeline, session: str) -> None:
    first = await begin(pipeline, session, **{MAX_ERRORS_HEADER: "1"})
    await first.settle(answer(UNKNOWN))
    await first.close(200)


@pytest.mark.parametrize(
    ("exhaustion_status", "expected"), [(None, 400), (429, 429), ({"responses": 403}, 403)]
)
async def test_a_spent_responses_session_is_refused_with_its_protocols_status(
    make_pipeline: Callable[..., Pipeline], exhaustion_status: object, expected: int
) -> None:
    # 400 by default: Codex CLI shows a 400's body and does not retry it; of a 429 it shows
    # only the status. `exhaustion_status: 429` gives the earlier answer back.
    settings = {} if exhaustion_status is None else {"exhaustion_status": exhaustion_status}
    pipeline = make_pipeline(repair="off", max_errors=1, **settings)
    await spend(pipeline, "s-responses")
    with pytest.raises(BudgetExhaustedError) as raised:
        await begin_responses(pipeline, "s-responses")
    assert status_of(raised.value) == expected
    assert raised.value.error_type == "error_budget_exhausted"
    assert (raised.value.headers or {})["x-should-retry"] == "false"
    labels = {"model": "scripted-model", "api": "responses", "status": str(expected)}
    text = pipeline.metrics.render().decode()
    assert metric(text, "toolsentry_requests_total", **labels) == 1


async def test_the_budget_message_names_the_channels_that_spent_it(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    pipeline = make_pipeline(repair="off")
    await spend(pipeline, "s-named")
    with pytest.raises(BudgetExhaustedError) as raised:
        await begin(pipeline, "s-named", **{MAX_ERRORS_HEADER: "1"})
    assert raised.value.message == (
        "session 's-named' has used its error budget: 1 errors of 1 allowed "
        "(failures by channel, repaired ones included: 1 unknown_tool)"
    )


async def test_the_finish_policy_closes_the_turn_at_begin_with_the_text_to_answer(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    pipeline = make_pipeline(repair="off", max_errors=1, exhaustion_policy="finish")
    first = await begin(pipeline, "s-finish")
    await first.settle(answer(UNKNOWN))
    await first.close(200)
    ending = await begin(pipeline, "s-finish")
    assert ending.closed
    assert ending.ending is not None
    assert "error budget" in ending.ending


@pytest.mark.parametrize(
    ("headers", "param"),
    [
        ({MAX_ERRORS_HEADER: "many"}, MAX_ERRORS_HEADER),
        ({MAX_ERRORS_HEADER: "0"}, MAX_ERRORS_HEADER),
        ({REPAIR_HEADER: "sometimes"}, REPAIR_HEADER),
    ],
)
async def test_a_bad_request_control_is_refused_naming_its_header(
    make_pipeline: Callable[..., Pipeline], headers: dict[str, str], param: str
) -> None:
    pipeline = make_pipeline()
    with pytest.raises(BadRequestError) as raised:
        await begin(pipeline, "s-bad", **headers)
    assert raised.value.param == param


async def test_a_request_may_lower_its_budget_but_not_raise_it(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    pipeline = make_pipeline(max_errors=5)
    lowered = await begin(pipeline, "s-low", **{MAX_ERRORS_HEADER: "2"})
    raised = await begin(pipeline, "s-high", **{MAX_ERRORS_HEADER: "50"})
    assert (lowered.budget.max_errors, raised.budget.max_errors) == (2, 5)


async def test_the_proxys_own_controls_are_not_forwarded_upstream(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    pipeline = make_pipeline()
    controls = {REPAIR_HEADER: "off", MAX_ERRORS_HEADER: "3", "x-request-id": "req-1"}
    turn = await begin(pipeline, "s-forward", **controls)
    assert turn.forward["x-request-id"] == "req-1"
    assert not [name for name in turn.forward if name.startswith(HEADER_PREFIX)]


async def test_a_session_refused_twice_ran_out_once_and_was_refused_twice(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    pipeline = make_pipeline(repair="off", max_errors=1)
    first = await begin(pipeline, "s-twice")
    await first.settle(answer(UNKNOWN))
    await first.close(200)  # its one unrepaired call spends the budget
    assert counted(pipeline, "toolsentry_budget_exhausted_total") == 1
    assert counted(pipeline, "toolsentry_budget_refusals_total") == 0
    for _ in range(2):
        with pytest.raises(BudgetExhaustedError):
            await begin(pipeline, "s-twice")
    assert counted(pipeline, "toolsentry_budget_exhausted_total") == 1
    assert counted(pipeline, "toolsentry_budget_refusals_total") == 2


async def test_tool_errors_that_spend_the_budget_count_the_session_under_every_policy(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    pipeline = make_pipeline(max_errors=2, exhaustion_policy="observe")
    failed = [
        {"role": "tool", "tool_call_id": f"call_{n}", "content": "Error: no such order"}
        for n in range(3)
    ]
    body = make_request()
    for n in range(3):  # each request reports one failed tool result more
        calls = [tool_call("get_order_details", {"order_id": "#W1"}, id=f"call_{n}")]
        body["messages"] += [{"role": "assistant", "content": None, "tool_calls": calls}, failed[n]]
        turn = await begin(pipeline, "s-observed", body)
        await turn.close(200)
    assert turn.record.errors == 3
    assert counted(pipeline, "toolsentry_budget_exhausted_total") == 1
    assert counted(pipeline, "toolsentry_budget_refusals_total") == 0  # observe refuses nothing


def with_tool_results(*texts: str, first: int = 0) -> dict[str, object]:
    """A request whose history holds one call of `get_order_details` and its result per text,
    the calls numbered from `first`."""
    body = make_request()
    for n, text in enumerate(texts, first):
        calls = [tool_call("get_order_details", {"order_id": "#W1"}, id=f"call_{n}")]
        body["messages"] += [
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": f"call_{n}", "content": text},
        ]
    return body


CODEX_FAILED = "Chunk ID: 1\nWall time: 0.1 seconds\nProcess exited with code 2\nOutput:\nls: no"
AGENTS_FAILED = "An error occurred while running the tool. Please try again."


async def test_tool_errors_are_read_in_the_form_of_the_client_that_sent_them(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    pipeline = make_pipeline()
    body = with_tool_results(CODEX_FAILED, "unsupported call: x", AGENTS_FAILED, "delivered")
    codex = await begin(pipeline, "s-codex", body, originator="codex_exec")
    other = await begin(pipeline, "s-other", body, **{"user-agent": "OpenAI/Python 3.63.0"})
    # Codex's two forms; the Agents SDK's text, read on any client but Codex.
    assert (codex.record.errors, other.record.errors) == (2, 1)
    assert codex.record.channels == {"tool_error": 2}
    prefixed = await begin(pipeline, "s-codex", with_tool_results("Error: no such order", first=9))
    assert prefixed.record.errors == 3  # τ²-bench's prefix, read for every client


async def test_a_configured_tool_error_pattern_is_read_where_it_applies(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    rule = {"pattern": r"^FAILED\b", "clients": ["agents_sdk"], "apis": ["chat"]}
    pipeline = make_pipeline(tool_errors=[rule], tool_error_prefix="")
    body = with_tool_results("FAILED: disk full", "Error: not counted without a prefix")
    agents = await begin(pipeline, "s-agents", body, **{"user-agent": "Agents/Python 0.24.0"})
    other = await begin(pipeline, "s-plain", body)
    assert (agents.record.errors, other.record.errors) == (1, 0)
