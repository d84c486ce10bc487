"""The real Claude Code through the proxy: its first tool call names a tool that does not exist, the
proxy re-asks in Messages form, Claude Code runs the repaired `Bash` call and finishes with text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from proxy.testing import answer, call
from tests.clients import run_claude_print
from tests.proxy.conftest import RunningProxy, RunningUpstream

MARKER = "toolsentry-was-here"
DONE = "The marker file is written."


def tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The `tool_result` blocks of a Messages request, in order."""
    return [
        block
        for message in body.get("messages") or []
        if isinstance(message.get("content"), list)
        for block in message["content"]
        if isinstance(block, dict) and block.get("type") == "tool_result"
    ]


class ClaudeCodeScript:
    """The scripted model of the episode: a tool that does not exist, then (told so) `Bash`, then,
    with the command's output, a closing text. Requests without tools (Claude Code's own: titles,
    checks) get a short text."""

    def __init__(self) -> None:
        self.tool_requests = 0

    def __call__(self, body: dict[str, Any]) -> Any:
        if not body.get("tools"):
            return answer("Marker file")
        self.tool_requests += 1
        results = tool_results(body)
        if not results:
            return answer(None, call("RunShell", {"cmd": f"echo {MARKER}"}, id="toolu_bad"))
        if all(r.get("tool_use_id") == "toolu_bad" for r in results):  # the proxy's re-ask
            command = f"echo {MARKER} > marker.txt && cat marker.txt"
            return answer(
                None, call("Bash", {"command": command, "description": "Write the marker"})
            )
        return answer(DONE)


def test_claude_code_runs_the_repaired_call_and_the_session_shows_one_repair(
    proxy: RunningProxy, upstream: RunningUpstream, tmp_path: Path
) -> None:
    script = ClaudeCodeScript()
    upstream.script.handler = script
    work = tmp_path / "work"
    done = run_claude_print(
        proxy.server.url, tmp_path, "Write the marker file.", "--output-format", "json"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["result"] == DONE
    assert (work / "marker.txt").read_text().strip() == MARKER  # the repaired Bash call ran
    sessions = {h.get("x-claude-code-session-id") for h in upstream.script.request_headers}
    (session,) = sessions
    assert session == result["session_id"]
    record = proxy.session(session)
    assert record["channels"] == {"unknown_tool": 1}
    assert (record["repairs"], record["errors"]) == (1, 0)
    assert all(q == "beta=true" for q in upstream.script.queries)
    reask = upstream.script.requests[1]
    assert reask["messages"][-1]["content"][0]["tool_use_id"] == "toolu_bad"


class FailingCommandScript:
    """A `Bash` call whose command fails (a missing directory), then, with Claude Code's report of
    the failure, a closing text; the reports it sent are kept."""

    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []

    def __call__(self, body: dict[str, Any]) -> Any:
        if not body.get("tools"):
            return answer("Listing")
        results = tool_results(body)
        if not results:
            command = "ls /nonexistent-toolsentry-dir"
            return answer(None, call("Bash", {"command": command, "description": "List it"}))
        self.reports = results
        return answer(DONE)


def test_a_failed_command_claude_code_reports_is_one_tool_error_in_the_session(
    proxy: RunningProxy, upstream: RunningUpstream, tmp_path: Path
) -> None:
    script = FailingCommandScript()
    upstream.script.handler = script
    done = run_claude_print(
        proxy.server.url, tmp_path, "List the directory.", "--output-format", "json"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # Claude Code's own report of the failure: one tool_result flagged is_error.
    (report,) = script.reports
    assert report["is_error"] is True
    session = json.loads(done.stdout)["session_id"]
    record = proxy.session(session)
    assert record["channels"] == {"tool_error": 1}
    assert record["errors"] == 1
