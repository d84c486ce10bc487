"""Which tool results report a failed tool execution (the `tool_error` channel), in the form each
client the project tests sends it back to the model; docs/tool-errors.md says where each form
comes from in the client's own source and what counts as a failure.

    identify_client(headers) -> Client              who sent the request
    ToolErrorTable(prefix, patterns)                the built-in recognisers and the operator's
      .judge(client, api) -> Judge                  the table of one request, chosen once
    Judge(text, flag) -> bool                       whether one tool result reports a failure

A recogniser is a pure function of a result's text. Every client gets the configured prefix
(τ²-bench's `Error…`), MCP results passed through as JSON (`isError: true`) and the operator's
patterns that apply to it; an identified client gets its own forms besides. Where the protocol
carries its own flag (Anthropic's `is_error`) the flag decides, and only the operator's patterns
read the text too: a Messages client says itself what failed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

HEAD_CHARS = 4096
"""How much of a result's text the recognisers and the operator's patterns read: every known form
puts its marker at the head, and it bounds what a pattern may cost on a large result."""

MAX_PATTERN_CHARS = 256
"""The longest pattern `tool_errors:` accepts."""

MAX_MCP_JSON_CHARS = 1024 * 1024
"""The largest result read as an MCP `CallToolResult` (parsed whole, so bounded)."""

Recogniser = Callable[[str], bool]
"""Whether a tool result's text reports a failed execution."""


class Client(StrEnum):
    """The clients whose tool results have a form of their own, by what identifies their requests."""

    CODEX = "codex"  # header `originator: codex_exec` (codex_cli_rs, codex_vscode, …)
    CLAUDE_CODE = "claude_code"  # user agent `claude-cli/…`
    AGENTS_SDK = "agents_sdk"  # user agent `Agents/Python …`
    OTHER = "other"  # plain SDK users, LangChain/LangGraph, anything else


def identify_client(headers: Mapping[str, str]) -> Client:
    """The client that sent a request, from its headers (keyed by lower-case names)."""
    originator = headers.get("originator", "")
    agent = headers.get("user-agent", "")
    # Codex sends its originator as a header and as the user agent's first word.
    if originator.startswith("codex") or agent.startswith("codex_"):
        return Client.CODEX
    if agent.startswith("claude-cli/"):
        return Client.CLAUDE_CODE
    if agent.startswith("Agents/Python"):
        return Client.AGENTS_SDK
    return Client.OTHER


# --- Codex CLI ------------------------------------------------------------------------------
# codex-rs/core/src/tools/handlers/unified_exec.rs `format_response` (exec_command, write_stdin):
#   Chunk ID: …\nWall time: … seconds\nProcess exited with code N\n…\nOutput:\n<output>
# codex-rs/core/src/tools/mod.rs `format_exec_output_for_model_freeform` (shell):
#   Exit code: N\nWall time: … seconds\n[Total output lines: N\n]Output:\n<output>
# (a timeout exits 124 and its output starts `command timed out after N milliseconds`; a sandbox
# denial is the command's output with its non-zero exit code)
_CODEX_EXIT = re.compile(r"(?:Process exited with code|Exit code:) (-?\d+)")
_CODEX_HEADER_FIRST = ("Chunk ID: ", "Wall time: ", "Exit code: ")
_CODEX_HEADER_LINES = 8  # the most header lines before `Output:`
# ... `format_exec_output_for_model_structured` (shell, JSON): {"output":"…","metadata":
# {"exit_code":N,"duration_seconds":X}}; the output is JSON-escaped, so the unescaped metadata
# at the end can only be the real one.
_CODEX_JSON_EXIT = re.compile(
    r'"metadata":\{"exit_code":(-?\d+),"duration_seconds":[-+.\deE]+\}\}\Z'
)
# Texts Codex answers a call with instead of running it (FunctionCallError::RespondToModel):
# codex-rs/core/src/tools/registry.rs `unsupported_tool_call_message` (a tool it does not have),
# the handlers' argument and start failures, and ToolError::Rejected("rejected by user").
_CODEX_REFUSALS = re.compile(
    r"unsupported (?:custom tool )?call: |failed to parse [\w ]*arguments: "
    r"|(?:exec_command|write_stdin) failed: |rejected by user\Z"
)


