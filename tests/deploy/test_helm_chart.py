"""The Helm chart in deploy/helm/toolsentry, through Helm's own engine (helm-python-sdk binds
Helm v4's Go SDK: the `helm lint` and `helm template` code, no binary): it lints clean, renders
manifests that validate against the Kubernetes API's schemas (kubernetes-validate, strict: an
unknown field fails), starts the proxy with an admin key from a Secret, a shared store and the
project's own alert rules, refuses values that cannot work with a message saying what to set, and
writes a configuration the proxy's own CLI accepts.

No cluster runs here: what a cluster would add (scheduling, probes answered, the Prometheus
Operator reading its objects) is not tested.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "toolsentry"
# The oldest Kubernetes the chart declares (Chart.yaml kubeVersion) and the newest the
# validator knows.
KUBE_VERSIONS = ("1.25.0", kubernetes_validate.utils.latest_version())
ADMIN = {"adminKey": {"value": "admin-secret"}}
EVERYTHING = {
    **ADMIN,
    "replicaCount": 3,
    "upstreams": [
        {
            "name": "vllm-awq",
            "base_url": "http://vllm-awq:8000/v1",
            "models": ["qwen-awq"],
            "apiKeySecret": {"name": "vllm-keys", "key": "awq"},
        },
        {"name": "vllm-bf16", "base_url": "http://vllm-bf16:8000/v1", "models": ["qwen-bf16"]},
    ],
    "clientKeys": {"existingSecret": "agent-keys"},
    "store": {"type": "redis", "redis": {"persistence": {"enabled": True, "size": "2Gi"}}},
    "config": {"max_errors": 2, "repair": "reask", "exhaustion_policy": "finish"},
    "env": [{"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://collector:4318"}],
    "autoscaling": {"enabled": True, "maxReplicas": 6},
    "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
    "prometheusRule": {"enabled": True},
}


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    """The chart's manifests for `values`, as `helm template` writes them."""
    with helm.Chart.load(CHART) as chart:
        files = chart.render(values, name="ts", namespace="agents")
    return [
        doc
        for name, text in sorted(files.items())
        if name.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def kind(manifests: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [m for m in manifests if m["kind"] == name]


def one(manifests: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (found,) = kind(manifests, name)
    return found


def proxy_container(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_the_chart_lints_without_warnings() -> None:
    for values in (None, ADMIN, EVERYTHING):
        report = helm.lint(CHART, values, strict=True)
        assert report["errors"] == [], report
        assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


@pytest.mark.parametrize("values", [ADMIN, EVERYTHING], ids=["defaults", "everything"])
@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_every_rendered_manifest_validates_against_the_kubernetes_schemas(
    values: dict[str, Any], version: str
) -> None:
    manifests = render(values)
    built_in = [m for m in manifests if not m["apiVersion"].startswith("monitoring.coreos.com")]
    assert {m["kind"] for m in built_in} >= {"Deployment", "Service", "ConfigMap", "Secret"}
    for manifest in built_in:
        kubernetes_validate.validate(manifest, version, strict=True)


def test_the_proxy_runs_non_root_on_a_read_only_root_with_health_and_readiness_probes() -> None:
    manifests = render(ADMIN)
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    container = proxy_container(manifests)
    # The image's own user (Dockerfile: useradd --uid 10001).
    dockerfile = (REPO / "Dockerfile").read_text(encoding="utf-8")
    uid = dockerfile.split("--uid ", 1)[1].split()[0]
    assert pod["securityContext"]["runAsUser"] == int(uid)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_the_admin_key_comes_from_a_secret_and_the_scrape_uses_it() -> None:
    manifests = render(EVERYTHING)
    admin = env_of(proxy_container(manifests))["TOOLSENTRY_ADMIN_KEY"]["secretKeyRef"]
    secret = one(manifests, "Secret")
    assert secret["metadata"]["name"] == admin["name"]
    assert base64.b64decode(secret["data"][admin["key"]]).decode() == "admin-secret"
    endpoint = one(manifests, "ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint["path"] == "/metrics"
    assert endpoint["authorization"]["credentials"] == admin
    # The monitor selects the proxy's Service by its port's name.
    service = next(
        s for s in kind(manifests, "Service") if not s["metadata"]["name"].endswith("redis")
    )
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert one(manifests, "ServiceMonitor")["spec"]["selector"]["matchLabels"].items() <= (
        service["metadata"]["labels"].items()
    )


def test_an_existing_admin_secret_is_used_and_none_is_created() -> None:
    manifests = render({"adminKey": {"existingSecret": "ops-admin", "secretKey": "token"}})
    admin = env_of(proxy_container(manifests))["TOOLSENTRY_ADMIN_KEY"]["secretKeyRef"]
    assert admin == {"name": "ops-admin", "key": "token"}
    assert kind(manifests, "Secret") == []


def test_the_alert_rules_are_the_projects_own() -> None:
    rule = one(render(EVERYTHING), "PrometheusRule")
    alerts = yaml.safe_load((REPO / "examples" / "prometheus" / "alerts.yml").read_text())
    assert rule["spec"] == alerts


def test_replicas_share_the_charts_redis_which_only_the_proxy_reaches() -> None:
    manifests = render(EVERYTHING)
    store = env_of(proxy_container(manifests))["TOOLSENTRY_STORE"]
    (redis,) = [s for s in kind(manifests, "Service") if s["metadata"]["name"].endswith("redis")]
    assert store == f"redis://{redis['metadata']['name']}:6379/0"
    statefulset = one(manifests, "StatefulSet")
    args = statefulset["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--appendfsync") + 1] == "always"
    assert statefulset["spec"]["volumeClaimTemplates"][0]["spec"]["resources"] == {
        "requests": {"storage": "2Gi"}
    }
    policy = one(manifests, "NetworkPolicy")
    proxy_labels = one(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    (allowed,) = policy["spec"]["ingress"][0]["from"]
    assert allowed["podSelector"]["matchLabels"] == proxy_labels
    # The HPA owns the replica count; the PDB keeps one pod through a drain.
    assert "replicas" not in one(manifests, "Deployment")["spec"]
    assert one(manifests, "HorizontalPodAutoscaler")["spec"]["maxReplicas"] == 6
    assert one(manifests, "PodDisruptionBudget")["spec"]["minAvailable"] == 1


def test_an_external_redis_url_comes_from_a_secret() -> None:
    values = {
        **ADMIN,
        "store": {
            "type": "redis",
            "redis": {"internal": False, "external": {"existingSecret": "redis-url"}},
        },
    }
    manifests = render(values)
    store = env_of(proxy_container(manifests))["TOOLSENTRY_STORE"]
    assert store == {"secretKeyRef": {"name": "redis-url", "key": "url"}}
    assert kind(manifests, "StatefulSet") == []


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({}, "adminKey: set adminKey.existingSecret"),
        ({**ADMIN, "store": {"type": "memory"}}, "store.type memory keeps each pod's sessions"),
        (
            {**ADMIN, "store": {"type": "redis", "redis": {"internal": False}}},
            "store.redis.external.existingSecret",
        ),
        ({**ADMIN, "replicas": 2}, "additional properties 'replicas' not allowed"),
        ({**ADMIN, "config": {"store": "memory"}}, "config"),
    ],
    ids=[
        "no-admin-key",
        "memory-store-with-replicas",
        "external-redis-without-url",
        "unknown-key",
        "config-overrides-chart",
    ],
)
def test_values_that_cannot_work_are_refused_saying_what_to_set(
    values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmError) as refused:
        render(values)
    assert message in str(refused.value)


@pytest.fixture
def rendered_config(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """EVERYTHING's config file on disk and the proxy's environment as the pod would have it
    (the Secrets it names given values here)."""
    manifests = render(EVERYTHING)
    config = tmp_path / "config.yaml"
    config.write_text(one(manifests, "ConfigMap")["data"]["config.yaml"], encoding="utf-8")
    secrets = {
        ("ts-toolsentry-admin", "admin-key"): "admin-secret",
        ("agent-keys", "api-keys"): json.dumps([{"name": "agent-1", "key": "sk-agent-1"}]),
        ("vllm-keys", "awq"): "sk-upstream",
    }
    environ = {}
    for name, value in env_of(proxy_container(manifests)).items():
        if isinstance(value, dict):
            ref = value["secretKeyRef"]
            value = secrets[ref["name"], ref["key"]]
        environ[name] = value
    return config, environ


def test_the_rendered_configuration_is_what_the_proxy_runs_with(
    rendered_config: tuple[Path, dict[str, str]],
) -> None:
    config, environ = rendered_config
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLSENTRY_", "OTEL_"))}
    printed = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "serve", "--config", str(config), "--print-settings"],
        env={**clean, **environ},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert printed.returncode == 0, printed.stderr
    settings = json.loads(printed.stdout)
    assert settings["host"] == "0.0.0.0"
    assert settings["store"] == "redis://ts-toolsentry-redis:6379/0"
    assert settings["max_errors"] == 2
    assert settings["exhaustion_policy"] == "finish"
    assert [u["name"] for u in settings["upstreams"]] == ["vllm-awq", "vllm-bf16"]
    assert settings["upstreams"][0]["api_key_env"] == "TOOLSENTRY_UPSTREAM_KEY_0"
    assert environ["TOOLSENTRY_UPSTREAM_KEY_0"] == "sk-upstream"
    assert [k["name"] for k in settings["api_keys"]] == ["agent-1"]
    assert settings["admin_key"] != "admin-secret"  # set, and masked when printed
    assert settings["admin_key"]
