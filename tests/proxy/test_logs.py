import io
import re
import tempfile
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.logs import (
    REDACTED,
    _big_ints_as_text,
    configure_logging,
    get_logger,
    log_request,
    redact,
)


@pytest.fixture(autouse=True)
def _restore_quiet_logs() -> object:
    yield
    configure_logging("warning", stream=io.StringIO())


def test_secrets_are_masked_at_any_depth_and_bearer_tokens_wherever_they_appear() -> None:
    event = {
        "headers": {"Authorization": "Bearer sk-1", "x-api-key": "k", "accept": "json"},
        "upstreams": [{"name": "vllm", "api_key": "sk-2"}],
        "note": "bearer sk-3",
        "count": 3,
    }
    assert redact(event) == {
        "headers": {"Authorization": REDACTED, "x-api-key": REDACTED, "accept": "json"},
        "upstreams": [{"name": "vllm", "api_key": REDACTED}],
        "note": REDACTED,
        "count": 3,
    }


def test_each_event_is_one_json_line_with_level_and_time_and_no_secret() -> None:
    stream = io.StringIO()
    configure_logging("info", stream=stream)
    get_logger().info("chat_completion", model="m", authorization="Bearer sk-1", latency_ms=1.5)
    (line,) = stream.getvalue().splitlines()
    event = orjson.loads(line)
    assert event["event"] == "chat_completion"
    assert event["level"] == "info"
    assert event["timestamp"].endswith("Z")
    assert event["authorization"] == REDACTED
    assert event["latency_ms"] == 1.5


def test_a_binary_backed_stream_gets_the_same_lines_as_bytes() -> None:
    with tempfile.TemporaryFile("w+") as file:
        configure_logging("info", stream=file)
        log = get_logger()
        log.info("one", session="s1")
        log.info("two", token="t")
        file.seek(0)
        events = [orjson.loads(line) for line in file.read().splitlines()]
    assert [e["event"] for e in events] == ["one", "two"]
    assert events[1]["token"] == REDACTED


def test_events_below_the_configured_level_are_not_written() -> None:
    stream = io.StringIO()
    configure_logging("warning", stream=stream)
    log = get_logger()
    log.info("hidden")
    log.warning("shown")
    assert [orjson.loads(line)["event"] for line in stream.getvalue().splitlines()] == ["shown"]


_keys = st.sampled_from(["event", "model", "Authorization", "API_KEY", "token", "note", "x"])
_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=10),
    st.sampled_from(["Bearer sk-1", "bearer x", "BEARER  y"]),
)
_events = st.dictionaries(
    _keys,
    st.recursive(
        _leaves,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=3),
        max_leaves=6,
    ),
)


@given(event=_events)
def test_an_events_secrets_are_masked_as_redact_masks_them(event: dict[str, Any]) -> None:
    configure_logging("info", stream=(stream := io.StringIO()))
    get_logger().info("e", **{k: v for k, v in event.items() if k != "event"})
    logged = orjson.loads(stream.getvalue())
    expected = redact({k: v for k, v in event.items() if k != "event"})
    assert {k: v for k, v in logged.items() if k not in ("event", "level", "timestamp")} == (
        orjson.loads(orjson.dumps(_big_ints_as_text(expected)))
    )


def test_the_timestamp_is_utc_iso_8601_with_microseconds_and_now() -> None:
    stream = io.StringIO()
    configure_logging("info", stream=stream)
    before = datetime.now(UTC)
    get_logger().info("stamped")
    after = datetime.now(UTC)
    stamp = orjson.loads(stream.getvalue())["timestamp"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", stamp)
    slack = timedelta(milliseconds=1)  # the two clocks round their microseconds differently
    assert before - slack <= datetime.fromisoformat(stamp.replace("Z", "+00:00")) <= after + slack


@given(event=_events)
def test_the_request_event_is_the_line_the_structlog_logger_writes(event: dict[str, Any]) -> None:
    fields = {k: v for k, v in event.items() if k != "event"}
    lines = []
    for write in (
        lambda: get_logger().info("request", **fields),
        lambda: log_request(dict(fields)),
    ):
        with tempfile.TemporaryFile("w+") as file:  # a binary-backed stream, as in production
            configure_logging("info", stream=file)
            write()
            file.seek(0)
            lines.append(orjson.loads(file.read()))
    for line in lines:
        assert line.pop("timestamp")
    assert list(lines[0].items()) == list(lines[1].items())


def test_the_request_event_is_not_written_below_info() -> None:
    stream = io.StringIO()
    configure_logging("warning", stream=stream)
    log_request({"request_id": "r1"})
    configure_logging("info", stream=stream)
    log_request({"request_id": "r2", "authorization": "Bearer sk-1"})
    (line,) = stream.getvalue().splitlines()
    event = orjson.loads(line)
    assert (event["request_id"], event["event"], event["authorization"]) == (
        "r2",
        "request",
        REDACTED,
    )


def test_an_integer_beyond_64_bits_is_logged_as_its_digits_instead_of_failing() -> None:
    stream = io.StringIO()
    configure_logging("info", stream=stream)
    get_logger().info("big", count=2**70, nested={"ids": [2**65, 3]})
    event = orjson.loads(stream.getvalue())
    assert (event["count"], event["nested"]) == (str(2**70), {"ids": [str(2**65), 3]})
