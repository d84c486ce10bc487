"""The GPU deployment in examples/ is self-consistent: every file parses, every mount exists, every
query names a series the running proxy exposes on /metrics (scraped live, after traffic that makes
each series appear), the alert rules pass `promtool check rules`, and `promtool test rules` makes
each alert fire (tests/examples/alerts_test.yml)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from proxy.app import create_app
from proxy.config import Settings, load_settings
from proxy.metrics import Metrics, ShadowMetrics
from proxy.testing import Fault, LoopbackServer, ScriptedUpstream, completion, tool_call
from tests.proxy.metrics_text import samples
from tests.require import require

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ALERTS_TEST = Path(__file__).with_name("alerts_test.yml")
PROMTOOL_MISSING = (
    "promtool is not installed: install Debian's package prometheus (apt-get install prometheus, "
    "or run scripts/system-deps) to check and test the alert rules"
)

SELECTOR = re.compile(r"\b(toolsentry_[a-z_]+)(?:\{([^}]*)\})?")
MATCHER = re.compile(r'\b([a-z_]+)\s*(=~|!=|!~|=)\s*"([^"]*)"')
GROUPING = re.compile(r"\bby\s*\(([^)]*)\)")
# Labels whose values are the deployment's own (the served model names); others have the values
# the proxy uses (channels, outcomes, results, statuses), so a misspelt one matches nothing.
FREE_LABELS = {"model"}
# Grafana's template variables, as Grafana would substitute them before sending a query.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__range": "1h", "$model": ".*"}


def declared_only() -> set[str]:
    """Sample names of the families proxy/metrics.py declares that a running app does not expose.

    The shadow comparison's families are defined there but not wired into the app yet, so no
    scrape can show them; their names are checked against the declaration, their labels not.
    """
    metrics = Metrics()
    ShadowMetrics(metrics)
    declared = {
        name + suffix
        for name, _ in re.findall(r"^# TYPE (\S+) (\S+)$", metrics.render().decode(), re.M)
        for suffix in ("", "_total")
    }
    return {name for name in declared if name.startswith("toolsentry_shadow_")}


class Exposed:
    """What a live /metrics page exposes: per sample name, the labels and the values seen."""

    def __init__(self, text: str) -> None:
        self.labels: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        for name, labels, _ in samples(text):
            for label, value in labels.items():
                self.labels[name][label].add(value)
        self.names_only = declared_only() - set(self.labels)

    def check_query(self, expr: str) -> None:
        """Assert every series `expr` selects, matches and groups by is on the page."""
        selectors = SELECTOR.findall(expr)
        assert selectors, f"no toolsentry metric in {expr!r}"
        grouping_allowed: set[str] = set()
        if all(name in self.names_only for name, _ in selectors):
            return  # nothing on the page to compare labels with (see declared_only)
        for name, matchers in selectors:
            if name in self.names_only:
                continue
            assert name in self.labels, f"{expr!r} names {name}, not on the proxy's /metrics"
            have = self.labels[name]
            grouping_allowed |= set(have)
            for label, op, value in MATCHER.findall(matchers):
                assert label in have, f"{expr!r}: {name} has no label {label} (it has {set(have)})"
                if op == "=" and label not in FREE_LABELS:
                    assert value in have[label], (
                        f"{expr!r}: {name}{{{label}={value!r}}} never appears; seen {have[label]}"
                    )
        for group in GROUPING.findall(expr):
            used = {label.strip() for label in group.split(",") if label.strip()}
            assert used <= grouping_allowed, f"{expr!r} groups by {used - grouping_allowed}"


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_order_status",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def exposed() -> Exposed:
    """The proxy's /metrics after traffic that makes every series the examples query appear."""
    valid = completion(tool_calls=[tool_call("get_order_status", {"order_id": "#W1"})])
    unknown = completion(tool_calls=[tool_call("get_weather", {"city": "Paris"})])
    script = ScriptedUpstream(
        # valid; unknown then repaired; unknown three times (two re-asks fail); upstream down
        replies=[valid, unknown, valid, unknown, unknown, unknown, Fault(500)]
    )
    with LoopbackServer(script.app) as upstream:
        settings = Settings(
            upstreams=[{"name": "scripted", "base_url": f"{upstream.url}/v1"}],
            max_errors=1,
            retries=0,
        )
        with (
            LoopbackServer(create_app(settings, environ={})) as proxy,
            openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0) as client,
        ):
            statuses = []
            # the last session's one unrepaired call spends its budget of 1, so its next request is refused
            for session in ("valid", "repaired", "unrepaired", "unrepaired", "down"):
                try:
                    client.chat.completions.create(
                        model="scripted-model",
                        messages=[{"role": "user", "content": "Where is my order?"}],
                        tools=TOOLS,  # type: ignore[arg-type]
                        extra_headers={"x-session-id": session},
                    )
                    statuses.append(200)
                except openai.APIStatusError as exc:
                    statuses.append(exc.status_code)
            assert statuses == [200, 200, 200, 429, 500]
            text = httpx.get(f"{proxy.url}/metrics", timeout=10).text
    return Exposed(text)


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        require("promtool", PROMTOOL_MISSING)
    return found


