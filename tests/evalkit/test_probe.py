"""The probe's pure parts: contexts cut from recordings, agreement, window errors, targets, the
journal, and the figures of hand-built answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evalkit.errors import UsageError
from evalkit.formats import read_results
from evalkit.messages import AssistantMessage, UserMessage
from evalkit.probe.asking import (
    Answer,
    Journal,
    Key,
    Target,
    agreement,
    is_window_error,
    plan,
    window_limit,
)
from evalkit.probe.contexts import RecordedCall, canonical_json, cut_contexts, load_contexts
from evalkit.probe.figures import ANY, pair_figures, repair_figures, target_figures


def tau2_file(tau2_dir: Path, domain: str) -> Path:
    path = tau2_dir / "results" / f"gpt-4.1_{domain}_1trial.json"
    if not path.is_file():
        pytest.skip(f"τ²-bench {domain} results file missing: {path}")
    return path


@pytest.mark.parametrize("domain", ["retail", "telecom"])
def test_every_assistant_turn_after_the_first_user_message_is_a_context(
    tau2_dir: Path, domain: str
) -> None:
    path = tau2_file(tau2_dir, domain)
    results = read_results(path)
    contexts, undeclared = cut_contexts(results, str(path))
    expected = 0
    for simulation in results.simulations:
        seen_user = False
        for m in simulation.messages:
            if isinstance(m, UserMessage) and not m.is_tool_call():
                seen_user = True
            elif isinstance(m, AssistantMessage) and seen_user:
                expected += 1
    assert len(contexts) == expected
    assert undeclared == 0  # τ²-bench's gpt-4.1 called only declared tools
    policy = results.info["environment_info"]["policy"]
    first = contexts[0]
    assert first.messages[0]["role"] == "system"
    assert policy in first.messages[0]["content"]
    assert first.messages[-1]["role"] in ("user", "tool")
    recorded = results.simulations[0].messages[first.turn]
    assert isinstance(recorded, AssistantMessage)
    assert [c.name for c in first.recorded] == [c.name for c in recorded.tool_calls or []]
    names = {t["function"]["name"] for t in first.tools}
    assert {c.name for ctx in contexts for c in ctx.recorded} <= names


def test_recorded_turns_keep_their_calls_as_canonical_json(tau2_dir: Path) -> None:
    path = tau2_file(tau2_dir, "retail")
    contexts, _ = cut_contexts(read_results(path), str(path))
    calling = next(c for c in contexts if c.recorded)
    call = calling.recorded[0]
    assert call.arguments == canonical_json(json.loads(call.arguments))


def test_a_file_of_another_domain_is_refused_naming_both(tau2_dir: Path) -> None:
    path = tau2_file(tau2_dir, "retail")
    with pytest.raises(UsageError, match=r"holds a 'retail' run, not 'telecom'"):
        load_contexts([path], domain="telecom")


def test_a_drawn_sample_is_the_same_for_the_same_seed_and_keeps_file_order(
    tau2_dir: Path,
) -> None:
    path = tau2_file(tau2_dir, "telecom")
    everything = [c.id for c in load_contexts([path]).contexts]
    first = load_contexts([path], per_file=12, seed=3)
    again = load_contexts([path], per_file=12, seed=3)
    other = load_contexts([path], per_file=12, seed=4)
    ids = [c.id for c in first.contexts]
    assert ids == [c.id for c in again.contexts]
    assert ids != [c.id for c in other.contexts]
    assert len(ids) == 12
    assert ids == [i for i in everything if i in set(ids)]
    assert first.available == {str(path): len(everything)}


def call(name: str, **arguments: Any) -> RecordedCall:
    return RecordedCall(name, canonical_json(arguments))


def test_agreement_compares_trigger_then_names_then_arguments() -> None:
    recorded = [call("get_order_details", order_id="#W1")]
    assert agreement(recorded, []) == {"trigger": False, "name": None, "arguments": None}
    assert agreement([], []) == {"trigger": True, "name": None, "arguments": None}
    assert agreement(recorded, [call("get_user_details", user_id="u")]) == {
        "trigger": True,
        "name": False,
        "arguments": None,
    }
    assert agreement(recorded, [call("get_order_details", order_id="#W2")])["arguments"] is False
    assert agreement(recorded, [call("get_order_details", order_id="#W1")]) == {
        "trigger": True,
        "name": True,
        "arguments": True,
    }


def test_arguments_agree_whatever_the_key_order() -> None:
    a = RecordedCall("f", canonical_json({"a": 1, "b": [1, 2]}))
    b = RecordedCall("f", canonical_json({"b": [1, 2], "a": 1}))
    assert agreement([a], [b])["arguments"] is True


@pytest.mark.parametrize(
    ("text", "limit"),
    [
        (
            "This model's maximum context length is 4096 tokens. However, you requested 9000 "
            "tokens (8744 in the messages, 256 in the completion).",
            4096,
        ),
        (
            "'max_tokens' or 'max_completion_tokens' is too large: 256. This model's maximum "
            "context length is 16384 tokens and your request has 16300 input tokens",
            16384,
        ),
    ],
)
def test_window_errors_name_the_limit(text: str, limit: int) -> None:
    assert is_window_error(text)
    assert window_limit(text) == limit


def test_other_bad_requests_are_not_window_errors() -> None:
    assert not is_window_error("'messages' must be an array")
    assert window_limit("no number here") is None


def test_a_target_is_name_url_and_model() -> None:
    target = Target.parse("q4=http://127.0.0.1:8001/v1/,gemma-270m")
    assert target == Target("q4", "http://127.0.0.1:8001/v1", "gemma-270m")
    for bad in ("http://x/v1,m", "q4=http://x/v1", "=http://x/v1,m", "q4=,m"):
        with pytest.raises(UsageError, match="NAME=URL,MODEL"):
            Target.parse(bad)


def answer(context: str, target: str, *channels: str, route: str = "direct", **kw: Any) -> Answer:
    violations = [{"channel": c, "message": c} for c in channels]
    return Answer(Key(context, target, 0, route), "answered", violations=violations, **kw)  # type: ignore[arg-type]


def test_the_journal_drops_a_cut_last_line_and_the_question_is_asked_again(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path / "answers.jsonl")
    journal.append(answer("c1", "a", "unknown_tool"))
    journal.append(answer("c2", "a"))
    with journal.path.open("a") as handle:
        handle.write('{"context": "c3", "target": "a", "sam')
    answers, broken = journal.read()
    assert broken == 1
    assert set(answers) == {Key("c1", "a", 0, "direct"), Key("c2", "a", 0, "direct")}
    assert answers[Key("c1", "a", 0, "direct")].channels == {"unknown_tool"}


def test_plan_asks_only_what_is_missing_target_by_target(tau2_dir: Path) -> None:
    path = tau2_file(tau2_dir, "retail")
    contexts = load_contexts([path], per_file=3).contexts
    targets = [Target("a", "http://a/v1", "m"), Target("b", "http://b/v1", "m")]
    first = answer(contexts[0].id, "a", "unknown_tool")
    done = {first.key: first}
    questions = plan(contexts, targets, 2, "http://proxy/v1", done)
    assert len(questions) == 3 * 2 * 2 * 2 - 1
    assert [q.key.target for q in questions] == sorted(q.key.target for q in questions)
    assert {q.base_url for q in questions if q.key.route == "proxy"} == {"http://proxy/v1"}
    # Only the failing direct answer is asked again through the proxy.
    failing = plan(contexts, targets, 2, "http://proxy/v1", done, proxy_failing_only=True)
    proxied = [q.key for q in failing if q.key.route == "proxy"]
    assert proxied == [Key(contexts[0].id, "a", 0, "proxy")]
    assert len(failing) == 3 * 2 * 2 - 1 + 1


def test_pair_figures_count_novel_failures_and_ratios(tau2_dir: Path) -> None:
    answers = [
        answer("c1", "ref", "unknown_tool"),
        answer("c2", "ref"),
        answer("c3", "ref"),
        answer("c4", "ref"),
        answer("c1", "low", "unknown_tool"),
        answer("c2", "low", "schema_violation"),
        answer("c3", "low", "schema_violation"),
        answer("c4", "low"),
        answer("c5", "low", "empty_response"),  # the reference did not answer c5: left out
    ]
    pair = pair_figures("ref", "low", answers)
    assert pair.contexts == 4
    a, na, b, nb, ratio = pair.ratios[ANY]
    assert (a, na, b, nb) == (1, 4, 3, 4)
    assert ratio is not None
    assert ratio.ratio == pytest.approx(3.0)
    # Of low's 3 failures, the two schema violations have signatures ref never shows.
    assert pair.novel_share == pytest.approx(2 / 3)
    assert pair.ratios["empty_response"][2] == 0


def test_repair_success_counts_reported_channels_delivered_valid() -> None:
    reported = {"x-toolsentry-violations": "unknown_tool"}
    answers = [
        answer("c1", "a", route="proxy", proxy=reported),  # repaired: delivered clean
        answer("c2", "a", "unknown_tool", route="proxy", proxy=reported),  # not repaired
        answer("c3", "a", route="proxy"),
    ]
    figures = repair_figures("a", answers)
    assert figures.channels["unknown_tool"] == (2, 1)
    assert figures.channels["schema_violation"] == (0, 0)
    assert figures.delivered_failing == 1
    assert figures.answered == 3


def test_target_rates_count_answers_and_skip_what_did_not_fit(tau2_dir: Path) -> None:
    path = tau2_file(tau2_dir, "retail")
    contexts = load_contexts([path], per_file=4).contexts
    ids = [c.id for c in contexts]
    answers = [
        answer(ids[0], "a", "unknown_tool", "schema_violation"),
        answer(ids[1], "a"),
        answer(ids[2], "a", "leaked_tool_call"),
        Answer(Key(ids[3], "a", 0, "direct"), "too_long", error="too long", limit=4096),
    ]
    figures = target_figures(Target("a", "u", "m"), contexts, answers, None, resamples=200)
    assert (figures.asked, figures.answered, figures.too_long, figures.window) == (4, 3, 1, 4096)
    assert figures.channels["unknown_tool"].count == 1
    assert figures.channels[ANY].count == 2
    assert figures.channels[ANY].n == 3
    low, high = figures.channels[ANY].low, figures.channels[ANY].high
    assert low is not None
    assert high is not None
    assert low <= 2 / 3 <= high
