"""Rewards are the product of the reward-basis checks; pass^k is τ²-bench's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from evalkit.domains.base import Domain
from evalkit.messages import AssistantMessage, ToolCall, ToolMessage
from evalkit.scoring import NLAssertionCheck, db_check, evaluate, evaluate_with_judge, pass_hat_k
from evalkit.tasks import Action, RewardType, Task


def gold_messages(task: Task, *, skip: str | None = None, text: str = "Done.") -> list[Any]:
    """A trajectory calling the task's gold actions (all but `skip`), then saying `text`."""
    messages: list[Any] = []
    for action in task.gold_actions:
        if action.action_id == skip:
            continue
        call = ToolCall(id=action.action_id, name=action.name, arguments=action.arguments)
        messages.append(AssistantMessage(tool_calls=[call]))
        messages.append(ToolMessage(id=action.action_id, content="ok"))
    messages.append(AssistantMessage(content=text))
    return messages


def state_changing(domain: Domain, task: Task) -> list[Action]:
    tools, _ = domain.toolkit_classes()
    return [a for a in task.gold_actions if tools.mutates(a.name)]


def with_basis(task: Task, *basis: RewardType, **criteria: Any) -> Task:
    assert task.evaluation_criteria is not None
    evaluation = task.evaluation_criteria.model_copy(
        update={"reward_basis": list(basis), **criteria}
    )
    return task.model_copy(update={"evaluation_criteria": evaluation})


@pytest.mark.parametrize("shortcut", [True, False])
def test_leaving_out_one_state_changing_gold_action_scores_zero(
    retail: Domain, shortcut: bool
) -> None:
    checked = 0
    for task in retail.tasks:
        for action in state_changing(retail, task):
            messages = gold_messages(task, skip=action.action_id)
            assert db_check(retail, task, messages, shortcut=shortcut).db_reward == 0.0
            info = evaluate(retail, task, messages, "user_stop", shortcut=shortcut)
            assert info.reward == 0.0, task.id
            checked += 1
    assert checked >= 30


def test_leaving_out_a_state_changing_action_of_a_tau2_task_scores_zero(
    tau2_retail: Domain,
) -> None:
    task = tau2_retail.get_task("0")
    (exchange,) = state_changing(tau2_retail, task)
    messages = gold_messages(task, skip=exchange.action_id)
    assert evaluate(tau2_retail, task, messages, "user_stop").reward == 0.0
    assert evaluate(tau2_retail, task, gold_messages(task), "user_stop").reward == 1.0


def test_read_only_calls_do_not_change_the_db_verdict(retail: Domain) -> None:
    task = next(t for t in retail.tasks if state_changing(retail, t))
    extra = AssistantMessage(
        tool_calls=[ToolCall(id="x", name="list_all_product_types", arguments={})]
    )
    messages = [extra, *gold_messages(task)]
    assert db_check(retail, task, messages, shortcut=False).db_match
    assert db_check(retail, task, messages, shortcut=True).db_match


def test_same_end_state_by_another_path_passes_db_without_shortcut(retail: Domain) -> None:
    task = next(
        t for t in retail.tasks if any(a.name == "cancel_pending_order" for a in t.gold_actions)
    )
    cancel = next(a for a in task.gold_actions if a.name == "cancel_pending_order")
    failed_first = AssistantMessage(
        tool_calls=[
            ToolCall(
                id="bad",
                name="cancel_pending_order",
                arguments={**cancel.arguments, "reason": "changed my mind"},
            )
        ]
    )
    messages = [failed_first, *gold_messages(task)]
    assert db_check(retail, task, messages, shortcut=True).db_match
    assert db_check(retail, task, messages, shortcut=False).db_match


