"""The turn's lifecycle (`proxy/pipeline/turn.py`) driven directly, without a client or a driver:
begin (overrides, budget gate, tool errors), settle (validate, local fix, re-ask, on_unrepaired),
close (once), against a scripted upstream on loopback for the re-asks."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from proxy.app import create_app
from proxy.config import Settings
from proxy.errors import BadRequestError, BudgetExhaustedError, UnrepairedToolCallError
from proxy.guard.channels import Channel, Violation
from proxy.headers import HEADER_PREFIX, MAX_ERRORS_HEADER, REPAIR_HEADER
from proxy.metrics import CallOutcome, RepairResult
from proxy.pipeline.turn import Exchange, Pipeline, Turn, beyond
from proxy.protocols.base import Choice
from proxy.protocols.chat import ChatProtocol
from proxy.testing import LoopbackServer, ScriptedUpstream, completion, tool_call
from tests.proxy.builders import make_request
from tests.proxy.metrics_text import metric

VALID = tool_call("get_order_details", {"order_id": "#W1"}, id="call_ok")
UNKNOWN = tool_call("lookup_order", {"order_id": "#W1"}, id="call_bad")


@pytest.fixture
def script() -> Iterator[tuple[ScriptedUpstream, str]]:
    upstream = ScriptedUpstream()
    with LoopbackServer(upstream.app) as server:
        yield upstream, f"{server.url}/v1"


@pytest.fixture
async def make_pipeline(
    script: tuple[ScriptedUpstream, str],
) -> AsyncIterator[Callable[..., Pipeline]]:
    made: list[Pipeline] = []

    def make(**overrides: Any) -> Pipeline:
        overrides.setdefault("upstreams", [{"name": "scripted", "base_url": script[1]}])
        pipeline: Pipeline = create_app(Settings(**overrides), environ={}).state.pipeline
        made.append(pipeline)
        return pipeline

    yield make
    for pipeline in made:
        await pipeline.router.close()


async def begin(pipeline: Pipeline, session: str, **headers: str) -> Turn:
    exchange = Exchange("chat", time.perf_counter())
    headers = {"x-session-id": session, **headers}
    return await pipeline.begin(ChatProtocol(pipeline.limits), make_request(), headers, exchange)


def answer(*calls: dict[str, Any], content: str | None = None) -> Choice:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = list(calls)
    return Choice(0, message, "tool_calls" if calls else "stop")


def counted(pipeline: Pipeline, name: str, **labels: str) -> float:
    """A sample of the turn's model and protocol (0 when not exposed)."""
    labels = {"model": "scripted-model", **labels, "api": "chat"}
    return metric(pipeline.metrics.render().decode(), name, may_be_absent=True, **labels)


