"""The headline and Markdown of a replay summary, from hand-built results analysed as `analyze`
analyses them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evalkit.analysis.load import load_runs
from evalkit.analysis.run import RunAnalysis
from evalkit.summary import headline, markdown
from tests.evalkit.analysis.builders import episode, errors, results, write


def leaked(task_id: str, **fields: Any) -> dict[str, Any]:
    """An episode whose agent leaked one call into its text (no tool error: τ²-bench's count is
    0, the proxy's 1)."""
    simulation = episode(task_id, **fields)
    simulation["messages"].insert(
        2,
        {
            "role": "assistant",
            "content": '<tool_call>{"name": "get_order_details", "arguments": {}}</tool_call>',
        },
    )
    simulation["messages"].insert(3, {"role": "user", "content": "Hello?"})
    return simulation


def through_proxy(simulation: dict[str, Any]) -> dict[str, Any]:
    simulation["toolsentry"] = {
        "turns": [{"turn_idx": 1, "headers": {"x-toolsentry-repairs": "0"}}],
        "channels": {},
    }
    return simulation


def run_of(tmp_path: Path, name: str, simulations: list[dict[str, Any]]) -> RunAnalysis:
    data = results([through_proxy(s) for s in simulations], model=f"sim-{name}")
    data["info"]["toolsentry"] = {"arm": name}
    (run,) = load_runs([write(tmp_path / f"{name}.json", data)], resamples=200)
    return run


def test_the_headline_quotes_the_proxys_budget_curve_and_what_repair_recovers(
    tmp_path: Path,
) -> None:
    clean = [episode(str(i)) for i in range(4)]
    # Task 0 leaks a call (proxy count 1), task 1 leaks one and fails a tool (2), task 2 fails
    # two tools (2), task 3 is clean.
    damaged = [
        leaked("0"),
        leaked("1", calls=errors(1)),
        episode("2", errors(2)),
        episode("3"),
    ]
    arms = [("bf16", "off"), ("bf16", "reask"), ("int4", "off"), ("int4", "reask")]
    runs = [
        run_of(tmp_path, name, sims)
        for name, sims in zip(
            ["bf16", "bf16+repair", "int4", "int4+repair"],
            [clean, clean, damaged, clean],
            strict=True,
        )
    ]
    lines = headline(arms, runs)
    assert "proxy experienced-failure budget" in lines[0]
    # At k = 2 only tasks 0 and 3 survive the proxy's count (τ²-bench's would keep 0, 1 and 3).
    assert lines[1].startswith(
        "int4 against bf16: 100.0% vs 100.0% at max_errors 10 (+0.0 points); "
        "50.0% vs 100.0% at max_errors 2 (-50.0 points); 1.25 failures per episode against 0.00."
    )
    assert "repair for int4 at max_errors 2: 50.0% → 100.0%" in lines[-1]
    text = markdown("replay", ["preamble"], arms, runs)
    assert text.startswith("# replay\n\npreamble\n")
    assert "| int4 | 0.0 | 25.0 | 50.0 | " + " | ".join(["100.0"] * 8) + " |" in text
    assert "## Budget curve: τ²-bench tool-error budget" in text
    assert "## Failures the agent experienced (count)" in text