def codex_exec_failed(text: str) -> bool:
    """A Codex command's output whose header (before `Output:`) names a non-zero exit code."""
    if text.startswith('{"output":'):
        found = _CODEX_JSON_EXIT.search(text[-HEAD_CHARS:])
        return found is not None and int(found[1]) != 0
    if not text.startswith(_CODEX_HEADER_FIRST):
        return False
    for line in text[:HEAD_CHARS].split("\n", _CODEX_HEADER_LINES)[:_CODEX_HEADER_LINES]:
        if line == "Output:":
            return False
        found = _CODEX_EXIT.fullmatch(line)
        if found is not None:
            return int(found[1]) != 0
    return False


def codex_refused(text: str) -> bool:
    """A call Codex did not run: an unknown tool, bad arguments, a refused approval."""
    return _CODEX_REFUSALS.match(text[:HEAD_CHARS]) is not None


# --- OpenAI Agents SDK ------------------------------------------------------------------------
# agents/tool.py `default_tool_error_function` ("… Please try again.", with " Error: <exception>"
# appended before 0.1), `default_tool_timeout_error_message` (f"… {timeout_seconds:g} seconds."),
# DEFAULT_APPROVAL_REJECTION_MESSAGE; agents/run_internal/turn_resolution.py
# `_default_tool_not_found_message` (tool_not_found_behavior="return_error_to_model").
_AGENTS_SDK_FAILURES = re.compile(
    r"An error occurred while running the tool\. Please try again\."
    r"|Tool '[^'\n]{1,256}' (?:timed out after [-+.\deEinf]+ seconds|not found)\.\Z"
    r"|Tool execution was not approved\.\Z"
)


def agents_sdk_failed(text: str) -> bool:
    """The Agents SDK's default text for a tool that raised, timed out, was missing or refused."""
    return _AGENTS_SDK_FAILURES.match(text[:HEAD_CHARS]) is not None


# --- LangChain / LangGraph --------------------------------------------------------------------
# langgraph/prebuilt/tool_node.py TOOL_CALL_ERROR_TEMPLATE ("Error: {error!r}\n Please fix your
# mistakes."), INVALID_TOOL_NAME_ERROR_TEMPLATE ("Error: {name} is not a valid tool, try one of
# [...]."), TOOL_INVOCATION_ERROR_TEMPLATE ("Error invoking tool '{name}' with kwargs …");
# langchain_core/tools/base.py `_handle_validation_error` / `_handle_tool_error` defaults. Their
# ToolMessage's `status="error"` stays on the client: langchain-openai sends only role, content
# and tool_call_id.
_LANGCHAIN_INVALID_TOOL = re.compile(r"Error: [^\n]{1,256} is not a valid tool, try one of \[")
_LANGCHAIN_DEFAULTS = frozenset({"Tool input validation error", "Tool execution error"})


def langchain_failed(text: str) -> bool:
    """LangGraph's ToolNode or a LangChain tool's default text for a failed call."""
    if text.startswith("Error: "):
        return (
            text.endswith("\n Please fix your mistakes.")
            or _LANGCHAIN_INVALID_TOOL.match(text[:HEAD_CHARS]) is not None
        )
    return text.startswith("Error invoking tool '") or text in _LANGCHAIN_DEFAULTS


