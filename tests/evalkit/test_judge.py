"""The NL judge: τ²-bench's protocol against a scripted judge server on loopback, retries, and
a judge that fails reported as the episode's infrastructure error — never a silent pass."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from evalkit.cli import app
from evalkit.domains.base import Domain
from evalkit.errors import JudgeError
from evalkit.formats import read_results
from evalkit.judge import LLMJudge, parse_verdicts, transcript
from evalkit.messages import AssistantMessage, ToolMessage, UserMessage
from evalkit.replay import Replay, ReplayOptions, execute
from evalkit.scoring import evaluate_with_judge
from evalkit.summary import summarize_replay
from evalkit.tasks import RewardType, Task
from tests.evalkit.conftest import Reply, ScriptedChatServer, completion

runner = CliRunner()

CONVERSATION = [
    AssistantMessage(content="Hi! How can I help you today?"),
    UserMessage(content="Cancel my order please."),
    ToolMessage(id="c", content="{}"),
    AssistantMessage(content="Shall I cancel it? (yes/no)"),
]


def verdict(*met: bool) -> Reply:
    """A judge answer in τ²-bench's format, one result per flag."""
    results = [
        {"expectedOutcome": f"outcome {i}", "reasoning": f"because {i}", "metExpectation": m}
        for i, m in enumerate(met)
    ]
    return Reply(completion(json.dumps({"results": results})))


def failure(status: int = 500) -> Reply:
    return Reply({"error": {"message": "judge down", "type": "server_error"}}, status=status)


def nl_task(retail: Domain) -> Task:
    """Retail task 0 scored on its NL assertion alone."""
    task = retail.get_task("0")
    assert task.evaluation_criteria is not None
    criteria = task.evaluation_criteria.model_copy(
        update={"reward_basis": [RewardType.NL_ASSERTION], "nl_assertions": ["Agent asks first."]}
    )
    return task.model_copy(update={"evaluation_criteria": criteria})


def judge_on(server: ScriptedChatServer, attempts: int = 3) -> LLMJudge:
    return LLMJudge.at(server.base_url, "judge", attempts=attempts, wait_initial=0.01)


async def test_verdicts_gate_the_reward_and_are_stored_with_their_reasoning(
    chat_server: ScriptedChatServer, retail: Domain
) -> None:
    chat_server.replies = [verdict(True), verdict(False)]
    judge = judge_on(chat_server)
    task = nl_task(retail)
    passed = await evaluate_with_judge(retail, task, CONVERSATION, "user_stop", judge)
    failed = await evaluate_with_judge(retail, task, CONVERSATION, "user_stop", judge)
    await judge.close()
    assert passed.reward == 1.0
    assert failed.reward == 0.0
    assert failed.nl_assertions is not None
    assert (failed.nl_assertions[0].met, failed.nl_assertions[0].justification) == (
        False,
        "because 0",
    )
    assert passed.info is not None
    assert passed.info["judge"]["model"] == "judge"
    request = chat_server.requests[0]
    prompt = request["body"]["messages"][1]["content"]
    assert prompt.startswith("conversation:\nassistant: Hi! How can I help you today?")
    assert "tool: {}" in prompt
    assert 'expectedOutcomes:\n["Agent asks first."]' in prompt
    assert request["headers"]["x-evalkit-task"] == "0"
    assert request["body"]["temperature"] == 0.0


async def test_a_failing_or_unreadable_judge_is_retried_then_raises(
    chat_server: ScriptedChatServer,
) -> None:
    chat_server.replies = [failure(), Reply(completion("I think so")), verdict(True)]
    judge = judge_on(chat_server)
    checks = await judge.judge(["a"], CONVERSATION)
    assert [c.met for c in checks] == [True]
    assert len(chat_server.requests) == 3
    chat_server.replies = [failure(), failure(503)]
    twice = judge_on(chat_server, attempts=2)
    with pytest.raises(
        JudgeError, match=r"failed 2 time\(s\); last: judge endpoint answered HTTP 503"
    ):
        await twice.judge(["a"], CONVERSATION)
    await twice.close()
    await judge.close()


def test_an_answer_that_is_not_one_verdict_per_assertion_is_unreadable() -> None:
    with pytest.raises(JudgeError, match="unreadable"):
        parse_verdicts(["a", "b"], "I think so")
    with pytest.raises(JudgeError, match="1 results for 2 assertions"):
        parse_verdicts(["a", "b"], json.dumps({"results": [{"metExpectation": True}]}))
    with pytest.raises(JudgeError, match="not true or false"):
        parse_verdicts(["a"], json.dumps({"results": [{"metExpectation": "yes"}]}))


def test_the_transcript_is_every_message_as_role_and_content() -> None:
    assert transcript(CONVERSATION).splitlines() == [
        "assistant: Hi! How can I help you today?",
        "user: Cancel my order please.",
        "tool: {}",
        "assistant: Shall I cancel it? (yes/no)",
    ]


async def test_replay_with_a_judge_scores_nl_assertions_and_a_failing_judge_is_an_infrastructure_error(
    chat_server: ScriptedChatServer, tmp_path: Path
) -> None:
    # Tasks 0 and 1 have an NL assertion: the judge passes 0; for 1 it fails on every attempt.
    chat_server.replies = [verdict(True), failure(), failure(), failure()]
    options = ReplayOptions(
        tasks="0,1",
        profiles=("bf16",),
        repairs=("off",),
        concurrency=1,
        judge_base_url=chat_server.base_url,
        judge_model="judge",
    )
    replay = Replay.start(options, tmp_path / "run")
    await execute(replay)
    (arm,) = replay.arms
    by_task = {s.task_id: s for s in read_results(replay.runs[arm.name].path).simulations}
    judged, broken = by_task["0"], by_task["1"]
    assert judged.reward_info is not None
    assert judged.reward_info.nl_assertions
    assert judged.reward_info.nl_assertions[0].met is True
    assert broken.termination_reason == "infrastructure_error"
    assert broken.reward_info is not None
    assert broken.reward_info.reward == 0.0
    assert "judge failed 3 time(s)" in (broken.toolsentry or {})["failure"]
    (run,) = summarize_replay(replay)
    assert (run.judged, run.unjudged) == (1, 0)


def test_rescore_with_a_judge_recomputes_a_reward_that_needs_nl_assertions(
    chat_server_thread: ScriptedChatServer, tmp_path: Path
) -> None:
    replay = Replay.start(
        ReplayOptions(tasks="0", profiles=("bf16",), repairs=("off",), seed=2), tmp_path / "run"
    )
    asyncio.run(execute(replay))
    path = replay.runs[replay.arms[0].name].path
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    (simulation,) = data["simulations"]
    assert simulation["reward_info"]["info"]["not_evaluated"] == ["NL_ASSERTION"]
    # Without a judge the reward is not recomputed; with one that says the assertion failed,
    # the recomputed reward is 0 against the recorded one (scored without it).
    chat_server_thread.replies = [verdict(False)]
    result = runner.invoke(
        app,
        [
            *("rescore", str(path), "--json"),
            *("--judge-base-url", chat_server_thread.base_url, "--judge-model", "judge"),
        ],
    )
    report = json.loads(result.output)
    (disagreement,) = report["disagree"]
    assert disagreement["reward"]["recomputed"] == 0.0
    assert result.exit_code == 1
