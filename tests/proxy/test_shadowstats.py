"""The shadow comparison's pure arithmetic: decisions, outcomes, tallies, figures, sampling."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats as scipy_stats
from scipy.stats.contingency import relative_risk

from proxy.guard.channels import Channel, Violation
from proxy.shadowstats import _MEMO as MEMO
from proxy.shadowstats import (
    Decision,
    Outcome,
    Pair,
    Tally,
    canonical_arguments,
    classify,
    figures,
    is_sampled,
    katz_ratio,
    pair_counts,
    pair_key,
    signature_agreement,
    tally_pairs,
)


def decision(*tools: str, failures: tuple[tuple[str, str], ...] = (), args: str = "{}") -> Decision:
    return Decision(tuple(tools), tuple(args for _ in tools), failures)


UNKNOWN = Channel.UNKNOWN_TOOL.value


def test_a_decision_keeps_names_canonical_arguments_and_one_signature_per_violation() -> None:
    got = Decision.of(
        [("get_order", '{"b": 1, "a": 2}'), ("lookup_order", "not json")],
        [
            Violation(Channel.UNKNOWN_TOOL, "no such tool", "lookup_order", 1),
            Violation(Channel.EMPTY_RESPONSE, "empty"),
        ],
    )
    assert got.tools == ("get_order", "lookup_order")
    assert got.arguments == ('{"a":2,"b":1}', None)
    assert got.failures == ((UNKNOWN, "lookup_order"), ("empty_response", ""))
    assert got.channels == (UNKNOWN, "empty_response")
    assert not got.valid


@pytest.mark.parametrize(
    ("primary", "reference", "outcome"),
    [
        (decision("a", "b"), decision("a", "b"), Outcome.AGREE),
        (decision(), decision(), Outcome.AGREE),  # both plain text
        (decision("a"), decision("b"), Outcome.DIVERGE),
        (decision("a", "b"), decision("b", "a"), Outcome.DIVERGE),  # order matters
        (decision("a"), decision(), Outcome.DIVERGE),  # a call against plain text
        (decision("x", failures=((UNKNOWN, "x"),)), decision("a"), Outcome.PRIMARY_ONLY),
        (decision("a"), decision("x", failures=((UNKNOWN, "x"),)), Outcome.REFERENCE_ONLY),
        (
            decision("x", failures=((UNKNOWN, "x"),)),
            decision("y", failures=(("malformed_arguments", "y"),)),
            Outcome.BOTH,
        ),
    ],
)
def test_pairs_are_classified_by_validity_then_tool_decision(
    primary: Decision, reference: Decision, outcome: Outcome
) -> None:
    assert classify(primary, reference) is outcome


def test_arguments_are_compared_only_when_the_same_tools_are_called_in_the_same_order() -> None:
    same = Pair.between(
        Decision(("a", "b"), ('{"id":1,"q":"x"}', '{"k":1}'), ()),
        Decision(("a", "b"), ('{"id":2,"q":"x","extra":true}', '{"k":1}'), ()),
    )
    assert same.arguments is not None
    assert (same.arguments.compared, same.arguments.equal) == (2, 1)
    assert dict(same.arguments.differing_keys) == {"extra": 1, "id": 1}
    assert Pair.between(decision("a"), decision("b")).arguments is None
    assert Pair.between(decision(), decision()).arguments is None
    malformed = Pair.between(Decision(("a",), (None,), ()), Decision(("a",), ('{"k":1}',), ()))
    assert malformed.arguments is not None
    assert (malformed.arguments.compared, malformed.arguments.equal) == (1, 0)


_TOOLS = st.sampled_from(["a", "b", "x|y"])
_ARGUMENTS = st.sampled_from(['{"id":1}', '{"id":2}', '{"id":1,"q":"x"}', "{}", None])
_FAILURES = st.lists(
    st.tuples(st.sampled_from([UNKNOWN, "malformed_arguments", "empty_response"]), _TOOLS),
    max_size=2,
)


@st.composite
def decisions(draw: st.DrawFn) -> Decision:
    calls = draw(st.lists(st.tuples(_TOOLS, _ARGUMENTS), max_size=3))
    return Decision(tuple(t for t, _ in calls), tuple(a for _, a in calls), tuple(draw(_FAILURES)))


@given(decisions(), decisions(), st.booleans())
def test_a_pairs_key_counts_what_the_pair_counts(
    primary: Decision, other: Decision, same_calls: bool
) -> None:
    # Half the time the reference calls what the primary called (the usual pair, whose
    # agreement the key takes without comparing), with failures of its own.
    reference = Decision(primary.tools, primary.arguments, other.failures) if same_calls else other
    pair = Pair.between(primary, reference)
    key = pair_key(primary, reference)
    assert hash(key) == hash(pair_key(primary, reference))
    again = Pair.of_key(key)
    assert again.outcome is pair.outcome
    assert again.arguments == pair.arguments
    assert pair_counts(again) == pair_counts(pair)
    assert list(pair_counts(again)[1]) == list(pair_counts(pair)[1])  # names in the same order


def test_the_usual_pair_has_every_call_compared_and_equal_in_its_key() -> None:
    a = Decision(("a", "b"), ('{"id":1}', '{"k":2}'), ())
    assert pair_key(a, Decision(a.tools, a.arguments, ()))[4] == (2, 2, ())
    other = Decision(("a", "b"), ('{"id":2}', '{"k":2}'), ())
    assert pair_key(a, other)[4] == (2, 1, (("id", 1),))
    unreadable = Decision(("a",), (None,), ())
    assert pair_key(unreadable, unreadable)[4] == (1, 0, ())  # not an object: never equal
    assert pair_key(a, Decision(("b",), ("{}",), ()))[4] is None


def test_canonical_arguments_are_the_same_text_for_both_sides_and_the_same_form() -> None:
    raw = '{"b": 1, "a": {"d": 2, "c": 3}}'
    first = canonical_arguments(raw)
    assert first == '{"a":{"c":3,"d":2},"b":1}'
    second = canonical_arguments(raw[:5] + raw[5:])  # another string of the same text
    assert second is first  # the memo's: the second side's lookup is a hit
    # Not text (the guard's reading: arguments must be a string): never held, not an object.
    assert canonical_arguments({"b": 1, "a": 2}) is None
    assert canonical_arguments("[1]") is None
    assert canonical_arguments("[1]") is None  # a non-object is remembered too
    assert canonical_arguments("  ") == "{}"
    assert canonical_arguments(None) is None


def test_the_canonical_memo_stays_bounded_in_texts_and_characters() -> None:
    for i in range(MEMO.ENTRIES + 10):
        canonical_arguments(f'{{"n": {i}}}')
        assert len(MEMO.texts) <= MEMO.ENTRIES
    assert canonical_arguments('{"n": 3}') == '{"n":3}'
    long = '{"text": "' + "x" * (MEMO.CHARS // 3) + '"}'
    for i in range(4):
        assert canonical_arguments(long.replace("text", f"t{i}")) is not None
        assert MEMO.chars <= MEMO.CHARS
        assert MEMO.chars == sum(len(k) + len(v or "") for k, v in MEMO.texts.items())


def test_a_pair_survives_the_log_line_it_is_written_as() -> None:
    pair = Pair.between(
        Decision(("a", "zz"), ('{"id":1}', "{}"), ((UNKNOWN, "zz"),)),
        Decision(("a",), ('{"id":2}',), ()),
    )
    again = Pair.from_log(pair.to_log())
    assert again.outcome is pair.outcome is Outcome.PRIMARY_ONLY
    assert pair_counts(again) == pair_counts(pair)
    with pytest.raises(ValueError, match="not a shadow pair"):
        Pair.from_log({"primary": {"tools": []}})


def test_a_tally_counts_outcomes_answers_signatures_and_arguments() -> None:
    x = (UNKNOWN, "lookup")
    pairs = [
        Pair.between(decision("lookup", failures=(x, x)), decision("get")),
        Pair.between(decision("lookup", failures=(x,)), decision("lookup", failures=(x,))),
        Pair.between(decision("get"), decision("get")),
    ]
    tally = tally_pairs(pairs)
    assert tally.pairs == 3
    assert tally.outcomes == {"primary_only": 1, "both": 1, "agree": 1}
    # Per answer: the first primary answer failed twice in one channel, it counts once.
    assert tally.answers == {("primary", UNKNOWN): 2, ("reference", UNKNOWN): 1}
    assert tally.signatures["primary"] == Counter({x: 3})
    assert tally.signatures["reference"] == Counter({x: 1})
    assert (tally.args_compared, tally.args_equal) == (2, 2)


def test_tool_names_with_the_separator_in_them_read_back_whole() -> None:
    odd = (UNKNOWN, "ns|tool|name")
    tally = tally_pairs([Pair.between(decision("ns|tool|name", failures=(odd,)), decision())])
    assert tally.signatures["primary"] == Counter({odd: 1})


def test_figures_show_rates_ratio_correlation_and_novel_share_with_their_counts() -> None:
    fields = {
        "pairs": 200,
        "dropped": 3,
        "errors|timeout": 2,
        "outcome|agree": 150,
        "answers|primary|unknown_tool": 40,
        "answers|reference|unknown_tool": 10,
        "sig|primary|unknown_tool|a": 30,
        "sig|primary|unknown_tool|b": 9,
        "sig|primary|unknown_tool|new": 1,
        "sig|reference|unknown_tool|a": 7,
        "sig|reference|unknown_tool|b": 3,
        "args|compared": 10,
        "args|equal": 8,
        "args|key|order_id": 2,
    }
    got = figures(Tally.parse(fields))
    assert got["pairs"] == 200
    assert got["dropped"] == 3
    assert got["errors"] == {"timeout": 2}
    assert got["outcomes"]["agree"] == 150
    assert got["outcomes"]["both"] == 0
    unknown = got["channels"][UNKNOWN]
    assert unknown["primary"]["answers"] == 40
    assert unknown["primary"]["rate"] == pytest.approx(0.2)
    assert unknown["reference"]["rate"] == pytest.approx(0.05)
    assert unknown["ratio"]["value"] == pytest.approx(4.0)
    assert unknown["ratio"]["excludes_one"] is True
    sig = got["signatures"]
    assert sig["novel_share"] == pytest.approx(1 / 40)
    assert (sig["novel_failures"], sig["primary_failures"], sig["reference_failures"]) == (
        1,
        40,
        10,
    )
    assert sig["rank_correlation"] == pytest.approx(scipy_stats.spearmanr([30, 9, 1], [7, 3, 0])[0])
    assert sig["top"]["primary"][0] == {"channel": UNKNOWN, "tool": "a", "count": 30}
    assert got["arguments"]["agreement"] == pytest.approx(0.8)
    assert got["arguments"]["differing_keys"] == [{"key": "order_id", "count": 2}]


def test_figures_of_nothing_are_empty_not_errors() -> None:
    got = figures(Tally.parse({}))
    assert got["pairs"] == 0
    assert got["channels"] == {}
    assert got["signatures"]["rank_correlation"] is None
    assert got["signatures"]["novel_share"] is None
    assert got["arguments"]["agreement"] is None


@given(st.integers(1, 80), st.integers(1, 80), st.integers(0, 80))
def test_katz_ratio_matches_scipys_relative_risk(p: int, r: int, more: int) -> None:
    trials = max(p, r) + more
    got = katz_ratio(p, r, trials)
    expected = relative_risk(p, trials, r, trials)
    low, high = expected.confidence_interval(0.95)
    assert got is not None
    assert (got.ratio, got.low, got.high) == pytest.approx(
        (expected.relative_risk, low, high), rel=1e-9
    )


def test_katz_ratio_corrects_a_side_without_events_and_is_none_without_any() -> None:
    assert katz_ratio(0, 0, 10) is None
    assert katz_ratio(3, 0, 0) is None
    corrected = katz_ratio(5, 0, 50)
    assert corrected is not None
    assert corrected.corrected
    assert corrected.ratio == pytest.approx(11.0)


def test_signature_agreement_over_the_union_and_the_share_never_seen_in_the_reference() -> None:
    primary = {(UNKNOWN, "a"): 10, (UNKNOWN, "b"): 5, (UNKNOWN, "c"): 5}
    reference = {(UNKNOWN, "a"): 4, (UNKNOWN, "b"): 2, (UNKNOWN, "d"): 1}
    correlation, novel = signature_agreement(primary, reference)
    assert novel == pytest.approx(5 / 20)
    expected = scipy_stats.spearmanr([10, 5, 5, 0], [4, 2, 0, 1])[0]
    assert correlation == pytest.approx(expected)
    assert signature_agreement({}, {}) == (None, None)


def test_one_thousand_sessions_at_a_tenth_sample_about_a_tenth_the_same_on_every_turn() -> None:
    sessions = [f"session-{i}" for i in range(1000)]
    chosen = {s for s in sessions if is_sampled(s, seed=7, rate=0.1)}
    # Binomial(1000, 0.1): ±5 standard deviations is 100 ± 47.
    assert 53 <= len(chosen) <= 147
    turns = [s for _ in range(5) for s in random.Random(1).sample(sessions, len(sessions))]
    per_turn = Counter(s for s in turns if is_sampled(s, seed=7, rate=0.1))
    assert set(per_turn) == chosen
    assert set(per_turn.values()) == {5}  # every turn of a sampled session, none of the others
    other_seed = {s for s in sessions if is_sampled(s, seed=8, rate=0.1)}
    assert other_seed != chosen
    assert all(is_sampled(s, seed=7, rate=1.0) for s in sessions)
    assert not any(is_sampled(s, seed=7, rate=0.0) for s in sessions)


def test_the_sample_share_converges_on_the_rate() -> None:
    hits = sum(is_sampled(str(i), seed=0, rate=0.3) for i in range(20_000))
    assert math.isclose(hits / 20_000, 0.3, abs_tol=0.02)
