"""The agent under test: a model on any `base_url` (the proxy, vLLM, …) asked in one of three wire
protocols (`evalkit.wire`), and an oracle.

`LLMAgent` sends the domain policy as its system prompt and the domain tools, marks every request
with the episode's session and task (`x-session-id`, `x-evalkit-task`), and keeps the proxy's
`x-toolsentry-*` response headers on each assistant message (`proxy_headers`), so the results
file can say what the proxy saw and did at every turn. It builds one protocol-neutral
`AgentTurn`; an `AgentWire` writes it in its protocol and reads the answer back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import openai
from openai import AsyncOpenAI

from evalkit.errors import EndpointError
from evalkit.messages import (
    AssistantMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
    agent_view,
    now_iso,
)
from evalkit.tasks import Action, Task
from proxy.session.budget import DEFAULT_SESSION_HEADER

SESSION_HEADER = DEFAULT_SESSION_HEADER  # the one the proxy reads first
TASK_HEADER = "x-evalkit-task"
TRIAL_HEADER = "x-evalkit-trial"
SEED_HEADER = "x-evalkit-seed"

AGENT_INSTRUCTIONS = """\
You are a customer service agent. Help the customer within the rules of the policy below.
In each turn, either send the customer a message or make one tool call, never both at once.
Use only facts you got from the customer or from the tools; do not invent anything.\
"""


class Agent(Protocol):
    """Produces the agent's next message from the conversation so far (the full trajectory)."""

    async def respond(self, history: Sequence[Any]) -> AssistantMessage: ...


@dataclass(frozen=True)
class AgentTurn:
    """One request of the agent, protocol-neutral.

    `history` is the agent's view of the episode (`evalkit.messages.agent_view`); `tools` are
    the domain's tools in Chat Completions' shape; `metadata` goes into the body's `metadata`
    (where a simulated upstream behind a proxy reads the episode); `options` are further keyword
    arguments of the SDK call (`temperature`, …).
    """

    model: str
    system: str | None
    history: Sequence[Any]
    tools: Sequence[Mapping[str, Any]]
    headers: Mapping[str, str] = field(default_factory=dict)
    metadata: Mapping[str, str] | None = None
    options: Mapping[str, Any] = field(default_factory=dict)


class AgentWire(Protocol):
    """Sends an agent turn in one wire protocol and reads the answer (`evalkit.wire`)."""

    @property
    def api(self) -> str:
        """The protocol's name: chat, responses or messages."""
        ...

    async def send(self, turn: AgentTurn) -> AssistantMessage:
        """The endpoint's answer to `turn`.

        Raises:
            EndpointError: when the endpoint fails (status and error type kept).
            AgentError: when the answer holds no message.
        """
        ...

    async def close(self) -> None:
        """Close the wire's client."""
        ...


def system_prompt(policy: str) -> str:
    """The agent's system prompt: our instructions and the domain policy."""
    return f"<instructions>\n{AGENT_INSTRUCTIONS}\n</instructions>\n<policy>\n{policy}\n</policy>"


def make_client(
    base_url: str,
    *,
    api_key: str = "EMPTY",
    default_headers: Mapping[str, str] | None = None,
    max_retries: int = 2,
    timeout: float = 120.0,
) -> AsyncOpenAI:
    """An `AsyncOpenAI` client on `base_url` (one per run; episodes share its connection pool)."""
    return AsyncOpenAI(
        base_url=base_url,
        api_key=api_key,
        default_headers=dict(default_headers or {}),
        max_retries=max_retries,
        timeout=timeout,
    )


def episode_headers(
    session_id: str | None,
    task_id: str | None,
    trial: int | None = None,
    seed: int | None = None,
) -> dict[str, str]:
    """The headers that tie a request to its episode."""
    headers = {}
    if session_id is not None:
        headers[SESSION_HEADER] = session_id
    if task_id is not None:
        headers[TASK_HEADER] = task_id
    if trial is not None:
        headers[TRIAL_HEADER] = str(trial)
    if seed is not None:
        headers[SEED_HEADER] = str(seed)
    return headers


def episode_metadata(task_id: str, trial: int, seed: int) -> dict[str, str]:
    """The episode's task, trial and seed as a body `metadata` object.

    A proxy forwards the body but need not forward a client's headers; a simulated upstream
    behind one reads the episode from here (`extra_body={"metadata": ...}` in `llm_args`).
    """
    return {"evalkit_task": task_id, "evalkit_trial": str(trial), "evalkit_seed": str(seed)}


def to_openai_messages(system: str | None, history: Sequence[Any]) -> list[dict[str, Any]]:
    """The conversation in OpenAI's chat format, from the point of view of the assistant."""
    out: list[dict[str, Any]] = []
    if system is not None:
        out.append({"role": "system", "content": system})
    for m in history:
        if isinstance(m, AssistantMessage):
            entry: dict[str, Any] = {"role": "assistant", "content": m.content}
            if m.tool_calls:
                entry["tool_calls"] = [_openai_call(c) for c in m.tool_calls]
            out.append(entry)
        elif isinstance(m, UserMessage):
            out.append({"role": "user", "content": m.content or ""})
        elif isinstance(m, ToolMessage):
            out.append({"role": "tool", "tool_call_id": m.id, "content": m.content or ""})
    return out


def _openai_call(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": arguments_text(call)},
    }


def arguments_text(call: ToolCall) -> str:
    """A call's arguments as the model wrote them: its raw text when that was not a JSON object."""
    return call.raw_arguments if call.raw_arguments is not None else json.dumps(call.arguments)


