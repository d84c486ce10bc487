"""The NL judge asks an OpenAI-compatible endpoint and never passes an unreadable answer."""

from __future__ import annotations

import json

from openai import AsyncOpenAI

from evalkit.domains.base import Domain
from evalkit.judge import LLMJudge, parse_verdicts, transcript
from evalkit.messages import AssistantMessage, ToolMessage, UserMessage
from evalkit.scoring import evaluate_with_judge
from evalkit.tasks import RewardType
from tests.evalkit.conftest import Reply, ScriptedChatServer, completion

CONVERSATION = [
    AssistantMessage(content="Hi! How can I help you today?"),
    UserMessage(content="Cancel my order please."),
    ToolMessage(id="c", content="{}"),
    AssistantMessage(content="Shall I cancel it? (yes/no)"),
]


async def test_judge_verdicts_gate_the_reward(
    chat_server: ScriptedChatServer, chat_client: AsyncOpenAI, retail: Domain
) -> None:
    verdict = {"results": [{"assertion": "a", "met": True, "justification": "asked first"}]}
    chat_server.replies.append(Reply(completion(json.dumps(verdict))))
    task = retail.tasks[0]
    assert task.evaluation_criteria is not None
    criteria = task.evaluation_criteria.model_copy(
        update={"reward_basis": [RewardType.NL_ASSERTION], "nl_assertions": ["Agent asks first."]}
    )
    task = task.model_copy(update={"evaluation_criteria": criteria})
    info = await evaluate_with_judge(
        retail, task, CONVERSATION, "user_stop", LLMJudge(chat_client, "judge")
    )
    assert info.reward == 1.0
    assert info.nl_assertions is not None
    assert info.nl_assertions[0].justification == "asked first"
    prompt = chat_server.requests[0]["body"]["messages"][1]["content"]
    assert "1. Agent asks first." in prompt
    assert "user: Cancel my order please." in prompt


def test_unreadable_answers_fail_every_assertion() -> None:
    checks = parse_verdicts(["a", "b"], "I think so")
    assert [c.met for c in checks] == [False, False]
    assert "unreadable" in checks[0].justification
    wrong_count = json.dumps({"results": [{"met": True}]})
    assert [c.met for c in parse_verdicts(["a", "b"], wrong_count)] == [False, False]


def test_transcript_leaves_out_tool_traffic() -> None:
    assert transcript(CONVERSATION).splitlines() == [
        "assistant: Hi! How can I help you today?",
        "user: Cancel my order please.",
        "assistant: Shall I cancel it? (yes/no)",
    ]
