"""Hostile input against the running proxy: whatever a client sends, the proxy answers with a
normal completion or a clear OpenAI-shaped 4xx, never a 5xx of its own, and in bounded time."""

from __future__ import annotations

import io
import json
import socket
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.testing import answer, call, completion, tool_call
from tests.proxy.builders import make_request, make_tool
from tests.proxy.conftest import RunningProxy, RunningUpstream

EXAMPLES = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def echo_first_tool(body: dict[str, Any]) -> Any:
    """The upstream calls the first declared tool (with `{"code": …}` arguments for `check`),
    so every hostile schema is exercised by the validator; anything odd gets plain text."""
    try:
        name = body["tools"][0]["function"]["name"]
    except (KeyError, IndexError, TypeError):
        return completion("plain text")
    if not isinstance(name, str):
        return completion("plain text")
    arguments = {"code": "a" * 40 + "!"} if name == "check" else {}
    return completion(tool_calls=[tool_call(name, arguments)])


@pytest.fixture
def echoing(upstream: RunningUpstream) -> RunningUpstream:
    upstream.script.handler = echo_first_tool
    return upstream


def assert_not_a_proxy_failure(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text
    assert "Traceback" not in response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["message"]


def assert_openai_error(response: httpx.Response, status: int, mentions: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert mentions in error["message"]


# -- generated chat bodies -----------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=8).filter(lambda k: k != "stream"), inner, max_size=4)
    ),
    max_leaves=16,
)
SCHEMA_WORDS = [
    "type", "properties", "required", "enum", "pattern", "items", "additionalProperties",
    "$ref", "minimum", "maxLength", "anyOf", "format", "const", "$defs",
]  # fmt: skip
schemas = st.recursive(
    st.sampled_from(["object", "string", "integer", "array", "null"]).map(lambda t: {"type": t})
    | json_values,
    lambda inner: (
        st.dictionaries(st.sampled_from(SCHEMA_WORDS), inner | json_values, max_size=5)
        | st.dictionaries(st.text(max_size=6), inner, max_size=3).map(
            lambda props: {"type": "object", "properties": props}
        )
    ),
    max_leaves=12,
)
tools = st.fixed_dictionaries(
    {"type": st.just("function") | json_values},
    optional={
        "function": st.fixed_dictionaries(
            {"name": st.text(max_size=12) | json_values},
            optional={"parameters": schemas, "description": json_values},
        )
        | json_values
    },
)
messages = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "developer"]) | json_values},
    optional={
        "content": json_values,
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {"id": json_values, "function": json_values, "type": json_values}
            ),
            max_size=2,
        )
        | json_values,
        "tool_call_id": st.text(max_size=10) | json_values,
    },
)
chat_bodies = st.fixed_dictionaries(
    {"messages": st.lists(messages, max_size=4) | json_values},
    optional={
        "model": st.just("scripted-model") | json_values,
        "tools": st.lists(tools, max_size=3) | json_values,
        "tool_choice": st.sampled_from(["auto", "none", "required"]) | json_values,
        "metadata": json_values,
        "user": json_values,
        "n": json_values,
    },
)
header_text = st.text(alphabet=string.printable.strip() + " ", max_size=30).map(str.strip)
hostile_headers = st.fixed_dictionaries(
    {},
    optional={
        "x-session-id": header_text,
        "x-toolsentry-max-errors": header_text,
        "x-toolsentry-repair": header_text,
    },
)


# -- limits --------------------------------------------------------------------------------------


def test_a_body_over_the_limit_is_a_413_with_or_without_a_length(
    make_proxy: Callable[..., RunningProxy],
) -> None:
    proxy = make_proxy(max_body_bytes=64 * 1024)
    big = orjson.dumps(make_request("x" * 100_000))
    with proxy.http() as http:
        declared = http.post("/v1/chat/completions", content=big)
        chunked = http.post("/v1/chat/completions", content=iter([big[:50_000], big[50_000:]]))
    assert_openai_error(declared, 413, "limit")
    assert_openai_error(chunked, 413, "limit")


