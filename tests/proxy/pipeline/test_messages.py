"""The Messages route end to end: the real anthropic SDK → proxy (uvicorn) → scripted upstream."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.testing import SSE, Fault, answer, call, thinking
from tests.proxy.conftest import RunningProxy, RunningUpstream

TOOLS: list[Any] = [
    {
        "name": "Bash",
        "description": "Run a shell command.",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
            "required": ["command"],
            "additionalProperties": False,
        },
    },
    {
        "name": "Read",
        "description": "Read a file.",
        "input_schema": {
            "type": "object",
            "properties": {"file_path": {"type": "string"}},
            "required": ["file_path"],
        },
    },
    {"type": "web_search_20250305", "name": "web_search", "max_uses": 2},
]
ASKED: list[Any] = [{"role": "user", "content": "List the files here."}]


def ls(call_id: str = "toolu_ok") -> Any:
    return call("Bash", {"command": "ls"}, id=call_id)


def claude(proxy: RunningProxy) -> anthropic.Anthropic:
    client = anthropic.Anthropic(base_url=proxy.server.url, api_key="test-key", max_retries=0)
    proxy.clients.append(client)
    return client


def args(session: str, **kwargs: Any) -> dict[str, Any]:
    return {
        "model": "scripted-model",
        "max_tokens": 512,
        "messages": ASKED,
        "tools": TOOLS,
        "extra_headers": {"x-claude-code-session-id": session},
        **kwargs,
    }


def ask(proxy: RunningProxy, session: str, **kwargs: Any) -> Any:
    """A plain request; returns the raw response (`.parse()` for the message)."""
    return claude(proxy).messages.with_raw_response.create(**args(session, **kwargs))


def streamed(proxy: RunningProxy, session: str, **kwargs: Any) -> tuple[list[Any], Any]:
    """A streamed request; returns the SDK's events and the message they accumulate to."""
    with claude(proxy).messages.stream(**args(session, **kwargs)) as stream:
        events = list(stream)
        return events, stream.get_final_message()


def test_a_hallucinated_tool_is_reasked_in_messages_form_and_the_client_gets_the_valid_call(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(
        answer("Let me look.", call("ListFiles", {"path": "."}, id="toolu_bad")),
        answer(None, ls()),
    )
    raw = ask(proxy, "s-halluc")
    message = raw.parse()
    (block,) = message.content
    assert (block.type, block.name, block.input) == ("tool_use", "Bash", {"command": "ls"})
    assert message.stop_reason == "tool_use"
    assert raw.headers["x-toolsentry-repairs"] == "1"
    assert raw.headers["x-toolsentry-violations"] == "unknown_tool"
    first, reask = upstream.script.requests
    assert reask["messages"][:-2] == first["messages"]
    assistant, user = reask["messages"][-2:]
    assert assistant == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_bad", "name": "ListFiles", "input": {"path": "."}},
        ],
    }
    (result,) = user["content"]
    assert (result["type"], result["tool_use_id"], result["is_error"]) == (
        "tool_result",
        "toolu_bad",
        True,
    )
    assert "ListFiles" in result["content"]
    assert "Bash" in result["content"]
    assert "stream" not in reask
    assert reask["tools"] == first["tools"]  # as sent, the server tool included
    assert (message.usage.input_tokens, message.usage.output_tokens) == (20, 10)  # both attempts
    session = proxy.session("s-halluc")
    assert (session["channels"], session["repairs"], session["errors"]) == (
        {"unknown_tool": 1},
        1,
        0,
    )


