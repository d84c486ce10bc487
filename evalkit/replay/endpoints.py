"""The endpoints of a replay: checking that one answers, starting the proxy (and the simulated
upstream) on loopback, and reading the proxy's session record of an episode."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx

from evalkit.domains.base import Domain
from evalkit.errors import EndpointError
from evalkit.replay.options import PROBE_TIMEOUT_S, ReplayOptions
from evalkit.sim.profiles import DamageProfile


async def check_reachable(base_url: str, what: str) -> None:
    """Fail fast when nothing answers at `base_url` (a GET of `/models`; any HTTP answer will do).

    Raises:
        EndpointError: naming `what` and the URL, when the connection fails or times out.
    """
    url = f"{base_url.rstrip('/')}/models"
    try:
        async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S) as client:
            await client.get(url)
    except httpx.TimeoutException:
        raise EndpointError(
            f"the {what} at {base_url} did not answer within {PROBE_TIMEOUT_S:g} s"
        ) from None
    except httpx.HTTPError as exc:
        reason = str(exc) or type(exc).__name__
        raise EndpointError(
            f"cannot reach the {what} at {base_url}: {reason} (is the server running?)"
        ) from None


@contextlib.contextmanager
def proxy_in_front(upstream: str, *, max_errors: int, name: str = "upstream") -> Iterator[str]:
    """Start the toolsentry proxy on a free loopback port in front of the OpenAI base URL
    `upstream`, with budget `max_errors` and per-request overrides allowed (the arms' repair).

    Yields the proxy's OpenAI base URL; the proxy stops on exit.
    """
    from proxy.app import create_app
    from proxy.config import Settings
    from proxy.config_upstream import UpstreamConfig
    from proxy.testing import LoopbackServer

    settings = Settings(
        upstreams=[UpstreamConfig(name=name, base_url=upstream)],
        max_errors=max_errors,
        allow_overrides=True,
    )
    proxy = LoopbackServer(create_app(settings))
    proxy.start()
    try:
        yield f"{proxy.url}/v1"
    finally:
        proxy.stop()


@contextlib.contextmanager
def embedded_upstream(
    domain: Domain, options: ReplayOptions, profiles: dict[str, DamageProfile]
) -> Iterator[str]:
    """Start the simulated upstream and a proxy in front of it on free loopback ports.

    Yields the proxy's OpenAI base URL; both servers stop on exit. The proxy's budget is the
    run's `max_errors`; arms choose repair per request.
    """
    from evalkit.sim.server import create_sim_app
    from proxy.testing import LoopbackServer

    first = next(iter(profiles))
    sim = LoopbackServer(create_sim_app(domain, profiles, default_profile=first, seed=options.seed))
    sim.start()
    try:
        with proxy_in_front(
            f"{sim.url}/v1", max_errors=options.max_errors, name="evalkit-sim"
        ) as base_url:
            yield base_url
    finally:
        sim.stop()


async def fetch_session(http: httpx.AsyncClient, base_url: str, session: str) -> dict[str, Any]:
    """The proxy's record of `session` (`GET /v1/sessions/{id}`).

    Raises:
        EndpointError: saying why there is none — the request failed, the server has no
            session API or wants an admin key (its status), or the answer is not a record.
    """
    url = f"{base_url.rstrip('/')}/sessions/{quote(session, safe='')}"
    try:
        response = await http.get(url)
    except httpx.HTTPError as exc:
        raise EndpointError(f"GET {url} failed: {exc or type(exc).__name__}") from None
    if response.status_code != 200:
        raise EndpointError(
            f"GET {url} answered HTTP {response.status_code}", status=response.status_code
        )
    try:
        data = response.json()
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise EndpointError(f"GET {url} answered something that is not a session record")
    return data