def test_communicate_needs_every_string_in_an_agent_message(retail: Domain) -> None:
    task = with_basis(retail.tasks[0], RewardType.COMMUNICATE, communicate_info=["1,234.5", "gold"])
    messages = [AssistantMessage(content="It costs 1234.5 and it is GOLD.")]
    # τ²-bench removes commas from the message only, so an info string with a comma never matches
    info = evaluate(retail, task, messages, "user_stop")
    assert [c.met for c in info.communicate_checks or []] == [False, True]
    assert info.reward == 0.0
    task = with_basis(retail.tasks[0], RewardType.COMMUNICATE, communicate_info=["1234.5"])
    messages = [AssistantMessage(content="It costs 1,234.5.")]
    assert evaluate(retail, task, messages, "user_stop").reward == 1.0


def test_action_check_compares_the_arguments_the_call_passes(retail: Domain) -> None:
    task = with_basis(retail.tasks[0], RewardType.ACTION)
    assert evaluate(retail, task, gold_messages(task), "user_stop").reward == 1.0
    first = task.gold_actions[0]
    wrong = dict(first.arguments)
    wrong[next(iter(wrong))] = "someone else"
    messages = gold_messages(task, skip=first.action_id)
    messages.insert(0, AssistantMessage(tool_calls=[ToolCall(name=first.name, arguments=wrong)]))
    info = evaluate(retail, task, messages, "user_stop")
    assert info.reward == 0.0
    assert next(c.action_match for c in info.action_checks or []) is False


def test_nl_assertions_without_a_judge_are_flagged_and_left_out(retail: Domain) -> None:
    task = with_basis(
        retail.tasks[0], RewardType.DB, RewardType.NL_ASSERTION, nl_assertions=["Agent is polite."]
    )
    info = evaluate(retail, task, gold_messages(task), "user_stop")
    assert info.reward == 1.0
    assert info.info is not None
    assert info.info["not_evaluated"] == ["NL_ASSERTION"]
    assert info.reward_breakdown is not None
    assert "NL_ASSERTION" not in info.reward_breakdown


class FixedJudge:
    def __init__(self, met: bool) -> None:
        self.met = met
        self.asked: list[str] = []
        self.info: dict[str, Any] = {"model": "fixed"}

    async def judge(
        self, assertions: Sequence[str], messages: Sequence[Any], *, task_id: str | None = None
    ) -> list[NLAssertionCheck]:
        self.asked.extend(assertions)
        return [
            NLAssertionCheck(nl_assertion=a, met=self.met, justification="") for a in assertions
        ]


@pytest.mark.parametrize(("met", "reward"), [(True, 1.0), (False, 0.0)])
async def test_nl_assertions_with_a_judge_gate_the_reward(
    retail: Domain, met: bool, reward: float
) -> None:
    task = with_basis(retail.tasks[0], RewardType.NL_ASSERTION, nl_assertions=["Agent is polite."])
    judge = FixedJudge(met)
    info = await evaluate_with_judge(retail, task, gold_messages(task), "user_stop", judge)
    assert info.reward == reward
    assert judge.asked == ["Agent is polite."]
    assert info.reward_breakdown == {"NL_ASSERTION": reward}


def test_pass_hat_k_is_the_mean_of_binomial_ratios() -> None:
    rewards = {"a": [1.0, 1.0, 0.0, 1.0], "b": [0.0, 0.0, 1.0, 0.0]}
    assert pass_hat_k(rewards, 1) == pytest.approx((3 / 4 + 1 / 4) / 2)
    assert pass_hat_k(rewards, 2) == pytest.approx((3 / 6 + 0) / 2)
    assert pass_hat_k(rewards, 4) == 0.0
    assert pass_hat_k({"a": [0.9999999, 1.0]}, 2) == 1.0


def test_pass_hat_k_refuses_k_above_the_trials() -> None:
    with pytest.raises(ValueError, match="fewer than k=3"):
        pass_hat_k({"a": [1.0, 1.0]}, 3)
    with pytest.raises(ValueError, match="at least 1"):
        pass_hat_k({"a": [1.0]}, 0)
