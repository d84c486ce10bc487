"""evalkit against a real model: `evalkit probe` on recorded τ²-bench turns, and `evalkit replay`
through the proxy with the same real vLLM playing the customer.

Gemma 3 270M is a base model: its rewards are not asserted. What is asserted is that the tools
work end to end on a real server — every answer classified, figures computed, files valid, and
the proxy's session records agreeing with what the results file says it reported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from evalkit.domains import get_domain
from evalkit.formats import read_results
from proxy.guard.toolcheck import validate
from scripts.live_requests import (
    MODEL,
)
from tests.live.conftest import ROOT

pytestmark = pytest.mark.vllm

# τ²-bench's files: $TAU2_DATA_DIR, else ../shared/tau2 next to the repository (as the evalkit suite).
TAU2_RESULTS = Path(os.environ.get("TAU2_DATA_DIR") or ROOT.parent / "shared" / "tau2") / "results"


def evalkit(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "evalkit.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def tau2_file(domain: str) -> Path:
    path = TAU2_RESULTS / f"gpt-4.1_{domain}_1trial.json"
    if not path.is_file():
        pytest.skip(
            f"τ²-bench's recorded {domain} run is missing at {path}: put τ²-bench's files at "
            "../shared/tau2 next to the repository or point TAU2_DATA_DIR at them"
        )
    return path


def test_probe_on_ten_recorded_turns_classifies_every_answer(
    vllm_url: str, tmp_path: Path, summary: list[str]
) -> None:
    out = tmp_path / "probe"
    done = evalkit(
        "probe", str(tau2_file("retail")), "--target", f"vllm={vllm_url},{MODEL}",
        "--contexts", "10", "--max-tokens", "128", "--concurrency", "2", "--resamples", "1000",
        "--out", str(out), "--quiet",
        timeout=1800,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    data: dict[str, Any] = json.loads((out / "probe.json").read_text())
    assert data["complete"] is True
    assert data["contexts"]["selected"] == 10
    answers = data["answers"]
    assert len(answers) == 10
    (target,) = data["figures"]["targets"]
    assert target["asked"] == 10
    assert target["answered"] + target["too_long"] + target["rejected"] == 10
    too_long = [a for a in answers if a["status"] == "too_long"]
    assert all(a["limit"] == target["window"] for a in too_long), too_long
    answered = [a for a in answers if a["status"] == "answered"]
    assert answered, f"no context fitted the server's window ({target['window']} tokens)"
    items = {c["id"]: c for c in data["contexts"]["items"]}
    tools = get_domain("retail").toolkit_classes()[0].openai_tools()
    for a in answered:
        assert a["context"] in items
        raw = a["message"]["raw_data"]
        again = validate(raw["message"], tools, finish_reason=raw.get("finish_reason"))
        assert [v.to_dict() for v in again] == a["violations"]
        assert set(a["agreement"]) == {"trigger", "name", "arguments"}
    failing = sum(1 for a in answered if a["violations"])
    assert target["channels"]["any"]["count"] == failing
    assert target["channels"]["any"]["n"] == len(answered)
    assert (out / "probe.md").read_text().count("## ") >= 3
    summary.append(
        f"probe: {len(answered)} of 10 retail turns answered (window {target['window']}), "
        f"{failing} with a violation; trigger agreement "
        f"{target['agreement']['trigger']['count']}/{target['agreement']['trigger']['n']}"
    )


def test_replay_through_the_proxy_with_an_llm_user_agrees_with_the_session_records(
    vllm_url: str, proxy_url: str, tmp_path: Path, summary: list[str]
) -> None:
    out = tmp_path / "replay"
    done = evalkit(
        "replay", "--domain", "retail", "--base-url", f"{proxy_url}/v1", "--model", MODEL,
        "--tasks", "0,1", "--user", "llm", "--user-base-url", vllm_url, "--user-model", MODEL,
        "--max-steps", "8", "--concurrency", "2", "--out", str(out),
        timeout=2400,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    files = sorted(out.glob("**/results*.json"))
    assert files, f"no results file in {out}: {sorted(p.name for p in out.rglob('*'))}"
    results = read_results(files[0])
    assert len(results.simulations) == 2
    assert {s.task_id for s in results.simulations} == {"0", "1"}
    reached = 0
    for simulation in results.simulations:
        block = simulation.toolsentry
        assert block is not None, f"simulation {simulation.id} has no toolsentry block"
        if not block["turns"]:
            # The 270M base model playing the customer may end the conversation before the agent
            # speaks (it echoes its instructions, stop marker included): then no request reached
            # the proxy, and the proxy must know no such session either.
            missing = httpx.get(f"{proxy_url}/v1/sessions/{block['session_id']}", timeout=30)
            assert missing.status_code == 404, missing.text
            assert block["errors"] in (None, 0)
            assert not block["channels"]
            summary.append(
                f"replay task {simulation.task_id}: {simulation.termination_reason} before the "
                "agent's first turn (the simulated customer ended it); no proxy session, as recorded"
            )
            continue
        reached += 1
        session = block["session"]
        assert session
        record = httpx.get(f"{proxy_url}/v1/sessions/{session}", timeout=30).json()
        assert record["session"] == session
        # Every agent turn of the episode went through the proxy in this session.
        assert record["requests"] == len(block["turns"])
        assert record["errors"] == block["errors"]
        assert record["repairs"] == block["repairs"]
        assert record["max_errors"] == block["max_errors"]
        reported = {k: v for k, v in record["channels"].items() if v}
        named = {k: v for k, v in block["channels"].items() if v}
        # A turn's x-toolsentry-violations names a channel once, however many of its calls had
        # it; the session counts every violation.
        assert set(reported) == set(named)
        assert all(named[k] <= reported[k] for k in named)
        summary.append(
            f"replay task {simulation.task_id}: {simulation.termination_reason}, "
            f"{len(block['turns'])} agent turns, proxy channels {reported or 'none'}"
        )
    summary.append(f"replay: {reached} of {len(results.simulations)} episodes reached the agent")
