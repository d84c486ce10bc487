"""The pinned real agent clients are installed (make clients) and run with no network."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.clients import claude_bin, codex_bin, pinned_version


def _version(binary: Path, home: Path) -> str:
    result = subprocess.run(
        [str(binary), "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={"HOME": str(home), "PATH": os.environ["PATH"], "DISABLE_AUTOUPDATER": "1"},
    )
    return result.stdout.strip()


def test_the_installed_codex_cli_is_the_pinned_version(tmp_path: Path) -> None:
    assert _version(codex_bin(), tmp_path) == f"codex-cli {pinned_version('@openai/codex')}"


def test_the_installed_claude_code_is_the_pinned_version(tmp_path: Path) -> None:
    pinned = pinned_version("@anthropic-ai/claude-code")
    assert _version(claude_bin(), tmp_path) == f"{pinned} (Claude Code)"