def test_a_valid_answer_is_passed_back_as_the_upstream_wrote_it(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(
        answer("Running ls.", ls(), thoughts=[thinking("plan: ls", "sig+/==")], vendor_field=7)
    )
    raw = ask(proxy, "s-valid", thinking={"type": "enabled", "budget_tokens": 1024})
    upstream_body = json.loads(raw.http_response.content)
    assert upstream_body["vendor_field"] == 7
    first, text, tool_use = raw.parse().content
    assert (first.type, first.thinking, first.signature) == ("thinking", "plan: ls", "sig+/==")
    assert (text.text, tool_use.name) == ("Running ls.", "Bash")
    assert raw.headers["x-toolsentry-violations"] == ""
    assert upstream.script.requests[0]["thinking"] == {"type": "enabled", "budget_tokens": 1024}


@pytest.mark.parametrize(
    ("bad", "channel"),
    [
        (answer(None, call("Bash", {"cmd": "ls"}, id="t1")), "schema_violation"),
        (answer(None, call("Bash", "{'command': 'ls'}", id="t1")), "malformed_arguments"),
        (answer(None, call("Bash", '{"command": "l', id="t1"), finish="length"), "truncated"),
        (
            answer('<tool_call>{"name": "Bash", "arguments": {"command": "ls"}}</tool_call>'),
            "leaked_tool_call",
        ),
        (answer(), "empty_response"),
    ],
    ids=["schema", "malformed", "truncated", "leaked", "empty"],
)
def test_every_channel_is_caught_and_repaired_plain_and_streamed(
    proxy: RunningProxy, upstream: RunningUpstream, bad: Any, channel: str
) -> None:
    for stream in (False, True):
        upstream.script.rescript(bad, answer(None, ls()))
        session = f"s-{channel}-{stream}"
        if stream:
            _, message = streamed(proxy, session)
        else:
            message = ask(proxy, session).parse()
        assert [(b.type, b.input) for b in message.content if b.type == "tool_use"] == [
            ("tool_use", {"command": "ls"})
        ]
        assert message.stop_reason == "tool_use"
        record = proxy.session(session)
        assert record["channels"] == {channel: 1}
        assert record["repairs"] == 1


@pytest.mark.parametrize(
    ("choice", "bad", "channel"),
    [
        ({"type": "any"}, answer("No tool needed."), "tool_choice_violation"),
        ({"type": "tool", "name": "Read"}, answer(None, ls("t1")), "tool_choice_violation"),
        ({"type": "none"}, answer(None, ls("t1")), "tool_choice_violation"),
    ],
    ids=["any", "tool", "none"],
)
def test_tool_choice_is_checked_in_anthropics_forms(
    proxy: RunningProxy, upstream: RunningUpstream, choice: Any, bad: Any, channel: str
) -> None:
    upstream.script.rescript(bad)
    raw = ask(proxy, f"s-choice-{choice['type']}", tool_choice=choice)
    assert channel in raw.headers["x-toolsentry-violations"]


def test_a_stream_passes_text_at_once_and_sends_the_settled_call_with_consecutive_indexes(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(
        SSE.of(
            answer(
                "Looking.", call("ListFiles", {}, id="toolu_bad"), thoughts=[thinking("t", "s1")]
            ),
            ping=True,
        ),
        answer("Found it.", ls()),
    )
    with httpx.Client(base_url=proxy.server.url, timeout=10) as http:
        body = http.post(
            "/v1/messages",
            json={
                **{k: v for k, v in args("s-stream").items() if k != "extra_headers"},
                "stream": True,
            },
            headers={"x-claude-code-session-id": "s-stream", "anthropic-version": "2023-06-01"},
        ).text
    events = [
        (block.split("\n")[0], json.loads(block.split("\n", 1)[1][6:]))
        for block in body.strip().split("\n\n")
        if block.startswith("event:")
    ]
    names = [name.removeprefix("event: ") for name, _ in events]
    assert names[:2] == ["message_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    starts = [data for _, data in events if data["type"] == "content_block_start"]
    assert [s["index"] for s in starts] == list(range(len(starts)))
    # the text already sent stands; the re-ask's answer replaces only the call
    assert [s["content_block"]["type"] for s in starts] == ["thinking", "text", "tool_use"]
    assert starts[-1]["content_block"]["name"] == "Bash"
    assert body.index(": x-toolsentry ") < body.index("event: message_stop")
    upstream.script.rescript(
        SSE.of(answer("Looking.", call("ListFiles", {}, id="toolu_bad"))), answer("Found it.", ls())
    )
    _, final = streamed(proxy, "s-stream-sdk")
    assert [b.type for b in final.content] == ["text", "tool_use"]
    assert (final.content[0].text, final.content[1].input) == ("Looking.", {"command": "ls"})


def test_thinking_blocks_in_the_conversation_reach_the_upstream_byte_for_byte(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    history = [
        {"role": "user", "content": "List the files."},
        {
            "role": "assistant",
            "content": [
                {
                    "type": "thinking",
                    "thinking": "I should run ls.",
                    "signature": "EqQBCkgIARABGAIiQ+/=",
                },
                {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"},
                {"type": "tool_use", "id": "toolu_1", "name": "ListFiles", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": "unknown",
                    "is_error": True,
                }
            ],
        },
    ]
    upstream.script.push(
        answer("Retrying.", call("ListFiles", {}, id="toolu_2")), answer(None, ls())
    )
    ask(proxy, "s-think", messages=history)
    sent = json.dumps(history, separators=(",", ":"))
    assert sent.encode() in upstream.script.raw_requests[0]
    assert upstream.script.requests[1]["messages"][: len(history)] == history


def test_a_tool_result_with_is_error_is_a_tool_error_counted_once(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    history = [
        {"role": "user", "content": "List the files."},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "ls: denied"}],
                    "is_error": True,
                }
            ],
        },
    ]
    upstream.script.push(answer("Sorry."))
    ask(proxy, "s-toolerr", messages=history)
    ask(proxy, "s-toolerr", messages=history)
    record = proxy.session("s-toolerr")
    assert record["channels"] == {"tool_error": 1}
    assert record["errors"] == 1


def test_the_session_is_claude_codes_header_or_the_session_inside_metadata_user_id(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(answer("Hi"))
    user_id = json.dumps({"device_id": "d", "account_uuid": "", "session_id": "cc-uuid-1"})
    client = claude(proxy)
    raw = client.messages.with_raw_response.create(
        model="scripted-model", max_tokens=8, messages=ASKED, metadata={"user_id": user_id}
    )
    assert raw.headers["x-toolsentry-session"] == "cc-uuid-1"
    raw = ask(proxy, "cc-header-2", metadata={"user_id": user_id})
    assert raw.headers["x-toolsentry-session"] == "cc-header-2"


def test_errors_are_anthropic_shaped_and_the_budget_429_is_not_retried(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    proxy = make_proxy(max_errors=1, repair="off")
    upstream.script.push(answer(None, call("Nope", {}, id="t1")))
    ask(proxy, "s-budget")
    with pytest.raises(anthropic.RateLimitError) as caught:
        ask(proxy, "s-budget")
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert caught.value.body["type"] == "error"  # type: ignore[index]
    assert caught.value.body["error"]["type"] == "error_budget_exhausted"  # type: ignore[index]
    retrying = anthropic.Anthropic(base_url=proxy.server.url, api_key="k", max_retries=3)
    proxy.clients.append(retrying)
    requests = len(upstream.script.requests)
    with pytest.raises(anthropic.RateLimitError):
        retrying.messages.create(**args("s-budget"))
    assert len(upstream.script.requests) == requests  # refused at the gate, and not retried
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude(proxy).messages.create(model="m", max_tokens=8, messages=[])
    assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    upstream.script.push(Fault.error(529, "overloaded"))
    with pytest.raises(anthropic.APIStatusError) as overloaded:
        ask(proxy, "s-529")
    assert overloaded.value.status_code == 529
    assert overloaded.value.body == {  # the upstream's own Anthropic error, as it sent it
        "type": "error",
        "error": {"type": "overloaded_error", "message": "overloaded"},
    }


def test_an_upstream_failure_inside_the_stream_is_an_anthropic_error_event(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(
        SSE.of(answer("Hello there, friend"), fail_after=3, fail_message="engine died")
    )
    with pytest.raises(anthropic.APIStatusError, match="engine died"):
        streamed(proxy, "s-fail")


def test_the_query_string_and_anthropic_headers_reach_the_upstream_but_not_the_clients_key(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(answer("Hi"), answer(None, call("Nope", {}, id="t1")), answer("Hi"))
    client = claude(proxy)
    client.beta.messages.create(  # Claude Code's TypeScript SDK adds ?beta=true itself
        model="scripted-model",
        max_tokens=8,
        messages=ASKED,
        betas=["claude-code-20250219"],
        extra_query={"beta": "true"},
        extra_headers={"x-api-key": "client-secret"},
    )
    assert upstream.script.queries == ["beta=true"]
    sent = upstream.script.request_headers[-1]
    assert sent["anthropic-beta"] == "claude-code-20250219"
    assert "anthropic-version" in sent
    assert "x-api-key" not in sent  # the client's key stays at the proxy
    ask(proxy, "s-query-reask", extra_query={"beta": "true"})  # the re-ask keeps it too
    assert upstream.script.queries[1:] == ["beta=true", "beta=true"]


def test_a_client_key_may_come_as_x_api_key(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    proxy = make_proxy(api_keys=["k-1"])
    upstream.script.push(answer("Hi"))
    keyed = anthropic.Anthropic(
        base_url=proxy.server.url,
        api_key="placeholder",
        max_retries=0,
        default_headers={"authorization": "", "x-api-key": "k-1"},
    )
    proxy.clients.append(keyed)
    assert keyed.messages.create(model="m", max_tokens=8, messages=ASKED).content[0].text == "Hi"
    wrong = anthropic.Anthropic(
        base_url=proxy.server.url,
        api_key="placeholder",
        max_retries=0,
        default_headers={"authorization": "", "x-api-key": "nope"},
    )
    proxy.clients.append(wrong)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        wrong.messages.create(model="m", max_tokens=8, messages=ASKED)
    assert caught.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


def test_count_tokens_is_forwarded_raw(proxy: RunningProxy, upstream: RunningUpstream) -> None:
    got = claude(proxy).messages.count_tokens(model="scripted-model", messages=ASKED)
    assert got.input_tokens > 0
    assert upstream.script.paths[-1] == "/v1/messages/count_tokens"
    assert upstream.script.requests == []  # no turn: nothing checked, nothing counted


def test_requests_without_tools_pass_untouched(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(answer("A title"))
    raw = claude(proxy).messages.with_raw_response.create(
        model="scripted-model",
        max_tokens=8,
        messages=ASKED,
        system=[{"type": "text", "text": "Write a title."}],
    )
    assert raw.parse().content[0].text == "A title"
    assert raw.headers["x-toolsentry-violations"] == ""


valid_calls = st.builds(
    lambda command, n: call("Bash", {"command": command, "timeout": n}),
    st.text(min_size=1, max_size=12),
    st.integers(0, 99),
)
replies = st.builds(
    lambda text, calls, thought: answer(
        text or None,
        *calls,
        thoughts=[thinking(thought, "sig")] if thought else [],
    ),
    st.text(max_size=20),
    st.lists(valid_calls, max_size=2),
    st.text(max_size=10),
)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    reply=replies, fragment=st.sampled_from([1, 3, 16]), cut=st.sampled_from([None, [1], [7, 3]])
)
def test_a_stream_through_the_proxy_accumulates_to_the_plain_message(
    proxy: RunningProxy, upstream: RunningUpstream, reply: Any, fragment: int, cut: Any
) -> None:
    upstream.script.rescript(SSE.of(reply, fragment=fragment, chunk_sizes=cut, ping=True))
    # A session of its own per example: an empty answer counts against the budget, and twenty
    # examples in one session would spend it.
    session = f"s-prop-{uuid.uuid4().hex}"
    plain = ask(proxy, session).parse().model_dump()
    _, final = streamed(proxy, session)
    streamed_body = final.model_dump()
    plain["content"] = [b for b in plain["content"] if b.get("text") != ""]
    assert [_block(b) for b in streamed_body["content"]] == [_block(b) for b in plain["content"]]
    assert streamed_body["stop_reason"] == plain["stop_reason"]
    assert streamed_body["usage"] == plain["usage"]


def _block(block: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in block.items() if k not in ("parsed_output", "citations", "caller")}
