"""Real components the suite needs, and what happens when one is missing: outside CI the test
skips with a reason a user can act on; under `CI=true`, or for the components named in
`TOOLSENTRY_REQUIRE` (comma-separated, or `all`), the same reason fails it.

Tests that need a component call `require(component, reason)` where they find it missing, or carry
`needs(component, reason)` as a mark (the reason `None` when it is present); the suite's conftest
turns the mark into the same call.

The module is also the pytest plugin that does it (tests/conftest.py loads it), imported by the
conftest before it is loaded as one, so it opts out of assertion rewriting (it asserts nothing):
PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import os
from collections.abc import Generator, Mapping
from typing import NoReturn

import pytest

COMPONENTS = frozenset(
    {
        "redis",  # redis-server on PATH (Debian: redis-server)
        "chromium",  # headless Chromium for the report rendering tests
        "tau2",  # τ²-bench's reference data at ../shared/tau2 or $TAU2_DATA_DIR
        "node",  # Node.js and npm for the real agent clients
        "codex",  # the pinned Codex CLI in clients/node_modules (make clients)
        "claude",  # the pinned Claude Code in clients/node_modules (make clients)
        "promtool",  # Prometheus's rule checker (Debian: prometheus)
        "wrk",  # the benchmarks' load generator, for their smoke tests (Debian: wrk)
        "corpus",  # the function-declaration corpora in .cache/corpus (make corpus)
        "openssl",  # OpenSSL's command line, its s_server for the mutual TLS test (Debian: openssl)
        "tinyproxy",  # a forward proxy for the upstream client's proxy tests (Debian: tinyproxy)
        "vllm",  # a real vLLM server (scripts/vllm-cpu start) for tests/live
    }
)


def _truthy(value: str) -> bool:
    return value.strip().lower() in {"1", "true", "yes", "on"}


def in_ci(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the run is CI's (`CI` set to true, as CI services and `.ci/run` set it)."""
    env = os.environ if environ is None else environ
    return _truthy(env.get("CI", ""))


def required_components(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """The components whose absence fails a test instead of skipping it.

    Every component under CI; otherwise those named in `TOOLSENTRY_REQUIRE`. Raises
    `pytest.UsageError` for a name that is not a component, so a typo cannot quietly require
    nothing.
    """
    env = os.environ if environ is None else environ
    if in_ci(env):
        return COMPONENTS
    names = {n.strip() for n in env.get("TOOLSENTRY_REQUIRE", "").split(",") if n.strip()}
    if "all" in names:
        return COMPONENTS
    unknown = names - COMPONENTS
    if unknown:
        raise pytest.UsageError(
            f"TOOLSENTRY_REQUIRE names unknown components {sorted(unknown)}; "
            f"known: {', '.join(sorted(COMPONENTS))} (or all)"
        )
    return frozenset(names)


def require(component: str, reason: str) -> NoReturn:
    """Stop the current test for want of `component`: fail when it is required, else skip.

    `reason` says what is missing and how to install it; it is the message either way.
    """
    if component not in COMPONENTS:
        raise ValueError(f"unknown component {component!r}; add it to tests.require.COMPONENTS")
    if component in required_components():
        pytest.fail(f"required component {component} is missing: {reason}", pytrace=False)
    pytest.skip(reason)


def needs(component: str, reason: str | None) -> pytest.MarkDecorator:
    """A mark for tests that need `component`; `reason` is why it is missing, `None` if present."""
    if component not in COMPONENTS:
        raise ValueError(f"unknown component {component!r}; add it to tests.require.COMPONENTS")
    return pytest.mark.needs(component, reason)


# -- the pytest side: the `needs` mark, and no skip at all under CI ------------------------------
# Loaded as a plugin by tests/conftest.py (`pytest_plugins`).


def pytest_configure(config: pytest.Config) -> None:
    required_components()  # a misspelt TOOLSENTRY_REQUIRE stops the run before it starts
    config.addinivalue_line(
        "markers", "needs(component, reason): needs a real component; reason None when present"
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("needs"):
        component, reason = mark.args
        if reason is not None:
            require(component, reason)


def _skip_reason(longrepr: object) -> str:
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _fail_skip_in_ci(report: pytest.TestReport | pytest.CollectReport) -> None:
    # A skip nobody routed through require() (a skipif mark, importorskip, a module-level skip)
    # hides an untested part just as well; CI fails it with its own reason.
    if report.skipped and in_ci() and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = (
            f"skipped under CI=true, where every collected test must run: "
            f"{_skip_reason(report.longrepr)}"
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport() -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    _fail_skip_in_ci(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report() -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    _fail_skip_in_ci(report)
    return report
