"""The upstream client's own failures and their translation into the proxy's `Upstream*` errors:
complete, specific, and never a bug of the proxy's passed off as the upstream's."""

from __future__ import annotations

import inspect
import socket
import ssl

import pytest

from proxy import upstream_errors, upstream_http1, upstream_origin, upstream_pool
from proxy.errors import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeoutError,
)
from proxy.upstream_errors import error_class_for, translate

# The modules of the upstream client below `proxy.upstream`.
_CLIENT_MODULES = (upstream_errors, upstream_http1, upstream_origin, upstream_pool)

# What the pool and the sockets under it raise: the pool's own classes, and the OS's.
_POOL_FAILURES: tuple[type[BaseException], ...] = (
    *upstream_errors.ERRORS,
    TimeoutError,
    ConnectionRefusedError,
    ConnectionResetError,
    ConnectionAbortedError,
    BrokenPipeError,
    socket.gaierror,
    ssl.SSLError,
    ssl.SSLCertVerificationError,
    OSError,
)


def test_every_failure_of_the_pool_maps_to_a_specific_upstream_error() -> None:
    # The client's own classes, wherever one of its modules defines them, are listed in
    # upstream_errors.ERRORS; one added without a row here fails.
    own = {
        cls
        for module in _CLIENT_MODULES
        for cls in vars(module).values()
        if inspect.isclass(cls) and issubclass(cls, Exception) and cls.__module__ == module.__name__
    }
    assert own - {upstream_errors.ResponseError} == set(upstream_errors.ERRORS)
    for cls in _POOL_FAILURES:
        mapped = error_class_for(cls)
        assert mapped is not None, cls
        assert mapped[0] is not UpstreamError, cls


@pytest.mark.parametrize(
    "bug", [ValueError("bad"), KeyError("k"), TypeError("t"), AssertionError()]
)
def test_an_exception_that_is_not_a_network_failure_is_raised_as_it_is(bug: Exception) -> None:
    # A fault of the proxy's own must stay one: never a 502 charged to the upstream.
    assert error_class_for(type(bug)) is None
    with pytest.raises(type(bug)):
        translate(bug, "u", "x")


def test_timeouts_connect_failures_and_broken_bodies_map_to_distinct_errors() -> None:
    assert isinstance(translate(TimeoutError(), "u", "x"), UpstreamTimeoutError)
    assert isinstance(translate(upstream_errors.ClosedEarly(), "u", "x"), UpstreamConnectError)
    assert isinstance(translate(ConnectionRefusedError(), "u", "x"), UpstreamConnectError)
    assert isinstance(translate(upstream_errors.BrokenOff("cut"), "u", "x"), UpstreamProtocolError)
    assert isinstance(
        translate(upstream_errors.InvalidResponse("junk"), "u", "x"), UpstreamProtocolError
    )
    assert "'u'" in translate(upstream_errors.ClosedEarly(), "u", "x").message
