"""The shadow mirror against a real loopback reference: pairs, drops, errors, the log, the store.

The reference here is the scripted upstream on loopback; the judge is the chat guard over the
reference's completion (what the turn hands the shadow for chat requests).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
import structlog
from typer.testing import CliRunner

from proxy.app import create_app
from proxy.cli import app as cli_app
from proxy.config import Settings, ShadowConfig, load_settings
from proxy.config_upstream import UpstreamConfig
from proxy.errors import ConfigError
from proxy.guard.toolcheck import validate
from proxy.metrics import Metrics
from proxy.session.redis_store import RedisStore
from proxy.session.sqlite_store import SqliteStore
from proxy.session.stores import MemoryStore, SessionStore
from proxy.shadow import (
    FLUSH_SECONDS,
    Shadow,
    ShadowRequest,
    open_shadow,
    reference_upstream,
)
from proxy.shadow_log_writer import ShadowLog
from proxy.shadowstats import Decision, Pair, figures, pair_counts, tally_pairs
from proxy.testing import (
    Fault,
    LoopbackServer,
    ScriptedUpstream,
    answer,
    call,
    completion,
    tool_call,
)
from proxy.upstream import HttpUpstream
from tests.proxy.builders import RETAIL_TOOLS
from tests.proxy.metrics_text import metric as sample
from tests.proxy.metrics_text import samples

REQUEST = {
    "model": "gemma-int4",
    "messages": [{"role": "user", "content": "where is order #W1?"}],
    "tools": RETAIL_TOOLS,
    "stream": True,
    "stream_options": {"include_usage": True},
}
VALID = completion(tool_calls=[tool_call("get_order_details", {"order_id": "#W1"})])
HALLUCINATED = completion(tool_calls=[tool_call("lookup_order", {"order_id": "#W1"})])


def chat_judge(reply: Any) -> Decision:
    choice = reply["choices"][0]
    message = choice["message"]
    calls = [
        (c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []
    ]
    return Decision.of(
        calls, validate(message, RETAIL_TOOLS, finish_reason=choice["finish_reason"])
    )


def request(
    primary: dict[str, Any], *, session: str = "s1", model: str = "gemma-int4"
) -> ShadowRequest:
    return ShadowRequest(
        model=model,
        session=session,
        api="chat",
        path="chat/completions",
        body={**REQUEST, "model": model},
        headers={"x-request-id": "r1", "x-custom": "kept"},
        primary=chat_judge(primary),
        judge=chat_judge,
        request_id="r1",
    )


class Reference:
    def __init__(self) -> None:
        self.script = ScriptedUpstream()
        self.server = LoopbackServer(self.script.app).start()
        self.entry = UpstreamConfig(
            name="bf16", base_url=f"{self.server.url}/v1", models=["gemma-bf16"]
        )


@pytest.fixture
def reference() -> Iterator[Reference]:
    ref = Reference()
    yield ref
    ref.server.stop()


@pytest.fixture
async def closing() -> AsyncIterator[list[Shadow]]:
    shadows: list[Shadow] = []
    yield shadows
    for shadow in shadows:
        await shadow.close()


def make_shadow(
    reference: Reference,
    closing: list[Shadow],
    *,
    store: SessionStore | None = None,
    metrics: Metrics | None = None,
    log: ShadowLog | None = None,
    **config: Any,
) -> tuple[Shadow, Metrics, SessionStore]:
    shadow_config = ShadowConfig(**{"reference": "bf16", "sample": 1.0, **config})
    metrics = metrics or Metrics()
    store = store or MemoryStore()
    shadow = Shadow(
        shadow_config,
        reference_upstream(reference.entry, shadow_config, api_key=None),
        reference_name="bf16",
        reference_model="gemma-bf16",
        metrics=metrics,
        store=store,
        log=log,
    )
    closing.append(shadow)
    return shadow, metrics, store


def shadow_over(
    upstream: HttpUpstream, config: ShadowConfig, closing: list[Shadow]
) -> tuple[Shadow, Metrics]:
    """A shadow asking `upstream` as its reference (no model name of its own), on a memory store."""
    metrics = Metrics()
    shadow = Shadow(
        config,
        upstream,
        reference_name="bf16",
        reference_model=None,
        metrics=metrics,
        store=MemoryStore(),
    )
    closing.append(shadow)
    return shadow, metrics


def metric(metrics: Metrics, name: str, **labels: str) -> float:
    return sample(metrics.render().decode(), name, **labels)


async def warm(shadow: Shadow, reference: Reference) -> None:
    """Leave an idle connection in the reference's pool, so that the next request goes out on it
    and is answered through the connection's callback (no task); one request of the script's."""
    assert isinstance(shadow.reference, HttpUpstream)
    reference.script.push(VALID)
    await shadow.reference.request("POST", "chat/completions", body=b"{}", headers={})
    assert shadow.reference.pool().idle == 1


async def submit_without_a_task(shadow: Shadow, shadowed: ShadowRequest) -> None:
    """Submit `shadowed` on a warm pool: nothing goes out before the submitting step ends (the
    turn closes before the client's response is written), then it goes on the idle connection,
    no task made."""
    assert isinstance(shadow.reference, HttpUpstream)
    before = len(asyncio.all_tasks())
    assert shadow.submit(shadowed)
    assert shadow.in_flight == 1
    assert shadow.reference.pool().idle == 1  # not sent yet
    await asyncio.sleep(0)
    assert shadow.reference.pool().idle == 0
    assert len(asyncio.all_tasks()) == before


@pytest.mark.parametrize("idle", [False, True], ids=["new-connection", "idle-connection"])
async def test_a_pair_goes_to_the_reference_non_streamed_and_is_counted_everywhere(
    reference: Reference, closing: list[Shadow], tmp_path: Path, idle: bool
) -> None:
    log = ShadowLog(tmp_path / "shadow.jsonl", max_bytes=1 << 20, backups=1)
    shadow, metrics, _ = make_shadow(reference, closing, log=log)
    if idle:
        await warm(shadow, reference)
        reference.script.push(VALID)
        # The request id comes from the request's own context when the turn gives none.
        with structlog.contextvars.bound_contextvars(request_id="r1"):
            await submit_without_a_task(shadow, replace(request(HALLUCINATED), request_id=None))
    else:
        reference.script.push(VALID)
        assert shadow.submit(request(HALLUCINATED))
    await shadow.drain()

    sent = reference.script.requests[-1]
    assert sent["model"] == "gemma-bf16"
    assert sent["stream"] is False
    assert "stream_options" not in sent
    assert sent["tools"] == RETAIL_TOOLS
    assert sent["messages"] == REQUEST["messages"]
    assert reference.script.request_headers[-1]["x-custom"] == "kept"

    labels = {"model": "gemma-int4", "reference": "bf16", "api": "chat"}
    assert metric(metrics, "toolsentry_shadow_pairs_total", outcome="primary_only", **labels) == 1
    assert (
        metric(
            metrics,
            "toolsentry_shadow_failures_total",
            side="primary",
            channel="unknown_tool",
            **labels,
        )
        == 1
    )
    stats = await shadow.stats()
    (entry,) = stats["data"]
    assert (entry["model"], entry["reference"], entry["pairs"]) == ("gemma-int4", "bf16", 1)
    assert entry["outcomes"]["primary_only"] == 1
    assert entry["channels"]["unknown_tool"]["primary"]["answers"] == 1
    assert entry["signatures"]["top"]["primary"] == [
        {"channel": "unknown_tool", "tool": "lookup_order", "count": 1}
    ]

    await shadow.close()
    closing.clear()
    (line,) = [json.loads(x) for x in (tmp_path / "shadow.jsonl").read_text().splitlines()]
    assert line["event"] == "pair"
    assert (line["session"], line["request_id"], line["api"]) == ("s1", "r1", "chat")
    assert line["models"] == {"primary": "gemma-int4", "reference": "bf16"}
    assert line["primary"]["tools"] == ["lookup_order"]
    assert line["reference"]["tools"] == ["get_order_details"]
    assert "bodies" not in line  # no message bodies unless log_bodies


@pytest.mark.parametrize(
    ("change", "as_is"),
    [
        ({}, False),  # no `stream`: the member appended
        ({"stream": False}, True),  # nothing to change: the bytes as they are
        ({"stream": True, "stream_options": {"include_usage": True}}, False),
        ({"model": "gemma-int4"}, False),  # the reference's model name goes in
    ],
)
async def test_the_primarys_bytes_go_to_the_reference_as_the_encoded_body_would(
    reference: Reference, closing: list[Shadow], change: dict[str, Any], as_is: bool
) -> None:
    shadow, _, _ = make_shadow(reference, closing)
    plain = {k: v for k, v in REQUEST.items() if k not in ("stream", "stream_options")}
    body = {**plain, "model": "gemma-bf16", **change}
    encoded = shadow.payload(replace(request(VALID), body=body))
    for raw in (orjson.dumps(body), json.dumps(body, indent=2).encode() + b"\n"):
        sent = shadow.payload(replace(request(VALID), body=body, raw=raw))
        assert orjson.loads(sent) == orjson.loads(encoded)
        assert list(orjson.loads(sent)) == list(orjson.loads(encoded))  # members in order
        assert (sent is raw) == as_is
    assert shadow.payload(replace(request(VALID), body=body, raw=orjson.dumps(body))) == encoded
    # Through the reference: what it is asked is what the encoded body asks.
    reference.script.push(VALID)
    assert shadow.submit(replace(request(VALID), body=body, raw=orjson.dumps(body)))
    await shadow.drain()
    assert reference.script.requests[0] == orjson.loads(encoded)


async def test_a_full_set_of_in_flight_requests_drops_and_counts_each_drop_exactly(
    reference: Reference, closing: list[Shadow]
) -> None:
    reference.script.push(Fault(200, VALID, delay=0.5))
    shadow, metrics, _ = make_shadow(reference, closing, max_in_flight=3)
    accepted = [shadow.submit(request(VALID, session=f"s{i}")) for i in range(10)]
    assert accepted == [True] * 3 + [False] * 7
    assert shadow.in_flight == 3
    await shadow.drain()
    assert shadow.in_flight == 0
    labels = {"model": "gemma-int4", "reference": "bf16", "api": "chat"}
    assert metric(metrics, "toolsentry_shadow_dropped_total", **labels) == 7
    (entry,) = (await shadow.stats())["data"]
    assert (entry["pairs"], entry["dropped"]) == (3, 7)
    assert entry["outcomes"]["agree"] == 3


@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        (Fault(500, {"error": {"message": "boom"}}), "status_500"),
        (Fault(503, {"error": {"message": "overloaded"}}), "status_503"),  # not retried either
        (Fault(200, b"not json"), "invalid_answer"),
        (Fault(200, {"object": "chat.completion"}), "invalid_answer"),
        (Fault(200, VALID, delay=3.0), "timeout"),
    ],
)
@pytest.mark.parametrize("idle", [False, True], ids=["new-connection", "idle-connection"])
async def test_a_failing_reference_is_counted_by_kind_and_asked_once(
    reference: Reference, closing: list[Shadow], reply: Fault, kind: str, idle: bool
) -> None:
    shadow, metrics, _ = make_shadow(reference, closing, timeout=0.3)
    if idle:
        await warm(shadow, reference)
        reference.script.push(reply)
        await submit_without_a_task(shadow, request(VALID))
    else:
        reference.script.push(reply)
        shadow.submit(request(VALID))
    await shadow.drain()
    assert len(reference.script.requests) == 1 + idle  # never retried
    labels = {"model": "gemma-int4", "reference": "bf16", "api": "chat"}
    assert metric(metrics, "toolsentry_shadow_errors_total", kind=kind, **labels) == 1
    (entry,) = (await shadow.stats())["data"]
    assert entry["errors"] == {kind: 1}
    assert entry["pairs"] == 0


async def test_a_reference_client_slower_to_give_up_is_cut_off_at_the_shadows_timeout(
    reference: Reference, closing: list[Shadow]
) -> None:
    # The reference's own client would wait 30 s for the 3 s answer; the shadow's timeout
    # (0.3 s) ends the request first, and it is counted as a timeout, not as a pair.
    reference.script.push(Fault(200, VALID, delay=3.0))
    config = ShadowConfig(reference="bf16", sample=1.0, timeout=0.3)
    patient = reference_upstream(
        reference.entry, config.model_copy(update={"timeout": 30.0}), api_key=None
    )
    shadow, metrics = shadow_over(patient, config, closing)
    assert shadow.submit(request(VALID))
    await shadow.drain()
    labels = {"model": "gemma-int4", "reference": "bf16", "api": "chat"}
    assert metric(metrics, "toolsentry_shadow_errors_total", kind="timeout", **labels) == 1
    (entry,) = (await shadow.stats())["data"]
    assert (entry["errors"], entry["pairs"]) == ({"timeout": 1}, 0)


async def test_a_reference_that_refuses_connections_is_a_connect_error(
    closing: list[Shadow], refused_port: int
) -> None:
    config = ShadowConfig(reference="bf16", sample=1.0)
    entry = UpstreamConfig(name="bf16", base_url=f"http://127.0.0.1:{refused_port}/v1")
    shadow, metrics = shadow_over(reference_upstream(entry, config, api_key=None), config, closing)
    shadow.submit(request(VALID))
    await shadow.drain()
    labels = {"model": "gemma-int4", "reference": "bf16", "api": "chat"}
    assert metric(metrics, "toolsentry_shadow_errors_total", kind="connect", **labels) == 1


async def test_close_cancels_what_is_in_flight_and_leaves_no_task(
    reference: Reference, closing: list[Shadow]
) -> None:
    reference.script.push(Fault(200, VALID, delay=30))
    shadow, _, _ = make_shadow(reference, closing, max_in_flight=4)
    before = len(asyncio.all_tasks())
    for i in range(4):
        shadow.submit(request(VALID, session=f"s{i}"))
    await asyncio.sleep(0)  # the starts run once the submitting step ends: no idle connection
    assert len(asyncio.all_tasks()) == before + 4
    await shadow.close()
    closing.clear()
    assert len(asyncio.all_tasks()) == before


@pytest.fixture
async def replica_stores(
    closing: list[Shadow], tmp_path: Path
) -> AsyncIterator[tuple[SqliteStore, SqliteStore]]:
    """Two replicas' stores on one SQLite file; the shadows are closed before the stores."""
    stores = (SqliteStore(tmp_path / "s.db"), SqliteStore(tmp_path / "s.db"))
    yield stores
    for shadow in closing:
        await shadow.close()
    closing.clear()
    for store in stores:
        await store.close()


async def test_two_replicas_on_one_store_show_the_same_figures(
    reference: Reference, closing: list[Shadow], replica_stores: tuple[SqliteStore, SqliteStore]
) -> None:
    reference.script.push(VALID)
    a, _, _ = make_shadow(reference, closing, store=replica_stores[0])
    b, _, _ = make_shadow(reference, closing, store=replica_stores[1])
    for i in range(3):
        a.submit(request(HALLUCINATED, session=f"a{i}"))
    b.submit(request(VALID, session="b"))
    await a.drain()
    await b.drain()
    first, second = await a.stats(), await b.stats()
    assert first["data"] == second["data"]
    assert first["data"][0]["pairs"] == 4
    assert first["data"][0]["outcomes"]["primary_only"] == 3


async def test_a_replica_writes_its_counts_and_metrics_without_being_read(
    reference: Reference, closing: list[Shadow], replica_stores: tuple[SqliteStore, SqliteStore]
) -> None:
    # Counts are written in batches; the writing replica never reads or drains here, so only
    # its timer can bring the pair and the drop to the store the other replica reads.
    reference.script.push(Fault(200, VALID, delay=0.2))
    a, metrics, _ = make_shadow(reference, closing, store=replica_stores[0], max_in_flight=1)
    b, _, _ = make_shadow(reference, closing, store=replica_stores[1])
    assert a.submit(request(HALLUCINATED, session="a0"))
    assert not a.submit(request(VALID, session="a1"))  # dropped: one in flight at most
    await asyncio.sleep(0.2 + FLUSH_SECONDS * 4)  # the answer, then a batch's wait
    assert a.in_flight == 0
    labels = {"model": "gemma-int4", "reference": "bf16", "api": "chat"}
    assert metric(metrics, "toolsentry_shadow_dropped_total", **labels) == 1  # a scrape sees it
    assert metric(metrics, "toolsentry_shadow_pairs_total", outcome="primary_only", **labels) == 1
    (entry,) = (await b.stats())["data"]
    assert (entry["pairs"], entry["dropped"], entry["outcomes"]["primary_only"]) == (1, 1, 1)


def calls(*made: tuple[str, dict[str, Any] | str]) -> dict[str, Any]:
    return completion(tool_calls=[tool_call(name, arguments) for name, arguments in made])


# Pairs of every kind, (the primary's answer, the reference's), by the text of the request's
# message: the reference answers each request its own way, in whatever order they come.
MIX = {
    "agree": (VALID, VALID),
    "keys": (
        calls(
            ("get_order_details", {"order_id": "#W1"}), ("get_order_details", {"order_id": "#W3"})
        ),
        calls(
            ("get_order_details", {"order_id": "#W2", "note": "x"}),
            ("get_order_details", {"order_id": "#W3"}),
        ),
    ),
    "unknown": (HALLUCINATED, VALID),
    "both": (HALLUCINATED, calls(("find_order", {"order_id": "#W1"}))),
    "malformed": (VALID, calls(("get_order_details", "{not json"))),
    "text": (completion("no tool needed"), VALID),
    "plain": (completion("hello"), completion("hi")),
}


def shadow_counts(metrics: Metrics) -> Counter[tuple[str, tuple[tuple[str, str], ...]]]:
    """Every shadow pair and failure series on the metrics page, by name and labels."""
    return Counter(
        {
            (name, tuple(sorted(labels.items()))): int(value)
            for name, labels, value in samples(metrics.render().decode())
            if name in ("toolsentry_shadow_pairs_total", "toolsentry_shadow_failures_total")
        }
    )


def counted_alone(
    model: str, pairs: list[Pair]
) -> Counter[tuple[str, tuple[tuple[str, str], ...]]]:
    """The series `shadow_counts` should read for `pairs` of `model`, counted pair by pair."""
    want: Counter[tuple[str, tuple[tuple[str, str], ...]]] = Counter()
    base = {"model": model, "reference": "bf16", "api": "chat"}
    for pair in pairs:
        labels = {**base, "outcome": pair.outcome.value}
        want["toolsentry_shadow_pairs_total", tuple(sorted(labels.items()))] += 1
        for side, decision in (("primary", pair.primary), ("reference", pair.reference)):
            for channel in decision.channels:
                labels = {**base, "side": side, "channel": channel}
                want["toolsentry_shadow_failures_total", tuple(sorted(labels.items()))] += 1
    return want


async def test_pairs_added_up_by_key_give_the_figures_of_each_pair_counted_alone(
    reference: Reference, closing: list[Shadow]
) -> None:
    reference.script.handler = lambda body: MIX[body["messages"][0]["content"]][1]
    shadow, metrics, _ = make_shadow(reference, closing, max_in_flight=64)
    names = ["agree"] * 6 + ["keys"] * 3 + ["unknown"] * 4 + ["both"] * 2 + ["malformed"] * 2
    names += ["text", "plain", "plain"]
    expected: dict[str, list[Pair]] = {"gemma-int4": [], "gemma-e2b": []}
    for round_ in range(2):  # two batches at least, many pairs of one key in each
        for i, name in enumerate(names):
            model = "gemma-int4" if i % 3 else "gemma-e2b"
            primary, answered = MIX[name]
            body = {**REQUEST, "model": model, "messages": [{"role": "user", "content": name}]}
            shadowed = replace(request(primary, session=f"s{round_}.{i}", model=model), body=body)
            assert shadow.submit(shadowed)
            expected[model].append(Pair.between(chat_judge(primary), chat_judge(answered)))
        await shadow.drain()
    outcomes = {p.outcome.value for pairs in expected.values() for p in pairs}
    assert outcomes == {"agree", "diverge", "primary_only", "reference_only", "both"}
    data = {entry["model"]: entry for entry in (await shadow.stats())["data"]}
    assert data == {
        model: {"model": model, "reference": "bf16", **figures(tally_pairs(pairs))}
        for model, pairs in expected.items()
    }
    assert data["gemma-int4"]["arguments"]["differing_keys"]  # argument keys were counted
    assert shadow_counts(metrics) == sum(
        (counted_alone(model, pairs) for model, pairs in expected.items()), Counter()
    )


async def test_a_batch_with_its_names_full_keeps_the_names_each_pair_would_have_kept(
    reference: Reference, closing: list[Shadow], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Four names fit, the pairs bring seven: the first pair's signature and the second's three
    # argument keys are in; "aa", "mm" and "bb" come too late, however the keys sort.
    monkeypatch.setattr("proxy.shadow.MAX_NAMES", 4)
    shadow, _, store = make_shadow(reference, closing)
    unknown = "unknown_tool"
    zz = Decision(("zz",), ('{"k":1}',), ((unknown, "zz"),))
    aa = Decision(("aa",), ("{}",), ((unknown, "aa"),))
    ok = Decision(("get_order_details",), ('{"order_id":"#W1","a":1}',), ())
    other = Decision(("get_order_details",), ('{"order_id":"#W2","b":2}',), ())
    mm = Decision(("mm", "bb"), ("{}", "{}"), ((unknown, "mm"), (unknown, "bb")))
    sequence = [(zz, ok), (ok, other), (zz, ok), (aa, ok), (mm, ok), (ok, other), (aa, aa)]
    fixed: Counter[str] = Counter()
    kept: dict[str, int] = {}
    for primary, answered in sequence:  # what counting each pair alone writes
        shadow._answered(replace(request(VALID), primary=primary), answered, None)
        pair_fixed, pair_names = pair_counts(Pair.between(primary, answered))
        fixed.update(pair_fixed)
        for name, count in pair_names.items():
            if name in kept or len(kept) < 4:
                kept[name] = kept.get(name, 0) + count
    await shadow.flush()
    assert list(kept) == [
        "sig|primary|unknown_tool|zz",
        "args|key|a",
        "args|key|b",
        "args|key|order_id",
    ]
    assert await store.read_counts("shadow-names:gemma-int4|bf16") == kept
    assert await store.read_counts("shadow:gemma-int4|bf16") == dict(fixed)
    assert await store.read_counts("shadow:index") == {"gemma-int4|bf16": len(sequence)}


async def test_a_store_that_fails_counts_one_error_for_each_event_of_the_batch(
    reference: Reference, closing: list[Shadow], refused_port: int
) -> None:
    reference.script.push(VALID)
    store = RedisStore(f"redis://127.0.0.1:{refused_port}/0", socket_timeout_s=1.0)
    shadow, metrics, _ = make_shadow(reference, closing, store=store)
    for i in range(7):  # two keys: five pairs agree, two primary_only
        assert shadow.submit(request(HALLUCINATED if i < 2 else VALID, session=f"s{i}"))
    continued = {**REQUEST, "input": "and #W2?", "previous_response_id": "resp_1"}
    skipped = replace(request(VALID), api="responses", path="responses", body=continued)
    assert not shadow.submit(skipped)  # an event without a pair, in the same batch
    await shadow.drain()
    labels = {"model": "gemma-int4", "reference": "bf16"}
    assert metric(metrics, "toolsentry_shadow_errors_total", kind="store", api="", **labels) == 8
    chat = {**labels, "api": "chat"}
    assert metric(metrics, "toolsentry_shadow_pairs_total", outcome="agree", **chat) == 5
    assert metric(metrics, "toolsentry_shadow_pairs_total", outcome="primary_only", **chat) == 2
    await shadow.close()
    closing.clear()
    await store.close()


async def test_the_models_filter_and_the_sample_decide_what_is_shadowed(
    reference: Reference, closing: list[Shadow]
) -> None:
    shadow, _, _ = make_shadow(reference, closing, models=["gemma-int4"])
    assert shadow.wants("gemma-int4", "any", upstream="int4")
    assert not shadow.wants("other", "any", upstream="int4")
    none, _, _ = make_shadow(reference, closing, sample=0.0)
    assert not none.wants("gemma-int4", "any", upstream="int4")


@pytest.mark.parametrize("models", [[], ["gemma-int4", "gemma-bf16"]])
async def test_the_references_own_traffic_is_never_shadowed(
    reference: Reference, closing: list[Shadow], models: list[str]
) -> None:
    shadow, _, _ = make_shadow(reference, closing, models=models)
    assert shadow.reference_name == "bf16"
    assert shadow.wants("gemma-int4", "any", upstream="int4")
    assert not shadow.wants("gemma-bf16", "any", upstream="bf16")  # its answer against itself


def test_shadow_settings_come_from_yaml_environment_and_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("shadow:\n  reference: bf16\n  sample: 0.5\n  max_in_flight: 4\n")
    monkeypatch.setenv("TOOLSENTRY_SHADOW_SAMPLE", "0.25")
    monkeypatch.setenv("TOOLSENTRY_SHADOW_MODELS", '["gemma-int4"]')
    settings = load_settings(config, shadow={"timeout": 5.0})
    got = settings.shadow
    assert (got.reference, got.sample, got.max_in_flight, got.timeout) == ("bf16", 0.25, 4, 5.0)
    assert got.models == ["gemma-int4"]
    assert got.enabled
    assert not Settings().shadow.enabled  # off by default
    monkeypatch.setenv("TOOLSENTRY_SHADOW_SAMPEL", "0.1")
    with pytest.raises(ConfigError, match=r"shadow\.sampel"):
        load_settings()


def test_a_reference_that_names_no_upstream_is_refused_by_check_config(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "upstreams:\n  - {name: int4, base_url: 'http://127.0.0.1:1/v1'}\n"
        "shadow: {reference: bf16, sample: 1.0}\n"
    )
    result = CliRunner().invoke(cli_app, ["check-config", str(config)])
    assert result.exit_code == 2
    assert "shadow.reference 'bf16' names no configured upstream" in result.output


def test_open_shadow_builds_nothing_when_off_and_a_worker_log_per_process(
    tmp_path: Path,
) -> None:
    entry = {"name": "bf16", "base_url": "http://127.0.0.1:1/v1", "models": ["gemma-bf16"]}
    off = Settings(upstreams=[entry])
    assert open_shadow(off, metrics=Metrics(), store=MemoryStore(), environ={}) is None
    on = Settings(
        upstreams=[entry],
        shadow={"reference": "bf16", "sample": 1.0, "log": str(tmp_path / "shadow.jsonl")},
    )
    shadow = open_shadow(
        on, metrics=Metrics(), store=MemoryStore(), environ={}, worker_log_suffix=True
    )
    assert shadow is not None
    assert shadow.reference_model == "gemma-bf16"
    assert shadow.log_path == tmp_path / f"shadow.{os.getpid()}.jsonl"
    asyncio.run(shadow.close())


def shadowed_settings(
    served: LoopbackServer, reference: Reference, *, log: Path | None = None, **extra: Any
) -> Settings:
    """A proxy serving gemma-int4 from `served`, every session shadowed by `reference`."""
    return Settings(
        upstreams=[
            {"name": "int4", "base_url": f"{served.url}/v1", "models": ["gemma-int4"]},
            reference.entry.model_dump(),
        ],
        shadow={"reference": "bf16", "sample": 1.0, "log": None if log is None else str(log)},
        admin_key="admin-secret",
        **extra,
    )


def test_every_protocol_is_shadowed_through_the_real_proxy_and_the_client_gets_its_repair(
    reference: Reference,
) -> None:
    primary = ScriptedUpstream(
        [
            answer(None, call("lookup_order", {"order_id": "#W1"})),  # chat: first answer
            answer(None, call("get_order_details", {"order_id": "#W1"})),  # chat: re-ask
            answer(None, call("lookup_order", {"order_id": "#W1"})),  # responses: first
            answer(None, call("get_order_details", {"order_id": "#W1"})),  # responses: re-ask
        ]
    )
    reference.script.push(answer(None, call("get_order_details", {"order_id": "#W1"})))
    with LoopbackServer(primary.app) as served:
        settings = shadowed_settings(served, reference)
        with LoopbackServer(create_app(settings, environ={})) as proxy:
            client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
            chat = client.chat.completions.create(
                model="gemma-int4", messages=REQUEST["messages"], tools=RETAIL_TOOLS
            )
            responses = client.responses.create(
                model="gemma-int4",
                input="where is order #W1?",
                tools=[
                    {"type": "function", "name": t["function"]["name"], **t["function"]}
                    for t in RETAIL_TOOLS
                ],
            )
            client.close()
            with httpx.Client(base_url=proxy.url, timeout=30) as http:
                assert http.get("/v1/stats/shadow").status_code == 401
                stats = settled(http)
                text = http.get("/metrics").text
    # The client got the repaired call; the shadow compared the model's first answer.
    assert chat.choices[0].message.tool_calls[0].function.name == "get_order_details"
    assert [i.name for i in responses.output if i.type == "function_call"] == ["get_order_details"]
    (entry,) = stats["data"]
    assert (entry["pairs"], entry["outcomes"]["primary_only"]) == (2, 2)
    assert entry["signatures"]["top"]["primary"] == [
        {"channel": "unknown_tool", "tool": "lookup_order", "count": 2}
    ]
    paths = reference.script.paths
    assert "/v1/chat/completions" in paths
    assert "/v1/responses" in paths
    for api in ("chat", "responses"):
        labels = {"model": "gemma-int4", "reference": "bf16", "api": api}
        assert sample(text, "toolsentry_shadow_pairs_total", outcome="primary_only", **labels) == 1


def test_the_clients_bytes_go_to_a_reference_of_the_same_model_with_stream_false_appended(
    reference: Reference,
) -> None:
    # A reference serving the same model name: the turn hands the shadow the bytes its first
    # attempt sent, and they go on as they are but for the member that makes them non-streamed.
    primary = ScriptedUpstream([answer(None, call("get_order_details", {"order_id": "#W1"}))])
    reference.script.push(answer(None, call("get_order_details", {"order_id": "#W1"})))
    reference.entry = reference.entry.model_copy(update={"models": ["gemma-int4"]})
    body = {"model": "gemma-int4", "messages": REQUEST["messages"], "tools": RETAIL_TOOLS}
    raw = json.dumps(body, indent=1).encode()  # not what orjson would write: the bytes are kept
    with LoopbackServer(primary.app) as served:
        settings = shadowed_settings(served, reference)
        with (
            LoopbackServer(create_app(settings, environ={})) as proxy,
            httpx.Client(base_url=proxy.url, timeout=30) as http,
        ):
            answered = http.post(
                "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
            )
            assert answered.status_code == 200
            assert settled(http, pairs=1)["data"][0]["pairs"] == 1
    assert primary.raw_requests == [raw]
    assert reference.script.raw_requests == [raw[:-1] + b',"stream":false}']
    assert json.loads(reference.script.raw_requests[0]) == {**body, "stream": False}


def settled(http: httpx.Client, pairs: int = 2, skipped: int = 0) -> dict[str, Any]:
    """The shadow's stats once `pairs` pairs and `skipped` skips are counted and nothing is in
    flight (a turn hands its request over as it closes, which may be after the client's reply)."""
    headers = {"x-admin-key": "admin-secret"}
    for _ in range(400):
        stats: dict[str, Any] = http.get("/v1/stats/shadow", headers=headers).json()
        entry = stats["data"][0] if stats["data"] else None
        if (
            stats["in_flight"] == 0
            and entry is not None
            and entry["pairs"] >= pairs
            and sum(entry["skipped"].values()) >= skipped
        ):
            return stats
        time.sleep(0.025)
    return stats


def test_the_stats_say_so_when_shadowing_is_off(make_proxy: Any) -> None:
    proxy = make_proxy()
    with proxy.http() as http:
        assert http.get("/v1/stats/shadow").json() == {
            "object": "shadow.stats",
            "enabled": False,
            "data": [],
        }


def test_a_turn_the_client_got_refused_is_compared_on_the_models_first_answer(
    reference: Reference,
) -> None:
    primary = ScriptedUpstream([answer(None, call("lookup_order", {"order_id": "#W1"}))])
    reference.script.push(answer(None, call("get_order_details", {"order_id": "#W1"})))
    with LoopbackServer(primary.app) as served:
        settings = shadowed_settings(served, reference, on_unrepaired="reject")
        with (
            LoopbackServer(create_app(settings, environ={})) as proxy,
            httpx.Client(base_url=proxy.url, timeout=30) as http,
        ):
            body = {k: v for k, v in REQUEST.items() if not k.startswith("stream")}
            refused = http.post("/v1/chat/completions", json=body)
            stats = settled(http, pairs=1)
    assert refused.status_code == 422
    (entry,) = stats["data"]
    assert (entry["pairs"], entry["outcomes"]["primary_only"]) == (1, 1)


def test_a_messages_turn_is_shadowed_on_the_messages_route(reference: Reference) -> None:
    primary = ScriptedUpstream([answer(None, call("lookup_order", {"order_id": "#W1"}))])
    reference.script.push(answer(None, call("get_order_details", {"order_id": "#W1"})))
    tools = [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"],
        }
        for t in RETAIL_TOOLS
    ]
    body = {
        "model": "gemma-int4",
        "max_tokens": 64,
        "messages": REQUEST["messages"],
        "tools": tools,
    }
    with (
        LoopbackServer(primary.app) as served,
        LoopbackServer(
            create_app(shadowed_settings(served, reference, repair="off"), environ={})
        ) as proxy,
        httpx.Client(base_url=proxy.url, timeout=30) as http,
    ):
        assert http.post("/v1/messages", json=body).status_code == 200
        stats = settled(http, pairs=1)
    assert "/v1/messages" in reference.script.paths
    (entry,) = stats["data"]
    assert (entry["pairs"], entry["outcomes"]["primary_only"]) == (1, 1)


RESPONSES_TOOLS = [{"type": "function", **t["function"]} for t in RETAIL_TOOLS]


@pytest.mark.parametrize(
    "reason", ["previous_response_id", "conversation", "item_reference"], ids=str
)
def test_a_responses_turn_that_continues_stored_context_is_skipped_with_its_reason(
    reference: Reference, tmp_path: Path, reason: str
) -> None:
    # The second turn carries only what is new; the rest is stored at the primary's upstream,
    # which the reference is not. It is not sent to the reference (which would refuse the ids,
    # or answer without the context): counted as skipped, never as a pair or a reference error.
    primary = ScriptedUpstream(
        [
            answer(None, call("get_order_details", {"order_id": "#W1"})),
            answer("Order #W1 was delivered."),
        ]
    )
    reference.script.push(answer(None, call("get_order_details", {"order_id": "#W1"})))
    log = tmp_path / "shadow.jsonl"
    with LoopbackServer(primary.app) as served:
        settings = shadowed_settings(served, reference, log=log, repair="off")
        with LoopbackServer(create_app(settings, environ={})) as proxy:
            client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
            first = client.responses.create(
                model="gemma-int4",
                input="where is order #W1?",
                tools=RESPONSES_TOOLS,
                extra_headers={"x-request-id": "req-1"},
            )
            (asked,) = [i for i in first.output if i.type == "function_call"]
            result = {"type": "function_call_output", "call_id": asked.call_id, "output": "ok"}
            continued: dict[str, Any] = {
                "previous_response_id": {"previous_response_id": first.id, "input": [result]},
                "conversation": {"conversation": "conv_1", "input": [result]},
                "item_reference": {"input": [{"type": "item_reference", "id": asked.id}, result]},
            }[reason]
            second = client.responses.create(
                model="gemma-int4",
                tools=RESPONSES_TOOLS,
                extra_headers={"x-request-id": "req-2"},
                **continued,
            )
            client.close()
            with httpx.Client(base_url=proxy.url, timeout=30) as http:
                stats = settled(http, pairs=1, skipped=1)
                text = http.get("/metrics").text
    assert second.output_text == "Order #W1 was delivered."  # the client is unaffected
    assert reference.script.paths.count("/v1/responses") == 1  # only the first turn was sent
    (entry,) = stats["data"]
    assert (entry["pairs"], entry["outcomes"]["agree"]) == (1, 1)
    assert entry["errors"] == {}
    assert entry["skipped"] == {
        r: int(r == reason) for r in ("previous_response_id", "conversation", "item_reference")
    }
    labels = {"model": "gemma-int4", "reference": "bf16", "api": "responses"}
    assert sample(text, "toolsentry_shadow_skipped_total", reason=reason, **labels) == 1
    assert sample(text, "toolsentry_shadow_pairs_total", outcome="agree", **labels) == 1
    # A pair's line is written when the reference answers, a skip's at once: either may be first.
    lines = sorted((json.loads(x) for x in log.read_text().splitlines()), key=lambda x: x["event"])
    assert [(x["event"], x.get("reason")) for x in lines] == [("pair", None), ("skipped", reason)]
    # Each line names its own request: the pair's, written by the shadow's task, and the skip's.
    assert [x["request_id"] for x in lines] == ["req-1", "req-2"]
    if reason == "previous_response_id":
        assert lines[0]["session"] == lines[1]["session"]  # the chain is one session


async def test_a_skip_reaches_the_store_even_with_nothing_in_flight(
    reference: Reference, closing: list[Shadow]
) -> None:
    shadow, metrics, store = make_shadow(reference, closing)
    continued = {**REQUEST, "input": "and #W2?", "previous_response_id": "resp_1"}
    skipped = ShadowRequest(
        model="gemma-int4",
        session="s1",
        api="responses",
        path="responses",
        body=continued,
        headers={},
        primary=chat_judge(VALID),
        judge=chat_judge,
    )
    assert not shadow.submit(skipped)
    await shadow.drain()
    assert reference.script.requests == []
    labels = {"model": "gemma-int4", "reference": "bf16", "api": "responses"}
    assert (
        metric(metrics, "toolsentry_shadow_skipped_total", reason="previous_response_id", **labels)
        == 1
    )
    # Another replica on the same store, which never saw the request, reads the same figure.
    other, _, _ = make_shadow(reference, closing, store=store)
    (entry,) = (await other.stats())["data"]
    assert (entry["pairs"], entry["skipped"]["previous_response_id"]) == (0, 1)


@pytest.mark.parametrize(
    ("second", "kind"),
    [
        (b"HTTP/1.1 200 OK\r\ncontent-length: 900\r\n\r\n{", "upstream"),  # broke off
        (b"", "timeout"),  # silent past the reference client's own read timeout
    ],
    ids=["broken-off", "silent"],
)
async def test_a_reference_failing_on_an_idle_connection_is_counted_by_kind(
    closing: list[Shadow], second: bytes, kind: str
) -> None:
    first = orjson.dumps(VALID)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(first), first))
        await reader.readuntil(b"\r\n\r\n")
        writer.write(second)
        await writer.drain()
        if not second:
            await reader.read()  # until the client gives up and closes
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    entry = UpstreamConfig(name="bf16", base_url=f"http://127.0.0.1:{port}/v1", timeout=0.2)
    config = ShadowConfig(reference="bf16", sample=1.0, timeout=5.0)
    upstream = HttpUpstream(entry, api_key=None, retries=0)
    shadow, metrics = shadow_over(upstream, config, closing)
    await upstream.request("POST", "chat/completions", body=b"{}", headers={})
    await submit_without_a_task(shadow, request(VALID))
    await asyncio.wait_for(shadow.drain(), 10)
    server.close()
    await server.wait_closed()
    labels = {"model": "gemma-int4", "reference": "bf16", "api": "chat"}
    assert metric(metrics, "toolsentry_shadow_errors_total", kind=kind, **labels) == 1
    (entry_stats,) = (await shadow.stats())["data"]
    assert (entry_stats["errors"], entry_stats["pairs"]) == ({kind: 1}, 0)


async def test_close_ends_what_is_in_flight_on_idle_connections_uncounted(
    reference: Reference, closing: list[Shadow]
) -> None:
    shadow, metrics, _ = make_shadow(reference, closing, max_in_flight=4)
    await warm(shadow, reference)
    reference.script.push(Fault(200, VALID, delay=1.0))  # still asked when the shadow closes
    await submit_without_a_task(shadow, request(VALID))
    await asyncio.sleep(0.1)
    await shadow.close()
    closing.clear()
    assert shadow.in_flight == 0
    assert isinstance(shadow.reference, HttpUpstream)
    labels = {"model": "gemma-int4", "reference": "bf16", "api": "chat"}
    text = metrics.render().decode()
    assert "toolsentry_shadow_errors_total{" not in text
    assert "toolsentry_shadow_pairs_total{" not in text
    assert shadow.reference._pool is None  # closed with its connections
    del labels
