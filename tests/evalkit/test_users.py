"""The scripted user answers from what it knows; the LLM user mirrors the conversation."""

from __future__ import annotations

from openai import AsyncOpenAI

from evalkit.domains.base import Domain
from evalkit.domains.telecom.user_tools import TelecomUserTools
from evalkit.env import Environment
from evalkit.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage, is_user_stop
from evalkit.tasks import Task, UserScenario
from evalkit.users import (
    UNANSWERED,
    LLMUser,
    OracleUser,
    ScriptedUser,
    extract_facts,
    first_person,
    scripted_user,
    user_tools,
)
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


def test_facts_include_a_phone_number_a_location_and_a_refuel_amount() -> None:
    facts = extract_facts(
        "You are John Smith with phone number 555-123-2002. You are currently abroad in France.",
        "Your data does not work.",
        "You are willing to refuel 2.0 GB of data if necessary.",
    )
    assert facts["phone"] == "555-123-2002"
    assert facts["location"] == "I am currently abroad in France."
    assert facts["refuel_gb"] == "2.0"
    assert (facts["first_name"], facts["last_name"]) == ("John", "Smith")
    other = extract_facts("Your customer ID is C2004; you were born on 1980-02-03.", "")
    assert (other["customer_id"], other["dob"]) == ("C2004", "1980-02-03")


async def test_scripted_telecom_user_answers_where_it_is_and_how_much_data_it_wants(
    telecom: Domain,
) -> None:
    task = next(t for t in telecom.tasks if "data_usage_exceeded" in t.id)
    user = scripted_user(telecom, task)
    answer = await reply_to(user, "What is your phone number, and are you travelling abroad?")
    assert f"My phone number is {user.facts['phone']}." in answer
    assert "I am at home in the United States." in answer
    assert "refuel" in await reply_to(user, "How much data would you like to refuel?")


async def test_scripted_telecom_user_calls_the_asked_tool_then_reports_the_result(
    telecom: Domain,
) -> None:
    user = scripted_user(telecom, telecom.tasks[0])
    history: list[object] = [
        AssistantMessage(content="Hi! How can I help you today?"),
        UserMessage(content="Hi! My phone has no service."),
        AssistantMessage(content="Please run a speed test. Also, are you travelling abroad?"),
    ]
    call = await user.respond(history)
    calls = call.tool_calls or []
    assert [(c.name, c.requestor) for c in calls] == [("run_speed_test", "user")]
    assert call.content is None
    result = ToolMessage(
        id=calls[0].id, content="Speed test failed: No Connection.", requestor="user"
    )
    history += [call, result]
    report = await user.respond(history)
    assert report.content == (
        "I did 'run speed test'. My phone shows:\nSpeed test failed: No Connection. "
        + user.facts["location"]
    )


async def test_oracle_user_plays_its_gold_actions_in_order_and_stops_when_all_are_done(
    tau2_telecom: Domain,
) -> None:
    task = tau2_telecom.tasks[0]  # gold: user toggle_data, then agent refuel_data
    user = OracleUser(task)
    greeting = AssistantMessage(content="Hi! How can I help you today?")
    opening = await user.respond([greeting])
    assert opening.content is not None
    assert opening.content.startswith("Hi! I")
    history: list[object] = [greeting, opening, AssistantMessage(content="Please do it.")]
    toggle = await user.respond(history)
    assert [c.name for c in toggle.tool_calls or []] == ["toggle_data"]
    history += [toggle, ToolMessage(id="oracle_user_0", content="ok", requestor="user")]
    assert (await user.respond(history)).content == "Done."
    history += [
        UserMessage(content="Done."),
        AssistantMessage(tool_calls=[ToolCall(id="a", name="refuel_data")]),
        ToolMessage(id="a", content="ok"),
        AssistantMessage(content="All done. Goodbye!"),
    ]
    assert is_user_stop(await user.respond(history))


def test_user_tools_are_the_phones_for_telecom_and_none_for_retail(
    telecom: Domain, retail: Domain
) -> None:
    tools = user_tools(telecom)
    assert tools is not None
    assert {t["function"]["name"] for t in tools} == set(TelecomUserTools.tool_names())
    assert user_tools(retail) is None


async def test_llm_user_in_telecom_calls_device_tools_that_the_environment_runs(
    chat_server: ScriptedChatServer, chat_client: AsyncOpenAI, telecom: Domain
) -> None:
    chat_server.replies.append(Reply(completion(tool_calls=[("c1", "toggle_airplane_mode", "{}")])))
    task = next(t for t in telecom.tasks if "]airplane_mode_on[" in t.id)
    user = LLMUser(chat_client, "user-model", task, tools=user_tools(telecom))
    message = await user.respond(
        [
            AssistantMessage(content="Hi! How can I help you today?"),
            UserMessage(content="No service."),
            AssistantMessage(content="Please turn airplane mode off."),
        ]
    )
    body = chat_server.requests[0]["body"]
    assert {t["function"]["name"] for t in body["tools"]} == set(TelecomUserTools.tool_names())
    assert "Your own device" in body["messages"][0]["content"]
    calls = message.tool_calls or []
    assert [(c.name, c.requestor) for c in calls] == [("toggle_airplane_mode", "user")]
    env = Environment(telecom, task)
    answer = env.execute(calls[0])
    assert not answer.error
    assert (answer.content or "").startswith("Airplane Mode is now OFF.")
