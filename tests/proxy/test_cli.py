"""The `toolsentry` command line: help, config checking, and a real `serve` process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
from typer.testing import CliRunner

from proxy.cli import app
from proxy.testing import completion, unused_socket
from tests.processes import port_options, reported_port, stop_process, tail
from tests.proxy.builders import make_request
from tests.proxy.conftest import RunningUpstream

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]


def test_serve_help_documents_every_option() -> None:
    result = runner.invoke(app, ["serve", "--help"], env={"COLUMNS": "200", "TERM": "dumb"})
    assert result.exit_code == 0
    for option in (
        "--upstream",
        "--config",
        "--host",
        "--port",
        "--port-file",
        "--workers",
        "--store",
        "--max-errors",
        "--repair",
        "--log-level",
    ):
        assert option in result.output
    assert "TOOLSENTRY_MAX_ERRORS" in result.output


def test_check_config_prints_resolved_settings_with_secrets_masked(tmp_path: Path) -> None:
    config = tmp_path / "toolsentry.yaml"
    config.write_text(
        "upstreams:\n  - name: vllm\n    base_url: http://127.0.0.1:8001/v1\n    models: [qwen]\n"
        "max_errors: 3\nadmin_key: hunter2\nrepair: off\n"
    )
    result = runner.invoke(app, ["check-config", str(config)])
    assert result.exit_code == 0, result.output
    resolved = json.loads(result.stdout)
    assert resolved["max_errors"] == 3
    assert resolved["repair"] == "off"
    assert resolved["upstreams"][0]["models"] == ["qwen"]
    assert "hunter2" not in result.output


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("max_errors: [1\n", "not valid YAML"),
        ("- a\n- b\n", "must be a mapping"),
        ("upstreams:\n  - name: x\n    base_url: ftp://nope\n", "base_url must start with http"),
        ("upstreams: [{name: x, base_url: 'http://h/v1'}]\nmax_errors: 0\n", "max_errors"),
        ("upstreams: [{name: x, base_url: 'http://h/v1'}]\nbogus: 1\n", "bogus"),
    ],
)
def test_check_config_rejects_bad_files_with_a_clear_message(
    tmp_path: Path, text: str, expected: str
) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    result = runner.invoke(app, ["check-config", str(config)])
    assert result.exit_code == 2
    assert expected in result.output
    assert "Traceback" not in result.output


def test_serve_refuses_several_workers_on_the_memory_store() -> None:
    result = runner.invoke(app, ["serve", "--upstream", "http://127.0.0.1:9/v1", "--workers", "2"])
    assert result.exit_code == 2
    assert "shared session store" in result.output


def test_serve_workers_auto_counts_the_cpus_its_affinity_allows() -> None:
    serve = [sys.executable, "-m", "proxy.cli", "serve", "--upstream", "http://127.0.0.1:9/v1"]
    one_cpu = ["taskset", "-c", str(min(os.sched_getaffinity(0)))]
    printed = subprocess.run(
        [*one_cpu, *serve, "--workers", "auto", "--print-settings"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=180,
        check=True,
    )
    assert json.loads(printed.stdout)["workers"] == 1


def test_serve_without_an_upstream_says_how_to_give_one() -> None:
    result = runner.invoke(app, ["serve"], env={"TOOLSENTRY_UPSTREAM": ""})
    assert result.exit_code == 2
    assert "--upstream" in result.output


def test_serve_on_port_0_reports_the_port_it_listens_on_and_serves_there(
    upstream: RunningUpstream, tmp_path: Path
) -> None:
    port_file, log_path = tmp_path / "serve.port", tmp_path / "serve.log"
    log = log_path.open("wb")
    process = subprocess.Popen(
        [
            sys.executable, "-m", "proxy.cli", "serve", "--upstream", upstream.base_url,
            *port_options(port_file), "--max-errors", "4",
        ],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        port = reported_port(process, port_file, tail(log_path))
        assert port != 0
        # The socket listens before the port is reported: the first request is never refused.
        upstream.script.push(completion("through a real process"))
        with openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0, timeout=60
        ) as client:
            raw = client.chat.completions.with_raw_response.create(**make_request())
        assert raw.parse().choices[0].message.content == "through a real process"
        assert raw.headers["x-toolsentry-max-errors"] == "4"
        # The startup line names the same URL.
        startup = log_path.read_text().splitlines()[0]
        assert f"on http://127.0.0.1:{port}/v1 → {upstream.base_url}" in startup
    finally:
        stop_process(process, timeout=20)
        log.close()


def test_serve_on_a_port_in_use_says_so_and_exits_2(tmp_path: Path) -> None:
    with unused_socket() as taken:
        taken.listen()
        port = taken.getsockname()[1]
        result = runner.invoke(
            app,
            ["serve", "--upstream", "http://127.0.0.1:9/v1", "--port", str(port),
             "--port-file", str(tmp_path / "p")],
        )  # fmt: skip
    assert result.exit_code == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.output
    assert not (tmp_path / "p").exists()


@pytest.mark.redis
def test_serve_with_workers_on_redis_sums_metrics_and_removes_their_directory(
    upstream: RunningUpstream, tmp_path: Path, redis_url: str
) -> None:
    from tests.proxy.metrics_text import metric
    from tests.proxy.system.support import ProxyProcess

    upstream.script.push(completion("from a worker"))
    proxy = ProxyProcess(
        upstream.base_url, tmp_path / "serve.log", "--workers", "2", "--store", redis_url
    ).wait_ready()
    try:
        for _ in range(6):  # a new connection each, so both workers may serve
            httpx.post(f"{proxy.url}/v1/chat/completions", json=make_request(), timeout=30)
        files = proxy.worker_metric_files()
        children = Path(f"/proc/{proxy.process.pid}/task/{proxy.process.pid}/children")
        worker = children.read_text().split()[0]
        environ = Path(f"/proc/{worker}/environ").read_bytes().split(b"\0")
        directory = next(e for e in environ if e.startswith(b"PROMETHEUS_MULTIPROC_DIR="))
        metrics_dir = Path(directory.split(b"=", 1)[1].decode())
        text = proxy.metrics()
    finally:
        proxy.stop()
    assert any(f.startswith("counter_") for f in files)
    assert (
        metric(text, "toolsentry_requests_total", api="chat", model="scripted-model", status="200")
        == 6
    )
    assert not metrics_dir.exists()
