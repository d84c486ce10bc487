"""schemathesis against the proxy's own `/openapi.json`: requests generated from the schema, valid
and invalid (wrong types, missing fields, odd paths and query strings), sent over HTTP to a proxy
on loopback in front of a scripted upstream. The proxy never answers 5xx of its own making, and
every 4xx it sends is an OpenAI-shaped error. With two client keys and an admin key configured,
each request sent under one of the keys, no turn route's 200 comes from the upstream unchecked:
each carries the session it was counted in."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
from proxy.headers import ERRORS_HEADER, SESSION_HEADER
from proxy.testing import LoopbackServer, ScriptedUpstream, answer, call

EXAMPLES = 150


KEYS = {"client-key-A": "a", "client-key-B": "b"}
ADMIN_KEY = "admin-key"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
TURN_ROUTES = ("/v1/chat/completions", "/v1/responses", "/v1/messages")


@contextmanager
def serving(**keys: Any) -> Iterator[str]:
    """A proxy on loopback in front of a scripted upstream, with `keys` in its settings."""
    # One protocol-neutral answer, written in the protocol of whichever route it is asked on.
    script = ScriptedUpstream(replies=[answer(None, call("get_order", {}))])
    with LoopbackServer(script.app) as upstream:
        # Generated requests carry no session header, so the many that repeat one history share
        # its session; the scripted call is unknown to most of them, so with the default budget
        # such a session is spent after ten and every later turn is a 429. The budget is not what this
        # test is about: room for every example keeps the turn routes answering.
        config = Settings(
            upstreams=[{"name": "scripted", "base_url": f"{upstream.url}/v1"}],
            max_errors=10 * EXAMPLES,
            **keys,
        )
        with LoopbackServer(create_app(config)) as proxy:
            yield proxy.url


@pytest.fixture
def proxy_url() -> Iterator[str]:
    with serving() as url:
        yield url


@pytest.fixture
def keyed_proxy_url() -> Iterator[str]:
    keys = [{"name": name, "key": key} for key, name in KEYS.items()]
    with serving(api_keys=keys, admin_key=ADMIN_KEY) as url:
        yield url


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


def fuzz_openapi(
    proxy_url: str, check_response: Callable[[Any, httpx.Response], None] | None = None
) -> set[tuple[str, int]]:
    """Generated requests, valid and invalid, from the proxy's own schema, sent to `proxy_url`;
    each answer is no 5xx, its 4xx in the route's error shape, and passes `check_response`
    (case, response). Returns the (path, status) pairs seen: a turn route that got no 200 yet
    is fuzzed again with valid requests of its own."""
    spec = httpx.get(f"{proxy_url}/openapi.json", timeout=10, headers=ADMIN).json()
    schema = schemathesis.openapi.from_dict(spec)
    seen: set[tuple[str, int]] = set()

    def fuzz(cases: st.SearchStrategy[Any], examples: int) -> None:
        @settings(
            max_examples=examples,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=cases, key=st.sampled_from(sorted(KEYS)))
        def check(case: Any, key: str) -> None:
            case.headers = {**(case.headers or {}), "authorization": f"Bearer {key}"}
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
            if check_response is not None:
                check_response(case, response)

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
    for route in TURN_ROUTES:
        if 200 not in {status for path, status in seen if path == route}:
            fuzz(schema.include(path=route).as_strategy(GenerationMode.POSITIVE), EXAMPLES // 3)
    return seen


def answered_and_refused(seen: set[tuple[str, int]]) -> dict[str, bool]:
    """For each turn route, whether the fuzzing got both a 200 and a 4xx from it."""
    statuses = {route: {status for path, status in seen if path == route} for route in TURN_ROUTES}
    return {
        route: 200 in got and any(400 <= status < 500 for status in got)
        for route, got in statuses.items()
    }


def test_requests_generated_from_the_openapi_schema_get_no_5xx_and_openai_shaped_4xx(
    proxy_url: str,
) -> None:
    seen = fuzz_openapi(proxy_url)
    assert answered_and_refused(seen) == dict.fromkeys(TURN_ROUTES, True), seen


def test_with_client_keys_no_turn_answer_comes_from_the_upstream_unchecked(
    keyed_proxy_url: str,
) -> None:
    """Under two client keys and an admin key, every 200 of a turn route went through the
    guard: it carries the session it was counted in, owned by the key that sent it."""

    def checked(case: Any, response: httpx.Response) -> None:
        if case.operation.path in TURN_ROUTES and response.status_code == 200:
            where = f"{case.method} {case.formatted_path}"
            assert response.headers.get(SESSION_HEADER), f"{where}: 200 without its session"
            assert response.headers.get(ERRORS_HEADER), f"{where}: 200 without its count"

    seen = fuzz_openapi(keyed_proxy_url, checked)
    assert answered_and_refused(seen) == dict.fromkeys(TURN_ROUTES, True), seen