async def test_a_valid_answer_settles_unchanged_and_close_runs_once(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    pipeline = make_pipeline()
    turn = await begin(pipeline, "s-valid")
    settled = await turn.settle(answer(VALID))
    assert settled.message["tool_calls"] == [VALID]
    assert not settled.changed
    assert not turn.closed
    report = await turn.close(200)
    assert turn.closed
    assert await turn.close(500) is report  # a second close returns the first report
    assert turn.report() is report
    assert (report.session, report.errors, report.repairs, report.violations) == (
        "s-valid",
        0,
        0,
        (),
    )
    assert report.final
    assert report.status == 200
    outcome = CallOutcome.VALID.value
    assert counted(pipeline, "toolsentry_tool_calls_total", outcome=outcome) == 1
    assert counted(pipeline, "toolsentry_requests_total", status="200") == 1


async def test_an_unknown_tool_is_reasked_and_the_repair_is_reported_and_counted(
    make_pipeline: Callable[..., Pipeline], script: tuple[ScriptedUpstream, str]
) -> None:
    upstream, _ = script
    upstream.push(completion(tool_calls=[VALID]))
    pipeline = make_pipeline()
    turn = await begin(pipeline, "s-reask")
    settled = await turn.settle(answer(UNKNOWN))
    assert settled.changed
    assert settled.message["tool_calls"][0]["function"]["name"] == "get_order_details"
    assert upstream.requests[-1]["messages"][-1]["tool_call_id"] == "call_bad"
    report = await turn.close(200)
    assert (report.errors, report.repairs, report.violations) == (0, 1, (Channel.UNKNOWN_TOOL,))
    record = await pipeline.store.get("s-reask")
    assert record is not None
    assert (record.errors, record.repairs, record.channels) == (0, 1, {"unknown_tool": 1})
    success = RepairResult.SUCCESS.value
    assert (
        counted(pipeline, "toolsentry_repairs_total", channel="unknown_tool", result=success) == 1
    )
    repaired = CallOutcome.REPAIRED.value
    assert counted(pipeline, "toolsentry_tool_calls_total", outcome=repaired) == 1


async def test_without_repair_the_failure_reaches_the_client_and_costs_one_error(
    make_pipeline: Callable[..., Pipeline], script: tuple[ScriptedUpstream, str]
) -> None:
    pipeline = make_pipeline()
    turn = await begin(pipeline, "s-off", **{REPAIR_HEADER: "off"})
    settled = await turn.settle(answer(UNKNOWN, VALID))
    assert settled.message["tool_calls"] == [UNKNOWN, VALID]
    assert not script[0].requests  # nothing was re-asked
    report = await turn.close(200)
    assert (report.errors, report.repairs, report.violations) == (1, 0, ("unknown_tool",))
    assert counted(pipeline, "toolsentry_tool_calls_total", outcome="invalid") == 1
    assert counted(pipeline, "toolsentry_tool_calls_total", outcome="valid") == 1
    failure = RepairResult.FAILURE.value
    assert (
        counted(pipeline, "toolsentry_repairs_total", channel="unknown_tool", result=failure) == 1
    )


async def test_on_unrepaired_strip_removes_the_call_and_a_message_left_without_calls_stops(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    pipeline = make_pipeline(repair="off", on_unrepaired="strip")
    turn = await begin(pipeline, "s-strip")
    settled = await turn.settle(answer(UNKNOWN, content="Let me look."))
    assert settled.changed
    assert not settled.message.get("tool_calls")
    assert settled.finish_reason == "stop"
    report = await turn.close(200)
    assert (report.errors, report.violations) == (0, ("unknown_tool",))
    stripped = CallOutcome.STRIPPED.value
    assert counted(pipeline, "toolsentry_tool_calls_total", outcome=stripped) == 1


async def test_on_unrepaired_reject_closes_the_turn_with_422_and_raises(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    pipeline = make_pipeline(repair="off", on_unrepaired="reject")
    turn = await begin(pipeline, "s-reject")
    with pytest.raises(UnrepairedToolCallError) as raised:
        await turn.settle(answer(UNKNOWN))
    assert raised.value.code == "unknown_tool"
    assert turn.closed
    assert turn.report().status == UnrepairedToolCallError.status_code == 422
    assert raised.value.headers is not None
    assert raised.value.headers["x-toolsentry-errors"] == "1"


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


def test_beyond_counts_per_channel_the_larger_of_what_was_found_and_what_was_delivered() -> None:
    unknown = Violation(Channel.UNKNOWN_TOOL, "no such tool", "x", 0)
    schema = Violation(Channel.SCHEMA_VIOLATION, "missing order_id", "y", 0)
    assert beyond([unknown], [unknown]) == []  # the same failure again is one failure
    assert beyond([schema], [unknown]) == [schema]  # a different one is another
    assert beyond([unknown, unknown], [unknown]) == [unknown]


async def test_the_proxys_own_controls_are_not_forwarded_upstream(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    pipeline = make_pipeline()
    controls = {REPAIR_HEADER: "off", MAX_ERRORS_HEADER: "3", "x-request-id": "req-1"}
    turn = await begin(pipeline, "s-forward", **controls)
    assert turn.forward["x-request-id"] == "req-1"
    assert not [name for name in turn.forward if name.startswith(HEADER_PREFIX)]
