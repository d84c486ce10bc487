"""Classify the failures of a recorded episode into channels, from its trajectory alone.

Every tool message with `error: true` is one failure — exactly the errors τ²-bench counts
against `max_errors`, the agent's and the user's — and falls in exactly one channel:

- the user's own tool calls (telecom's device tools) fail as `user_tool_error`;
- an agent call is checked with `proxy.guard` (the validator the proxy runs online) against the
  agent's declared tool schemas when they are known: `unknown_tool`, `malformed_arguments`,
  `truncated` or `schema_violation`;
- when the schemas are unknown, or the validator finds nothing (a schema too loose to see an
  extra argument that Python then rejects), the error text decides: τ²-bench's
  `Tool 'x' not found.`, arguments that are not a JSON object, Python's and pydantic's
  argument errors;
- anything else is a business rule of the environment (`Order not found`): `environment_error`.

The validator also finds mistakes that raised no error — a call the tool tolerated, a tool call
leaked into the text, an empty message. Those do not consume the error budget and are kept apart
as `silent` violations; they count against the proxy's budget, which counts every failure the
agent experienced (`EpisodeFailures.experienced`, in the proxy's own channels), but not against
τ²-bench's. When the episode ran through the proxy, its `toolsentry` block adds what the proxy
counted upstream, repaired violations included (`ProxyRecord`: the session record the run
fetched, else the `x-toolsentry-*` headers of each turn).
"""

from __future__ import annotations

import enum
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from evalkit.agent import to_openai_messages
from evalkit.analysis.budget import Budget
from evalkit.formats import SimulationRun
from evalkit.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage
from evalkit.tasks import RewardType
from proxy.guard import Channel, Violation
from proxy.guard.toolcheck import ToolIndex, validate
from proxy.headers import REPAIRS_HEADER


class ErrorChannel(enum.StrEnum):
    """Where a recorded tool error came from. Values are the names used in files and tables."""

    # The channels the proxy's validator also finds keep its names.
    UNKNOWN_TOOL = Channel.UNKNOWN_TOOL.value
    MALFORMED_ARGUMENTS = Channel.MALFORMED_ARGUMENTS.value
    TRUNCATED = Channel.TRUNCATED.value
    SCHEMA_VIOLATION = Channel.SCHEMA_VIOLATION.value
    ENVIRONMENT_ERROR = "environment_error"
    USER_TOOL_ERROR = "user_tool_error"

    @property
    def label(self) -> str:
        """The channel in plain words, for verdicts and reports."""
        return _LABELS[self]

    @property
    def side(self) -> str:
        """Whose calls the channel's rate is measured against: `assistant` or `user`."""
        return "user" if self is ErrorChannel.USER_TOOL_ERROR else "assistant"


_LABELS: Final = {
    ErrorChannel.UNKNOWN_TOOL: "tool-name hallucination",
    ErrorChannel.MALFORMED_ARGUMENTS: "malformed arguments",
    ErrorChannel.TRUNCATED: "truncated calls",
    ErrorChannel.SCHEMA_VIOLATION: "schema violations",
    ErrorChannel.ENVIRONMENT_ERROR: "environment errors",
    ErrorChannel.USER_TOOL_ERROR: "user tool errors",
}

_FROM_GUARD: Final = {
    Channel.UNKNOWN_TOOL: ErrorChannel.UNKNOWN_TOOL,
    Channel.MALFORMED_ARGUMENTS: ErrorChannel.MALFORMED_ARGUMENTS,
    Channel.TRUNCATED: ErrorChannel.TRUNCATED,
    Channel.SCHEMA_VIOLATION: ErrorChannel.SCHEMA_VIOLATION,
}

