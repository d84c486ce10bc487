"""The simulated model plays a task's gold actions and errs, recovers and repairs as its profile says."""

from __future__ import annotations

from collections import Counter

import pytest
from scipy.stats import spearmanr

from evalkit.domains import get_domain
from evalkit.domains.base import Domain
from evalkit.messages import AssistantMessage, ToolMessage, UserMessage
from evalkit.orchestrator import run_episode
from evalkit.scoring import evaluate
from evalkit.sim.model import (
    ASK_USER_PREFIX,
    CONFIRM_PREFIX,
    GIVE_UP,
    EpisodeKey,
    SimulatedModel,
)
from evalkit.sim.profiles import CHANNEL_FIELDS, builtin_profiles
from evalkit.sim.vocabulary import vocabulary
from evalkit.tasks import parse_tasks
from evalkit.users import ScriptedUser
from proxy.guard.repair import corrective_messages
from proxy.guard.toolcheck import compile_tools, validate
from tests.evalkit.domains.test_conformance import PHONE_TASK, PhoneDomain
from tests.evalkit.sim.builders import (
    OPENING,
    InProcessSimAgent,
    NamedCallUser,
    agent_tools,
    assistant_call,
    make_profile,
    tool_answer,
)


@pytest.fixture(scope="module")
def retail_domain() -> Domain:
    return get_domain("retail")


@pytest.fixture(scope="module")
def model(retail_domain: Domain) -> SimulatedModel:
    return SimulatedModel(retail_domain)


@pytest.fixture(scope="module")
def tools(retail_domain: Domain) -> list[dict[str, object]]:
    return agent_tools(retail_domain)


async def test_a_profile_without_damage_passes_every_retail_task_with_the_scripted_user(
    retail_domain: Domain,
) -> None:
    profile = make_profile()
    for task in retail_domain.tasks:
        agent = InProcessSimAgent(retail_domain, profile, EpisodeKey(task.id))
        sim = await run_episode(retail_domain, task, agent, ScriptedUser(task))
        info = evaluate(retail_domain, task, sim.messages, sim.termination_reason)
        assert (task.id, sim.termination_reason, info.reward) == (task.id, "user_stop", 1.0)
        assert sim.toolsentry is not None
        assert sim.toolsentry["episode_errors"] == 0


async def test_state_changing_calls_are_confirmed_first_and_the_closing_tells_the_facts(
    retail_domain: Domain,
) -> None:
    task = retail_domain.get_task("0")  # ends with cancel_pending_order
    agent = InProcessSimAgent(retail_domain, make_profile(), EpisodeKey(task.id))
    sim = await run_episode(retail_domain, task, agent, ScriptedUser(task))
    texts = [m.content or "" for m in sim.messages if isinstance(m, AssistantMessage)]
    calls = [
        c.name for m in sim.messages if isinstance(m, AssistantMessage) for c in m.tool_calls or []
    ]
    confirm = next(i for i, t in enumerate(texts) if t.startswith(CONFIRM_PREFIX))
    assert "cancel_pending_order" in texts[confirm]
    assert calls == [a.name for a in task.gold_actions]

    task = retail_domain.get_task("33")  # must tell the customer 55.9
    agent = InProcessSimAgent(retail_domain, make_profile(), EpisodeKey(task.id))
    sim = await run_episode(retail_domain, task, agent, ScriptedUser(task))
    assert any("55.9" in (m.content or "") for m in sim.messages if isinstance(m, AssistantMessage))


async def test_a_policy_error_closes_before_the_last_state_changing_call(
    retail_domain: Domain,
) -> None:
    task = retail_domain.get_task("0")
    agent = InProcessSimAgent(retail_domain, make_profile(policy_error=1.0), EpisodeKey(task.id))
    sim = await run_episode(retail_domain, task, agent, ScriptedUser(task))
    calls = [
        c.name for m in sim.messages if isinstance(m, AssistantMessage) for c in m.tool_calls or []
    ]
    assert "cancel_pending_order" not in calls
    assert sim.termination_reason == "user_stop"
    assert evaluate(retail_domain, task, sim.messages, sim.termination_reason).reward == 0.0


def test_the_same_episode_turn_gets_the_same_answer_and_other_trials_draw_apart(
    model: SimulatedModel, tools: list[dict[str, object]]
) -> None:
    int4 = builtin_profiles()["int4"]
    answers = [model.reply(OPENING, tools, EpisodeKey("0", trial, 7), int4) for trial in range(40)]
    again = [model.reply(OPENING, tools, EpisodeKey("0", trial, 7), int4) for trial in range(40)]
    assert answers == again
    assert len({str(a.tool_calls) for a in answers}) > 1


def test_a_more_damaged_profile_makes_every_mistake_a_less_damaged_one_makes_and_more(
    model: SimulatedModel, tools: list[dict[str, object]]
) -> None:
    # The same mistakes, more often: on the same request int4 errs wherever bf16 does, on the
    # same channel with the same call (the same wrong name, the same broken arguments).
    profiles = builtin_profiles()
    bf16_errs: Counter[str] = Counter()
    int4_errs: Counter[str] = Counter()
    for seed in range(2000):
        key = EpisodeKey("0", 0, seed)
        bf16 = model.reply(OPENING, tools, key, profiles["bf16"])
        int4 = model.reply(OPENING, tools, key, profiles["int4"])
        if bf16.mistake is not None:
            bf16_errs[bf16.mistake] += 1
            assert (int4.mistake, int4.tool_calls, int4.content) == (
                bf16.mistake,
                bf16.tool_calls,
                bf16.content,
            ), seed
        if int4.mistake is not None:
            int4_errs[int4.mistake] += 1
    assert set(bf16_errs) == set(int4_errs) == set(CHANNEL_FIELDS)
    assert 2.0 * bf16_errs.total() < int4_errs.total() < 3.0 * bf16_errs.total()


