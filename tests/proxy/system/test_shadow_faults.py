"""A slow or failing reference never reaches the client: the real proxy with shadowing on, in
front of a scripted primary, a reference that sleeps 5 s or answers 500, and 1,000 requests."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.app import create_app
from proxy.config import Settings
from proxy.testing import Fault, LoopbackServer, ScriptedUpstream, completion, tool_call
from tests.proxy.builders import RETAIL_TOOLS
from tests.proxy.metrics_text import metric

REQUESTS = 1000
ANSWER = completion(tool_calls=[tool_call("get_order_details", {"order_id": "#W1"}, id="c1")])


def chat(i: int) -> dict[str, Any]:
    return {
        "model": "gemma-int4",
        "messages": [{"role": "user", "content": f"where is order #W{i}?"}],
        "tools": RETAIL_TOOLS,
    }


@pytest.fixture
def servers() -> Iterator[
    tuple[LoopbackServer, ScriptedUpstream, LoopbackServer, ScriptedUpstream]
]:
    primary, reference = ScriptedUpstream([ANSWER]), ScriptedUpstream()
    with LoopbackServer(primary.app) as p, LoopbackServer(reference.app) as r:
        yield p, primary, r, reference


def start_proxy(
    primary: LoopbackServer, reference: LoopbackServer | None, **shadow: Any
) -> tuple[LoopbackServer, Any]:
    upstreams = [{"name": "int4", "base_url": f"{primary.url}/v1", "models": ["gemma-int4"]}]
    settings: dict[str, Any] = {"upstreams": upstreams}
    if reference is not None:
        upstreams.append(
            {"name": "bf16", "base_url": f"{reference.url}/v1", "models": ["gemma-bf16"]}
        )
        settings["shadow"] = {"reference": "bf16", "sample": 1.0, **shadow}
    app = create_app(Settings(**settings), environ={})
    return LoopbackServer(app).start(), app


def answers(proxy: LoopbackServer, n: int) -> list[tuple[int, dict[str, str], bytes]]:
    out = []
    with httpx.Client(base_url=proxy.url, timeout=30) as http:
        for i in range(n):
            r = http.post("/v1/chat/completions", json=chat(i), headers={"x-session-id": f"s{i}"})
            headers = {k: v for k, v in r.headers.items() if k.startswith("x-toolsentry-")}
            out.append((r.status_code, headers, r.content))
    return out


def wait_until(condition: Callable[[], bool], seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def connections_to(port: int) -> int:
    """Established TCP connections on this host whose remote end is 127.0.0.1:`port`."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote, state = fields[2], fields[3]
        if state == "01" and remote == f"0100007F:{port:04X}":
            count += 1
    return count


def stats(proxy: LoopbackServer) -> dict[str, Any]:
    data: dict[str, Any] = httpx.get(f"{proxy.url}/v1/stats/shadow", timeout=30).json()
    return data


@pytest.mark.slow
@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        (Fault(200, ANSWER, delay=5.0), "timeout"),
        (Fault(500, {"error": {"message": "no"}}), "status_500"),
    ],
    ids=["sleeps-5s", "answers-500"],
)
def test_a_bad_reference_leaves_every_response_identical_and_is_counted_exactly(
    servers: tuple[LoopbackServer, ScriptedUpstream, LoopbackServer, ScriptedUpstream],
    reply: Fault,
    kind: str,
) -> None:
    primary, _, reference, reference_script = servers
    reference_script.push(reply)
    plain, _ = start_proxy(primary, None)
    try:
        expected = answers(plain, REQUESTS)
    finally:
        plain.stop()
    # A second for the sleeping reference; for the refusing one room enough that a loaded
    # machine never turns a 500 into a timeout (each is counted under its own kind).
    timeout = 1.0 if kind == "timeout" else 30.0
    shadowed, _ = start_proxy(primary, reference, max_in_flight=8, timeout=timeout)
    try:
        baseline_tasks = shadowed.task_count()
        got = answers(shadowed, REQUESTS)
        assert got == expected  # status, x-toolsentry-* headers and body, byte for byte
        assert wait_until(lambda: stats(shadowed)["in_flight"] == 0)
        (entry,) = stats(shadowed)["data"]
        text = httpx.get(f"{shadowed.url}/metrics", timeout=30).text
        labels = {"model": "gemma-int4", "reference": "bf16", "api": "chat"}
        # Either may be absent: all errors and no drop, or the other way round.
        errors = metric(
            text, "toolsentry_shadow_errors_total", may_be_absent=True, kind=kind, **labels
        )
        dropped = metric(text, "toolsentry_shadow_dropped_total", may_be_absent=True, **labels)
        # Every request was shadowed: each one is an error or a drop, none lost, none twice.
        assert errors + dropped == REQUESTS
        assert (entry["errors"], entry["dropped"], entry["pairs"]) == (
            {kind: errors},
            dropped,
            0,
        )
        assert len(reference_script.requests) == errors  # asked once each, never retried
        # No task left behind: the proxy's loop holds what it held before the load; no more
        # connections to the reference than its pool keeps (max_in_flight).
        assert wait_until(lambda: shadowed.task_count() <= baseline_tasks)
        assert connections_to(reference.port) <= 8
    finally:
        shadowed.stop()
