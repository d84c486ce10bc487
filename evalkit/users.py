"""User simulators: `ScriptedUser` (deterministic, no model), `OracleUser` (the task's gold actions)
and `LLMUser` (any OpenAI-compatible endpoint).

In telecom the user operates a phone: `scripted_user(domain, task)` gives a `ScriptedUser` with
the domain's `DeviceRequests` (rules that turn an agent's request into device tool calls), and
`user_tools(domain)` the tools for an `LLMUser`.

They end the conversation the way τ²-bench's user does: a message containing `###STOP###` when
the request is done, `###TRANSFER###` when handed to a human, `###OUT-OF-SCOPE###` when the
scenario cannot go on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import openai
from openai import AsyncOpenAI

from evalkit.agent import endpoint_error, next_gold_action, parse_tool_call
from evalkit.domains.base import Domain
from evalkit.errors import UserSimulatorError
from evalkit.messages import (
    STOP_TOKEN,
    TRANSFER_TOKEN,
    AssistantMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
    now_iso,
    user_view,
)
from evalkit.tasks import Task, UserInstructions

USER_GUIDELINES = """\
# How to play the customer

You are a customer talking to a customer service agent. Play the scenario below faithfully.

- Write one message per turn, in plain conversational language, as the customer would.
- Give information only when the agent asks for it, a little at a time; do not recite the
  scenario, put it in your own words.
- Never invent facts. What the scenario does not tell you, you do not know: say so.
- Follow the scenario's instructions on what to accept, refuse or confirm.
- When everything you came for is done, or there is nothing more the agent can do, answer with
  '###STOP###' alone.
- If the agent transfers you to a human agent, answer with '###TRANSFER###' alone.
- If the scenario gives you no way to continue the conversation, answer with
  '###OUT-OF-SCOPE###' alone.
"""

USER_TOOLS_GUIDELINES = """
# Your own device

You also have tools that act on your own device. When the agent asks you to check or change
something on it, use a tool, then tell the agent what you saw. Use only the tools you have.
"""


class UserSimulator(Protocol):
    """Produces the user's next message from the conversation so far (the full trajectory)."""

    async def respond(self, history: Sequence[Any]) -> UserMessage: ...