# τ²-bench's and evalkit's texts. The schema patterns are Python's own TypeError messages for a
# call with the wrong keywords and pydantic's validation messages: what a tool raises when the
# model's arguments do not fit its signature.
_UNKNOWN_TOOL_TEXT: Final = re.compile(r"^\s*Error:\s*Tool '(?P<name>.*)' not found\.?\s*$", re.S)
_MALFORMED_TEXT: Final = re.compile(
    r"not a JSON object|JSONDecodeError|Expecting (value|property name)|Unterminated string",
    re.I,
)
_SCHEMA_TEXT: Final = re.compile(
    r"unexpected keyword argument|missing \d+ required (positional|keyword-only) argument"
    r"|validation errors? for |Field required|Input should be",
    re.I,
)
_TEXT_LIMIT: Final = 200
_TO_GUARD: Final = {error: channel for channel, error in _FROM_GUARD.items()}


class NLScoring(enum.StrEnum):
    """How an episode's NL assertions entered its reward."""

    NONE = "none"  # the task has none, or the episode ended before any check ran
    JUDGED = "judged"
    NOT_EVALUATED = "not evaluated"


@dataclass(frozen=True, slots=True)
class ProxyRecord:
    """What the proxy counted in one episode: violations per channel as the upstream made them
    (repaired ones included), its requests and repairs, and where these figures come from:
    `session record` (the proxy's `GET /v1/sessions/{id}`, exact) or `response headers` (the
    `x-toolsentry-*` headers of each turn: one per channel per turn, a lower bound)."""

    channels: Mapping[str, int]
    requests: int
    repairs: int
    source: str


@dataclass(frozen=True, slots=True)
class DeclaredTools:
    """The agent's declared tools, compiled, and where they came from (for reports)."""

    index: ToolIndex
    source: str


@dataclass(frozen=True, slots=True)
class Failure:
    """One tool message with `error: true`, classified."""

    channel: ErrorChannel
    requestor: str
    tool_name: str | None
    text: str
    turn_idx: int | None = None


@dataclass(frozen=True, slots=True)
class EpisodeFailures:
    """One episode's outcome and failures: what the analysis of a run is built from."""

    simulation_id: str
    task_id: str
    trial: int | None
    reward: float
    termination_reason: str
    failures: tuple[Failure, ...]
    agent_calls: int
    user_calls: int
    silent: tuple[Violation, ...] = field(default_factory=tuple)
    agent_turns: int = 0
    proxy: ProxyRecord | None = None
    nl_assertions: NLScoring = NLScoring.NONE

    @property
    def errors(self) -> int:
        """The episode's error count as τ²-bench kept it (tool messages with `error: true`)."""
        return len(self.failures)

    def experienced(self) -> Counter[Channel]:
        """The failures the agent experienced, in the proxy's channels — what the proxy counts
        against its budget: its calls' tool errors (on the channel of the call's violation, else
        `tool_error`), and the violations that reached it without raising one (leaked calls,
        empty answers, tolerated calls). The user's tool errors are not the agent's."""
        counts: Counter[Channel] = Counter()
        for failure in self.failures:
            if failure.channel is not ErrorChannel.USER_TOOL_ERROR:
                counts[_TO_GUARD.get(failure.channel, Channel.TOOL_ERROR)] += 1
        counts.update(v.channel for v in self.silent)
        return counts

    def errors_for(self, budget: Budget) -> int:
        """The episode's count under `budget` (see `evalkit.analysis.budget`): τ²-bench's tool
        errors, or for the proxy's budget the larger of them and the experienced failures."""
        if budget is Budget.TAU2:
            return self.errors
        return max(self.errors, sum(self.experienced().values()))

    @property
    def proxy_channels(self) -> Mapping[str, int]:
        """Violations the proxy counted per channel, repaired ones included (empty without it)."""
        return self.proxy.channels if self.proxy is not None else {}

    @property
    def repairs(self) -> int:
        """Repairs the proxy made in the episode (0 without it)."""
        return self.proxy.repairs if self.proxy is not None else 0

    def channels(self) -> Counter[ErrorChannel]:
        """Failures per channel."""
        return Counter(f.channel for f in self.failures)

    def wrong_tool_names(self) -> Counter[str]:
        """The names the agent called that are not tools, with how often."""
        return Counter(
            f.tool_name or ""
            for f in self.failures
            if f.channel is ErrorChannel.UNKNOWN_TOOL and f.requestor == "assistant"
        )


