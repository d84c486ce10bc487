"""The scripted upstream answers as a real server would, so the proxy's tests compare like with like."""

from __future__ import annotations

import httpx
import orjson

from proxy.testing import SSE, LoopbackServer, ScriptedUpstream, completion


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
