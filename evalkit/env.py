"""The environment of one episode: runs tool calls against a domain's toolkits and counts errors.

Mirrors τ²-bench's environment: a call whose tool is unknown, whose arguments do not fit, or
whose business rules fail answers `Error: <reason>` in a tool message with `error: true`, and
adds one to `errors`, a count that is never reset. Results are serialised as τ²-bench does
(models as their JSON, strings as they are).
"""

from __future__ import annotations

import datetime
import json
from typing import Any

from pydantic import BaseModel

from evalkit.domains.base import Domain, Toolkit, update_db
from evalkit.messages import (
    AssistantMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
    now_iso,
    parse_message,
)
from evalkit.tasks import EnvAssertion, EnvFunctionCall, Task


class Environment:
    """Fresh toolkits of `domain`, put in the initial state of `task` when one is given."""

    def __init__(self, domain: Domain, task: Task | None = None) -> None:
        self.domain = domain
        self.agent_tools, self.user_tools = domain.fresh_toolkits()
        self.errors = 0
        if task is not None:
            self.apply_initial_state(task)

    # -- tool calls ------------------------------------------------------------------------

    def execute(self, call: ToolCall) -> ToolMessage:
        """Run one tool call; the answer is a tool message, with `error: true` on any failure.

        Failures add one to `errors`. Never raises for anything the call contains.
        """
        content, error = self._run(call)
        if error:
            self.errors += 1
        return ToolMessage(
            id=call.id,
            content=content,
            requestor=call.requestor,
            error=error,
            timestamp=now_iso(),
        )

    def replay(self, call: ToolCall, *, sync: bool = True) -> ToolMessage:
        """Run a recorded call without counting it (rebuilding a state, not playing an episode).

        `sync=False` skips the domain's sync step after the call, as τ²-bench does when it
        applies a task's gold actions.
        """
        content, error = self._run(call, sync=sync)
        return ToolMessage(id=call.id, content=content, requestor=call.requestor, error=error)

    def _run(self, call: ToolCall, *, sync: bool = True) -> tuple[str, bool]:
        try:
            toolkit = self._toolkit(call.requestor)
            if call.raw_arguments is not None and toolkit.has_tool(call.name):
                raise ValueError(
                    f"Arguments of tool '{call.name}' are not a JSON object: {call.raw_arguments[:200]}"
                )
            result = toolkit.call(call.name, call.arguments)
            if sync:
                self.sync()
        except Exception as exc:  # τ²-bench turns every failure of a call into its error text
            return f"Error: {exc}", True
        return to_json_str(result), False

    def _toolkit(self, requestor: str) -> Toolkit:
        if requestor == "user":
            if self.user_tools is None:
                raise ValueError("User tools not available")
            return self.user_tools
        return self.agent_tools

    def sync(self) -> None:
        """Let the domain reconcile the agent's and the user's sides (telecom); a no-op elsewhere."""
        self.domain.sync_tools(self.agent_tools, self.user_tools)

    # -- task set-up and assertions --------------------------------------------------------

    def apply_initial_state(self, task: Task) -> None:
        """Apply `task.initial_state`: data updates, set-up functions, then the recorded history.

        Raises:
            Exception: whatever a set-up function raises (a broken task, not an agent error).
        """
        state = task.initial_state
        if state is None:
            return
        data = state.initialization_data
        if data is not None:
            if data.agent_data is not None and self.agent_tools.db is not None:
                self.agent_tools.db = update_db(self.agent_tools.db, data.agent_data)
            if (
                data.user_data is not None
                and self.user_tools is not None
                and self.user_tools.db is not None
            ):
                self.user_tools.db = update_db(self.user_tools.db, data.user_data)
        for action in state.initialization_actions or []:
            self.run_function(action)
        for raw in state.message_history or []:
            message = parse_message(raw)
            if isinstance(message, AssistantMessage | UserMessage):
                for call in message.tool_calls or []:
                    self.replay(call)
        self.sync()

    def run_function(self, call: EnvFunctionCall) -> Any:
        """Run a toolkit function named by a task (set-up action or assertion) and sync.

        Raises:
            ValueError: when the function does not exist; anything the function raises.
        """
        toolkit = self._toolkit("user" if call.env_type == "user" else "assistant")
        result = toolkit.run_function(call.func_name, call.arguments)
        self.sync()
        return result

    def check_assertion(self, assertion: EnvAssertion) -> bool:
        """Whether the assertion holds (its function returns `assert_value`).

        Raises:
            ValueError: when the function does not return a bool.
        """
        result = self.run_function(assertion)
        if not isinstance(result, bool):
            raise ValueError(
                f"Function {assertion.func_name} returned {type(result).__name__} instead of bool"
            )
        return result == assertion.assert_value

    def db_hashes(self) -> tuple[str | None, str | None]:
        """Canonical hashes of the agent's and the user's databases (None where there is none)."""
        user = None if self.user_tools is None else self.user_tools.db_hash()
        return self.agent_tools.db_hash(), user


def to_json_str(result: Any) -> str:
    """A tool result as the text of its tool message, exactly as τ²-bench writes it."""
    if isinstance(result, str):
        return result
    return json.dumps(_plain(result), default=str)


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump()
    if isinstance(value, str) or value is None:
        return value
    if isinstance(value, bool | int | float):
        return str(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, datetime.date):
        return value.isoformat()
    raise ValueError(f"Unsupported type: {type(value)}")