def parse_tool_call(
    call_id: str, name: str, arguments: str | None, requestor: str = "assistant"
) -> ToolCall:
    """A tool call from the model's text arguments; text that is not a JSON object is kept raw."""
    text = arguments or ""
    try:
        parsed = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict):
        return ToolCall(id=call_id, name=name, arguments=parsed, requestor=requestor)  # type: ignore[arg-type]
    return ToolCall(id=call_id, name=name, arguments={}, requestor=requestor, raw_arguments=text)  # type: ignore[arg-type]


def endpoint_error(exc: openai.OpenAIError, what: str) -> EndpointError:
    """An `EndpointError` for a failed OpenAI SDK call (status and error type kept)."""
    if isinstance(exc, openai.APIStatusError):
        return status_error(what, exc.status_code, exc.message, exc.body)
    return EndpointError(f"{what} endpoint failed: {exc}")


def status_error(what: str, status: int, message: str, body: object) -> EndpointError:
    """An `EndpointError` for an HTTP error answer, its error type read from an OpenAI error
    (the SDK's body is the inner `error` object) or an Anthropic one (`{"type": "error",
    "error": {"type", "message"}}`)."""
    error_type = None
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict):
            if isinstance(inner.get("type"), str):
                error_type = inner["type"]
            # The error's own words, not the SDK's rendering of the whole body, so the same
            # error reads the same whichever protocol carried it.
            if isinstance(inner.get("message"), str):
                message = inner["message"]
    if error_type == "error_budget_exhausted":
        # Its status is the proxy's choice per protocol (exhaustion_status): the note names the
        # refusal, so the same episode reads the same whichever protocol carried it.
        return EndpointError(
            f"{what} endpoint refused the turn ({error_type}): {message}",
            status=status,
            error_type=error_type,
        )
    return EndpointError(
        f"{what} endpoint answered HTTP {status}: {message}", status=status, error_type=error_type
    )


class LLMAgent:
    """An agent backed by a model endpoint, asked over `wire` (Chat Completions, Responses or
    Messages; see `evalkit.wire`).

    One instance per episode: `session_id`, `task_id`, `trial` and `seed` go into every
    request's headers, with `headers` (the proxy's per-request settings); `metadata` into its
    body; `llm_args` are further arguments of the SDK call.
    """

    def __init__(
        self,
        wire: AgentWire,
        model: str,
        *,
        policy: str,
        tools: list[dict[str, Any]],
        session_id: str | None = None,
        task_id: str | None = None,
        llm_args: Mapping[str, Any] | None = None,
        trial: int | None = None,
        seed: int | None = None,
        headers: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        self.wire = wire
        self.model = model
        self.system = system_prompt(policy)
        self.tools = tools
        self.headers = {**episode_headers(session_id, task_id, trial, seed), **(headers or {})}
        self.metadata = dict(metadata) if metadata is not None else None
        self.llm_args = dict(llm_args or {"temperature": 0.0})

    async def respond(self, history: Sequence[Any]) -> AssistantMessage:
        """Ask the endpoint for the next message.

        Raises:
            EndpointError: when the endpoint fails (status and error type kept).
            AgentError: when the answer holds no message.
        """
        turn = AgentTurn(
            self.model,
            self.system,
            agent_view(history),
            self.tools,
            headers=self.headers,
            metadata=self.metadata,
            options=self.llm_args,
        )
        return await self.wire.send(turn)


def next_gold_action(actions: Sequence[Action], history: Sequence[Any]) -> Action | None:
    """The first gold action not yet performed, or None when all are done.

    Oracles perform only gold actions, each side in the gold order, so the calls each side has
    made so far say how far along the gold list the episode is.
    """
    made = {"assistant": 0, "user": 0}
    for m in history:
        if isinstance(m, AssistantMessage | UserMessage) and m.tool_calls is not None:
            made["assistant" if isinstance(m, AssistantMessage) else "user"] += len(m.tool_calls)
    for action in actions:
        if made[action.requestor] == 0:
            return action
        made[action.requestor] -= 1
    return None


def describe_action(action: Action) -> str:
    """A gold action as text: its name and its JSON arguments, e.g. `toggle_data({})`."""
    return f"{action.name}({json.dumps(action.arguments)})"


class OracleAgent:
    """Plays the task's gold actions in order, one call per turn, then says goodbye.

    A gold action of the user (telecom) is asked for in a message naming it, e.g. "Please do
    this on your device: toggle_data({})"; the agent's own actions it calls itself. The goodbye
    carries the task's `communicate_info`, so a perfect run also passes COMMUNICATE. Stateless:
    the next action is found from the calls already in the history.
    """

    def __init__(self, task: Task) -> None:
        self.actions = task.gold_actions
        criteria = task.evaluation_criteria
        self.communicate = list((criteria.communicate_info if criteria else None) or [])

    async def respond(self, history: Sequence[Any]) -> AssistantMessage:
        action = next_gold_action(self.actions, history)
        if action is not None and action.requestor == "assistant":
            done = sum(
                len(m.tool_calls)
                for m in history
                if isinstance(m, AssistantMessage) and m.tool_calls is not None
            )
            call = ToolCall(id=f"oracle_{done}", name=action.name, arguments=dict(action.arguments))
            return AssistantMessage(tool_calls=[call], timestamp=now_iso())
        if action is not None:
            text = f"Please do this on your device: {describe_action(action)}"
            return AssistantMessage(content=text, timestamp=now_iso())
        facts = "; ".join(self.communicate)
        text = "All done." + (f" For your information: {facts}." if facts else "")
        return AssistantMessage(content=f"{text} Goodbye!", timestamp=now_iso())
