"""User simulators: `ScriptedUser` (deterministic, no model) and `LLMUser` (any OpenAI-compatible endpoint).

Both end the conversation the way τ²-bench's user does: a message containing `###STOP###` when
the request is done, `###TRANSFER###` when handed to a human, `###OUT-OF-SCOPE###` when the
scenario cannot go on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import openai
from openai import AsyncOpenAI

from evalkit.agent import endpoint_error, parse_tool_call
from evalkit.errors import UserSimulatorError
from evalkit.messages import (
    STOP_TOKEN,
    TRANSFER_TOKEN,
    AssistantMessage,
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
    order id, payment method or address from `known_info` (keyword matching of the agent's
    message); says "yes" when asked to confirm; stops when the agent says goodbye or asks whether
    there is anything else, and sends `###TRANSFER###` when transferred. After
    `max_unanswered` agent messages in a row it cannot answer, it stops.
    """

    def __init__(self, task: Task, *, max_unanswered: int = 3) -> None:
        instructions = task.user_scenario.instructions
        if isinstance(instructions, UserInstructions):
            self.reason = instructions.reason_for_call
            known = instructions.known_info or ""
        else:
            self.reason = instructions
            known = instructions
        self.facts = extract_facts(known, self.reason)
        self.max_unanswered = max_unanswered

    async def respond(self, history: Sequence[Any]) -> UserMessage:
        view = user_view(history)
        agent_texts = [m for m in view if isinstance(m, AssistantMessage)]
        user_turns = [m for m in view if isinstance(m, UserMessage)]
        if not user_turns:
            return self._say(f"Hi! {first_person(self.reason)}")
        last = (agent_texts[-1].content or "") if agent_texts else ""
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
        if "user id" in text and "user_id" in facts:
            parts.append(f"My user id is {facts['user_id']}.")
        if "order" in text and ("id" in text or "number" in text) and "order_ids" in facts:
            parts.append(f"The order id is {facts['order_ids']}.")
        asks_payment = "payment" in text or "refund" in text or "pay " in text
        if asks_payment and "payment" in facts:
            parts.append(f"Please use my {facts['payment']}.")
        if "address" in text and "address" in facts and not asks_email:
            parts.append(f"The address is {facts['address']}.")
        if parts:
            return " ".join(parts)
        if any(k in text for k in _CONFIRM):
            return "Yes, please go ahead."
        if any(k in text for k in _GOODBYE):
            return f"No, that's all. Thank you! {STOP_TOKEN}"
        return None

    @staticmethod
    def _say(text: str) -> UserMessage:
        return UserMessage(content=text, timestamp=now_iso())


def extract_facts(known_info: str, reason: str) -> dict[str, str]:
    """What a scripted user can tell: email, name, zip, user id, order ids, payment, address."""
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
