"""Tasks in τ²-bench's format: a user scenario, an optional initial state and evaluation criteria.

Unknown fields are kept (`extra="allow"`), so τ²-bench's own `tasks.json` loads and dumps without loss.
"""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from evalkit.errors import DataError
from evalkit.messages import Requestor, ToolCall


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class RewardType(enum.StrEnum):
    """A check that can gate a task's reward (the reward is the product of those in `reward_basis`)."""

    DB = "DB"
    ENV_ASSERTION = "ENV_ASSERTION"
    NL_ASSERTION = "NL_ASSERTION"
    ACTION = "ACTION"
    COMMUNICATE = "COMMUNICATE"


class UserInstructions(_Model):
    domain: str
    reason_for_call: str
    known_info: str | None = None
    unknown_info: str | None = None
    task_instructions: str = ""

    def render(self) -> str:
        """The instructions as one text for a user simulator's prompt."""
        parts = [f"Domain: {self.domain}", f"Reason for call:\n\t{self.reason_for_call}"]
        if self.known_info is not None:
            parts.append(f"Known info:\n\t{self.known_info}")
        if self.unknown_info is not None:
            parts.append(f"Unknown info:\n\t{self.unknown_info}")
        parts.append(f"Task instructions:\n\t{self.task_instructions}")
        return "\n".join(parts)


class UserScenario(_Model):
    persona: str | None = None
    instructions: UserInstructions | str

    def render(self) -> str:
        """Persona and instructions as one text."""
        text = (
            self.instructions if isinstance(self.instructions, str) else self.instructions.render()
        )
        if self.persona:
            return f"Persona:\n\t{self.persona}\nInstructions:\n{text}"
        return text


class Action(_Model):
    """One gold tool call. `compare_args` None means: compare every argument the call passes."""

    action_id: str
    requestor: Requestor = "assistant"
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    info: str | None = None
    compare_args: list[str] | None = None

    def matches(self, call: ToolCall) -> bool:
        """Whether `call` performs this action, by τ²-bench's rule.

        Same name, and equal values for the compared keys: `compare_args` when given, otherwise
        the keys the call passes (so an extra argument in the call fails the match).
        """
        if call.name != self.name:
            return False
        keys = list(call.arguments) if self.compare_args is None else self.compare_args
        if not keys:
            return True
        called = {k: _normalised(v) for k, v in call.arguments.items() if k in keys}
        wanted = {k: _normalised(v) for k, v in self.arguments.items() if k in keys}
        return called == wanted


def _normalised(value: Any) -> Any:
    # An argument that is itself JSON text compares by meaning, not by spacing or key order.
    if isinstance(value, str):
        text = value.strip()
        if text.startswith(("{", "[")):
            try:
                return _normalised(json.loads(text))
            except json.JSONDecodeError:
                return value
        return value
    if isinstance(value, dict):
        return {k: _normalised(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalised(v) for v in value]
    return value


class EnvFunctionCall(_Model):
    """A function of the agent's (`assistant`) or the user's toolkit run outside the conversation."""

    env_type: Requestor
    func_name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class EnvAssertion(EnvFunctionCall):
    assert_value: bool = True
    message: str | None = None


class InitializationData(_Model):
    agent_data: dict[str, Any] | None = None
    user_data: dict[str, Any] | None = None


class InitialState(_Model):
    initialization_data: InitializationData | None = None
    initialization_actions: list[EnvFunctionCall] | None = None
    message_history: list[dict[str, Any]] | None = None


class EvaluationCriteria(_Model):
    actions: list[Action] | None = None
    env_assertions: list[EnvAssertion] | None = None
    communicate_info: list[str] | None = None
    nl_assertions: list[str] | None = None
    reward_basis: list[RewardType] = Field(
        default_factory=lambda: [RewardType.DB, RewardType.COMMUNICATE]
    )


class Task(_Model):
    id: str
    description: dict[str, Any] | None = None
    user_scenario: UserScenario
    initial_state: InitialState | None = None
    evaluation_criteria: EvaluationCriteria | None = None

    @property
    def gold_actions(self) -> list[Action]:
        """The gold actions (empty when the task has none)."""
        if self.evaluation_criteria is None or self.evaluation_criteria.actions is None:
            return []
        return self.evaluation_criteria.actions

    @property
    def reward_basis(self) -> list[RewardType]:
        """The checks whose product is the reward."""
        if self.evaluation_criteria is None:
            return []
        return self.evaluation_criteria.reward_basis


_TASKS = TypeAdapter(list[Task])


def parse_tasks(data: Any, *, source: str = "tasks") -> list[Task]:
    """Validate a list of task dicts.

    Raises:
        DataError: when the data is not a list of tasks (the message names `source`).
    """
    try:
        return _TASKS.validate_python(data)
    except ValidationError as exc:
        raise DataError(f"{source}: not a list of tasks in τ²-bench's format: {exc}") from exc


def load_tasks(path: Path) -> list[Task]:
    """Read a `tasks.json` file.

    Raises:
        DataError: when the file is missing, is not JSON, or does not hold tasks.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise DataError(f"{path}: no such tasks file") from exc
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno})") from exc
    return parse_tasks(data, source=str(path))