def test_wrong_tool_names_come_from_the_vocabulary_in_the_same_rank_order(
    model: SimulatedModel, tools: list[dict[str, object]]
) -> None:
    profiles = builtin_profiles()
    names: dict[str, Counter[str]] = {"bf16": Counter(), "int4": Counter()}
    for seed in range(4000):
        for profile, counter in names.items():
            reply = model.reply(OPENING, tools, EpisodeKey("1", 0, seed), profiles[profile])
            if reply.mistake == "unknown_tool":
                counter[reply.tool_calls[0]["function"]["name"]] += 1
    words = [name for name, _ in vocabulary("retail")]
    assert set(names["int4"]) <= set(words)
    assert set(names["bf16"]) <= set(words)
    correlation = spearmanr([names["bf16"][w] for w in words], [names["int4"][w] for w in words])
    assert correlation.statistic > 0.9
    assert names["int4"].most_common(1)[0][0] == names["bf16"].most_common(1)[0][0] == words[0]


@pytest.mark.parametrize(
    "channel", ["unknown_tool", "malformed_arguments", "schema_violation", "leaked_tool_call"]
)
def test_each_mistake_is_seen_by_the_proxy_validator_on_its_channel(
    model: SimulatedModel, tools: list[dict[str, object]], channel: str
) -> None:
    profile = make_profile(**{channel: 0.9})
    found = 0
    for seed in range(30):
        reply = model.reply(OPENING, tools, EpisodeKey("0", 0, seed), profile)
        if reply.mistake is None:
            continue
        assert reply.mistake == channel
        violations = validate(reply.message(), tools)
        assert [v.channel.value for v in violations] == [channel]
        found += 1
    assert found > 10


def _wrong_call_reask(tools: list[dict[str, object]]) -> list[dict[str, object]]:
    wrong = assistant_call("cancel_order", {"order_id": "#W1"}, "call_bad")
    violations = validate(wrong, tools)
    return [*OPENING, *corrective_messages(wrong, violations, compile_tools(tools))]


def test_a_corrective_reask_yields_the_right_call_or_repeats_the_mistake(
    model: SimulatedModel, tools: list[dict[str, object]]
) -> None:
    reask = _wrong_call_reask(tools)
    gold = model.task("0").gold_actions[0]
    fixed = model.reply(reask, tools, EpisodeKey("0"), make_profile(reask_fix=1.0))
    assert [c["function"]["name"] for c in fixed.tool_calls] == [gold.name]
    assert fixed.mistake is None
    stubborn = model.reply(reask, tools, EpisodeKey("0"), make_profile(reask_fix=0.0))
    assert [c["function"]["name"] for c in stubborn.tool_calls] == ["cancel_order"]
    assert stubborn.tool_calls[0]["id"] != "call_bad"


def test_after_an_environment_error_the_model_recovers_gives_up_or_repeats(
    model: SimulatedModel, tools: list[dict[str, object]]
) -> None:
    history = [
        *OPENING,
        assistant_call("cancel_order", {"order_id": "#W1"}, "call_bad"),
        tool_answer("call_bad", "Error: Tool 'cancel_order' not found."),
    ]
    gold = model.task("0").gold_actions[0]
    key = EpisodeKey("0")
    recovered = model.reply(history, tools, key, make_profile(recover=1.0))
    assert [c["function"]["name"] for c in recovered.tool_calls] == [gold.name]
    gave_up = model.reply(history, tools, key, make_profile(recover=0.0, give_up=1.0))
    assert gave_up.content == GIVE_UP
    assert not gave_up.tool_calls
    repeated = model.reply(history, tools, key, make_profile(recover=0.0, give_up=0.0))
    assert [c["function"]["name"] for c in repeated.tool_calls] == ["cancel_order"]


def test_gold_actions_done_in_the_history_are_not_called_again(
    model: SimulatedModel, tools: list[dict[str, object]]
) -> None:
    task = model.task("0")
    first, second = task.gold_actions[:2]
    history = [
        *OPENING,
        assistant_call(first.name, first.arguments, "call_1"),
        tool_answer("call_1", "omar_khan_6745"),
    ]
    reply = model.reply(history, tools, EpisodeKey("0"), make_profile())
    assert [(c["function"]["name"]) for c in reply.tool_calls] == [second.name]


async def test_user_actions_are_asked_for_by_name_and_count_as_done_once_answered() -> None:
    domain = PhoneDomain(parse_tasks([PHONE_TASK]))
    task = domain.tasks[0]
    agent = InProcessSimAgent(domain, make_profile(), EpisodeKey(task.id))
    _, device = domain.toolkit_classes()
    assert device is not None
    user = NamedCallUser(device.tool_names())
    sim = await run_episode(domain, task, agent, user, max_errors=5)
    asks = [
        m
        for m in sim.messages
        if isinstance(m, AssistantMessage) and ASK_USER_PREFIX in (m.content or "")
    ]
    assert len(asks) == 1
    assert '`toggle_airplane_mode({"on": false})`' in (asks[0].content or "")
    user_calls = [c for m in sim.messages if isinstance(m, UserMessage) for c in m.tool_calls or []]
    assert [(c.name, c.arguments) for c in user_calls] == [("toggle_airplane_mode", {"on": False})]
    answers = [m for m in sim.messages if isinstance(m, ToolMessage) and m.requestor == "user"]
    assert [m.error for m in answers] == [False]
    assert sim.termination_reason == "user_stop"
    assert evaluate(domain, task, sim.messages, sim.termination_reason).reward == 1.0
