"""The scripted user answers from what it knows; the LLM user mirrors the conversation."""

from __future__ import annotations

from openai import AsyncOpenAI

from evalkit.domains.base import Domain
from evalkit.messages import AssistantMessage, UserMessage, is_user_stop
from evalkit.tasks import Task, UserScenario
from evalkit.users import UNANSWERED, LLMUser, ScriptedUser, extract_facts, first_person
from tests.evalkit.conftest import Reply, ScriptedChatServer, completion


def make_task(known: str, reason: str = "You want to cancel order #W1234567.") -> Task:
    return Task(
        id="t",
        user_scenario=UserScenario(
            instructions={
                "domain": "retail",
                "reason_for_call": reason,
                "known_info": known,
                "task_instructions": "",
            }
        ),
    )


async def reply_to(user: ScriptedUser, agent_text: str) -> str:
    history = [
        AssistantMessage(content="Hi! How can I help you today?"),
        UserMessage(content="Hi! I want help."),
        AssistantMessage(content=agent_text),
    ]
    return (await user.respond(history)).content or ""


async def test_opens_with_the_reason_for_calling_in_the_first_person() -> None:
    user = ScriptedUser(make_task("Your email address is ann.lee1234@example.com."))
    message = await user.respond([AssistantMessage(content="Hi! How can I help you today?")])
    assert message.content == "Hi! I want to cancel order #W1234567."


async def test_gives_its_email_when_asked() -> None:
    user = ScriptedUser(make_task("Your email address is ann.lee1234@example.com."))
    assert await reply_to(user, "Could you give me your email?") == (
        "My email is ann.lee1234@example.com."
    )


async def test_without_an_email_it_offers_name_and_zip() -> None:
    user = ScriptedUser(make_task("You are Yusuf Rossi in zip code 19122."))
    text = await reply_to(user, "What is your email address?")
    assert text == (
        "I don't remember my email address. My name is Yusuf Rossi. My zip code is 19122."
    )


async def test_answers_order_ids_and_payment_methods_from_the_scenario() -> None:
    user = ScriptedUser(
        make_task("You are Ann Lee, zip code is 02101.", "Return #W7654321 to your gift card.")
    )
    assert await reply_to(user, "Which order id is it?") == "The order id is #W7654321."
    assert await reply_to(user, "Where should the refund go?") == "Please use my gift card."


async def test_confirms_stops_and_follows_a_transfer() -> None:
    user = ScriptedUser(make_task("Your email address is a@example.com."))
    assert await reply_to(user, "Shall I proceed with the cancellation (yes/no)?") == (
        "Yes, please go ahead."
    )
    assert (await reply_to(user, "Is there anything else I can help with?")).endswith("###STOP###")
    assert await reply_to(user, "YOU ARE BEING TRANSFERRED TO A HUMAN AGENT.") == "###TRANSFER###"


async def test_stops_after_three_messages_it_cannot_answer() -> None:
    user = ScriptedUser(make_task("Your email address is a@example.com."))
    history: list[AssistantMessage | UserMessage] = [
        AssistantMessage(content="Hi!"),
        UserMessage(content="Hi! I want help."),
    ]
    replies = []
    for _ in range(3):
        history.append(AssistantMessage(content="The weather is nice today."))
        message = await user.respond(history)
        history.append(message)
        replies.append(message.content)
    assert replies == [UNANSWERED, UNANSWERED, "###STOP###"]
    assert is_user_stop(message)


def test_facts_come_from_tau2_style_known_info() -> None:
    assert extract_facts("You are mei_kovacs_8020 in zipcode 28236.", "") == {
        "user_id": "mei_kovacs_8020",
        "first_name": "Mei",
        "last_name": "Kovacs",
        "zip": "28236",
    }
    assert first_person("You want your money back.") == "I want my money back."


async def test_llm_user_sees_the_agent_as_its_user_and_can_stop(
    chat_server: ScriptedChatServer, chat_client: AsyncOpenAI, retail: Domain
) -> None:
    chat_server.replies.append(Reply(completion("###STOP###")))
    task = retail.tasks[0]
    user = LLMUser(chat_client, "user-model", task)
    message = await user.respond(
        [
            AssistantMessage(content="Hi! How can I help you today?"),
            UserMessage(content="I want to cancel."),
            AssistantMessage(tool_calls=[]),
            AssistantMessage(content="Done. Anything else?"),
        ]
    )
    assert is_user_stop(message)
    body = chat_server.requests[0]["body"]
    assert body["messages"][0]["role"] == "system"
    assert task.user_scenario.render() in body["messages"][0]["content"]
    assert [m["role"] for m in body["messages"][1:]] == ["user", "assistant", "user", "user"]
    assert "tools" not in body
