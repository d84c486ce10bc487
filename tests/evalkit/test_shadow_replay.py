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
import numpy as np
import pytest
from typer.testing import CliRunner

from evalkit.cli import app as evalkit_cli
from evalkit.domains import get_domain
from evalkit.replay import Replay, ReplayOptions
from evalkit.shadowlog import SessionCounts, read_shadow_log, signature_figures
from evalkit.sim.profiles import builtin_profiles, load_profile
from evalkit.sim.server import create_sim_app
from proxy import shadowstats
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
    """`GET /v1/stats/shadow` once no shadow request is in flight any more (the deadline is a
    safety net against a hang, wide enough for a busy machine)."""
    deadline = time.monotonic() + 300
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
    (other,) = read_shadow_log([run.log])
    (int4,) = read_shadow_log([int4_run.log])
    apart = [signature_figures(g.pairs, resamples=1000).novel_share_ci for g in (other, int4)]
    assert apart[0] is not None
    assert apart[1] is not None
    assert apart[0].low > apart[1].high  # the intervals tell the two models apart
    assert novel > int4_run.stats["signatures"]["novel_share"] + 0.25
    assert (
        run.stats["signatures"]["novel_failures"] > run.stats["signatures"]["primary_failures"] / 2
    )


# -- the intervals of the rank correlation and the novel share, from the run's log -------------


def shadow_json(log: Path, *options: str) -> dict[str, Any]:
    result = CliRunner().invoke(evalkit_cli, ["shadow", str(log), "--json", *options])
    assert result.exit_code == 0, result.output
    (offline,) = json.loads(result.output)["data"]
    return offline  # type: ignore[no-any-return]


def test_evalkit_shadow_gives_the_signature_figures_intervals_from_a_seed(
    int4_run: ShadowRun,
) -> None:
    signatures = shadow_json(int4_run.log, "--resamples", "2000", "--seed", "5")["signatures"]
    sessions = len({x["session"] for x in map(json.loads, int4_run.log.read_text().splitlines())})
    assert signatures["bootstrap"] | {
        "rank_correlation": None,
        "novel_share": None,
        "no_interval": None,
    } == {
        "unit": "session",
        "sessions": sessions,
        "resamples": 2000,
        "seed": 5,
        "confidence": 0.95,
        "method": "basic",
        "rank_correlation": None,
        "novel_share": None,
        "no_interval": None,
    }
    # The simulated int4 draws its wrong names from bf16's vocabulary: no signature of its own,
    # a novel share of 0 on an endless log. The point estimate (5.8%) is biased up (and ρ down):
    # the interval, bias-corrected, covers the truth and holds the estimate. ρ's resamples read
    # lower than its estimate (about 0.89), mostly or all of them, as the replay's draws fall: a
    # basic interval is drawn only where it holds the estimate, and where none is, the report
    # says why, with the resamples' bias.
    low, high = signatures["novel_share_ci"]
    assert low == 0.0 < high < 0.10
    assert low <= signatures["novel_share"] <= high
    rho, rho_ci = signatures["rank_correlation"], signatures["rank_correlation_ci"]
    if rho_ci is None:
        refused = signatures["bootstrap"]["no_interval"]["rank_correlation"]
        assert refused.startswith("the resamples lie to one side of the estimate")
        assert "mean less the estimate: -0.0" in refused
    else:
        assert rho_ci[0] <= rho <= rho_ci[1] <= 1.0
        assert signatures["bootstrap"]["rank_correlation"]["bias"] < 0  # resamples read lower
    assert signatures["bootstrap"]["novel_share"]["defined_resamples"] == 2000
    assert signatures["bootstrap"]["novel_share"]["bias"] > 0  # resamples read higher
    again = shadow_json(int4_run.log, "--resamples", "2000", "--seed", "5")["signatures"]
    assert again == signatures
    other = shadow_json(int4_run.log, "--resamples", "2000", "--seed", "6")["signatures"]
    assert other["novel_share_ci"] != signatures["novel_share_ci"]
    assert other["novel_share"] == signatures["novel_share"]


def test_the_intervals_narrow_as_the_log_grows(int4_run: ShadowRun) -> None:
    (group,) = read_shadow_log([int4_run.log])
    sessions = list(dict.fromkeys(p.session for p in group.pairs))
    novel = []
    for share in (4, 2, 1):
        kept = set(sessions[: len(sessions) // share])
        sig = signature_figures([p for p in group.pairs if p.session in kept], resamples=1000)
        assert sig.novel_share_ci is not None
        novel.append(sig.novel_share_ci.high - sig.novel_share_ci.low)
        for ci, estimate in (
            (sig.novel_share_ci, sig.novel_share),
            (sig.rank_correlation_ci, sig.rank_correlation),
        ):
            assert ci is None or ci.low <= estimate <= ci.high  # type: ignore[operator]
    assert novel == sorted(novel, reverse=True)
    assert len(set(novel)) == 3


def test_the_session_is_the_unit_a_sessions_pairs_are_drawn_together(int4_run: ShadowRun) -> None:
    # A log in which every pair is logged three times in its session holds no more sessions:
    # drawn by session it gives the same intervals; drawn by pair it would give narrower ones.
    text = int4_run.log.read_text()
    tripled = int4_run.log.with_name("tripled.jsonl")
    tripled.write_text("".join(line + "\n" for line in text.splitlines() for _ in range(3)))
    (once,) = read_shadow_log([int4_run.log])
    (thrice,) = read_shadow_log([tripled])
    assert len(thrice.pairs) == 3 * len(once.pairs)
    a = signature_figures(once.pairs, resamples=500, seed=3)
    b = signature_figures(thrice.pairs, resamples=500, seed=3)
    assert (b.rank_correlation_ci, b.novel_share_ci) == (a.rank_correlation_ci, a.novel_share_ci)
    assert b.sessions == a.sessions


def test_a_resamples_figures_are_the_proxys_figures_of_the_resampled_log(
    int4_run: ShadowRun,
) -> None:
    # The estimator: what GET /v1/stats/shadow would show for the log of the drawn sessions.
    (group,) = read_shadow_log([int4_run.log])
    counts = SessionCounts.of(group.pairs)
    rng = np.random.default_rng(1)
    for _ in range(3):
        weights = rng.multinomial(
            len(counts.sessions), [1 / len(counts.sessions)] * len(counts.sessions)
        )
        times = dict(zip(counts.sessions, weights, strict=True))
        drawn = [p.pair for p in group.pairs for _ in range(times[p.session])]
        live = shadowstats.figures(shadowstats.tally_pairs(drawn))["signatures"]
        assert counts.agreement(weights) == (live["rank_correlation"], live["novel_share"])
