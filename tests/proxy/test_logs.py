import io
import tempfile

import orjson
import pytest

from proxy.logs import REDACTED, configure_logging, get_logger, redact


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