def run_promtool(*args: str, cwd: Path) -> str:
    result = subprocess.run(
        [promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def load_yaml(relative: str) -> Any:
    return yaml.safe_load((EXAMPLES / relative).read_text(encoding="utf-8"))


def alert_rules() -> list[dict[str, Any]]:
    return [
        rule for group in load_yaml("prometheus/alerts.yml")["groups"] for rule in group["rules"]
    ]


def dashboard_queries() -> list[str]:
    dashboard = json.loads(
        (EXAMPLES / "grafana/dashboards/toolsentry.json").read_text(encoding="utf-8")
    )
    return [
        target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])
    ]  # a row has no targets


def compose() -> dict[str, Any]:
    data = load_yaml("docker-compose.yml")
    assert isinstance(data, dict)
    return data


def command_flags(service: dict[str, Any]) -> dict[str, str]:
    flags: dict[str, str] = {}
    for item in service["command"]:
        key, _, value = item.partition("=")
        flags[key] = value
    return flags


def test_compose_runs_an_awq_and_a_full_precision_vllm_with_hermes_tool_calls() -> None:
    services = compose()["services"]

    awq, bf16 = command_flags(services["vllm-awq"]), command_flags(services["vllm-bf16"])

    assert awq["--quantization"] == "awq"
    assert awq["--model"].endswith("-AWQ")
    assert "--quantization" not in bf16
    assert bf16["--model"] == awq["--model"].removesuffix("-AWQ")
    for flags in (awq, bf16):
        assert "--enable-auto-tool-choice" in flags
        assert flags["--tool-call-parser"] == "hermes"
    for name in ("vllm-awq", "vllm-bf16"):
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"]


def test_compose_starts_the_proxy_with_its_config_file_mounted() -> None:
    proxy = compose()["services"]["toolsentry"]

    assert proxy["command"] == ["toolsentry", "serve", "--config", "/etc/toolsentry/config.yaml"]
    assert "./toolsentry/config.yaml:/etc/toolsentry/config.yaml:ro" in proxy["volumes"]
    assert (EXAMPLES / proxy["build"]["context"] / proxy["build"]["dockerfile"]).is_file()


