"""The simulated model: plays the agent of a task from its gold actions, and errs by a damage profile.

It is stateless: every request carries the conversation, and the model works out from it which
gold actions are done (calls in the history that perform them exactly), then answers with the
next step — a gold call, a confirmation question before a state-changing call, a request that
the customer act on their own device (a gold action of the user), or a closing message with the
task's `communicate_info`. Where the step is a tool call it may err on one channel, drawn from
the profile's rates; after an environment error it recovers, gives up or repeats the mistake;
under a corrective re-ask it fixes the call or repeats the mistake.

Every random choice comes from a generator seeded by (seed, task, trial, turn, attempt), so an
episode plays the same whatever else runs at the same time, and profiles that differ only in
their rates draw the same numbers. Whether a call goes wrong and how are two draws: the first
against the profile's total mistake rate, the second picks the channel in proportion to the
channel rates. So of two profiles with proportional rates (the built-in `bf16`, `fp8`, `int4`)
the more damaged one makes, on the same request, every mistake the less damaged one makes — the
same channel, the same wrong name — and then some: the same mistakes, more often.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from evalkit.domains.base import Domain
from evalkit.errors import UsageError
from evalkit.sim.conversation import Conversation, read_conversation
from evalkit.sim.profiles import DamageProfile
from evalkit.sim.vocabulary import wrong_tool_name
from evalkit.tasks import Action, Task
from proxy.guard import Channel
from proxy.guard.toolcheck import validate

CLOSING_QUESTION: Final = "Is there anything else I can help you with?"
CONFIRM_PREFIX: Final = "Before I go ahead, please confirm: I will"
ASK_USER_PREFIX: Final = "Please do this on your device and tell me what you see:"
GIVE_UP: Final = f"I'm sorry, I am not able to complete this request right now. {CLOSING_QUESTION}"
DONE: Final = "Everything you asked for is done."
GOODBYE: Final = "Thank you for contacting us. Goodbye! ###STOP###"


class UnknownTaskError(UsageError):
    """A request names a task the simulated model does not know."""


@dataclass(frozen=True)
class EpisodeKey:
    """What identifies an episode to the simulated model: task, trial and seed."""

    task_id: str
    trial: int = 0
    seed: int = 0


@dataclass(frozen=True)
class SimReply:
    """One answer of the simulated model; `mistake` names the channel it erred on, if any."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    mistake: str | None = None

    @property
    def finish_reason(self) -> str:
        """`tool_calls` when the answer has calls, else `stop`."""
        return "tool_calls" if self.tool_calls else "stop"

    def message(self) -> dict[str, Any]:
        """The answer as an OpenAI assistant message."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        return out


@dataclass(frozen=True)
class _Step:
    """What the model means to do next: call, confirm, ask_user, close or goodbye."""

    kind: str
    action: Action | None = None


def draws(key: EpisodeKey, *parts: object) -> random.Random:
    """A generator seeded from the episode and `parts` (turn, attempt, purpose)."""
    text = "|".join(str(p) for p in (key.seed, key.task_id, key.trial, *parts))
    digest = hashlib.sha256(text.encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def call_text(action: Action) -> str:
    """How the model names a call to a person: `name` and its argument values."""
    if not action.arguments:
        return f"`{action.name}`"
    values = ", ".join(_plain(v) for v in action.arguments.values())
    return f"`{action.name}` ({values})"


def device_call_text(action: Action) -> str:
    """How the model asks a customer to use a tool of their own device: `name({json})`.

    The scripted telecom customer does exactly the calls an agent message names this way.
    """
    return f"`{action.name}({json.dumps(action.arguments) if action.arguments else ''})`"


def _plain(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


class SimulatedModel:
    """Plays the agent of `domain`'s tasks with the mistakes of a damage profile."""

    def __init__(self, domain: Domain) -> None:
        self.domain = domain
        self.tasks: dict[str, Task] = {t.id: t for t in domain.tasks}
        agent_tools, _ = domain.toolkit_classes()
        self._mutates = agent_tools.mutates

    def task(self, task_id: str) -> Task:
        """The task `task_id`.

        Raises:
            UnknownTaskError: when the domain has no such task.
        """
        task = self.tasks.get(task_id)
        if task is None:
            raise UnknownTaskError(f"domain {self.domain.name!r} has no task {task_id!r}")
        return task

    def reply(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None,
        key: EpisodeKey,
        profile: DamageProfile,
    ) -> SimReply:
        """The next assistant message of the episode `key`, given the request's messages and tools.

        Raises:
            UnknownTaskError: when the key names no task of the domain.
        """
        task = self.task(key.task_id)
        conversation = read_conversation(messages)
        declared = _declared(tools)
        step = self._next_step(task, conversation, key, profile)
        rng = draws(key, conversation.turn, conversation.attempt)

        rejected = conversation.rejected()
        if rejected is not None:
            if rng.random() < profile.reask_fix:
                return self._render(step, rng, declared, profile, key, err=False)
            return _repeat(rejected, rng)

        last = conversation.last_assistant()
        # After a mistake the model may not get back on track: it gives up or errs the same way.
        if last is not None and _is_mistake(last, tools) and rng.random() >= profile.recover:
            if rng.random() < profile.give_up:
                return SimReply(GIVE_UP)
            return _repeat(last, rng)
        return self._render(step, rng, declared, profile, key, err=True)

    # -- what comes next -------------------------------------------------------------------

    def _next_step(
        self, task: Task, conversation: Conversation, key: EpisodeKey, profile: DamageProfile
    ) -> _Step:
        if conversation.says(CLOSING_QUESTION):
            return _Step("goodbye")
        gold = task.gold_actions
        cut = self._policy_cut(gold, key, profile)
        executed = Counter(
            _signature(c.name, c.arguments)
            for c in conversation.executed_calls()
            if c.arguments is not None and c.result is not None
        )
        asked: Counter[tuple[str, str]] = Counter()
        for position, action in enumerate(gold):
            signature = _signature(action.name, action.arguments)
            if action.requestor == "user":
                text = f"{ASK_USER_PREFIX} {device_call_text(action)}"
                asked[signature] += 1
                if conversation.answered_asks(text) >= asked[signature]:
                    continue
                if position == cut:
                    return _Step("close")
                return _Step("ask_user", action)
            if executed[signature] > 0:
                executed[signature] -= 1
                continue
            if position == cut:
                return _Step("close")
            if self._mutates(action.name):
                confirm = f"{CONFIRM_PREFIX} {call_text(action)}."
                if conversation.answered_asks(confirm) < 1:
                    return _Step("confirm", action)
            return _Step("call", action)
        return _Step("close")

    def _policy_cut(
        self, gold: list[Action], key: EpisodeKey, profile: DamageProfile
    ) -> int | None:
        """The gold action before which a policy error closes the episode, or None."""
        if not gold or draws(key, "policy").random() >= profile.policy_error:
            return None
        mutating = [i for i, a in enumerate(gold) if a.requestor == "user" or self._mutates(a.name)]
        return mutating[-1] if mutating else len(gold) - 1

    # -- saying it ------------------------------------------------------------------------

    def _render(
        self,
        step: _Step,
        rng: random.Random,
        declared: dict[str, dict[str, Any]],
        profile: DamageProfile,
        key: EpisodeKey,
        *,
        err: bool,
    ) -> SimReply:
        action = step.action
        if step.kind == "goodbye":
            return SimReply(GOODBYE)
        if step.kind == "close" or action is None:
            return SimReply(self._closing(key.task_id))
        if step.kind == "confirm":
            return SimReply(f"{CONFIRM_PREFIX} {call_text(action)}. Shall I proceed? (yes/no)")
        if step.kind == "ask_user":
            return SimReply(f"{ASK_USER_PREFIX} {device_call_text(action)}.")
        channel = _draw_channel(rng.random(), rng.random(), profile) if err else None
        detail = rng.random()
        call_id = _call_id(rng)
        arguments = dict(action.arguments)
        if channel is Channel.UNKNOWN_TOOL:
            name = wrong_tool_name(self.domain.name, declared, detail, profile.wrong_tool_names)
            if name is not None:
                return _call(call_id, name, json.dumps(arguments), channel)
        elif channel is Channel.MALFORMED_ARGUMENTS:
            return _call(call_id, action.name, _malformed(arguments, detail), channel)
        elif channel is Channel.SCHEMA_VIOLATION:
            broken = _violating(arguments, declared.get(action.name), detail)
            if broken is not None:
                return _call(call_id, action.name, json.dumps(broken), channel)
        elif channel is Channel.LEAKED_TOOL_CALL:
            text = json.dumps({"name": action.name, "arguments": arguments})
            return SimReply(f"<tool_call>\n{text}\n</tool_call>", mistake=channel)
        return _call(call_id, action.name, json.dumps(arguments), None)

    def _closing(self, task_id: str) -> str:
        criteria = self.tasks[task_id].evaluation_criteria
        facts = list((criteria.communicate_info if criteria else None) or [])
        told = f" For your information: {'; '.join(facts)}." if facts else ""
        return f"{DONE}{told} {CLOSING_QUESTION}"


