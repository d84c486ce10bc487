"""The recognisers of failed tool results, each with texts its client sends (the source file that
writes each text is named beside it), and the property that no successful result is counted."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.guard.tool_errors import (
    HEAD_CHARS,
    MAX_PATTERN_CHARS,
    Client,
    ToolErrorTable,
    agents_sdk_failed,
    codex_exec_failed,
    codex_refused,
    compile_pattern,
    identify_client,
    langchain_failed,
    mcp_result_failed,
    tool_error_pattern,
)

TABLE = ToolErrorTable("Error")


def judged(client: Client, text: str, flag: bool | None = None, api: str = "chat") -> bool:
    return TABLE.judge(client, api)(text, flag)


# codex-rs/core/src/tools/handlers/unified_exec.rs `format_response`
def unified_exec(output: str, exit_code: int | None = 0, *, chunk: str = "a1b2c3") -> str:
    lines = [f"Chunk ID: {chunk}", "Wall time: 0.0213 seconds"]
    if exit_code is not None:
        lines.append(f"Process exited with code {exit_code}")
    else:
        lines.append("Process running with session ID 1000")
    lines += ["Original token count: 12", "Output:", output]
    return "\n".join(lines)


# codex-rs/core/src/tools/mod.rs `format_exec_output_for_model_freeform`
def shell_freeform(output: str, exit_code: int = 0) -> str:
    return f"Exit code: {exit_code}\nWall time: 0.1 seconds\nOutput:\n{output}"


# codex-rs/core/src/tools/mod.rs `format_exec_output_for_model_structured` (serde_json, compact)
def shell_structured(output: str, exit_code: int = 0) -> str:
    payload = {"output": output, "metadata": {"exit_code": exit_code, "duration_seconds": 0.1}}
    return json.dumps(payload, separators=(",", ":"))


LS_MISSING = "ls: cannot access '/nonexistent': No such file or directory\n"


@pytest.mark.parametrize(
    "text",
    [
        unified_exec(LS_MISSING, 2),  # `ls /nonexistent` through exec_command
        unified_exec("", 1, chunk=""),  # no chunk id: the header starts at Wall time
        shell_freeform(LS_MISSING, 2),
        shell_freeform("command timed out after 10000 milliseconds\n", 124),
        shell_structured(LS_MISSING, 2),
        shell_structured("killed", -1),
    ],
)
def test_a_codex_command_with_a_non_zero_exit_is_a_failure(text: str) -> None:
    assert codex_exec_failed(text)
    assert judged(Client.CODEX, text)


@pytest.mark.parametrize(
    "text",
    [
        unified_exec("total 0\n"),
        unified_exec("still going\n", None),  # running on: no exit yet
        shell_freeform("ok\n"),
        shell_structured("ok\n"),
        # What the command printed never counts, only the header Codex wrote above it.
        unified_exec("Process exited with code 2\nExit code: 1\n"),
        unified_exec("Process exited with code 2\n", None),
        shell_freeform("Exit code: 7\n"),
        shell_structured('"metadata":{"exit_code":1,"duration_seconds":0.1}}'),
    ],
)
def test_a_codex_command_that_exited_zero_is_no_failure_whatever_it_printed(text: str) -> None:
    assert not codex_exec_failed(text)
    assert not judged(Client.CODEX, text)


@pytest.mark.parametrize(
    "text",
    [
        "unsupported call: run_shell_command",  # codex-rs/core/src/tools/registry.rs
        "unsupported custom tool call: apply_patchy",  # registry.rs
        "failed to parse exec_command arguments: missing field `cmd`",  # handlers/unified_exec.rs
        'exec_command failed: CreateProcess { message: "No such file" }',  # unified_exec.rs
        "rejected by user",  # tools/network_approval.rs, ToolError::Rejected
    ],
)
def test_a_call_codex_refused_to_run_is_a_failure(text: str) -> None:
    assert codex_refused(text)
    assert judged(Client.CODEX, text)


@pytest.mark.parametrize(
    "text",
    [
        # agents/tool.py default_tool_error_function (0.24) and its form before 0.1
        "An error occurred while running the tool. Please try again.",
        "An error occurred while running the tool. Please try again. Error: order not found",
        # agents/tool.py default_tool_timeout_error_message (f"{timeout_seconds:g}")
        "Tool 'get_order_status' timed out after 5 seconds.",
        "Tool 'get_order_status' timed out after 0.25 seconds.",
        # agents/run_internal/turn_resolution.py _default_tool_not_found_message
        "Tool 'check_order' not found.",
        # agents/tool.py DEFAULT_APPROVAL_REJECTION_MESSAGE
        "Tool execution was not approved.",
    ],
)
def test_the_agents_sdk_default_failure_texts_are_failures(text: str) -> None:
    assert agents_sdk_failed(text)
    assert judged(Client.AGENTS_SDK, text)
    assert judged(Client.OTHER, text)  # the SDK's LiteLLM model sends no SDK user agent


@pytest.mark.parametrize(
    "text",
    [
        # langgraph/prebuilt/tool_node.py TOOL_CALL_ERROR_TEMPLATE (repr of the exception)
        "Error: ValueError('order not found')\n Please fix your mistakes.",
        # ... INVALID_TOOL_NAME_ERROR_TEMPLATE
        "Error: check_order is not a valid tool, try one of [get_order_status, cancel_order].",
        # ... TOOL_INVOCATION_ERROR_TEMPLATE
        "Error invoking tool 'get_order_status' with kwargs {'id': 1} with error:\n"
        " order_id: Field required\n Please fix the error and try again.",
        # langchain_core/tools/base.py _handle_validation_error / _handle_tool_error defaults
        "Tool input validation error",
        "Tool execution error",
    ],
)
def test_langgraph_and_langchain_default_failure_texts_are_failures(text: str) -> None:
    assert langchain_failed(text)
    assert judged(Client.OTHER, text)
    assert ToolErrorTable("").judge(Client.OTHER, "chat")(text, None)  # with no prefix too


def test_an_mcp_result_passed_through_as_json_fails_by_its_is_error() -> None:
    # MCP schema.ts CallToolResult: {content: [...], isError?: boolean}
    failed = {"content": [{"type": "text", "text": "no such order"}], "isError": True}
    fine = {"content": [{"type": "text", "text": "delivered"}], "isError": False}
    assert mcp_result_failed(json.dumps(failed))
    assert not mcp_result_failed(json.dumps(fine))
    assert not mcp_result_failed(json.dumps({"content": [], "note": {"isError": True}}))
    assert not mcp_result_failed('{"isError": true')  # not JSON
    for client in Client:
        assert judged(client, json.dumps(failed))


def test_the_configured_prefix_is_read_for_every_client_and_can_be_turned_off() -> None:
    for client in Client:
        assert judged(client, "Error: Order #W1 not found")  # τ²-bench's form
    assert not ToolErrorTable("").judge(Client.OTHER, "chat")("Error: Order #W1 not found", None)
    assert ToolErrorTable("FAILED").judge(Client.OTHER, "chat")("FAILED: no", None)


def test_a_protocol_flag_decides_and_the_text_is_not_read() -> None:
    # Claude Code: tool_result blocks carry is_error (Messages API)
    assert judged(Client.CLAUDE_CODE, "Exit code 2\nls: cannot access", True, "messages")
    assert not judged(Client.CLAUDE_CODE, "Error: that is just file content", False, "messages")


@pytest.mark.parametrize(
    ("headers", "client"),
    [
        ({"originator": "codex_exec", "user-agent": "codex_exec/0.169.0 (Ubuntu 24.4.0)"}, "codex"),
        ({"originator": "codex_cli_rs"}, "codex"),
        ({"user-agent": "codex_vscode/0.169.0"}, "codex"),
        ({"user-agent": "claude-cli/2.1.332 (external, cli)", "x-app": "cli"}, "claude_code"),
        ({"user-agent": "Agents/Python 0.24.0"}, "agents_sdk"),
        ({"user-agent": "OpenAI/Python 3.63.0"}, "other"),
        ({}, "other"),
    ],
)
def test_the_client_is_identified_by_its_headers(headers: dict[str, str], client: str) -> None:
    assert identify_client(headers) == client


def test_an_operator_pattern_applies_only_to_the_clients_and_protocols_it_names() -> None:
    pattern = tool_error_pattern(r"^FAILED\b", [Client.CODEX], ["responses"])
    table = ToolErrorTable("Error", [pattern])
    assert table.judge(Client.CODEX, "responses")("FAILED: disk full", None)
    assert not table.judge(Client.CODEX, "chat")("FAILED: disk full", None)
    assert not table.judge(Client.OTHER, "responses")("FAILED: disk full", None)


def test_an_operator_pattern_reads_flagged_results_too() -> None:
    table = ToolErrorTable("Error", [tool_error_pattern("permission denied")])
    judge = table.judge(Client.CLAUDE_CODE, "messages")
    assert judge("cat: /root/x: permission denied", False)
    assert not judge("Error: a built-in form, but the flag says no", False)


def test_an_operator_pattern_reads_only_the_head_of_a_result() -> None:
    table = ToolErrorTable("Error", [tool_error_pattern("FAILED")])
    judge = table.judge(Client.OTHER, "chat")
    assert judge("x" * (HEAD_CHARS - 6) + "FAILED", None)
    assert not judge("x" * HEAD_CHARS + "FAILED", None)


def test_a_pattern_too_long_or_not_a_regex_is_refused() -> None:
    with pytest.raises(ValueError, match="at most"):
        compile_pattern("a" * (MAX_PATTERN_CHARS + 1))
    with pytest.raises(ValueError, match="not a regular expression"):
        compile_pattern("(unclosed")


# --- no successful result is ever counted -----------------------------------------------------

# Output that may print what a failure's marker looks like, on lines of its own.
MARKERS = ["Process exited with code 2", "Exit code: 1", "Output:", "rejected by user"]
printed = st.lists(st.sampled_from(MARKERS) | st.text(max_size=60), max_size=6).map("\n".join)
not_prefixed = printed.filter(lambda t: not t.startswith("Error"))


@settings(max_examples=200, deadline=None)
@given(printed, st.sampled_from(["unified", "running", "freeform", "structured"]))
def test_no_successful_codex_command_is_counted(output: str, form: str) -> None:
    text = {
        "unified": unified_exec(output),
        "running": unified_exec(output, None),
        "freeform": shell_freeform(output),
        "structured": shell_structured(output),
    }[form]
    assert not judged(Client.CODEX, text, api="responses")


@settings(max_examples=200, deadline=None)
@given(printed)
def test_no_result_claude_code_did_not_flag_is_counted(text: str) -> None:
    assert not judged(Client.CLAUDE_CODE, text, False, "messages")


@settings(max_examples=200, deadline=None)
@given(not_prefixed, st.sampled_from([Client.AGENTS_SDK, Client.OTHER]))
def test_no_successful_python_tool_output_is_counted(text: str, client: Client) -> None:
    # What the Agents SDK (str(output)) and langchain-openai (the ToolMessage's content) send for
    # a tool that returned: its own text, which only τ²-bench's convention reads as a failure.
    assert not judged(client, text)
    assert not judged(client, json.dumps({"result": text}))


@settings(max_examples=100, deadline=None)
@given(printed, st.sampled_from(list(Client)), st.booleans())
def test_no_successful_mcp_result_is_counted(text: str, client: Client, flagged: bool) -> None:
    result: dict[str, object] = {"content": [{"type": "text", "text": text}]}
    if flagged:
        result["isError"] = False
    assert not judged(client, json.dumps(result))
