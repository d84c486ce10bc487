"""The real agent clients the suite points at the proxy: the Codex CLI and Claude Code, pinned in
clients/package.json and installed by `make clients` into clients/node_modules.

`codex_bin()` and `claude_bin()` return the path of the installed binary; when it is missing the
calling test skips (fails under CI, see tests/require.py) saying how to install it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
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


def run_codex_exec(base_url: str, tmp_path: Path, prompt: str) -> subprocess.CompletedProcess[str]:
    """`codex exec PROMPT` with a private CODEX_HOME whose one provider is the Responses API at
    `base_url` (model `scripted-model`), in an empty working directory under `tmp_path`, with no
    approval or sandbox prompts; its exit, output and error text."""
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(
        'model = "scripted-model"\n'
        'model_provider = "toolsentry"\n'
        "[model_providers.toolsentry]\n"
        'name = "toolsentry"\n'
        f'base_url = "{base_url}"\n'
        'wire_api = "responses"\n'
        'env_key = "TS_KEY"\n'
    )
    work = tmp_path / "work"
    work.mkdir()
    return subprocess.run(
        [
            str(codex_bin()),
            "exec",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "--cd",
            str(work),
            prompt,
        ],
        env={**os.environ, "CODEX_HOME": str(home), "TS_KEY": "unused", "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def claude_bin() -> Path:
    """The pinned Claude Code (its native binary)."""
    return _client_bin("claude", "claude", "@anthropic-ai/claude-code")


def run_claude_print(
    base_url: str, tmp_path: Path, prompt: str, *options: str
) -> subprocess.CompletedProcess[str]:
    """`claude -p PROMPT --model claude-sonnet-4-5 --max-turns 5 --allowedTools Bash OPTIONS`
    against the Messages API at `base_url` (the proxy's root), with a private HOME and no
    traffic of its own, in an empty working directory `tmp_path/work`; its exit, output and
    error text."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "any-key",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    command = [str(claude_bin()), "-p", prompt, "--model", "claude-sonnet-4-5"]
    command += ["--max-turns", "5", "--allowedTools", "Bash", *options]
    return subprocess.run(
        command, cwd=work, env=env, capture_output=True, text=True, timeout=240, check=False
    )