def _draw_channel(whether: float, which: float, profile: DamageProfile) -> Channel | None:
    """The channel a call errs on, or None: it errs when `whether` falls below the profile's
    mistake rate, on the channel `which` picks in proportion to the channel rates.

    One draw for both would not nest: with the channels laid end to end, a draw that lands on
    `bf16`'s malformed_arguments lands on `int4`'s (longer) unknown_tool span.
    """
    total = profile.mistake_rate
    if whether >= total:
        return None
    point = which * total
    erring = [(channel, rate) for channel, rate in profile.channel_rates().items() if rate > 0]
    for channel, rate in erring:
        if point < rate:
            return channel
        point -= rate
    return erring[-1][0]  # `point` left over by rounding at the top end


def _call(call_id: str, name: str, arguments: str, mistake: str | None) -> SimReply:
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return SimReply(None, [call], mistake)


def _call_id(rng: random.Random) -> str:
    return f"call_{rng.getrandbits(64):016x}"


def _repeat(message: dict[str, Any], rng: random.Random) -> SimReply:
    """The same mistake again: the message's content and calls, with fresh call ids."""
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        calls.append(
            {
                "id": _call_id(rng),
                "type": "function",
                "function": {
                    "name": function.get("name", ""),
                    "arguments": function.get("arguments", ""),
                },
            }
        )
    content = message.get("content")
    return SimReply(content if isinstance(content, str) else None, calls, mistake="repeated")