def test_invalid_json_is_a_400_in_the_openai_shape(proxy: RunningProxy) -> None:
    with proxy.http() as http:
        for raw in (b"{not json", b"", b"[1, 2]", b'"text"', b"\xff\xfe"):
            response = http.post("/v1/chat/completions", content=raw)
            assert_openai_error(response, 400, "JSON")


def test_thousands_of_tools_are_refused_naming_the_limit(proxy: RunningProxy) -> None:
    tools = [make_tool(f"tool_{i}") for i in range(3000)]
    with proxy.http() as http:
        response = http.post("/v1/chat/completions", json=make_request(tools=tools))
    assert_openai_error(response, 400, "max_tools=512")


def test_hundreds_of_tools_within_the_limit_get_a_normal_answer(
    proxy: RunningProxy, echoing: RunningUpstream
) -> None:
    tools = [make_tool(f"tool_{i}", {"x": {"type": "string"}}) for i in range(500)]
    with proxy.http() as http:
        response = http.post("/v1/chat/completions", json=make_request(tools=tools))
    assert response.status_code == 200, response.text
    assert response.headers["x-toolsentry-violations"] == ""


def nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"inner": schema}}
    return schema


def test_a_deeply_nested_schema_is_refused_naming_the_configured_limit(
    make_proxy: Callable[..., RunningProxy], echoing: RunningUpstream
) -> None:
    proxy = make_proxy(max_schema_depth=10)
    deep = {"type": "function", "function": {"name": "deep", "parameters": nested(8)}}
    with proxy.http() as http:
        refused = http.post("/v1/chat/completions", json=make_request(tools=[deep]))
        deep["function"]["parameters"] = nested(3)
        accepted = http.post("/v1/chat/completions", json=make_request(tools=[deep]))
    assert_openai_error(refused, 400, "max_schema_depth=10")
    assert accepted.status_code == 200, accepted.text


