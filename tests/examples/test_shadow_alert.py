"""The shadow alert (examples/prometheus/alerts.yml) under Prometheus's own rule tester."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from tests.require import require

PROMETHEUS = Path(__file__).resolve().parents[2] / "examples" / "prometheus"


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        require(
            "promtool",
            "promtool is not installed: install Debian's package prometheus "
            "(apt-get install prometheus) to test the alert rules",
        )
    assert found is not None
    return found


def promtool_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args],
        cwd=PROMETHEUS,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_unknown_tool_ratio_alert_fires_at_twice_the_reference_for_15_minutes() -> None:
    # alerts_test.yml: 4× fires, +Inf (a reference without any) fires, 1.5× and a trickle of
    # 30 pairs do not; nothing fires before the 15 minutes are up.
    result = promtool_run("test", "rules", "alerts_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_alert_rules_load_in_prometheus() -> None:
    result = promtool_run("check", "rules", "alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_dashboard_has_a_shadow_row_with_outcomes_and_the_rate_ratio() -> None:
    dashboard = json.loads(
        (PROMETHEUS.parent / "grafana" / "dashboards" / "toolsentry.json").read_text("utf-8")
    )
    panels = dashboard["panels"]
    (row,) = [p for p in panels if p["type"] == "row" and "Shadow" in p["title"]]
    below = [p for p in panels if p["gridPos"]["y"] > row["gridPos"]["y"]]
    exprs = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in below}
    outcomes = next(e for t, e in exprs.items() if "outcomes" in t)
    assert "by (model, reference, outcome)" in outcomes
    assert "toolsentry_shadow_pairs_total" in outcomes
    ratio = next(e for t, e in exprs.items() if "rate ratio" in t)
    assert 'side="primary"' in ratio
    assert 'side="reference"' in ratio
    assert "by (model, reference, channel)" in ratio
