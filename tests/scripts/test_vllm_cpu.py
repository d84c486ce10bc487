"""Tests for scripts/vllm_cpu.py: finding the vLLM server of `scripts/vllm-cpu`, with a fake
`vllm-cpu` that answers `status` as the real one does."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts import vllm_cpu
from scripts.vllm_cpu import find_vllm


def fake_vllm_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    path = tmp_path / "vllm-cpu"
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)
    monkeypatch.setattr(vllm_cpu, "VLLM_CPU", path)
    monkeypatch.delenv("TOOLSENTRY_VLLM_URL", raising=False)


def test_the_url_in_the_environment_is_taken_as_it_is_without_a_trailing_slash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_vllm_cpu(tmp_path, monkeypatch, "exit 1")
    monkeypatch.setenv("TOOLSENTRY_VLLM_URL", "http://127.0.0.1:9/v1/")
    assert find_vllm() == ("http://127.0.0.1:9/v1", "")


def test_a_running_server_is_the_last_line_that_status_prints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_vllm_cpu(tmp_path, monkeypatch, "echo 'running (pid 7)'\necho http://127.0.0.1:8/v1/")
    assert find_vllm() == ("http://127.0.0.1:8/v1", "")


def test_a_stopped_server_is_none_with_what_status_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_vllm_cpu(tmp_path, monkeypatch, "echo 'not running' >&2\nexit 3")
    assert find_vllm() == (None, "not running")
    fake_vllm_cpu(tmp_path, monkeypatch, "exit 2")
    assert find_vllm() == (None, "scripts/vllm-cpu status exited 2")