def test_nesting_deeper_than_any_parser_allows_is_a_clear_400(proxy: RunningProxy) -> None:
    depth = 5000
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": '
    raw += b"[" * depth + b"]" * depth + b"}"
    with proxy.http() as http:
        response = http.post("/v1/chat/completions", content=raw)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_a_huge_enum_is_refused_by_size_and_a_large_one_is_checked(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    def with_enum(values: list[str]) -> dict[str, Any]:
        prop = {"code": {"type": "string", "enum": values}}
        return make_request(tools=[make_tool("pick", prop, ["code"])])

    huge = [f"value-number-{i:07d}" for i in range(100_000)]
    upstream.script.push(completion(tool_calls=[tool_call("pick", {"code": "not-listed"})]))
    with proxy.http() as http:
        refused = http.post("/v1/chat/completions", json=with_enum(huge))
        checked = http.post(
            "/v1/chat/completions",
            json=with_enum(huge[:5000]),
            headers={"x-toolsentry-repair": "off"},
        )
    assert_openai_error(refused, 400, "max_schema_bytes")
    assert checked.status_code == 200, checked.text
    assert checked.headers["x-toolsentry-violations"] == "schema_violation"


def test_a_catastrophic_backtracking_pattern_cannot_hang_the_proxy(
    proxy: RunningProxy, echoing: RunningUpstream
) -> None:
    evil = {"code": {"type": "string", "pattern": "^(a+)+$"}}
    request = make_request(tools=[make_tool("check", evil, ["code"])])
    with httpx.Client(base_url=proxy.server.url, timeout=30) as http:  # the bound
        answers = [http.post("/v1/chat/completions", json=request) for _ in range(5)]
    for response in answers:
        assert response.status_code == 200, response.text
        call = response.json()["choices"][0]["message"]["tool_calls"][0]
        assert call["function"]["name"] == "check"


def test_a_client_that_leaves_halfway_through_its_body_costs_nothing_and_logs_no_error(
    proxy: RunningProxy, upstream: RunningUpstream, log: io.StringIO
) -> None:
    body = orjson.dumps(make_request(user="left-halfway"))
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
    )
    with socket.create_connection(("127.0.0.1", proxy.server.port), timeout=10) as raw:
        raw.sendall(head + body[: len(body) // 2])
    upstream.script.push(completion("still here"))

    with proxy.http() as http:
        after = http.post("/v1/chat/completions", json=make_request(user="came-after"))
        left = http.get("/v1/sessions/left-halfway")

    assert after.status_code == 200, after.text
    assert len(upstream.script.requests) == 1
    assert left.status_code == 404
    assert "error" not in [json.loads(line)["level"] for line in log.getvalue().splitlines()]


# -- the Responses API -----------------------------------------------------------------------------


def echo_first_responses_tool(body: dict[str, Any]) -> Any:
    """A Responses upstream that calls the first declared function (inside a namespace too)."""
    tools = body.get("tools")
    first = tools[0] if isinstance(tools, list) and tools and isinstance(tools[0], dict) else {}
    namespace = None
    if first.get("type") == "namespace" and isinstance(first.get("tools"), list) and first["tools"]:
        namespace, first = first.get("name"), first["tools"][0]
    name = first.get("name") if isinstance(first, dict) else None
    if not isinstance(name, str) or not (namespace is None or isinstance(namespace, str)):
        return answer("plain text")
    return answer(None, call(name, {}, namespace=namespace))


flat_tools = st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "custom", "web_search", "mcp"]) | json_values},
    optional={"name": st.text(max_size=12) | json_values, "parameters": schemas},
)
responses_tools = flat_tools | st.fixed_dictionaries(
    {"type": st.just("namespace"), "name": st.text(max_size=8) | json_values},
    optional={"tools": st.lists(flat_tools, max_size=2) | json_values},
)
input_items = st.fixed_dictionaries(
    {
        "type": st.sampled_from(
            ["message", "function_call", "function_call_output", "reasoning", "web_search_call"]
        )
        | json_values
    },
    optional={
        "role": st.sampled_from(["user", "system", "developer", "assistant"]) | json_values,
        "content": json_values,
        "call_id": st.text(max_size=8) | json_values,
        "name": json_values,
        "arguments": json_values,
        "output": st.sampled_from(["Error: failed", "ok"]) | json_values,
    },
)
responses_bodies = st.fixed_dictionaries(
    {"input": st.lists(input_items, max_size=4) | st.text(max_size=20) | json_values},
    optional={
        "model": st.just("scripted-model") | json_values,
        "instructions": st.text(max_size=20) | json_values,
        "tools": st.lists(responses_tools, max_size=3) | json_values,
        "tool_choice": st.sampled_from(["auto", "none", "required"])
        | st.fixed_dictionaries({"type": st.just("function"), "name": json_values})
        | json_values,
        "previous_response_id": st.text(max_size=10) | json_values,
        "metadata": json_values,
        "user": json_values,
    },
)


# -- the Messages API ------------------------------------------------------------------------------


def assert_not_a_messages_failure(response: httpx.Response) -> None:
    """Below 500, and a refusal in Anthropic's shape."""
    assert response.status_code < 500, response.text
    assert "Traceback" not in response.text
    if response.status_code >= 400:
        body = response.json()
        assert body["type"] == "error", response.text
        assert set(body["error"]) == {"type", "message"}
        assert body["error"]["message"]


def echo_first_messages_tool(body: dict[str, Any]) -> Any:
    """A Messages upstream that calls the first declared tool."""
    tools = body.get("tools")
    first = tools[0] if isinstance(tools, list) and tools and isinstance(tools[0], dict) else {}
    name = first.get("name")
    return answer(None, call(name, {})) if isinstance(name, str) else answer("plain text")


