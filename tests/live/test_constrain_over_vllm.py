"""`repair: constrain` in front of a real vLLM: the live suite's fixed requests under `reask` and
under `constrain`, through one proxy started with `--repair constrain` (the `reask` requests ask
for it with `x-toolsentry-repair: reask`).

Under `constrain` the re-ask asks vLLM for a named or required call with the tools' schemas marked
`strict`, which it decodes under a grammar. Every response the proxy repaired must hold only valid
calls, judged by the live suite's own check (jsonschema), not by the proxy; nothing may fall back
to a plain re-ask (vLLM takes the fields). The run prints repair success per channel for both
modes, from the proxy's `toolsentry_repairs_total`. One test per request, so that a subset can be
chosen with `-k` (e.g. `-k "constrain and cancel"`) on a slow machine.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator

import httpx
import openai
import pytest

from scripts.live_requests import (
    MODES,
    PROMPTS,
    Prompt,
    counter_values,
    failures,
    send,
    tool_choice_for,
    unreported,
)
from tests.live.conftest import SUMMARY, ProxyNotReady, running_proxy

pytestmark = pytest.mark.vllm

REPAIR_MODES = ["reask", "constrain"]
# (repair mode, channel) -> Counter of results (success, failure, fallback), over the run
_REPAIRS: dict[tuple[str, str], Counter[str]] = {}
_REPAIRED_RESPONSES: Counter[str] = Counter()
_REQUESTS: Counter[str] = Counter()


@pytest.fixture(scope="module")
def constrain_proxy(
    vllm_url: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[str]:
    log_path = tmp_path_factory.mktemp("proxy-constrain") / "proxy.log"
    try:
        with running_proxy(vllm_url, log_path, "--repair", "constrain") as url:
            yield url
    except ProxyNotReady as exc:
        pytest.fail(str(exc))
    lines = request.config.stash.setdefault(SUMMARY, [])
    for mode in REPAIR_MODES:
        if not _REQUESTS[mode]:
            continue
        lines.append(
            f"repair: {mode} — {_REQUESTS[mode]} requests, {_REPAIRED_RESPONSES[mode]} responses "
            "repaired; per channel success/failure/fallback:"
        )
        for (asked, channel), results in sorted(_REPAIRS.items()):
            if asked != mode:
                continue
            tried = results["success"] + results["failure"]
            rate = f"{results['success'] / tried:.0%}" if tried else "–"
            lines.append(
                f"  {channel:24} {results['success']:3d}/{results['failure']:3d}/"
                f"{results['fallback']:3d}  success {rate}"
            )


def _grown(before: str, after: str) -> dict[str, Counter[str]]:
    old = counter_values(before, "toolsentry_repairs_total")
    grown: dict[str, Counter[str]] = {}
    for key, value in counter_values(after, "toolsentry_repairs_total").items():
        if value > old.get(key, 0.0):
            labels = dict(key)
            grown.setdefault(labels["channel"], Counter())[labels["result"]] += int(
                value - old.get(key, 0.0)
            )
    return grown


@pytest.mark.parametrize(
    ("choice", "stream"), MODES, ids=[f"{c}-{'stream' if s else 'json'}" for c, s in MODES]
)
@pytest.mark.parametrize("prompt", PROMPTS, ids=lambda p: p.name)
@pytest.mark.parametrize("mode", REPAIR_MODES)
def test_a_repaired_response_holds_only_valid_calls(
    constrain_proxy: str, mode: str, prompt: Prompt, choice: str, stream: bool
) -> None:
    before = httpx.get(f"{constrain_proxy}/metrics", timeout=30).text
    with openai.OpenAI(
        base_url=f"{constrain_proxy}/v1",
        api_key="unused",
        max_retries=0,
        timeout=900,
        default_headers={"x-toolsentry-repair": mode},
    ) as client:
        received = send(client, prompt, choice, stream, f"live-{mode}-{uuid.uuid4().hex[:12]}", 64)
    grown = _grown(before, httpx.get(f"{constrain_proxy}/metrics", timeout=30).text)
    _REQUESTS[mode] += 1
    _REPAIRED_RESPONSES[mode] += received.repairs > 0
    for channel, results in grown.items():
        _REPAIRS.setdefault((mode, channel), Counter()).update(results)

    tool_choice = tool_choice_for(prompt, choice)
    assert unreported(received, prompt.tools, tool_choice) == []
    if received.repairs:
        # the proxy checked the repaired calls; here the suite's own jsonschema check does too
        assert [f.description for f in failures(received, prompt.tools, tool_choice)] == []
    if mode == "constrain":
        assert sum(results["fallback"] for results in grown.values()) == 0
