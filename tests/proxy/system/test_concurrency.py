"""Exact counts under concurrency: one session hammered through several proxy processes that
share one store (two `serve` processes on Redis; one `serve --workers 2` on SQLite).

Every request gets an unknown tool from the upstream with repair off, so every answered request
costs its session exactly one error. The guarantee under test:

- no increment is lost: the session's error count equals the number of requests that got a
  200, and `/metrics` (summed over every process) agrees;
- the budget gate is exact in time: a request sent after any response had reported the count at
  `max_errors` is rejected. Requests already past the gate when the count reached `max_errors`
  are still answered (and counted), so the count may end above `max_errors`, by fewer than the
  number of requests in flight.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from proxy.testing import completion, tool_call
from tests.proxy.builders import make_request
from tests.proxy.conftest import RunningUpstream
from tests.proxy.metrics_text import metric
from tests.proxy.system.support import Outcome, ProxyProcess, fire

pytestmark = pytest.mark.slow

REQUESTS = 200
CONCURRENCY = 20
BUDGET = 50

Deployment = Callable[[], list[ProxyProcess]]


@pytest.fixture
def unknown_tool_upstream(upstream: RunningUpstream) -> RunningUpstream:
    upstream.script.push(completion(tool_calls=[tool_call("refund_everything", {})]))
    return upstream


@pytest.fixture(
    params=[
        pytest.param("two-processes-on-redis", marks=pytest.mark.redis),
        "two-workers-on-sqlite",
    ]
)
def deployment(
    request: pytest.FixtureRequest, unknown_tool_upstream: RunningUpstream, tmp_path: Path
) -> Iterator[list[ProxyProcess]]:
    common = ["--repair", "off", "--max-errors", "100000"]
    if request.param == "two-processes-on-redis":
        redis_url = request.getfixturevalue("redis_url")
        shared = [*common, "--store", redis_url]
        processes = [
            ProxyProcess(unknown_tool_upstream.base_url, tmp_path / f"p{i}.log", *shared)
            for i in range(2)
        ]
    else:
        store = f"sqlite:///{tmp_path / 'sessions.db'}"
        workers = [*common, "--store", store, "--workers", "2"]
        processes = [ProxyProcess(unknown_tool_upstream.base_url, tmp_path / "p.log", *workers)]
    try:
        ready = [process.wait_ready() for process in processes]
        if request.param == "two-workers-on-sqlite":
            wait_for_both_workers(ready[0])
        yield ready
    finally:
        for process in processes:
            process.stop()


def wait_for_both_workers(process: ProxyProcess) -> None:
    """Serve requests of another session until both workers have served one (a worker that is
    still starting would leave the whole load to the other). Bounded: about a minute."""
    for _ in range(1200):
        httpx.post(
            f"{process.url}/v1/chat/completions",
            json=make_request(),
            headers={"x-session-id": "warm-up"},
            timeout=30,
        )
        if len([f for f in process.worker_metric_files() if f.startswith("counter_")]) == 2:
            return
        time.sleep(0.05)  # a worker spawned on a busy machine may take seconds to import
    pytest.fail("the second worker never served a request")


def summed(processes: list[ProxyProcess], name: str, **labels: str) -> float:
    return sum(metric(p.metrics(), name, may_be_absent=True, **labels) for p in processes)


def counting(processes: list[ProxyProcess], name: str, **labels: str) -> Callable[[], float]:
    """How much a summed metric grew since this call."""
    before = summed(processes, name, **labels)
    return lambda: summed(processes, name, **labels) - before


def test_every_concurrent_error_is_counted_exactly_once(deployment: list[ProxyProcess]) -> None:
    urls = [p.url for p in deployment]
    labels = {"model": "scripted-model", "api": "chat"}
    answered = counting(deployment, "toolsentry_requests_total", status="200", **labels)
    unknown = counting(deployment, "toolsentry_violations_total", channel="unknown_tool", **labels)
    outcomes = asyncio.run(fire(urls, REQUESTS, concurrency=CONCURRENCY, session="hammered"))

    assert [o.status for o in outcomes] == [200] * REQUESTS
    session = deployment[0].session("hammered")
    assert (session["errors"], session["requests"]) == (REQUESTS, REQUESTS)
    assert session["channels"] == {"unknown_tool": REQUESTS}
    # Each response reported the count just after its own increment: all different, 1..200.
    assert sorted(o.errors or 0 for o in outcomes) == list(range(1, REQUESTS + 1))
    assert answered() == REQUESTS
    assert unknown() == REQUESTS


def test_the_budget_gate_rejects_every_request_sent_after_the_count_reached_it(
    deployment: list[ProxyProcess],
) -> None:
    urls = [p.url for p in deployment]
    labels = {"model": "scripted-model", "api": "chat"}
    ok = counting(deployment, "toolsentry_requests_total", status="200", **labels)
    refused = counting(deployment, "toolsentry_requests_total", status="429", **labels)
    exhausted = counting(deployment, "toolsentry_budget_exhausted_total", **labels)
    refusals = counting(deployment, "toolsentry_budget_refusals_total", **labels)
    outcomes = asyncio.run(
        fire(
            urls,
            REQUESTS,
            concurrency=CONCURRENCY,
            session="budgeted",
            headers={"x-toolsentry-max-errors": str(BUDGET)},
        )
    )
    answered = [o for o in outcomes if o.status == 200]
    rejected = [o for o in outcomes if o.status == 429]
    assert len(answered) + len(rejected) == REQUESTS

    session = deployment[0].session("budgeted")
    # No lost increment: every answered request cost exactly one error, and nothing else did.
    assert session["errors"] == len(answered)
    assert session["requests"] == REQUESTS
    assert session["channels"] == {"unknown_tool": len(answered)}
    # At least the budget was let through, and at most the requests in flight past it.
    assert BUDGET <= len(answered) <= BUDGET + CONCURRENCY - 1
    # No request sent after a response had shown the budget spent was answered.
    spent_at = min(o.received for o in outcomes if (o.errors or 0) >= BUDGET)
    late: list[Outcome] = [o for o in outcomes if o.sent > spent_at]
    assert late, "the load should outlast the budget"
    assert all(o.status == 429 for o in late)
    assert all((o.errors or 0) >= BUDGET for o in rejected)

    assert ok() == len(answered)
    assert refused() == len(rejected)
    assert refusals() == len(rejected)
    assert exhausted() == 1  # one session ran out, once, whichever replica's request spent it
