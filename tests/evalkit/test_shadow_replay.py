"""Shadow comparison end to end: evalkit's retail tasks replayed through the real proxy in front of
two simulated upstreams on loopback — `int4` serving, `bf16` its reference — with every session
shadowed. The simulated upstream is a model of failure dynamics (same draws, more often at int4),
not a real model; what is tested is that the proxy measures what it models."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from evalkit.cli import app as evalkit_cli
from evalkit.domains import get_domain
from evalkit.replay import Replay, ReplayOptions
from evalkit.sim.profiles import builtin_profiles, load_profile
from evalkit.sim.server import create_sim_app
from proxy.app import create_app
from proxy.config import Settings
from proxy.testing import LoopbackServer

pytestmark = pytest.mark.slow


@dataclass
class ShadowRun:
    stats: dict[str, Any]
    log: Path


def run_shadowed(tmp_path: Path, primary_profile: str, *, trials: int) -> ShadowRun:
    """Replay every retail task through the proxy (int4 sim serving, bf16 sim as reference)."""
    domain = get_domain("retail")
    profiles = dict(builtin_profiles())
    primary = load_profile(primary_profile)
    profiles[primary.name] = primary
    log = tmp_path / "shadow.jsonl"
    with (
        LoopbackServer(create_sim_app(domain, profiles, default_profile=primary.name)) as served,
        LoopbackServer(create_sim_app(domain, profiles, default_profile="bf16")) as reference,
    ):
        settings = Settings(
            upstreams=[
                {"name": "quantized", "base_url": f"{served.url}/v1", "models": [primary.model]},
                {"name": "bf16", "base_url": f"{reference.url}/v1", "models": ["sim-bf16"]},
            ],
            shadow={"reference": "bf16", "sample": 1.0, "max_in_flight": 64, "log": str(log)},
        )
        app = create_app(settings, environ={})
        with LoopbackServer(app) as proxy:
            base_url = f"{proxy.url}/v1"
            options = ReplayOptions(
                base_url=base_url, model=primary.model, repairs=(), trials=trials, seed=11
            )
            replay = Replay.start(options, tmp_path / "run")
            asyncio.run(replay.run(base_url))
            stats = settled_stats(proxy.url)
    (entry,) = stats["data"]
    return ShadowRun(entry, log)


def settled_stats(url: str) -> dict[str, Any]:
    """`GET /v1/stats/shadow` once no shadow request is in flight any more."""
    deadline = time.monotonic() + 60
    while True:
        stats: dict[str, Any] = httpx.get(f"{url}/v1/stats/shadow", timeout=30).json()
        if stats["in_flight"] == 0 or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


@pytest.fixture(scope="module")
def int4_run(tmp_path_factory: pytest.TempPathFactory) -> ShadowRun:
    return run_shadowed(tmp_path_factory.mktemp("int4"), "int4", trials=3)


def test_the_quantized_model_makes_the_references_mistakes_louder(int4_run: ShadowRun) -> None:
    stats = int4_run.stats
    assert (stats["model"], stats["reference"]) == ("sim-int4", "bf16")
    assert stats["pairs"] > 500
    assert stats["dropped"] == 0
    assert stats["errors"] == {}
    ratio = stats["channels"]["unknown_tool"]["ratio"]
    assert ratio["value"] > 1.5
    assert ratio["ci"][0] > 1.0  # the 95% CI excludes 1
    # At this size (46 tasks × 3 trials: ~40 reference failures over ~35 signatures) the
    # signature figures are noisy: the same vocabulary shows as a positive rank correlation and
    # a novel share well below a different vocabulary's (the last test). The goals
    # (> 0.8, < 10%) are NOT met at this size, nor at 10 trials (0.71, 12.4%; README).
    assert stats["signatures"]["rank_correlation"] > 0.0


def test_evalkit_shadow_reads_the_same_figures_from_the_runs_log(int4_run: ShadowRun) -> None:
    result = CliRunner().invoke(evalkit_cli, ["shadow", str(int4_run.log), "--json"])
    assert result.exit_code == 0, result.output
    (offline,) = json.loads(result.output)["data"]
    live = int4_run.stats
    assert offline["pairs"] == live["pairs"]
    assert offline["outcomes"] == live["outcomes"]
    for channel, figures in live["channels"].items():
        mine = offline["channels"][channel]
        for side in ("primary", "reference"):
            assert mine[side]["answers"] == figures[side]["answers"]
        if figures["ratio"] is not None:
            assert mine["ratio"]["value"] == pytest.approx(figures["ratio"]["value"])
            assert mine["ratio"]["ci"] == pytest.approx(figures["ratio"]["ci"])
    for key in ("rank_correlation", "novel_share", "primary_failures", "reference_failures"):
        assert offline["signatures"][key] == pytest.approx(live["signatures"][key])


def test_a_profile_with_its_own_wrong_names_shows_a_high_novel_share(
    tmp_path: Path, int4_run: ShadowRun
) -> None:
    profile = tmp_path / "int4-other.yaml"
    profile.write_text(
        "name: int4-other\nbase: bf16\nmultiplier: 2.5\n"
        "wrong_tool_names: {purge_account: 5, wire_money: 3, escalate_to_human: 2}\n"
    )
    run = run_shadowed(tmp_path, str(profile), trials=3)
    novel = run.stats["signatures"]["novel_share"]
    assert novel > 0.5
    assert novel > int4_run.stats["signatures"]["novel_share"] + 0.25
    assert (
        run.stats["signatures"]["novel_failures"] > run.stats["signatures"]["primary_failures"] / 2
    )
