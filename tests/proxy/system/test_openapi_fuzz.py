"""schemathesis against the proxy's own `/openapi.json`: requests generated from the schema, valid
and invalid (wrong types, missing fields, odd paths and query strings), sent over HTTP to a proxy
on loopback in front of a scripted upstream. The proxy never answers 5xx of its own making, and
every 4xx it sends is an OpenAI-shaped error."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from proxy.app import create_app
from proxy.config import Settings
from proxy.testing import LoopbackServer, ScriptedUpstream, answer, call

EXAMPLES = 150


@pytest.fixture
def proxy_url() -> Iterator[str]:
    # One protocol-neutral answer, written in the protocol of whichever route it is asked on.
    script = ScriptedUpstream(replies=[answer(None, call("get_order", {}))])
    with LoopbackServer(script.app) as upstream:
        # Generated requests carry no session header, so many of them share one fingerprinted
        # session; the scripted call is unknown to most of them, so with the default budget the
        # session is spent after ten and every later turn is a 429. The budget is not what this
        # test is about: room for every example keeps the turn routes answering.
        config = Settings(
            upstreams=[{"name": "scripted", "base_url": f"{upstream.url}/v1"}],
            max_errors=10 * EXAMPLES,
        )
        with LoopbackServer(create_app(config)) as proxy:
            yield proxy.url


def is_openai_error(body: Any) -> bool:
    error = body.get("error") if isinstance(body, dict) else None
    return (
        isinstance(error, dict)
        and isinstance(error.get("message"), str)
        and bool(error["message"])
        and isinstance(error.get("type"), str)
        and {"param", "code"} <= error.keys()
    )


def is_anthropic_error(body: Any) -> bool:
    error = body.get("error") if isinstance(body, dict) else None
    return (
        body.get("type") == "error"
        and isinstance(error, dict)
        and isinstance(error.get("message"), str)
        and bool(error["message"])
        and isinstance(error.get("type"), str)
    )


def test_requests_generated_from_the_openapi_schema_get_no_5xx_and_openai_shaped_4xx(
    proxy_url: str,
) -> None:
    spec = httpx.get(f"{proxy_url}/openapi.json", timeout=10).json()
    schema = schemathesis.openapi.from_dict(spec)
    seen: set[tuple[str, int]] = set()

    def fuzz(cases: st.SearchStrategy[Any], examples: int) -> None:
        @settings(
            max_examples=examples,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=cases)
        def check(case: Any) -> None:
            response = case.call(base_url=proxy_url, timeout=10)
            where = f"{case.method} {case.formatted_path} -> {response.status_code}"
            seen.add((case.operation.path, response.status_code))
            # A 502/503/504 would be the upstream's failure passed on; the scripted one never
            # fails.
            assert response.status_code < 500, f"{where}: {response.content[:500]!r}"
            if 400 <= response.status_code < 500:
                shaped = (
                    is_anthropic_error if case.operation.path == "/v1/messages" else is_openai_error
                )
                assert shaped(orjson.loads(response.content)), (
                    f"{where}: not an error in the route's shape: {response.content[:500]!r}"
                )

        check()

    fuzz(
        st.one_of(
            schema.as_strategy(GenerationMode.POSITIVE), schema.as_strategy(GenerationMode.NEGATIVE)
        ),
        EXAMPLES,
    )
    # The fuzzing reached the turn routes and got answers and refusals from the proxy on each.
    # Which cases a run draws is chance (hypothesis seeds from the random state earlier tests
    # leave), and a few positive cases of a route may all be refused: a route without an answer
    # yet gets positive cases of its own until one is answered.
    for route in ("/v1/chat/completions", "/v1/responses", "/v1/messages"):
        if 200 not in {status for path, status in seen if path == route}:
            fuzz(schema.include(path=route).as_strategy(GenerationMode.POSITIVE), EXAMPLES // 3)
        statuses = {status for path, status in seen if path == route}
        assert 200 in statuses, (route, seen)
        assert any(400 <= status < 500 for status in statuses), (route, seen)