def classify_error_text(text: str | None) -> ErrorChannel | None:
    """The channel an agent's tool error text names, or None when it reads as a business error."""
    if not text:
        return None
    if _UNKNOWN_TOOL_TEXT.match(text):
        return ErrorChannel.UNKNOWN_TOOL
    if _MALFORMED_TEXT.search(text):
        return ErrorChannel.MALFORMED_ARGUMENTS
    if _SCHEMA_TEXT.search(text):
        return ErrorChannel.SCHEMA_VIOLATION
    return None


def classify_simulation(
    simulation: SimulationRun, tools: DeclaredTools | None = None
) -> EpisodeFailures:
    """Classify every error of one recorded episode.

    `tools` are the agent's declared tools; without them the error texts alone decide. A reward
    that was not recorded (an episode that crashed) counts as 0. Never raises for anything a
    trajectory contains: a tool message that answers no recorded call is classified by its text.
    """
    pending: list[_PendingCall] = []
    failures: list[Failure] = []
    silent: list[Violation] = []
    agent_calls = user_calls = agent_turns = 0
    for position, message in enumerate(simulation.messages):
        # The first message is the agent's fixed greeting, not a turn of the model.
        agent_turns += isinstance(message, AssistantMessage) and position > 0
        if isinstance(message, AssistantMessage) and tools is not None:
            per_call, message_level = _check_message(message, tools.index)
            silent.extend(message_level)
        else:
            per_call = {}
        if isinstance(message, AssistantMessage | UserMessage) and message.tool_calls:
            for position, call in enumerate(message.tool_calls):
                pending.append(_PendingCall(call, per_call.get(position)))
            if isinstance(message, AssistantMessage):
                agent_calls += len(message.tool_calls)
            else:
                user_calls += len(message.tool_calls)
        if not isinstance(message, ToolMessage):
            continue
        answered = _take(pending, message.id)
        if message.error:
            failures.append(_classify(message, answered))
        elif answered is not None and answered.violation is not None:
            silent.append(answered.violation)
    # Calls that were never answered (the episode ended first) keep their violations too.
    silent.extend(p.violation for p in pending if p.violation is not None)
    reward = simulation.reward_info.reward if simulation.reward_info is not None else None
    return EpisodeFailures(
        simulation_id=simulation.id,
        task_id=simulation.task_id,
        trial=simulation.trial,
        reward=float(reward) if reward is not None else 0.0,
        termination_reason=simulation.termination_reason,
        failures=tuple(failures),
        agent_calls=agent_calls,
        user_calls=user_calls,
        silent=tuple(silent),
        agent_turns=agent_turns,
        proxy=proxy_record(simulation.toolsentry),
        nl_assertions=nl_scoring(simulation),
    )


def nl_scoring(simulation: SimulationRun) -> NLScoring:
    """Whether a judge scored the episode's NL assertions, or they were left out of its reward
    (`reward_info.info["not_evaluated"]`)."""
    info = simulation.reward_info
    if info is None:
        return NLScoring.NONE
    if info.nl_assertions:
        return NLScoring.JUDGED
    left_out = (info.info or {}).get("not_evaluated")
    if isinstance(left_out, list) and RewardType.NL_ASSERTION.value in left_out:
        return NLScoring.NOT_EVALUATED
    return NLScoring.NONE


