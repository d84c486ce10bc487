"""The scripted upstream answers as a real server would, so the proxy's tests compare like with like."""

from __future__ import annotations

import httpx
import orjson

from proxy.testing import SSE, Fault, LoopbackServer, ScriptedUpstream, answer, call, completion


def test_a_repeated_stream_reply_answers_a_plain_request_with_the_completion_it_streams() -> None:
    answer = completion("Hello.")
    script = ScriptedUpstream([SSE.of(answer)])
    with LoopbackServer(script.app) as server, httpx.Client(base_url=server.url) as http:
        streamed = http.post("/v1/chat/completions", json={"messages": [], "stream": True})
        plain = http.post("/v1/chat/completions", json={"messages": []})
    assert streamed.headers["content-type"].startswith("text/event-stream")
    assert b'"content":"Hel' in streamed.content
    assert plain.headers["content-type"] == "application/json"
    assert orjson.loads(plain.content) == answer


def test_a_stream_reply_without_a_completion_is_streamed_to_any_request() -> None:
    script = ScriptedUpstream([SSE([{"n": 1}])])
    with LoopbackServer(script.app) as server, httpx.Client(base_url=server.url) as http:
        plain = http.post("/v1/chat/completions", json={"messages": []})
    assert plain.content == b'data: {"n":1}\n\ndata: [DONE]\n\n'


def test_one_answer_is_rendered_for_the_route_it_arrives_on() -> None:
    script = ScriptedUpstream([answer("Hi", call("get_order", {"id": 1}, id="call_1"))])
    with LoopbackServer(script.app) as server, httpx.Client(base_url=server.url) as http:
        chat = http.post("/v1/chat/completions?x=1", json={"messages": []}).json()
        responses = http.post("/v1/responses", json={"input": "x"}).json()
        messages = http.post("/v1/messages?beta=true", json={"messages": []}).json()
        chat_stream = http.post("/v1/chat/completions", json={"messages": [], "stream": True})
    assert chat["choices"][0]["message"]["tool_calls"][0]["id"] == "call_1"
    assert [i["type"] for i in responses["output"]] == ["message", "function_call"]
    assert [b["type"] for b in messages["content"]] == ["text", "tool_use"]
    assert chat_stream.text.endswith("data: [DONE]\n\n")
    assert script.apis == ["chat", "responses", "messages", "chat"]
    assert script.queries == ["x=1", "", "beta=true", ""]


def test_a_raw_body_is_sent_as_it_is_and_an_error_takes_the_routes_shape() -> None:
    script = ScriptedUpstream([{"not": "a response"}])
    with LoopbackServer(script.app) as server, httpx.Client(base_url=server.url) as http:
        raw = http.post("/v1/responses", json={"input": "x", "stream": True})
        script.rescript(Fault.error(404, "no such model"))
        chat = http.post("/v1/chat/completions", json={"messages": []})
        messages = http.post("/v1/messages", json={"messages": []})
    assert raw.json() == {"not": "a response"}
    assert chat.status_code == messages.status_code == 404
    assert chat.json()["error"] == {
        "message": "no such model",
        "type": "NotFoundError",
        "param": None,
        "code": 404,
    }
    assert messages.json() == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "no such model"},
    }