# --- MCP, passed through ---------------------------------------------------------------------
# A client that hands the model an MCP `CallToolResult` as JSON keeps its `isError` (MCP spec,
# schema.ts `CallToolResult.isError`).
def mcp_result_failed(text: str) -> bool:
    """An MCP `CallToolResult` serialized as the result's text, with `isError: true`."""
    if not text.startswith("{") or '"isError"' not in text or len(text) > MAX_MCP_JSON_CHARS:
        return False
    try:
        result = json.loads(text)
    except ValueError:
        return False
    return isinstance(result, dict) and result.get("isError") is True


def prefix_recogniser(prefix: str) -> Recogniser:
    """τ²-bench's form: the text starts with `prefix` (never matches when it is empty)."""

    def starts_with_prefix(text: str) -> bool:
        return bool(prefix) and text.startswith(prefix)

    return starts_with_prefix


BUILT_IN: Mapping[Client, tuple[Recogniser, ...]] = {
    Client.CODEX: (codex_exec_failed, codex_refused),
    Client.CLAUDE_CODE: (),  # its tool_result blocks carry is_error
    Client.AGENTS_SDK: (agents_sdk_failed,),
    # Unidentified: LangChain sends the openai SDK's user agent, and the Agents SDK's LiteLLM
    # model LiteLLM's; both forms are specific enough to read on any request.
    Client.OTHER: (langchain_failed, agents_sdk_failed),
}
"""Each client's own forms, besides the ones every client gets."""


@dataclass(frozen=True, slots=True)
class ToolErrorPattern:
    """An operator's form of a failed tool result: `pattern` searched in the result's head, on the
    requests of `clients` over `apis` (every one where empty)."""

    pattern: re.Pattern[str]
    clients: frozenset[Client] = frozenset()
    apis: frozenset[str] = frozenset()

    def applies(self, client: Client, api: str) -> bool:
        """Whether the pattern reads the results of `client`'s requests over `api`."""
        return (not self.clients or client in self.clients) and (not self.apis or api in self.apis)

    def __call__(self, text: str) -> bool:
        return self.pattern.search(text[:HEAD_CHARS]) is not None


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """An operator's pattern compiled. Raises ValueError for one too long or not a regex."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"a tool error pattern has at most {MAX_PATTERN_CHARS} characters")
    try:
        return re.compile(pattern)
    except re.error as error:
        raise ValueError(f"{pattern!r} is not a regular expression: {error}") from None


class Judge(Protocol):
    """Whether one tool result reports a failure: its text, and the protocol's own flag (None
    where the protocol has none)."""

    def __call__(self, text: str, flag: bool | None) -> bool: ...


@dataclass(frozen=True, slots=True)
class _Judge:
    by_text: tuple[Recogniser, ...]
    operator: tuple[Recogniser, ...]

    def __call__(self, text: str, flag: bool | None) -> bool:
        if flag:
            return True
        readers = self.by_text if flag is None else self.operator
        return any(recognise(text) for recognise in readers)


class ToolErrorTable:
    """The recognisers of every client: the built-in ones, the configured prefix and the
    operator's patterns."""

    def __init__(self, prefix: str, patterns: Sequence[ToolErrorPattern] = ()) -> None:
        self._common = (prefix_recogniser(prefix), mcp_result_failed)
        self._patterns = tuple(patterns)
        self._judges: dict[tuple[Client, str], _Judge] = {}

    def judge(self, client: Client, api: str) -> Judge:
        """The judge of the tool results of one request of `client` over `api`."""
        key = (client, api)
        judge = self._judges.get(key)
        if judge is None:
            operator = tuple(p for p in self._patterns if p.applies(client, api))
            judge = _Judge((*self._common, *BUILT_IN[client], *operator), operator)
            self._judges[key] = judge
        return judge


def tool_error_pattern(
    pattern: str, clients: Collection[Client] = (), apis: Collection[str] = ()
) -> ToolErrorPattern:
    """A `ToolErrorPattern` from its configured parts. Raises ValueError for a bad pattern."""
    return ToolErrorPattern(compile_pattern(pattern), frozenset(clients), frozenset(apis))