def proxy_record(block: Mapping[str, Any] | None) -> ProxyRecord | None:
    """What the proxy itself counted in one episode, from its `toolsentry` block: the session
    record when the run fetched one, else the headers kept on each turn; None for an episode
    that did not go through the proxy (no block, or a block without proxy headers)."""
    if not isinstance(block, Mapping):
        return None
    record = block.get("proxy_session")
    if isinstance(record, Mapping) and isinstance(record.get("channels"), Mapping):
        return ProxyRecord(
            channels=_counts(record["channels"]),
            requests=_integer(record.get("requests")),
            repairs=_integer(record.get("repairs")),
            source="session record",
        )
    turns = [t for t in block.get("turns") or [] if isinstance(t, Mapping)]
    if not turns:
        return None
    # x-toolsentry-repairs counts the repairs of its own response.
    repairs = sum(_integer(_header(t, REPAIRS_HEADER)) for t in turns)
    channels = block.get("channels")
    return ProxyRecord(
        channels=_counts(channels) if isinstance(channels, Mapping) else {},
        requests=len(turns),
        repairs=repairs,
        source="response headers",
    )


def _header(turn: Mapping[str, Any], name: str) -> object:
    headers = turn.get("headers")
    return headers.get(name) if isinstance(headers, Mapping) else None


def _counts(values: Mapping[Any, Any]) -> dict[str, int]:
    return {str(k): v for k, v in values.items() if isinstance(v, int)}


def _integer(value: object) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value
    return int(value) if isinstance(value, str) and value.isdigit() else 0


def count_channels(episodes: Iterable[EpisodeFailures]) -> Counter[ErrorChannel]:
    """Failures per channel over `episodes`."""
    total: Counter[ErrorChannel] = Counter()
    for episode in episodes:
        total.update(episode.channels())
    return total


@dataclass(slots=True)
class _PendingCall:
    call: ToolCall
    violation: Violation | None


def _take(pending: list[_PendingCall], call_id: str) -> _PendingCall | None:
    """The call a tool message answers: the oldest one with its id, else the oldest one."""
    for position, entry in enumerate(pending):
        if call_id and entry.call.id == call_id:
            return pending.pop(position)
    return pending.pop(0) if pending else None


def _classify(message: ToolMessage, answered: _PendingCall | None) -> Failure:
    text = (message.content or "")[:_TEXT_LIMIT]
    call = answered.call if answered is not None else None
    name = call.name if call is not None else None
    if message.requestor == "user" or (call is not None and call.requestor == "user"):
        channel = ErrorChannel.USER_TOOL_ERROR
    elif answered is not None and answered.violation is not None:
        channel = _FROM_GUARD[answered.violation.channel]
    else:
        channel = classify_error_text(message.content) or ErrorChannel.ENVIRONMENT_ERROR
    if name is None and channel is ErrorChannel.UNKNOWN_TOOL:
        unknown = _UNKNOWN_TOOL_TEXT.match(message.content or "")
        name = unknown.group("name") if unknown else None
    return Failure(channel, message.requestor, name, text, message.turn_idx)


def _check_message(
    message: AssistantMessage, index: ToolIndex
) -> tuple[dict[int, Violation], list[Violation]]:
    """Guard violations of one agent message: the first one of each call that makes the call
    fail, by call position; and the message-level ones (leaked calls, empty message)."""
    openai_message, finish_reason = _openai_message(message)
    per_call: dict[int, Violation] = {}
    message_level: list[Violation] = []
    for violation in validate(openai_message, None, finish_reason=finish_reason, index=index):
        if violation.call_index is None:
            message_level.append(violation)
        elif violation.channel in _FROM_GUARD:
            per_call.setdefault(violation.call_index, violation)
    return per_call, message_level


def _openai_message(message: AssistantMessage) -> tuple[Mapping[str, Any], str | None]:
    """The message as the model sent it: the recorded raw response when it matches the parsed
    calls (it keeps the arguments' original text), else rebuilt from the parsed calls."""
    raw = message.raw_data
    calls = message.tool_calls or []
    if isinstance(raw, dict) and isinstance(raw.get("message"), dict):
        raw_message: dict[str, Any] = raw["message"]
        raw_calls = raw_message.get("tool_calls")
        if len(raw_calls if isinstance(raw_calls, list) else []) == len(calls):
            finish = raw.get("finish_reason")
            return raw_message, finish if isinstance(finish, str) else None
    (rebuilt,) = to_openai_messages(None, [message])
    return rebuilt, None