def _is_mistake(message: dict[str, Any], tools: Sequence[dict[str, Any]] | None) -> bool:
    if not tools:
        return False
    return bool(validate(message, list(tools)))


def _declared(tools: Sequence[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Declared tool names and their `parameters` schemas."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            parameters = function.get("parameters")
            out[function["name"]] = parameters if isinstance(parameters, dict) else {}
    return out


def _signature(name: str, arguments: Mapping[str, Any] | None) -> tuple[str, str]:
    return name, json.dumps(dict(arguments or {}), sort_keys=True)


def _malformed(arguments: dict[str, Any], detail: float) -> str:
    """Argument text that is not a JSON object: cut short, or a Python dict."""
    if not arguments or detail < 0.5:
        return json.dumps(arguments)[:-1]
    return repr(arguments)


def _violating(
    arguments: dict[str, Any], schema: dict[str, Any] | None, detail: float
) -> dict[str, Any] | None:
    """Arguments that break `schema`: a required field dropped, else a string given as a number.

    Returns None when the schema leaves nothing to break.
    """
    if not schema:
        return None
    required = [r for r in schema.get("required") or [] if r in arguments]
    if required:
        dropped = required[int(detail * len(required))]
        return {k: v for k, v in arguments.items() if k != dropped}
    properties = schema.get("properties") or {}
    strings = [k for k in arguments if (properties.get(k) or {}).get("type") == "string"]
    if strings:
        return {**arguments, strings[int(detail * len(strings))]: 0}
    return None
