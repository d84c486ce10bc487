"""The turn's lifecycle (`proxy/pipeline/turn.py`) driven directly, without a client or a driver:
settle (validate, local fix, re-ask, on_unrepaired) and close (once), against a scripted upstream
on loopback for the re-asks; the turn's beginning is tested with the gate (test_gate.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from proxy.errors import UnrepairedToolCallError
from proxy.guard.channels import Channel, Violation
from proxy.guard.unrepaired import DEFAULT_ON_UNREPAIRED
from proxy.headers import REPAIR_HEADER
from proxy.metrics import CallOutcome, RepairResult
from proxy.pipeline.gate import Pipeline
from proxy.pipeline.turn import beyond
from proxy.session.stores import MemoryStore, SessionRecord
from proxy.testing import Fault, ScriptedUpstream, completion, tool_call
from tests.proxy.pipeline.turns import UNKNOWN, VALID, answer, begin, counted


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


@pytest.mark.parametrize(
    ("settings", "headers"),
    [({}, {REPAIR_HEADER: "off"}), ({"repair": "off"}, {}), ({"max_reasks": 0}, {})],
    ids=["header", "setting", "no-reasks"],
)
async def test_without_repair_the_failure_reaches_the_client_and_costs_one_error(
    make_pipeline: Callable[..., Pipeline],
    script: tuple[ScriptedUpstream, str],
    settings: dict[str, Any],
    headers: dict[str, str],
) -> None:
    pipeline = make_pipeline(on_unrepaired="passthrough", **settings)
    turn = await begin(pipeline, "s-off", **headers)
    settled = await turn.settle(answer(UNKNOWN, VALID))
    assert settled.message["tool_calls"] == [UNKNOWN, VALID]
    assert not script[0].requests  # nothing was re-asked
    report = await turn.close(200)
    assert (report.errors, report.repairs, report.violations) == (1, 0, ("unknown_tool",))
    assert counted(pipeline, "toolsentry_tool_calls_total", outcome="invalid") == 1
    assert counted(pipeline, "toolsentry_tool_calls_total", outcome="valid") == 1
    violations = counted(pipeline, "toolsentry_violations_total", channel="unknown_tool")
    assert violations == 1
    # No repair was tried, so none failed: the violation is counted as one, and only as one.
    for result in RepairResult:
        assert (
            counted(pipeline, "toolsentry_repairs_total", channel="unknown_tool", result=result)
            == 0
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
    assert (report.errors, report.violations) == (1, ("unknown_tool",))
    stripped = CallOutcome.STRIPPED.value
    assert counted(pipeline, "toolsentry_tool_calls_total", outcome=stripped) == 1


async def test_per_channel_on_unrepaired_strips_one_call_and_passes_the_other(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    # The default's mapping, set: unknown_tool strips, the rest passes (with repair off, as
    # here, only an on_unrepaired the operator set changes a call).
    pipeline = make_pipeline(repair="off", on_unrepaired=dict(DEFAULT_ON_UNREPAIRED))
    turn = await begin(pipeline, "s-mixed")
    bad_arguments = tool_call("cancel_pending_order", "{not json")
    settled = await turn.settle(answer(UNKNOWN, bad_arguments))
    assert settled.message["tool_calls"] == [bad_arguments]
    assert settled.finish_reason == "tool_calls"
    report = await turn.close(200)
    assert report.errors == 2  # the stripped call is a failure the agent experienced too
    assert sorted(report.violations) == ["malformed_arguments", "unknown_tool"]
    assert counted(pipeline, "toolsentry_tool_calls_total", outcome="stripped") == 1
    assert counted(pipeline, "toolsentry_tool_calls_total", outcome="invalid") == 1


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


def test_beyond_counts_per_channel_the_larger_of_what_was_found_and_what_was_delivered() -> None:
    unknown = Violation(Channel.UNKNOWN_TOOL, "no such tool", "x", 0)
    schema = Violation(Channel.SCHEMA_VIOLATION, "missing order_id", "y", 0)
    assert beyond([unknown], [unknown]) == []  # the same failure again is one failure
    assert beyond([schema], [unknown]) == [schema]  # a different one is another
    assert beyond([unknown, unknown], [unknown]) == [unknown]


class CountingStore(MemoryStore):
    """The memory store, noting each operation the turn asks of it (one round trip each in a
    shared store)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    async def record(self, session: str, **counts: Any) -> SessionRecord:
        self.asked.append("record")
        return await super().record(session, **counts)

    async def claim_call_ids(
        self, session: str, call_ids: Sequence[str], *, now: float
    ) -> list[str]:
        self.asked.append("claim_call_ids")
        return await super().claim_call_ids(session, call_ids, now=now)

    async def link_response(self, response_id: str, session: str, *, now: float) -> None:
        self.asked.append("link_response")
        await super().link_response(response_id, session, now=now)


async def test_a_commit_writes_what_the_client_will_get_once_and_close_asks_the_store_nothing_more(
    make_pipeline: Callable[..., Pipeline], script: tuple[ScriptedUpstream, str]
) -> None:
    upstream, _ = script
    upstream.push(Fault.error(500, "the re-ask fails"))
    pipeline = make_pipeline(max_reasks=1, retries=0)
    pipeline.store = store = CountingStore()
    turn = await begin(pipeline, "s-commit")
    assert store.asked == ["record"]  # the gate's
    await turn.settle(answer(UNKNOWN))  # re-asked; the re-ask's failure counts an upstream error
    assert store.asked == ["record"]
    await turn.commit()
    # The call the client gets claimed and its failures, the upstream's with them, in one record.
    assert store.asked == ["record", "claim_call_ids", "record"]
    record = await store.get("s-commit")
    assert record is not None
    assert (record.errors, record.channels) == (1, {"unknown_tool": 1, "upstream_error": 1})
    report = await turn.close(200)
    assert store.asked == ["record", "claim_call_ids", "record"]
    assert (report.errors, report.status) == (1, 200)


async def test_a_turn_with_nothing_to_count_asks_the_store_nothing_after_its_gate(
    make_pipeline: Callable[..., Pipeline],
) -> None:
    pipeline = make_pipeline()
    pipeline.store = store = CountingStore()
    turn = await begin(pipeline, "s-nothing")
    await turn.settle(answer(VALID))
    await turn.commit()
    await turn.close(200)
    assert store.asked == ["record"]