class DeviceRequests(Protocol):
    """How a scripted user acts on their own device (telecom): the domain's rules that turn an
    agent's message into calls of the user's tools, and the results into a reply."""

    def calls_for(self, agent_text: str, seen: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
        """The (tool, arguments) calls the agent's message asks for, in order; `seen` holds the
        results of the user's earlier calls, oldest first (what the user knows of the device)."""
        ...

    def report(self, results: Sequence[tuple[ToolCall, ToolMessage]]) -> str:
        """What the user tells the agent after making `results`' calls."""
        ...


@runtime_checkable
class DeviceDomain(Protocol):
    """A domain whose user operates a device and can be played by a scripted user."""

    def device_requests(self) -> DeviceRequests: ...


def scripted_user(domain: Domain, task: Task, *, max_unanswered: int = 3) -> ScriptedUser:
    """A `ScriptedUser` for `task`, operating the device with the domain's rules where it has one."""
    device = domain.device_requests() if isinstance(domain, DeviceDomain) else None
    return ScriptedUser(task, device=device, max_unanswered=max_unanswered)


def user_tools(domain: Domain) -> list[dict[str, Any]] | None:
    """The user's tools in OpenAI's format (for an `LLMUser`), or None when the user has none."""
    _, toolkit = domain.toolkit_classes()
    return None if toolkit is None else toolkit.openai_tools()


# -- scripted user ---------------------------------------------------------------------------

_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_ZIP = re.compile(r"zip\s*(?:code)?\s*(?:is\s*)?(\d{5})", re.IGNORECASE)
_ORDER = re.compile(r"#W\d+")
_USER_ID = re.compile(r"\b[a-z]+_[a-z]+_\d+\b")
_NAME = re.compile(
    r"(?:You are|Your name is|name is)\s+([A-Z][a-zA-Z'-]+)\s+([A-Z][a-zA-Z'-]+)", re.IGNORECASE
)
_PAYMENT = re.compile(r"\b(gift card|credit card|paypal|debit card)\b", re.IGNORECASE)
_ADDRESS = re.compile(r"address is ([^.]+(?:\.\s*\d+)?)", re.IGNORECASE)
_PHONE = re.compile(r"\b\d{3}-\d{3}-\d{4}\b")
_LOCATION = re.compile(r"[^.]*\b(?:abroad|at home|travell?ing)\b[^.]*\.", re.IGNORECASE)
_REFUEL = re.compile(r"refuel (\d+(?:\.\d+)?) ?GB", re.IGNORECASE)
_DOB = re.compile(r"born on (\d{4}-\d{2}-\d{2})")
_CUSTOMER_ID = re.compile(r"customer ID is (C\d+)", re.IGNORECASE)

UNANSWERED = "Sorry, I'm not sure what you need from me. Could you help me with my request?"

_GOODBYE = (
    "goodbye",
    "good bye",
    "anything else",
    "have a great day",
    "have a nice day",
    "all done",
    "is there anything",
)
_TRANSFER = ("transferred to a human", "transfer you to a human", "human agent")
_WHERE = ("abroad", "travel", "outside", "overseas", "where are you", "location")
_REFUEL_ASK = ("how much data", "refuel", "how many gb")
_CONFIRM = (
    "confirm",
    "proceed",
    "yes/no",
    "(yes)",
    "shall i",
    "should i",
    "would you like me to",
    "do you want me to",
    "go ahead",
)


class ScriptedUser:
    """A deterministic customer built from the task's instructions, for runs without a user model.

    Opens with the reason for calling; answers a request for an email, name, zip code, user id,
    order id, payment method, address, phone number, location or refuel amount from the
    scenario (keyword matching of the agent's message); says "yes" when asked to confirm; stops
    when the agent says goodbye or asks whether there is anything else, and sends
    `###TRANSFER###` when transferred. After `max_unanswered` agent messages in a row it cannot
    answer, it stops.

    With `device` (telecom), it first does on its device what the agent's message asks for —
    the domain's rules pick the user tools — and then tells the agent what the device showed.
    """

    def __init__(
        self, task: Task, *, device: DeviceRequests | None = None, max_unanswered: int = 3
    ) -> None:
        instructions = task.user_scenario.instructions
        if isinstance(instructions, UserInstructions):
            self.reason = instructions.reason_for_call
            known = instructions.known_info or ""
            steps = instructions.task_instructions
        else:
            self.reason = instructions
            known = instructions
            steps = ""
        self.facts = extract_facts(known, self.reason, steps)
        self.device = device
        self.max_unanswered = max_unanswered

    async def respond(self, history: Sequence[Any]) -> UserMessage:
        view = user_view(history)
        agent_texts = [m for m in view if isinstance(m, AssistantMessage)]
        user_turns = [m for m in view if isinstance(m, UserMessage)]
        if not user_turns:
            return self._say(f"Hi! {first_person(self.reason)}")
        last = (agent_texts[-1].content or "") if agent_texts else ""
        if self.device is not None and isinstance(view[-1], ToolMessage):
            # Report what the device showed, and answer what else the agent asked.
            report = self.device.report(_latest_results(view))
            return self._say(" ".join([report, *self.facts_asked(last)]))
        if self.device is not None:
            seen = [m.content or "" for m in view if isinstance(m, ToolMessage)]
            calls = self.device.calls_for(last, seen)
            if calls:
                made = sum(len(m.tool_calls or []) for m in user_turns)
                return UserMessage(
                    tool_calls=[
                        ToolCall(id=f"user_call_{made + i}", name=n, arguments=a, requestor="user")
                        for i, (n, a) in enumerate(calls)
                    ],
                    timestamp=now_iso(),
                )
        reply = self.answer(last)
        if reply is None:
            unanswered = 1
            for m in reversed(user_turns):
                if m.content != UNANSWERED:
                    break
                unanswered += 1
            return self._say(STOP_TOKEN if unanswered >= self.max_unanswered else UNANSWERED)
        return self._say(reply)

    def answer(self, agent_text: str) -> str | None:
        """The reply to one agent message, or None when the script has nothing to say."""
        text = agent_text.lower()
        if any(k in text for k in _TRANSFER):
            return TRANSFER_TOKEN
        parts = self.facts_asked(agent_text)
        if parts:
            return " ".join(parts)
        if any(k in text for k in _CONFIRM):
            return "Yes, please go ahead."
        if any(k in text for k in _GOODBYE):
            return f"No, that's all. Thank you! {STOP_TOKEN}"
        return None

    def facts_asked(self, agent_text: str) -> list[str]:
        """The sentences that answer what the agent's message asks about the customer."""
        text = agent_text.lower()
        parts: list[str] = []
        facts = self.facts
        asks_email = "email" in text
        asks_name = "name" in text
        asks_zip = "zip" in text or "postal" in text
        if asks_email:
            if "email" in facts:
                parts.append(f"My email is {facts['email']}.")
            else:
                parts.append("I don't remember my email address.")
                asks_name = asks_zip = True
        if asks_name and "first_name" in facts:
            parts.append(f"My name is {facts['first_name']} {facts['last_name']}.")
        if asks_zip and "zip" in facts:
            parts.append(f"My zip code is {facts['zip']}.")
        if "phone" in text and "number" in text and "phone" in facts:
            parts.append(f"My phone number is {facts['phone']}.")
        if "user id" in text and "user_id" in facts:
            parts.append(f"My user id is {facts['user_id']}.")
        if "order" in text and ("id" in text or "number" in text) and "order_ids" in facts:
            parts.append(f"The order id is {facts['order_ids']}.")
        asks_payment = "payment" in text or "refund" in text or "pay " in text
        if asks_payment and "payment" in facts:
            parts.append(f"Please use my {facts['payment']}.")
        if "address" in text and "address" in facts and not asks_email:
            parts.append(f"The address is {facts['address']}.")
        if any(k in text for k in _WHERE) and "location" in facts:
            parts.append(facts["location"])
        if any(k in text for k in _REFUEL_ASK) and "refuel_gb" in facts:
            parts.append(f"I'd like to refuel {facts['refuel_gb']} GB.")
        if ("birth" in text or "dob" in text) and "dob" in facts:
            parts.append(f"My date of birth is {facts['dob']}.")
        if "customer id" in text and "customer_id" in facts:
            parts.append(f"My customer ID is {facts['customer_id']}.")
        return parts

    @staticmethod
    def _say(text: str) -> UserMessage:
        return UserMessage(content=text, timestamp=now_iso())


def _latest_results(view: Sequence[Any]) -> list[tuple[ToolCall, ToolMessage]]:
    # The answers to the user's last tool-call message, paired with their calls.
    calls: dict[str, ToolCall] = {}
    results: list[ToolMessage] = []
    for m in reversed(view):
        if isinstance(m, ToolMessage):
            results.append(m)
        elif isinstance(m, UserMessage) and m.tool_calls:
            calls = {c.id: c for c in m.tool_calls}
            break
    return [
        (calls.get(r.id) or ToolCall(id=r.id, name="?", requestor="user"), r)
        for r in reversed(results)
    ]


class OracleUser:
    """Plays the task's gold actions of the user (telecom's device actions) in the gold order.

    When the next gold action is the user's, it calls it; when it is the agent's, it lets the
    agent go on; once every gold action is done it stops. With `OracleAgent` it performs the
    gold path of a task exactly, so the episode scores what the gold actions score.
    """

    def __init__(self, task: Task) -> None:
        self.actions = task.gold_actions
        instructions = task.user_scenario.instructions
        self.reason = (
            instructions.reason_for_call
            if isinstance(instructions, UserInstructions)
            else instructions
        )

    async def respond(self, history: Sequence[Any]) -> UserMessage:
        view = user_view(history)
        user_turns = [m for m in view if isinstance(m, UserMessage)]
        if not user_turns:
            return UserMessage(content=f"Hi! {first_person(self.reason)}", timestamp=now_iso())
        action = next_gold_action(self.actions, history)
        if action is not None and action.requestor == "user":
            made = sum(len(m.tool_calls or []) for m in user_turns)
            call = ToolCall(
                id=f"oracle_user_{made}",
                name=action.name,
                arguments=dict(action.arguments),
                requestor="user",
            )
            return UserMessage(tool_calls=[call], timestamp=now_iso())
        if isinstance(view[-1], ToolMessage):
            return UserMessage(content="Done.", timestamp=now_iso())
        if action is None:
            return UserMessage(content=f"Thank you! {STOP_TOKEN}", timestamp=now_iso())
        return UserMessage(content="Please go ahead.", timestamp=now_iso())


def extract_facts(known_info: str, reason: str, instructions: str = "") -> dict[str, str]:
    """What a scripted user can tell: email, name, zip, user id, order ids, payment, address,
    phone number, where they are, how much data they would refuel, date of birth, customer ID."""
    facts: dict[str, str] = {}
    both = f"{known_info} {reason}"
    if m := _EMAIL.search(known_info):
        facts["email"] = m.group(0).rstrip(".")
    if (m := _NAME.search(known_info)) and not _USER_ID.fullmatch(m.group(1)):
        facts["first_name"], facts["last_name"] = m.group(1), m.group(2)
    if m := _ZIP.search(known_info):
        facts["zip"] = m.group(1)
    if m := _USER_ID.search(known_info):
        facts["user_id"] = m.group(0)
        if "first_name" not in facts:
            first, last, _ = m.group(0).split("_")
            facts["first_name"], facts["last_name"] = first.title(), last.title()
    orders = list(dict.fromkeys(_ORDER.findall(both)))
    if orders:
        facts["order_ids"] = " and ".join(orders)
    if m := _PAYMENT.search(both):
        facts["payment"] = m.group(1).lower()
    if m := _ADDRESS.search(both):
        facts["address"] = m.group(1).strip()
    if m := _PHONE.search(known_info):
        facts["phone"] = m.group(0)
    if m := _LOCATION.search(known_info):
        facts["location"] = first_person(m.group(0).strip())
    if m := _REFUEL.search(instructions):
        facts["refuel_gb"] = m.group(1)
    if m := _DOB.search(known_info):
        facts["dob"] = m.group(1)
    if m := _CUSTOMER_ID.search(known_info):
        facts["customer_id"] = m.group(1)
    return facts


def first_person(text: str) -> str:
    """The scenario's second-person text turned into the customer's first person (roughly)."""
    swaps = [
        (r"\bYou are\b", "I am"),
        (r"\byou are\b", "I am"),
        (r"\bYou were\b", "I was"),
        (r"\byou were\b", "I was"),
        (r"\bYou\b", "I"),
        (r"\byour\b", "my"),
        (r"\bYour\b", "My"),
        (r"\byourself\b", "myself"),
        (r"\byou\b", "me"),
    ]
    for pattern, repl in swaps:
        text = re.sub(pattern, repl, text)
    return text


# -- LLM user --------------------------------------------------------------------------------


class LLMUser:
    """A customer played by a model behind an OpenAI-compatible endpoint.

    The conversation is mirrored for the model: the agent's messages are its `user` turns and its
    own messages are `assistant` turns. With `tools` (telecom), it may call them; its calls are
    executed by the environment and counted like the agent's.
    """

    def __init__(
        self,
        client: AsyncOpenAI,
        model: str,
        task: Task,
        *,
        tools: list[dict[str, Any]] | None = None,
        guidelines: str = USER_GUIDELINES,
        llm_args: Mapping[str, Any] | None = None,
    ) -> None:
        self._client = client
        self.model = model
        self.tools = tools or None
        body = guidelines + (USER_TOOLS_GUIDELINES if self.tools else "")
        self.system = f"{body}\n<scenario>\n{task.user_scenario.render()}\n</scenario>"
        self.llm_args = dict(llm_args or {"temperature": 0.0})

    def mirrored(self, history: Sequence[Any]) -> list[dict[str, Any]]:
        """The user's view of the conversation in OpenAI's format, roles swapped."""
        out: list[dict[str, Any]] = [{"role": "system", "content": self.system}]
        for m in user_view(history):
            if isinstance(m, AssistantMessage):
                out.append({"role": "user", "content": m.content or ""})
            elif isinstance(m, UserMessage):
                entry: dict[str, Any] = {"role": "assistant", "content": m.content}
                if m.tool_calls:
                    entry["tool_calls"] = [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": _args_text(c.arguments)},
                        }
                        for c in m.tool_calls
                    ]
                out.append(entry)
            elif isinstance(m, ToolMessage):
                out.append({"role": "tool", "tool_call_id": m.id, "content": m.content or ""})
        return out

    async def respond(self, history: Sequence[Any]) -> UserMessage:
        """Ask the endpoint for the customer's next message.

        Raises:
            EndpointError: when the endpoint fails.
            UserSimulatorError: when the answer has no choice.
        """
        kwargs: dict[str, Any] = dict(self.llm_args)
        if self.tools:
            kwargs["tools"] = self.tools
        try:
            completion = await self._client.chat.completions.create(
                model=self.model,
                messages=self.mirrored(history),  # type: ignore[arg-type]
                **kwargs,
            )
        except openai.OpenAIError as exc:
            raise endpoint_error(exc, "user") from exc
        if not completion.choices:
            raise UserSimulatorError("the user's endpoint returned no choices")
        message = completion.choices[0].message
        calls = [
            parse_tool_call(c.id, c.function.name, c.function.arguments, requestor="user")
            for c in (message.tool_calls or [])
            if c.type == "function"
        ]
        return UserMessage(content=message.content, tool_calls=calls or None, timestamp=now_iso())


def _args_text(arguments: Mapping[str, Any]) -> str:
    return json.dumps(dict(arguments))
