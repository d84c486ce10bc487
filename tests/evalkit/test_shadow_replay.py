"""Shadow comparison end to end: evalkit's retail tasks replayed through the real proxy in front of
two simulated upstreams on loopback — `int4` serving, `bf16` its reference — with every session
shadowed. The simulated upstream is a model of failure dynamics, not a real model: int4 makes every
mistake bf16 makes on the same request (the same channel, the same wrong name) and 1.5× more
besides, drawn from the same weighted vocabulary (evalkit/sim/model.py). What is tested is that the
proxy measures what it models, at the issue's goals.

Size. The signature figures are estimates whose bias shrinks with the failures behind them: a
signature the primary shows only once or twice is often absent from the reference's smaller sample
by chance, which raises the novel share and flattens the rank correlation. At 3 trials per task
(~635 pairs, ~28 reference failures) the model gives ρ ≈ 0.55 and a novel share ≈ 39%; at 10 trials
(~2,200 pairs, ~130–160 reference failures) six seeds gave ρ 0.79–0.90 (one of six just under 0.8)
and novel share 3.4–6.9% (README, "Is my quantized model worse than it looks?"). The test runs 10
trials at the replay's fixed seed."""

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
    return run_shadowed(tmp_path_factory.mktemp("int4"), "int4", trials=10)


def test_the_quantized_model_makes_the_references_mistakes_louder(int4_run: ShadowRun) -> None:
    stats = int4_run.stats
    assert (stats["model"], stats["reference"]) == ("sim-int4", "bf16")
    assert stats["pairs"] > 2000
    assert stats["dropped"] == 0
    assert stats["errors"] == {}
    assert sum(stats["skipped"].values()) == 0  # chat requests carry their whole context
    ratio = stats["channels"]["unknown_tool"]["ratio"]
    assert ratio["value"] > 1.5
    assert ratio["ci"][0] > 1.0  # the 95% CI excludes 1
    signatures = stats["signatures"]
    assert signatures["reference_failures"] > 100  # what the figures below stand on
    assert signatures["rank_correlation"] > 0.8
    assert signatures["novel_share"] < 0.10


def test_on_each_request_the_reference_errs_only_where_the_primary_does_and_the_same_way(
    int4_run: ShadowRun,
) -> None:
    # The pairs themselves, from the run's log: "the same mistakes, more often" per request.
    lines = [json.loads(x) for x in int4_run.log.read_text().splitlines()]
    pairs = [x for x in lines if x["event"] == "pair"]
    assert len(pairs) == int4_run.stats["pairs"]
    assert int4_run.stats["outcomes"]["reference_only"] == 0
    both = [x for x in pairs if x["outcome"] == "both"]
    assert len(both) > 100
    for pair in both:
        assert pair["primary"]["failures"] == pair["reference"]["failures"], pair["request_id"]


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
    assert (offline["dropped"], offline["errors"], offline["skipped"]) == (
        live["dropped"],
        live["errors"],
        live["skipped"],
    )


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
