"""Metrics: one process keeps its values in memory; worker processes share a directory and
`/metrics` sums them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from proxy.errors import ConfigError
from proxy.guard.dialect import FallbackReason, SchemaFallback
from proxy.metrics import Metrics, SchemaFallbackStats, UnknownToolStats
from tests.proxy.metrics_text import metric
from tests.proxy.system.support import REPO

WORKER = textwrap.dedent(
    """
    import sys
    from proxy.metrics import Metrics

    metrics = Metrics(multiprocess_dir=sys.argv[1])
    metrics.requests.labels("m", "200", "chat").inc(int(sys.argv[2]))
    metrics.upstream_seconds.labels("m", "chat").observe(0.01)
    sys.stdout.write(metrics.render().decode())
    """
)


def run_worker(directory: Path, count: int) -> str:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    done = subprocess.run(
        [sys.executable, "-c", WORKER, str(directory), str(count)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def test_workers_sharing_a_directory_render_the_sum_of_their_values(tmp_path: Path) -> None:
    run_worker(tmp_path, 3)
    text = run_worker(tmp_path, 4)  # renders after adding its own
    assert metric(text, "toolsentry_requests_total", api="chat", model="m", status="200") == 7
    assert metric(text, "toolsentry_upstream_seconds_count", api="chat", model="m") == 2


def test_multiprocess_metrics_without_the_environment_variable_are_refused(
    tmp_path: Path,
) -> None:
    # This test process imported prometheus_client without PROMETHEUS_MULTIPROC_DIR.
    with pytest.raises(ConfigError, match="PROMETHEUS_MULTIPROC_DIR"):
        Metrics(multiprocess_dir=str(tmp_path))


def test_two_in_process_metrics_count_apart() -> None:
    first, second = Metrics(), Metrics()
    first.requests.labels("m", "200", "chat").inc()
    assert (
        metric(
            first.render().decode(),
            "toolsentry_requests_total",
            api="chat",
            model="m",
            status="200",
        )
        == 1
    )
    assert (
        metric(
            second.render().decode(),
            "toolsentry_requests_total",
            api="chat",
            may_be_absent=True,
            model="m",
            status="200",
        )
        == 0
    )


def test_a_models_kept_series_count_into_the_same_values_as_labels() -> None:
    metrics = Metrics()
    series = metrics.for_model("m", "chat")
    assert metrics.for_model("m", "chat") is series
    series.requests("200").inc()
    metrics.requests.labels("m", "200", "chat").inc()
    series.requests("429").inc()
    series.tool_calls("valid").inc(3)
    series.upstream_seconds.observe(0.5)
    series.overhead_seconds.observe(0.001)
    metrics.for_model("other", "responses").requests("200").inc()
    text = metrics.render().decode()
    assert metric(text, "toolsentry_requests_total", api="chat", model="m", status="200") == 2
    assert metric(text, "toolsentry_requests_total", api="chat", model="m", status="429") == 1
    assert (
        metric(text, "toolsentry_requests_total", api="responses", model="other", status="200") == 1
    )
    assert metric(text, "toolsentry_tool_calls_total", api="chat", model="m", outcome="valid") == 3
    assert metric(text, "toolsentry_upstream_seconds_sum", api="chat", model="m") == 0.5
    assert metric(text, "toolsentry_overhead_seconds_count", api="chat", model="m") == 1
    assert 'toolsentry_overhead_seconds_count{api="responses",model="other"}' not in text


def test_unknown_tool_names_are_bounded_per_model() -> None:
    stats = UnknownToolStats(max_names=2)
    for name in ("a", "b", "c", "a"):
        stats.add("m", name)
    assert stats.top()["models"] == {"m": [{"name": "a", "count": 2}, {"name": "b", "count": 1}]}


def test_calls_written_as_text_are_counted_per_model_and_format() -> None:
    stats = UnknownToolStats()
    for fmt in ("hermes", "kimi_k2", "hermes"):
        stats.add_leak("m", fmt)
    assert stats.top()["leaked_formats"] == {
        "m": [{"format": "hermes", "count": 2}, {"format": "kimi_k2", "count": 1}]
    }


def fell_back(*tools: str) -> tuple[SchemaFallback, ...]:
    """A compiled tool list's fallbacks: each tool with an unknown type."""
    return tuple(
        SchemaFallback(t, FallbackReason.UNKNOWN_TYPE, "unknown type 'Point'") for t in tools
    )


def test_schema_fallbacks_are_counted_per_request_and_reason_and_new_once_per_tool_list() -> None:
    metrics = Metrics()
    listed = fell_back("a", "b")
    assert metrics.count_schema_fallbacks("m", listed)
    assert not metrics.count_schema_fallbacks("m", listed)  # the same compiled list again
    assert metrics.count_schema_fallbacks("m", fell_back("a", "b"))  # another list, same tools
    text = metrics.render().decode()
    assert metric(text, "toolsentry_schema_fallbacks_total", model="m", reason="unknown_type") == 3
    [a, b] = metrics.schema_fallback_tools.report()["models"]["m"]
    assert (a["tool"], a["reason"], a["requests"]) == ("a", "unknown_type", 3)
    assert (b["tool"], b["requests"]) == ("b", 3)


def test_schema_fallback_statistics_are_bounded_per_model_and_in_the_lists_remembered() -> None:
    stats = SchemaFallbackStats(max_tools=2, max_lists=2)
    first = fell_back("a")
    for tools in (first, fell_back("b"), fell_back("c")):
        assert stats.add("m", tools)
    assert [t["tool"] for t in stats.report()["models"]["m"]] == ["a", "b"]
    assert stats.add("m", first)  # forgotten: the two lists remembered are the later ones