def test_every_file_compose_mounts_exists() -> None:
    for name, service in compose()["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (EXAMPLES / source).exists(), f"{name} mounts missing {source}"


def test_proxy_config_routes_each_served_model_to_its_vllm() -> None:
    services = compose()["services"]
    config = load_yaml("toolsentry/config.yaml")

    routes = {
        model: upstream["base_url"]
        for upstream in config["upstreams"]
        for model in upstream["models"]
    }

    for name in ("vllm-awq", "vllm-bf16"):
        served = command_flags(services[name])["--served-model-name"]
        assert routes[served] == f"http://{name}:8000/v1"
    for upstream in config["upstreams"]:
        assert set(upstream) == {
            "name",
            "base_url",
            "api_key_env",
            "models",
            "timeout",
            "max_connections",
        }
    assert config["repair"] in ("reask", "off")
    assert isinstance(config["max_errors"], int)


def test_proxy_config_is_accepted_by_the_proxys_own_settings() -> None:
    settings = load_settings(config_file=EXAMPLES / "toolsentry" / "config.yaml")

    assert [u.name for u in settings.upstreams] == ["vllm-awq", "vllm-bf16"]


def test_prometheus_scrapes_the_proxy_and_both_vllms_and_loads_the_alerts() -> None:
    config = load_yaml("prometheus/prometheus.yml")
    mounts = compose()["services"]["prometheus"]["volumes"]

    targets = {
        target
        for job in config["scrape_configs"]
        for group in job["static_configs"]
        for target in group["targets"]
    }

    assert targets == {"toolsentry:8000", "vllm-awq:8000", "vllm-bf16:8000"}
    for rule_file in config["rule_files"]:
        assert any(mount.split(":")[1] == rule_file for mount in mounts)


def test_alert_rules_cover_hallucination_budgets_and_repairs_with_exposed_series(
    exposed: Exposed,
) -> None:
    rules = alert_rules()

    for rule in rules:
        exposed.check_query(rule["expr"])
        assert rule["annotations"]["summary"]
    exprs = " ".join(rule["expr"] for rule in rules)
    assert 'channel="unknown_tool"' in exprs
    assert "toolsentry_budget_exhausted_total" in exprs
    assert 'result="failure"' in exprs
    assert all("by (model" in rule["expr"] for rule in rules)


def test_the_alert_rules_pass_promtool_check() -> None:
    out = run_promtool("check", "rules", str(EXAMPLES / "prometheus" / "alerts.yml"), cwd=EXAMPLES)
    assert f"SUCCESS: {len(alert_rules())} rules found" in out


def test_promtool_makes_each_alert_fire_on_synthetic_series_the_proxy_exposes(
    exposed: Exposed,
) -> None:
    # This file tests the proxy's alerts; examples/prometheus/alerts_test.yml the shadow alert.
    files = [ALERTS_TEST, EXAMPLES / "prometheus" / "alerts_test.yml"]
    tests = [t for f in files for t in yaml.safe_load(f.read_text(encoding="utf-8"))["tests"]]
    fired = {
        case["alertname"]
        for test in tests
        for case in test["alert_rule_test"]
        if case["exp_alerts"]
    }
    assert fired == {rule["alert"] for rule in alert_rules()}
    for test in tests:
        for series in test["input_series"]:
            exposed.check_query(series["series"])

    out = run_promtool("test", "rules", ALERTS_TEST.name, cwd=ALERTS_TEST.parent)
    assert "SUCCESS" in out


def test_grafana_dashboard_queries_only_exposed_series_through_the_provisioned_datasource(
    exposed: Exposed,
) -> None:
    dashboard = json.loads(
        (EXAMPLES / "grafana/dashboards/toolsentry.json").read_text(encoding="utf-8")
    )
    datasource = load_yaml("grafana/provisioning/datasources/prometheus.yml")["datasources"][0]
    provider = load_yaml("grafana/provisioning/dashboards/toolsentry.yml")["providers"][0]

    panels = dashboard["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels)
    for panel in panels:
        assert panel["datasource"]["uid"] == datasource["uid"]
    for expr in dashboard_queries():
        exposed.check_query(expr)
    titles = " ".join(panel["title"] for panel in panels).lower()
    for topic in ("by channel", "repair success", "budget", "overhead"):
        assert topic in titles
    grafana_mounts = compose()["services"]["grafana"]["volumes"]
    assert any(m.endswith(":" + provider["options"]["path"] + ":ro") for m in grafana_mounts)


def test_grafana_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    # promtool parses PromQL only in rule files: each query becomes a recording rule.
    rules = []
    for number, expr in enumerate(dashboard_queries()):
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        rules.append({"record": f"dashboard:query_{number}", "expr": expr})
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))

    out = run_promtool("check", "rules", str(path), cwd=tmp_path)
    assert f"SUCCESS: {len(rules)} rules found" in out


def test_compose_starts_the_published_proxy_with_an_admin_key_prometheus_scrapes_with() -> None:
    services = compose()["services"]
    proxy = services["toolsentry"]
    settings = load_settings(config_file=EXAMPLES / "toolsentry" / "config.yaml")
    published = [p for p in proxy["ports"] if str(p).count(":") == 1]  # on every interface
    # Published beyond loopback, so the proxy refuses to start without an admin key (issue 32):
    # compose requires one from the environment and hands the same to Prometheus as a secret.
    assert published
    assert settings.host == "0.0.0.0"
    assert proxy["environment"]["TOOLSENTRY_ADMIN_KEY"].startswith("${TOOLSENTRY_ADMIN_KEY:?")
    assert compose()["secrets"]["toolsentry_admin_key"] == {"environment": "TOOLSENTRY_ADMIN_KEY"}
    assert "toolsentry_admin_key" in services["prometheus"]["secrets"]
    job = next(
        j
        for j in load_yaml("prometheus/prometheus.yml")["scrape_configs"]
        if j["job_name"] == "toolsentry"
    )
    assert job["authorization"]["credentials_file"] == "/run/secrets/toolsentry_admin_key"
