"""Routes: models, health, raw pass-through, the session API, keys and error shapes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import Response

from proxy import __version__
from proxy.app import create_app
from proxy.config import Settings
from proxy.session.stores import MemoryStore, SessionRecord
from proxy.testing import LoopbackServer, ScriptedUpstream, completion, tool_call
from tests.proxy.builders import make_request
from tests.proxy.conftest import RunningProxy, RunningUpstream
from tests.proxy.metrics_text import metric


def assert_openai_error(response: httpx.Response, status: int, error_type: str) -> None:
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == error_type
    assert error["message"]
    assert "Traceback" not in response.text


def test_models_merges_every_upstreams_list(upstream: RunningUpstream) -> None:
    other = ScriptedUpstream(models=("other-model",))
    with LoopbackServer(other.app) as second:
        settings = Settings(
            upstreams=[
                {"name": "a", "base_url": upstream.base_url, "models": ["scripted-model"]},
                {"name": "b", "base_url": f"{second.url}/v1", "models": ["other-model"]},
            ]
        )
        with (
            LoopbackServer(create_app(settings)) as proxy,
            openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0) as client,
        ):
            assert sorted(m.id for m in client.models.list()) == ["other-model", "scripted-model"]
            other.push(completion("from b"))
            reply = client.chat.completions.create(
                **make_request(tools=[]) | {"model": "other-model"}
            )
            assert reply.choices[0].message.content == "from b"
            with pytest.raises(
                openai.NotFoundError, match="served models: other-model, scripted-model"
            ):
                client.chat.completions.create(**make_request() | {"model": "nobody"})


def test_health_and_readiness(proxy: RunningProxy) -> None:
    with proxy.http() as http:
        assert http.get("/healthz").json() == {"status": "ok"}
        assert http.get("/readyz").json()["status"] == "ready"


def test_readiness_fails_when_no_upstream_answers(
    make_proxy: Callable[..., RunningProxy], refused_port: int
) -> None:
    proxy = make_proxy(
        upstreams=[{"name": "gone", "base_url": f"http://127.0.0.1:{refused_port}/v1"}], retries=0
    )
    with proxy.http() as http:
        assert_openai_error(http.get("/readyz"), 503, "upstream_unavailable")


def test_an_unreachable_upstream_gives_a_502_naming_it(
    make_proxy: Callable[..., RunningProxy], refused_port: int
) -> None:
    proxy = make_proxy(
        upstreams=[{"name": "vllm-a", "base_url": f"http://127.0.0.1:{refused_port}/v1"}],
        retries=1,
    )
    with proxy.http() as http:
        response = http.post("/v1/chat/completions", json=make_request())
    assert_openai_error(response, 502, "upstream_connect_error")
    assert "vllm-a" in response.json()["error"]["message"]


def test_other_endpoints_are_proxied_raw(proxy: RunningProxy) -> None:
    with proxy.http() as http:
        embeddings = http.post(
            "/v1/embeddings", json={"model": "scripted-model", "input": "x"}
        ).json()
        tokenize = http.post("/tokenize", json={"prompt": "x"}).json()
    assert embeddings["path"] == "/v1/embeddings"
    assert tokenize["path"] == "/tokenize"


def test_a_raw_endpoint_keeps_the_clients_content_type_and_never_its_key(
    proxy: RunningProxy,
) -> None:
    form = b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper\r\n--b--\r\n'
    headers = {"content-type": "multipart/form-data; boundary=b", "authorization": "Bearer mine"}
    with proxy.http() as http:
        echoed = http.post("/v1/audio/transcriptions", content=form, headers=headers).json()
        posted = http.post("/tokenize", content=b'{"prompt": "x"}').json()
    assert echoed["headers"]["content-type"] == "multipart/form-data; boundary=b"
    assert "authorization" not in echoed["headers"]
    assert posted["headers"]["content-type"] == "application/json"  # the default for a body


def test_invalid_json_is_a_400_in_the_openai_shape(proxy: RunningProxy) -> None:
    with proxy.http() as http:
        response = http.post(
            "/v1/chat/completions",
            content=b"{not json",
            headers={"content-type": "application/json"},
        )
    assert_openai_error(response, 400, "invalid_request_error")


@pytest.mark.parametrize(
    "body",
    [
        [1, 2],
        {"model": "m"},
        {"model": "m", "messages": []},
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": "no"},
    ],
)
def test_malformed_requests_are_400s(proxy: RunningProxy, body: object) -> None:
    with proxy.http() as http:
        response = http.post("/v1/chat/completions", json=body)
    assert_openai_error(response, 400, "invalid_request_error")


def test_a_body_over_the_limit_is_a_413(make_proxy: Callable[..., RunningProxy]) -> None:
    proxy = make_proxy(max_body_bytes=2048)
    with proxy.http() as http:
        response = http.post("/v1/chat/completions", json=make_request("x" * 5000))
    assert_openai_error(response, 413, "invalid_request_error")


def test_client_keys_are_required_when_configured(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    proxy = make_proxy(api_keys=["k1", "k2"], admin_key="root")
    upstream.script.push(completion("hi"))
    with pytest.raises(openai.AuthenticationError):
        proxy.client(api_key="wrong").chat.completions.create(**make_request())
    assert (
        proxy.client(api_key="k2")
        .chat.completions.create(**make_request())
        .choices[0]
        .message.content
        == "hi"
    )
    with proxy.http() as http:
        assert_openai_error(
            http.get("/v1/sessions", headers={"authorization": "Bearer wrong"}),
            401,
            "authentication_error",
        )
        # A client key lists its own sessions only (issue 32): k2's is not k1's.
        own = http.get("/v1/sessions", headers={"authorization": "Bearer k1"})
        assert own.status_code == 200
        assert own.json()["data"] == []
        assert http.get("/v1/sessions", headers={"authorization": "Bearer root"}).status_code == 200


def test_session_api_lists_shows_and_deletes(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(completion(tool_calls=[tool_call("nope", {})]))
    client = proxy.client()
    for session, times in (("quiet", 1), ("noisy", 2)):
        for _ in range(times):
            client.chat.completions.create(
                **make_request(),
                extra_headers={"x-session-id": session, "x-toolsentry-repair": "off"},
            )
    with proxy.http() as http:
        failing = http.get("/v1/sessions", params={"order": "failing"}).json()["data"]
        assert [s["session"] for s in failing] == ["noisy", "quiet"]
        shown = http.get("/v1/sessions/noisy").json()
        assert set(shown) == {
            "session",
            "errors",
            "max_errors",
            "exhausted",
            "repairs",
            "channels",
            "requests",
            "created_at",
            "updated_at",
        }
        assert shown["errors"] == 2
        assert http.delete("/v1/sessions/noisy").status_code == 200
        assert_openai_error(http.get("/v1/sessions/noisy"), 404, "not_found_error")
        assert_openai_error(
            http.get("/v1/sessions", params={"order": "sideways"}), 400, "invalid_request_error"
        )


def test_a_session_id_with_slashes_is_shown_and_deleted_as_it_is_or_percent_encoded(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(completion(tool_calls=[tool_call("nope", {})]))
    client = proxy.client()
    for session in ("telecom/[mobile_data]/1", "telecom/[mobile_data]/2"):
        client.chat.completions.create(
            **make_request(), extra_headers={"x-session-id": session, "x-toolsentry-repair": "off"}
        )
    with proxy.http() as http:
        shown = http.get("/v1/sessions/telecom/[mobile_data]/1").json()
        encoded = http.get("/v1/sessions/telecom%2F%5Bmobile_data%5D%2F2").json()
        assert (shown["session"], shown["errors"]) == ("telecom/[mobile_data]/1", 1)
        assert (encoded["session"], encoded["errors"]) == ("telecom/[mobile_data]/2", 1)
        deleted = http.delete("/v1/sessions/telecom%2F%5Bmobile_data%5D%2F1")
        assert deleted.json() == {"id": "telecom/[mobile_data]/1", "deleted": True}
        assert http.delete("/v1/sessions/telecom/[mobile_data]/2").status_code == 200
        assert_openai_error(
            http.get("/v1/sessions/telecom/[mobile_data]/1"), 404, "not_found_error"
        )
        assert_openai_error(
            http.get("/v1/sessions/telecom%2F%5Bmobile_data%5D%2F2"), 404, "not_found_error"
        )


def test_session_id_falls_back_to_the_body_and_then_the_conversations_history(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(completion("hi"))
    client = proxy.client()
    by_metadata = client.chat.completions.with_raw_response.create(
        **make_request(), extra_body={"metadata": {"session_id": "from-metadata"}}
    )
    assert by_metadata.headers["x-toolsentry-session"] == "from-metadata"
    by_user = client.chat.completions.with_raw_response.create(**make_request(), user="from-user")
    assert by_user.headers["x-toolsentry-session"] == "from-user"
    first = client.chat.completions.with_raw_response.create(**make_request("first conversation"))
    again = client.chat.completions.with_raw_response.create(**make_request("first conversation"))
    other = client.chat.completions.with_raw_response.create(**make_request("another conversation"))
    assert first.headers["x-toolsentry-session"].startswith("conv-")
    assert first.headers["x-toolsentry-session"] == again.headers["x-toolsentry-session"]
    assert first.headers["x-toolsentry-session"] != other.headers["x-toolsentry-session"]


def test_session_tracking_fingerprint_gives_one_session_per_opening(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    upstream.script.push(completion("hi"))
    client = make_proxy(session_tracking="fingerprint").client()
    first = client.chat.completions.with_raw_response.create(**make_request("one opening"))
    # A new run of the same task, once the first has moved on: the same fingerprint.
    longer = make_request("one opening")
    longer["messages"] += [
        {"role": "assistant", "content": "hi"},
        {"role": "user", "content": "go"},
    ]
    client.chat.completions.with_raw_response.create(**longer)
    again = client.chat.completions.with_raw_response.create(**make_request("one opening"))
    assert first.headers["x-toolsentry-session"].startswith("fp-")
    assert again.headers["x-toolsentry-session"] == first.headers["x-toolsentry-session"]


def test_a_store_that_fails_while_a_conversation_is_looked_up_is_a_503_counted_at_begin(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream, refused_port: int
) -> None:
    proxy = make_proxy(store=f"redis://127.0.0.1:{refused_port}/0")
    with proxy.http() as http:
        response = http.post("/v1/chat/completions", json=make_request("no session header"))
        assert_openai_error(response, 503, "session_store_unavailable")
        page = http.get("/metrics").text
    assert metric(page, "toolsentry_session_store_errors_total", phase="begin", api="chat") == 1
    assert upstream.script.requests == []


def test_openapi_schema_describes_the_chat_route(proxy: RunningProxy) -> None:
    with proxy.http() as http:
        schema = http.get("/openapi.json").json()
    assert "/v1/chat/completions" in schema["paths"]


class BrokenStore(MemoryStore):
    """A store whose writes fail with an error the proxy does not know."""

    async def record(self, session: str, **counts: Any) -> SessionRecord:
        raise RuntimeError("disk on fire")


def test_an_unexpected_error_in_the_chat_route_is_a_500_without_a_traceback(
    upstream: RunningUpstream,
) -> None:
    settings = Settings(upstreams=[{"name": "scripted", "base_url": upstream.base_url}])
    with (
        LoopbackServer(create_app(settings, store=BrokenStore())) as proxy,
        httpx.Client(base_url=proxy.url, timeout=10) as http,
    ):
        response = http.post("/v1/chat/completions", json=make_request())
    assert_openai_error(response, 500, "internal_error")
    assert "disk on fire" not in response.text


def test_the_chat_route_passes_through_middleware_added_to_the_app(
    upstream: RunningUpstream,
) -> None:
    settings = Settings(upstreams=[{"name": "scripted", "base_url": upstream.base_url}])
    app = create_app(settings)

    class Stamp(BaseHTTPMiddleware):
        async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
            response = await call_next(request)
            response.headers["x-stamped"] = "yes"
            return response

    app.add_middleware(Stamp)
    upstream.script.push(completion("hi"))
    with (
        LoopbackServer(app) as proxy,
        httpx.Client(base_url=proxy.url, timeout=10) as http,
    ):
        response = http.post("/v1/chat/completions", json=make_request())
    assert response.status_code == 200
    assert response.headers["x-stamped"] == "yes"
    assert response.headers["x-toolsentry-session"]
    assert response.json()["choices"][0]["message"]["content"] == "hi"


def test_of_a_repeated_header_the_chat_route_reads_the_first(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(completion("hi"))
    headers = [("x-session-id", "first-one"), ("x-session-id", "second-one")]
    with proxy.http() as http:
        response = http.post("/v1/chat/completions", json=make_request(), headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["x-toolsentry-session"] == "first-one"


def test_the_upstream_sees_the_clients_user_agent_or_the_proxys_when_it_sent_none(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(completion("one"), completion("two"))
    with proxy.http() as http:
        http.post("/v1/chat/completions", json=make_request(), headers={"user-agent": "agent/7"})
        del http.headers["user-agent"]
        http.post("/v1/chat/completions", json=make_request())
    agents = [headers.get("user-agent") for headers in upstream.script.request_headers]
    assert agents == ["agent/7", f"toolsentry/{__version__}"]


@pytest.mark.parametrize("name", ["X-Session-Id", "x-session-id", "X-SESSION-ID"])
def test_the_session_header_is_found_whatever_its_case_on_the_wire(
    proxy: RunningProxy, upstream: RunningUpstream, name: str
) -> None:
    upstream.script.push(completion("hi"))
    with proxy.http() as http:
        response = http.post("/v1/chat/completions", json=make_request(), headers={name: "abc"})
    assert response.headers["x-toolsentry-session"] == "abc"


def test_a_unix_socket_upstream_answers_the_sdk_plainly_and_streamed(
    unix_upstream: RunningUpstream, make_proxy: Callable[..., RunningProxy]
) -> None:
    proxy = make_proxy(upstreams=[{"name": "sock", "base_url": unix_upstream.base_url}])
    client = proxy.client()
    plain = client.chat.completions.create(**make_request())
    streamed = client.chat.completions.create(**make_request(), stream=True)
    assert plain.choices[0].message.content == "hello"
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == "hello"
    assert [m.id for m in client.models.list()] == ["scripted-model"]
    assert unix_upstream.script.paths == ["/v1/chat/completions"] * 2 + ["/v1/models"]


def test_a_base_urls_query_and_credentials_reach_the_upstream_with_every_request(
    upstream: RunningUpstream, make_proxy: Callable[..., RunningProxy]
) -> None:
    url = upstream.base_url.replace("http://", "http://ann:s3cret@") + "?api-version=2024-10-21"
    proxy = make_proxy(upstreams=[{"name": "azure", "base_url": url}])
    client = proxy.client()
    client.chat.completions.create(**make_request())
    client.chat.completions.create(**make_request(), stream=True).close()
    assert upstream.script.queries == ["api-version=2024-10-21"] * 2
    assert {h["authorization"] for h in upstream.script.request_headers} == {
        "Basic YW5uOnMzY3JldA=="  # ann:s3cret
    }
