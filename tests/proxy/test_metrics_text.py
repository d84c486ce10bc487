"""The `/metrics` reader of the tests raises for a sample that is not there (tests/proxy/metrics_text.py)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from tests.proxy.metrics_text import MetricAbsent, metric


def page() -> str:
    registry = CollectorRegistry()
    requests = Counter("demo_requests", "Requests.", ["model", "status"], registry=registry)
    Counter("demo_unused", "Never incremented.", ["model"], registry=registry)
    latency = Histogram("demo_seconds", "Latency.", ["model"], registry=registry)
    requests.labels(model="m", status="200").inc(3)
    requests.labels(model='a "quoted", model', status="500").inc()
    latency.labels(model="m").observe(0.25)
    return generate_latest(registry).decode()


def test_a_sample_is_read_by_name_and_exact_labels() -> None:
    text = page()
    assert metric(text, "demo_requests_total", model="m", status="200") == 3
    assert metric(text, "demo_requests_total", model='a "quoted", model', status="500") == 1
    assert metric(text, "demo_seconds_count", model="m") == 1
    assert metric(text, "demo_seconds_sum", model="m") == 0.25


def test_an_absent_sample_raises_and_names_what_is_there() -> None:
    with pytest.raises(MetricAbsent, match="status': '200'"):
        metric(page(), "demo_requests_total", model="m", status="429")


def test_a_misspelt_metric_raises_even_when_the_sample_may_be_absent() -> None:
    with pytest.raises(MetricAbsent, match="no metric demo_request_total"):
        metric(page(), "demo_request_total", may_be_absent=True, model="m", status="200")


def test_a_partial_label_set_is_not_a_match() -> None:
    with pytest.raises(MetricAbsent):
        metric(page(), "demo_requests_total", model="m")


def test_a_declared_series_not_yet_exposed_reads_zero_only_when_allowed() -> None:
    text = page()
    assert metric(text, "demo_unused_total", may_be_absent=True, model="m") == 0
    assert metric(text, "demo_requests_total", may_be_absent=True, model="m", status="429") == 0
    with pytest.raises(MetricAbsent):
        metric(text, "demo_unused_total", model="m")