content_blocks = st.fixed_dictionaries(
    {
        "type": st.sampled_from(
            ["text", "tool_use", "tool_result", "thinking", "redacted_thinking", "image"]
        )
        | json_values
    },
    optional={
        "text": json_values,
        "id": st.text(max_size=8) | json_values,
        "name": json_values,
        "input": json_values,
        "tool_use_id": st.text(max_size=8) | json_values,
        "content": json_values,
        "is_error": st.booleans() | json_values,
        "thinking": json_values,
        "signature": json_values,
    },
)
turns = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant"]) | json_values,
        "content": st.lists(content_blocks, max_size=3) | st.text(max_size=20) | json_values,
    }
)
messages_bodies = st.fixed_dictionaries(
    {"messages": st.lists(turns, max_size=4) | json_values},
    optional={
        "model": st.just("scripted-model") | json_values,
        "max_tokens": st.integers(1, 64) | json_values,
        "system": st.text(max_size=20) | st.lists(content_blocks, max_size=2) | json_values,
        "tools": st.lists(
            st.fixed_dictionaries(
                {"name": st.text(max_size=12) | json_values},
                optional={"input_schema": schemas, "type": json_values},
            ),
            max_size=3,
        )
        | json_values,
        "tool_choice": st.fixed_dictionaries(
            {"type": st.sampled_from(["auto", "any", "tool", "none"]) | json_values},
            optional={"name": json_values, "disable_parallel_tool_use": json_values},
        )
        | json_values,
        "metadata": st.fixed_dictionaries({"user_id": st.text(max_size=30) | json_values})
        | json_values,
        "thinking": json_values,
    },
)


# -- every protocol: generated bodies and raw bytes ----------------------------------------------


@dataclass(frozen=True)
class Wire:
    """A protocol's route, the bodies generated for it, the upstream that answers them, and the
    check that an answer is no failure of the proxy's, in the protocol's own error shape."""

    route: str
    bodies: st.SearchStrategy[dict[str, Any]]
    upstream: Callable[[dict[str, Any]], Any]
    assert_not_a_failure: Callable[[httpx.Response], None]
    client_route: str = ""  # where generated bodies go, when the protocol's clients add a query

    @property
    def bodies_route(self) -> str:
        return self.client_route or self.route


WIRES = [
    pytest.param(
        Wire("/v1/chat/completions", chat_bodies, echo_first_tool, assert_not_a_proxy_failure),
        id="chat",
    ),
    pytest.param(
        Wire(
            "/v1/responses",
            responses_bodies,
            echo_first_responses_tool,
            assert_not_a_proxy_failure,
        ),
        id="responses",
    ),
    pytest.param(
        Wire(
            "/v1/messages",
            messages_bodies,
            echo_first_messages_tool,
            assert_not_a_messages_failure,
            client_route="/v1/messages?beta=true",  # as Claude Code sends it
        ),
        id="messages",
    ),
]


@pytest.mark.parametrize("wire", WIRES)
def test_generated_bodies_never_get_a_5xx_from_the_proxy(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream, wire: Wire
) -> None:
    upstream.script.handler = wire.upstream
    proxy = make_proxy(max_reasks=1)
    with proxy.http() as http:

        @EXAMPLES
        @given(body=wire.bodies, headers=hostile_headers)
        def check(body: dict[str, Any], headers: dict[str, str]) -> None:
            response = http.post(wire.bodies_route, json=body, headers=headers)
            wire.assert_not_a_failure(response)

        check()


@pytest.mark.parametrize("wire", WIRES)
def test_generated_raw_bytes_never_get_a_5xx_from_the_proxy(
    proxy: RunningProxy, upstream: RunningUpstream, wire: Wire
) -> None:
    upstream.script.handler = wire.upstream
    with proxy.http() as http:

        @EXAMPLES
        # stdlib json: it writes integers of any size, which orjson refuses to.
        @given(raw=st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()))
        def check(raw: bytes) -> None:
            response = http.post(
                wire.route, content=raw, headers={"content-type": "application/json"}
            )
            wire.assert_not_a_failure(response)

        check()
