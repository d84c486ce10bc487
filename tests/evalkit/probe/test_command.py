"""`evalkit probe` end to end on loopback: evalkit's simulated upstream (a model of failure
dynamics, not a real model) behind real HTTP, the real proxy in front of it, the real OpenAI SDK.

The contexts come from a results file that `evalkit replay` wrote against the same simulator.
A gate in front of the simulator can refuse long prompts the way vLLM does (HTTP 400 naming the
model's maximum context length), or fail with 503 after some requests (an endpoint going down).
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from typer.testing import CliRunner

from evalkit.cli import app
from evalkit.domains import get_domain
from evalkit.sim import builtin_profiles, create_sim_app
from proxy.app import create_app
from proxy.config import Settings
from proxy.config_upstream import UpstreamConfig
from proxy.guard.toolcheck import validate
from proxy.testing import LoopbackServer
from tests.processes import OutputLines

runner = CliRunner()
WINDOW = 4096


@dataclass
class Gate:
    """What the gate in front of the simulator does now."""

    max_body: int | None = None  # longer request bodies get vLLM's window error
    fail_after: int | None = None  # requests after this many get HTTP 503
    fail_first: int = 0  # the first n requests get HTTP 503 (then it recovers)
    # While set to an event, the answers after the first wait until it is set (a hang that
    # ends when the test says, not after some seconds).
    held: threading.Event | None = None
    requests: int = 0


def gated_sim(gate: Gate) -> Starlette:
    sim = create_sim_app(get_domain("retail"), builtin_profiles(), default_profile="bf16")
    transport = httpx.ASGITransport(app=sim)

    async def chat(request: Request) -> Response:
        body = await request.body()
        gate.requests += 1
        if gate.requests <= gate.fail_first or (
            gate.fail_after is not None and gate.requests > gate.fail_after
        ):
            return JSONResponse({"error": {"message": "overloaded", "code": 503}}, 503)
        if gate.max_body is not None and len(body) > gate.max_body:
            message = (
                f"This model's maximum context length is {WINDOW} tokens. However, you "
                f"requested {len(body) // 3} tokens. Please reduce the length of the messages."
            )
            error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
            return JSONResponse({"error": error}, 400)
        if gate.held is not None and gate.requests > 1:
            await asyncio.to_thread(gate.held.wait)
        async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
            answer = await client.post(
                "/v1/chat/completions",
                content=body,
                headers={k: v for k, v in request.headers.items() if k.startswith("x-")},
            )
        return Response(answer.content, answer.status_code, media_type="application/json")

    async def models(request: Request) -> Response:
        data = [
            {"id": f"sim-{name}", "object": "model", "max_model_len": WINDOW}
            for name in builtin_profiles()
        ]
        return JSONResponse({"object": "list", "data": data})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
        ]
    )


@dataclass
class Upstream:
    gate: Gate
    url: str  # the gated simulator's OpenAI base URL
    proxy_url: str  # a toolsentry proxy in front of it


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    gate = Gate()
    sim = LoopbackServer(gated_sim(gate)).start()
    settings = Settings(upstreams=[UpstreamConfig(name="sim", base_url=f"{sim.url}/v1")])
    proxy = LoopbackServer(create_app(settings)).start()
    try:
        yield Upstream(gate, f"{sim.url}/v1", f"{proxy.url}/v1")
    finally:
        if gate.held is not None:
            gate.held.set()  # a held answer would keep the server's thread from ending
        proxy.stop()
        sim.stop()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results file of two retail tasks, replayed against the simulator's int4 profile."""
    out = tmp_path_factory.mktemp("replay")
    result = runner.invoke(
        app, ["replay", "--tasks", "0,1", "--profile", "int4", "--repair", "off", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    return out / "results.json"


def probe(*args: str) -> Any:
    return runner.invoke(app, ["probe", *args, "--resamples", "200", "--quiet"])


def targets(upstream: Upstream) -> list[str]:
    return [
        "--target",
        f"bf16={upstream.url},sim-bf16",
        "--target",
        f"int4={upstream.url},sim-int4",
    ]


def read(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "probe.json").read_text())
    return data


def test_two_targets_through_the_proxy_every_answer_classified_and_figures_written(
    recorded: Path, upstream: Upstream, tmp_path: Path
) -> None:
    out = tmp_path / "probe"
    result = probe(
        str(recorded), *targets(upstream), "--via-proxy", upstream.proxy_url, "--out", str(out)
    )
    assert result.exit_code == 0, result.output
    data = read(out)
    contexts = data["contexts"]["selected"]
    assert contexts > 0
    assert data["complete"] is True
    assert len(data["answers"]) == contexts * 2 * 2
    # The journal holds the same answers the output file does.
    journal = (out / "answers.jsonl").read_text().splitlines()
    assert len(journal) == len(data["answers"])
    by_id = {c["id"]: c for c in data["contexts"]["items"]}
    tools = get_domain("retail").toolkit_classes()[0].openai_tools()
    for item in data["answers"]:
        assert item["status"] == "answered"
        assert item["context"] in by_id
        raw = item["message"]["raw_data"]
        again = validate(raw["message"], tools, finish_reason=raw.get("finish_reason"))
        assert [v.to_dict() for v in again] == item["violations"]
        if item["route"] == "proxy":
            assert "x-toolsentry-violations" in item["proxy"]
    figures = data["figures"]
    assert [t["name"] for t in figures["targets"]] == ["bf16", "int4"]
    for target in figures["targets"]:
        direct = [
            a for a in data["answers"] if a["target"] == target["name"] and a["route"] == "direct"
        ]
        failing = sum(1 for a in direct if a["violations"])
        assert target["channels"]["any"]["count"] == failing
        assert target["channels"]["any"]["n"] == contexts
        assert target["window"] == WINDOW
    (pair,) = figures["pairs"]
    assert (pair["reference"], pair["other"]) == ("bf16", "int4")
    assert pair["contexts"] == contexts
    for repair in figures["repairs"]:
        proxied = [
            a for a in data["answers"] if a["target"] == repair["target"] and a["route"] == "proxy"
        ]
        for channel, counts in repair["channels"].items():
            reported = [
                a for a in proxied if channel in a["proxy"]["x-toolsentry-violations"].split(",")
            ]
            assert counts["reported"] == len(reported)
            assert counts["repaired"] == sum(1 for a in reported if not a["violations"])
    page = (out / "probe.md").read_text()
    assert "## Violations per channel" in page
    assert "## int4 against bf16" in page
    assert "## Repair through the proxy" in page
    assert "<table>" in (out / "probe.html").read_text()
    assert (out / "probe_figures" / "probe-channels.png").stat().st_size > 1000


def test_only_failing_contexts_go_through_the_proxy_when_asked(
    recorded: Path, upstream: Upstream, tmp_path: Path
) -> None:
    out = tmp_path / "probe"
    result = probe(
        str(recorded), "--target", f"int4={upstream.url},sim-int4", "--via-proxy",
        upstream.proxy_url, "--proxy-failing-only", "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = read(out)
    direct = [a for a in data["answers"] if a["route"] == "direct"]
    proxied = [a for a in data["answers"] if a["route"] == "proxy"]
    failing = {(a["context"], a["sample"]) for a in direct if a["violations"]}
    assert failing, "the int4 profile made no mistake in these contexts"
    assert {(a["context"], a["sample"]) for a in proxied} == failing
    assert data["complete"] is True
    assert (
        probe(str(recorded), "--target", f"a={upstream.url},m", "--proxy-failing-only").exit_code
        == 2
    )


def test_base_url_and_model_pairs_are_targets_too(
    recorded: Path, upstream: Upstream, tmp_path: Path
) -> None:
    out = tmp_path / "probe"
    result = probe(
        str(recorded), "--base-url", upstream.url, "--model", "sim-fp8", "--contexts", "3",
        "--samples", "2", "--temperature", "0.7", "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = read(out)
    assert data["figures"]["targets"][0]["name"] == "sim-fp8"
    assert len(data["answers"]) == 3 * 2
    assert {a["sample"] for a in data["answers"]} == {0, 1}


def test_unpaired_base_urls_are_a_usage_error(recorded: Path, upstream: Upstream) -> None:
    result = probe(
        str(recorded), "--base-url", upstream.url, "--base-url", upstream.url, "--model", "m"
    )
    assert result.exit_code == 2
    assert "2 --base-url and 1 --model" in result.output


def test_prompts_longer_than_the_window_are_skipped_and_counted_with_the_limit(
    recorded: Path, upstream: Upstream, tmp_path: Path
) -> None:
    # Every request is longer than this: each one gets vLLM's window error.
    upstream.gate.max_body = 1
    out = tmp_path / "window"
    result = probe(str(recorded), "--target", f"a={upstream.url},sim-bf16", "--out", str(out))
    assert result.exit_code == 0, result.output
    data = read(out)
    (target,) = data["figures"]["targets"]
    assert target["too_long"] == len(data["answers"]) == target["asked"]
    assert target["answered"] == 0
    assert {a["limit"] for a in data["answers"]} == {WINDOW}
    assert (
        f"| a | sim-bf16 | {target['asked']} | 0 | 0 | {target['asked']} | {WINDOW} | 0 |"
        in (out / "probe.md").read_text()
    )


def test_an_endpoint_that_is_down_exits_non_zero_and_nothing_is_lost(
    recorded: Path, upstream: Upstream, tmp_path: Path
) -> None:
    out = tmp_path / "probe"
    upstream.gate.fail_after = 5
    result = probe(
        str(recorded), "--target", f"a={upstream.url},sim-bf16", "--concurrency", "1",
        "--retries", "1", "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 5
    assert "HTTP" in result.output or "failed after 2 attempts" in result.output
    assert f"evalkit probe --resume {out}" in result.output  # on one line, as it is copied
    kept = (out / "answers.jsonl").read_text().splitlines()
    assert len(kept) == 5
    assert not (out / "probe.json").exists()
    upstream.gate.fail_after = None
    requests_before = upstream.gate.requests
    resumed = probe("--resume", str(out))
    assert resumed.exit_code == 0, resumed.output
    data = read(out)
    assert data["complete"] is True
    keys = [(a["context"], a["target"], a["sample"], a["route"]) for a in data["answers"]]
    assert len(keys) == len(set(keys)) == data["contexts"]["selected"]
    # Only the missing questions were asked again.
    assert upstream.gate.requests - requests_before == len(keys) - 5


def test_ctrl_c_keeps_the_finished_answers_and_resume_asks_the_rest(
    recorded: Path, upstream: Upstream, tmp_path: Path
) -> None:
    upstream.gate.held = threading.Event()  # the first answer comes at once, the next ones hang
    out = tmp_path / "probe"
    process = subprocess.Popen(
        [
            sys.executable, "-m", "evalkit.cli", "probe", str(recorded), "--target",
            f"a={upstream.url},sim-bf16", "--concurrency", "1", "--out", str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    journal = out / "answers.jsonl"
    said = OutputLines(process.stdout)
    errors = OutputLines(process.stderr)
    # The run says its count of kept answers (its progress, as plain lines off a terminal): the
    # signal goes once the first answer is journaled; the next one hangs at the gate.
    said.wait_for(r"^a direct: 1/\d+ answers")
    process.send_signal(signal.SIGINT)
    process.wait(timeout=60)
    err = errors.whole()
    assert process.returncode == 130, err
    assert f"finish with: evalkit probe --resume {out}\n" in err  # on one line, as it is copied
    assert len(journal.read_text().splitlines()) == 1
    upstream.gate.held.set()
    upstream.gate.held = None
    resumed = probe("--resume", str(out))
    assert resumed.exit_code == 0, resumed.output
    data = read(out)
    assert data["complete"] is True
    assert len(data["answers"]) == data["contexts"]["selected"]


def test_infrastructure_errors_are_retried_and_the_answer_kept(
    recorded: Path, upstream: Upstream, tmp_path: Path
) -> None:
    upstream.gate.fail_first = 2
    out = tmp_path / "probe"
    result = probe(
        str(recorded), "--target", f"a={upstream.url},sim-bf16", "--contexts", "1",
        "--retries", "3", "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert upstream.gate.requests == 3
    assert [a["status"] for a in read(out)["answers"]] == ["answered"]


def test_nothing_listening_is_a_clear_error(recorded: Path, tmp_path: Path) -> None:
    out = tmp_path / "probe"
    result = probe(str(recorded), "--target", "a=http://127.0.0.1:9/v1,m", "--out", str(out))
    assert result.exit_code == 5
    assert "cannot reach a at http://127.0.0.1:9/v1" in result.output
    assert "is the server running?" in result.output


def test_a_file_that_is_not_a_results_file_exits_4(upstream: Upstream, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"simulations": [{"id": 3}]}')
    result = probe(str(bad), "--target", f"a={upstream.url},sim-bf16", "--out", str(tmp_path / "o"))
    assert result.exit_code == 4
    assert "not a results file" in result.output


def test_a_second_start_in_the_same_directory_points_at_resume(
    recorded: Path, upstream: Upstream, tmp_path: Path
) -> None:
    out = tmp_path / "probe"
    args = [
        str(recorded),
        "--target",
        f"a={upstream.url},sim-bf16",
        "--contexts",
        "1",
        "--out",
        str(out),
    ]
    assert probe(*args).exit_code == 0
    again = probe(*args)
    assert again.exit_code == 2
    assert "--resume" in again.output


def test_help_explains_the_probe() -> None:
    result = runner.invoke(app, ["probe", "--help"])
    assert result.exit_code == 0
    for words in ("--target", "--via-proxy", "--resume", "--samples", "proxy.guard"):
        assert words in result.output


def test_an_endpoint_without_the_file_s_tasks_is_refused_before_the_probe_runs(
    tau2_results_file: Path, upstream: Upstream, tmp_path: Path
) -> None:
    # The simulator serves evalkit's shipped retail data, τ²-bench's file was run on its own:
    # one question per task goes first, so the probe stops within them, naming the fix.
    out = tmp_path / "probe"
    tasks = {s["task_id"] for s in json.loads(tau2_results_file.read_text())["simulations"]}
    result = probe(str(tau2_results_file), "--target", f"a={upstream.url},sim-bf16",
                   "--out", str(out))  # fmt: skip
    assert result.exit_code == 6, result.output
    assert "does not know task" in result.output
    assert "--data-dir" in result.output
    assert "Traceback" not in result.output
    assert upstream.gate.requests <= len(tasks)
