"""The real agent clients the suite points at the proxy: the Codex CLI and Claude Code, pinned in
clients/package.json and installed by `make clients` into clients/node_modules.

`codex_bin()` and `claude_bin()` return the path of the installed binary; when it is missing the
calling test skips (fails under CI, see tests/require.py) saying how to install it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from tests.require import require

REPO = Path(__file__).resolve().parents[1]
CLIENTS = REPO / "clients"
BIN = CLIENTS / "node_modules" / ".bin"

INSTALL_HINT = (
    "run `make clients` (it needs Node.js and npm; scripts/system-deps installs them or says how)"
)


def pinned_version(package: str) -> str:
    """The version of `package` that clients/package.json pins."""
    manifest = json.loads((CLIENTS / "package.json").read_text(encoding="utf-8"))
    version: str = manifest["dependencies"][package]
    return version


def _client_bin(component: str, name: str, package: str) -> Path:
    path = BIN / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        require(
            component,
            f"{package}@{pinned_version(package)} is not installed at "
            f"{path.relative_to(REPO)}: {INSTALL_HINT}",
        )
    return path


def codex_bin() -> Path:
    """The pinned Codex CLI (a Node.js launcher of its native binary, so `node` must be on PATH)."""
    if shutil.which("node") is None:
        require("node", f"Node.js is not on PATH, and the Codex CLI runs on it: {INSTALL_HINT}")
    return _client_bin("codex", "codex", "@openai/codex")


def claude_bin() -> Path:
    """The pinned Claude Code (its native binary)."""
    return _client_bin("claude", "claude", "@anthropic-ai/claude-code")
