"""The shadow comparison's arithmetic (DESIGN §11): pure, no I/O, no clock.

A pair is one request answered twice, by the served model (the primary, e.g. INT4) and by its
full-precision reference (e.g. BF16). Each answer is reduced to a `Decision` (the tool names it
called, its arguments, its failures); `Pair` classifies the two; `Tally` adds pairs up as flat
string → count fields, the form the session store keeps them in so every worker and replica sees
the same figures; `figures` turns a tally into what `GET /v1/stats/shadow` shows.

The live figures are deliberately simple — rates with a Wilson interval, a rate ratio with Katz's
log interval, Spearman's rank correlation, the novel share, argument agreement. `evalkit shadow`
reads the shadow log and adds the full statistics (evalkit imports this module; the proxy never
imports evalkit). The interval and correlation arithmetic is `proxy/statistics.py`, which
evalkit's analysis uses too.

Units. A rate is per answer: the share of pairs whose primary (reference) answer failed in the
channel at least once. A signature is (channel, tool name as called; "" for a channel that names
no tool) and is counted once per failure, as in evalkit's analysis.
"""

from __future__ import annotations

import enum
import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import orjson

from proxy.guard.channels import Violation
from proxy.guard.toolcheck import parse_arguments
from proxy.protocols.base import API
from proxy.statistics import Z_95, relative_risk, spearman, wilson

_K = TypeVar("_K")
TOP_NAMES: Final = 10

# Field names of a tally. A tool name may hold any character, so it is always the last part.
_SEP: Final = "|"
PAIRS: Final = "pairs"
DROPPED: Final = "dropped"
_OUTCOME: Final = "outcome"
_ANSWERS: Final = "answers"
_SIGNATURE: Final = "sig"
_ERRORS: Final = "errors"
_SKIPPED: Final = "skipped"
ARGS_COMPARED: Final = "args|compared"
ARGS_EQUAL: Final = "args|equal"
_ARG_KEY: Final = "args|key"


class Outcome(enum.StrEnum):
    """How the two answers of a pair compare. The value is the metric label and the log's word."""

    AGREE = "agree"  # both valid: the same tool names in the same order, or both plain text
    DIVERGE = "diverge"  # both valid, a different tool decision
    PRIMARY_ONLY = "primary_only"  # only the primary's answer failed
    REFERENCE_ONLY = "reference_only"  # only the reference's answer failed
    BOTH = "both"  # both failed, with the same signatures or not


class Side(enum.StrEnum):
    """Which answer of a pair."""

    PRIMARY = "primary"
    REFERENCE = "reference"


Signature = tuple[str, str]
"""(channel, tool name as called); the name is "" for a channel that names no tool."""


@dataclass(slots=True, unsafe_hash=True)
class Decision:
    """One side's answer, reduced to what the comparison reads.

    `tools` are the names called, in order; `arguments` each call's arguments as canonical JSON
    (keys sorted) when they parse to an object, else None; `failures` one signature per violation
    the guard found.

    Not frozen (two are made per pair, and a frozen dataclass costs three times as much to make),
    but nothing assigns to one once made: it is hashed and compared by its fields.
    """

    tools: tuple[str, ...]
    arguments: tuple[str | None, ...]
    failures: tuple[Signature, ...]

    @property
    def valid(self) -> bool:
        """Whether the guard found nothing wrong with the answer."""
        return not self.failures

    @property
    def channels(self) -> tuple[str, ...]:
        """The channels this answer failed in, each once, in the order first seen."""
        if not self.failures:
            return ()
        return tuple(dict.fromkeys(channel for channel, _ in self.failures))

    @classmethod
    def of(cls, calls: Iterable[tuple[str, object]], violations: Iterable[Violation]) -> Decision:
        """The decision of an answer whose tool calls are `(name, arguments)` (arguments as the
        model wrote them: a JSON text, or an already-decoded object) and which the guard judged
        with `violations`."""
        names: list[str] = []
        arguments: list[str | None] = []
        for name, raw in calls:
            names.append(name)
            arguments.append(canonical_arguments(raw))
        return cls(tuple(names), tuple(arguments), _signatures(violations))

    @classmethod
    def of_message(cls, message: Mapping[str, Any], violations: Iterable[Violation]) -> Decision:
        """The decision of an assistant message in the guard's shape (`tool_calls` of
        `{"function": {"name", "arguments"}}`) that the guard judged with `violations`."""
        names: list[str] = []
        arguments: list[str | None] = []
        for call in message.get("tool_calls") or ():
            # dict first: the ABC's instance check costs more than the rest of the loop
            function = call.get("function") if isinstance(call, (dict, Mapping)) else None
            if isinstance(function, (dict, Mapping)):
                names.append(str(function.get("name", "")))
                arguments.append(canonical_arguments(function.get("arguments")))
        # A valid answer (the usual) has no failures: no call for them.
        failures = tuple([signature_of(v) for v in violations]) if violations else ()
        return cls(tuple(names), tuple(arguments), failures)

    def to_dict(self) -> dict[str, Any]:
        """The log's form of the decision: names and channels, never argument values."""
        return {
            "tools": list(self.tools),
            "channels": list(self.channels),
            "failures": [{"channel": c, "tool": t} for c, t in self.failures],
        }


def signature_of(violation: Violation) -> Signature:
    """The failure signature of one violation: (channel, tool name as called or "")."""
    return (violation.channel.value, violation.tool_name or "")


def _signatures(violations: Iterable[Violation]) -> tuple[Signature, ...]:
    # An empty list (a valid answer, the usual) is false; any other iterable is read.
    return tuple([signature_of(v) for v in violations]) if violations else ()


def canonical_arguments(raw: object) -> str | None:
    """A call's arguments as canonical JSON (sorted keys), or None when they are not an object.

    A text is looked up in a small memo first: the two answers of a pair usually call a tool
    with the same text, so the second side's canonical form (a parse and a sorted dump) is a
    dictionary hit, and both sides hold the same string. A value that is not a string goes the
    slow way (it may not be hashable, and it is no object's text anyway)."""
    if type(raw) is not str:
        return _canonical(raw)
    held = _MEMO.texts
    if raw in held:
        return held[raw]
    canonical = _canonical(raw)
    _MEMO.add(raw, canonical)
    return canonical


def _canonical(raw: object) -> str | None:
    value, problem = parse_arguments(raw)
    if problem is not None or not isinstance(value, dict):
        return None
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


class _Memo:
    """`canonical_arguments`' memo: raw text -> canonical form.

    Bounded: a pair's two answers come within the shadow's timeout of each other, so it only
    needs the calls of the pairs in flight (`max_in_flight`, a few calls each). It is emptied
    when it holds `ENTRIES` texts or `CHARS` characters (so long arguments cannot make it large
    either), which loses at most one hit per text then.
    """

    ENTRIES: Final = 4096
    CHARS: Final = 1 << 21

    __slots__ = ("chars", "texts")

    def __init__(self) -> None:
        self.texts: dict[str, str | None] = {}
        self.chars = 0

    def add(self, raw: str, canonical: str | None) -> None:
        size = len(raw) + (0 if canonical is None else len(canonical))
        if len(self.texts) >= self.ENTRIES or self.chars + size > self.CHARS:
            self.texts.clear()
            self.chars = 0
        self.texts[raw] = canonical
        self.chars += size


_MEMO: Final = _Memo()


def classify(primary: Decision, reference: Decision) -> Outcome:
    """The outcome of a pair (see `Outcome`)."""
    if primary.valid and reference.valid:
        return Outcome.AGREE if primary.tools == reference.tools else Outcome.DIVERGE
    if reference.valid:
        return Outcome.PRIMARY_ONLY
    if primary.valid:
        return Outcome.REFERENCE_ONLY
    return Outcome.BOTH


@dataclass(slots=True)  # not frozen, as `Decision`; nothing assigns to one once made
class ArgumentAgreement:
    """For a pair that calls the same tools in the same order: how many calls had equal
    arguments, and the argument keys whose values differed (summed over the calls)."""

    compared: int
    equal: int
    differing_keys: Mapping[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {
            "compared": self.compared,
            "equal": self.equal,
            "differing_keys": dict(sorted(self.differing_keys.items())),
        }


def compare_arguments(primary: Decision, reference: Decision) -> ArgumentAgreement | None:
    """Argument agreement when both sides call the same tools in the same order (None
    otherwise, and for plain-text answers). A call whose arguments are not an object on either
    side counts as compared and not equal, with no keys named."""
    if not primary.tools or primary.tools != reference.tools:
        return None
    return _compare_calls(primary, reference)


def _compare_calls(primary: Decision, reference: Decision) -> ArgumentAgreement:
    if _all_equal(primary, reference):
        return ArgumentAgreement(len(primary.tools), len(primary.tools), {})
    equal = 0
    keys: dict[str, int] = {}  # a plain dict: a Counter costs a few µs to create
    for mine, theirs in zip(primary.arguments, reference.arguments, strict=True):
        if mine is not None and mine == theirs:
            equal += 1
            continue
        if mine is None or theirs is None:
            continue
        a, b = orjson.loads(mine), orjson.loads(theirs)
        for k in sorted(a.keys() | b.keys()):
            if a.get(k, _MISSING) != b.get(k, _MISSING):
                keys[k] = keys.get(k, 0) + 1
    return ArgumentAgreement(len(primary.tools), equal, keys)


_MISSING: Final = object()


def _all_equal(primary: Decision, reference: Decision) -> bool:
    """Whether every call's arguments are an object and equal on both sides (of two decisions
    that call the same tools): the usual pair, every call compared and equal, no key differing.
    """
    arguments = primary.arguments
    return arguments == reference.arguments and None not in arguments


@dataclass(slots=True)  # not frozen, as `Decision`; nothing assigns to one once made
class Pair:
    """One request answered by both sides. `arguments` is their argument agreement (see
    `compare_arguments`); `between` computes it."""

    primary: Decision
    reference: Decision
    arguments: ArgumentAgreement | None

    @classmethod
    def between(cls, primary: Decision, reference: Decision) -> Pair:
        """The pair of two decisions, their argument agreement computed."""
        return cls(primary, reference, compare_arguments(primary, reference))

    @property
    def outcome(self) -> Outcome:
        return classify(self.primary, self.reference)

    def side(self, side: Side) -> Decision:
        return self.primary if side is Side.PRIMARY else self.reference

    def to_log(self) -> dict[str, Any]:
        """The pair's fields of a shadow log line: outcome, both decisions, argument agreement."""
        return {
            "outcome": self.outcome.value,
            "primary": self.primary.to_dict(),
            "reference": self.reference.to_dict(),
            "arguments": None if self.arguments is None else self.arguments.to_dict(),
        }

    @classmethod
    def of_key(cls, key: PairKey) -> Pair:
        """A pair with the counts of every pair whose `pair_key` is `key` (argument values
        aside: the key holds none)."""
        primary_tools, primary_failures, reference_tools, reference_failures, agreement = key
        return cls(
            Decision(primary_tools, (None,) * len(primary_tools), primary_failures),
            Decision(reference_tools, (None,) * len(reference_tools), reference_failures),
            None if agreement is None else ArgumentAgreement(*agreement[:2], dict(agreement[2])),
        )

    @classmethod
    def from_log(cls, line: Mapping[str, Any]) -> Pair:
        """The pair a shadow log line holds (the inverse of `to_log`, argument values aside).

        Raises:
            ValueError: a field is missing or of the wrong type.
        """
        try:
            sides = [_decision_from_log(line[s.value]) for s in Side]
            raw = line["arguments"]
            agreement = (
                None
                if raw is None
                else ArgumentAgreement(
                    int(raw["compared"]),
                    int(raw["equal"]),
                    {str(k): int(v) for k, v in raw["differing_keys"].items()},
                )
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a shadow pair: {exc!r}") from exc
        return cls(sides[0], sides[1], agreement)


AgreementKey = tuple[int, int, tuple[tuple[str, int], ...]]
"""An `ArgumentAgreement` as a hashable tuple: compared, equal, the differing keys' items."""
PairKey = tuple[
    tuple[str, ...],
    tuple[Signature, ...],
    tuple[str, ...],
    tuple[Signature, ...],
    AgreementKey | None,
]
"""What a pair's counts depend on: the primary's tools and failures, the reference's, and the
argument agreement (see `pair_key`)."""


def pair_key(primary: Decision, reference: Decision) -> PairKey:
    """The pair of two decisions as a small hashable key: `pair_counts(Pair.of_key(key))` is
    `pair_counts(Pair.between(primary, reference))`. Pairs can so be added up by key, one dict
    entry each, and counted once per distinct key times how many there were.

    The usual pair, the same tools called with the same arguments on both sides, costs no
    comparison: its agreement is every call compared and equal, no key differing."""
    tools = primary.tools
    agreement: AgreementKey | None = None
    if tools and tools == reference.tools:
        if _all_equal(primary, reference):
            agreement = (len(tools), len(tools), ())
        else:
            full = _compare_calls(primary, reference)
            agreement = (full.compared, full.equal, tuple(full.differing_keys.items()))
    return (tools, primary.failures, reference.tools, reference.failures, agreement)


def _decision_from_log(data: Mapping[str, Any]) -> Decision:
    tools = tuple(str(t) for t in data["tools"])
    failures = tuple((str(f["channel"]), str(f.get("tool") or "")) for f in data["failures"])
    return Decision(tools, (None,) * len(tools), failures)


# -- tallies -------------------------------------------------------------------------------------


def pair_counts(pair: Pair) -> tuple[dict[str, int], dict[str, int]]:
    """What one pair adds to a tally, split into the bounded fields (pairs, outcomes, per-channel
    answers, argument totals) and the unbounded ones (signatures and argument keys hold names a
    model made up; the store caps how many of those it keeps)."""
    fixed = {PAIRS: 1, _OUTCOME_FIELDS[classify(pair.primary, pair.reference)]: 1}
    names: dict[str, int] = {}
    for side, decision in ((Side.PRIMARY, pair.primary), (Side.REFERENCE, pair.reference)):
        if not decision.failures:  # the common case: nothing to name
            continue
        for channel in decision.channels:
            field = f"{_ANSWERS}{_SEP}{side.value}{_SEP}{channel}"
            fixed[field] = fixed.get(field, 0) + 1
        for channel, tool in decision.failures:
            field = f"{_SIGNATURE}{_SEP}{side.value}{_SEP}{channel}{_SEP}{tool}"
            names[field] = names.get(field, 0) + 1
    agreement = pair.arguments
    if agreement is not None:
        fixed[ARGS_COMPARED] = agreement.compared
        fixed[ARGS_EQUAL] = agreement.equal
        for key, count in agreement.differing_keys.items():
            field = f"{_ARG_KEY}{_SEP}{key}"
            names[field] = names.get(field, 0) + count
    return fixed, names


def outcome_field(outcome: Outcome) -> str:
    """The tally field counting pairs of one outcome."""
    return f"{_OUTCOME}{_SEP}{outcome.value}"


_OUTCOME_FIELDS: Final = {o: outcome_field(o) for o in Outcome}


def error_field(kind: str) -> str:
    """The tally field counting reference failures of one kind (timeout, status_500, …)."""
    return f"{_ERRORS}{_SEP}{kind}"


class SkipReason(enum.StrEnum):
    """Why a sampled request was not sent to the reference: it leans on state only the primary's
    upstream holds, so the reference could not be asked the same question. The value is the
    metric label and the log's word."""

    PREVIOUS_RESPONSE_ID = "previous_response_id"  # Responses: the context is a stored response
    CONVERSATION = "conversation"  # Responses: the context is a stored conversation
    ITEM_REFERENCE = "item_reference"  # Responses: an input item names a stored item by id


def skip_reason(api: str, body: Mapping[str, Any]) -> SkipReason | None:
    """Why a request of `api` cannot be replayed at a reference, or None when it can.

    A Responses request that continues a stored response (`previous_response_id`) or a stored
    conversation (`conversation`), or that names stored input items (`item_reference`), carries
    only what is new: the rest lives at the primary's upstream, which the reference is not. Sent
    as is, the reference would refuse it (it does not know the ids) or, worse, answer a
    question without its context; the pair would compare nothing.
    """
    if api != API.RESPONSES:
        return None
    if body.get("previous_response_id") is not None:
        return SkipReason.PREVIOUS_RESPONSE_ID
    if body.get("conversation") is not None:
        return SkipReason.CONVERSATION
    items = body.get("input")
    if isinstance(items, list) and any(
        isinstance(item, Mapping) and item.get("type") == "item_reference" for item in items
    ):
        return SkipReason.ITEM_REFERENCE
    return None


def skip_field(reason: SkipReason) -> str:
    """The tally field counting sampled requests skipped for one reason."""
    return f"{_SKIPPED}{_SEP}{reason.value}"


@dataclass(frozen=True, slots=True)
class Tally:
    """Everything counted for one (model, reference), read back from flat fields."""

    pairs: int
    dropped: int
    outcomes: Mapping[str, int]
    answers: Mapping[tuple[str, str], int]  # (side, channel) -> answers failing in it
    signatures: Mapping[str, Counter[Signature]]  # side -> signature counts
    errors: Mapping[str, int]
    skipped: Mapping[str, int]  # reason -> sampled requests not sent to the reference
    args_compared: int
    args_equal: int
    differing_keys: Mapping[str, int]

    @classmethod
    def parse(cls, fields: Mapping[str, int]) -> Tally:
        """Read a tally from its fields (both halves of `pair_counts`, merged)."""
        outcomes: dict[str, int] = {}
        answers: dict[tuple[str, str], int] = {}
        signatures: dict[str, Counter[Signature]] = {s.value: Counter() for s in Side}
        errors: dict[str, int] = {}
        skipped: dict[str, int] = {}
        keys: dict[str, int] = {}
        for name, count in fields.items():
            kind, _, rest = name.partition(_SEP)
            if kind == _OUTCOME:
                outcomes[rest] = count
            elif kind == _ANSWERS:
                side, _, channel = rest.partition(_SEP)
                answers[(side, channel)] = count
            elif kind == _SIGNATURE:
                side, _, signature = rest.partition(_SEP)
                channel, _, tool = signature.partition(_SEP)
                if side in signatures:
                    signatures[side][(channel, tool)] += count
            elif kind == _ERRORS:
                errors[rest] = count
            elif kind == _SKIPPED:
                skipped[rest] = count
            elif name.startswith(_ARG_KEY + _SEP):
                keys[name.removeprefix(_ARG_KEY + _SEP)] = count
        return cls(
            pairs=fields.get(PAIRS, 0),
            dropped=fields.get(DROPPED, 0),
            outcomes=outcomes,
            answers=answers,
            signatures=signatures,
            errors=errors,
            skipped=skipped,
            args_compared=fields.get(ARGS_COMPARED, 0),
            args_equal=fields.get(ARGS_EQUAL, 0),
            differing_keys=keys,
        )


def tally_pairs(pairs: Iterable[Pair]) -> Tally:
    """The tally of some pairs, without a store (the shadow log's reader uses this)."""
    fields: Counter[str] = Counter()
    for pair in pairs:
        fixed, names = pair_counts(pair)
        fields.update(fixed)
        fields.update(names)
    return Tally.parse(fields)


def is_sampled(session: str, *, seed: int, rate: float) -> bool:
    """Whether `session` is in the shadow sample: a hash of (seed, session) read as a number in
    [0, 1), below `rate`. The same session gets the same answer on every turn, worker and
    replica, so a sampled session is shadowed on all its turns."""
    if rate >= 1.0:
        return True
    if rate <= 0.0:
        return False
    digest = hashlib.blake2b(f"{seed}\x00{session}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < rate


# -- statistics ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ratio:
    """`primary rate / reference rate` with a 95% interval (Katz's log method). `corrected`: one
    side had no events, so half an event was added to each side (the usual continuity fix)."""

    ratio: float
    low: float
    high: float
    corrected: bool

    @property
    def excludes_one(self) -> bool:
        return self.low > 1.0 or self.high < 1.0


def katz_ratio(
    primary_events: int, reference_events: int, trials: int, z: float = Z_95
) -> Ratio | None:
    """The ratio of two rates over the same `trials` with Katz's log interval
    (`proxy.statistics.relative_risk`); None without trials or without events on either side."""
    found = relative_risk(primary_events, trials, reference_events, trials, z)
    return None if found is None else Ratio(*found)


def signature_agreement(
    primary: Mapping[Signature, int], reference: Mapping[Signature, int]
) -> tuple[float | None, float | None]:
    """(Spearman correlation of the two sides' signature counts over the union of signatures,
    share of the primary's failures whose signature the reference never produced). Either is
    None where undefined (no signatures; no primary failures)."""
    keys = sorted(primary.keys() | reference.keys())
    correlation = spearman([primary.get(k, 0) for k in keys], [reference.get(k, 0) for k in keys])
    total = sum(primary.values())
    novel = sum(n for k, n in primary.items() if not reference.get(k, 0))
    return correlation, (novel / total if total else None)


def figures(tally: Tally, *, top: int = TOP_NAMES) -> dict[str, Any]:
    """The JSON of one (model, reference) for `GET /v1/stats/shadow`, with the counts behind
    each figure. Hallucinated names appear only in the top-`top` lists."""
    n = tally.pairs
    channels = sorted({c for _, c in tally.answers})
    per_channel: dict[str, Any] = {}
    for channel in channels:
        entry: dict[str, Any] = {}
        events = {s: tally.answers.get((s.value, channel), 0) for s in Side}
        for side in Side:
            entry[side.value] = _rate(events[side], n)
        ratio = katz_ratio(events[Side.PRIMARY], events[Side.REFERENCE], n)
        entry["ratio"] = None if ratio is None else _ratio_dict(ratio)
        per_channel[channel] = entry
    primary = tally.signatures.get(Side.PRIMARY.value, Counter())
    reference = tally.signatures.get(Side.REFERENCE.value, Counter())
    correlation, novel = signature_agreement(primary, reference)
    novel_failures = sum(c for k, c in primary.items() if not reference.get(k, 0))
    return {
        "pairs": n,
        "dropped": tally.dropped,
        "errors": dict(sorted(tally.errors.items())),
        "skipped": {r.value: tally.skipped.get(r.value, 0) for r in SkipReason},
        "outcomes": {o.value: tally.outcomes.get(o.value, 0) for o in Outcome},
        "channels": per_channel,
        "signatures": {
            "rank_correlation": correlation,
            "distinct": len(primary.keys() | reference.keys()),
            "novel_share": novel,
            "novel_failures": novel_failures,
            "primary_failures": sum(primary.values()),
            "reference_failures": sum(reference.values()),
            "top": {
                side: [
                    {"channel": c, "tool": t, "count": k}
                    for (c, t), k in _most_common(tally.signatures.get(side, Counter()), top)
                ]
                for side in (Side.PRIMARY.value, Side.REFERENCE.value)
            },
        },
        "arguments": {
            "compared": tally.args_compared,
            "equal": tally.args_equal,
            "agreement": (tally.args_equal / tally.args_compared) if tally.args_compared else None,
            "differing_keys": [
                {"key": key, "count": count}
                for key, count in _most_common(Counter(tally.differing_keys), top)
            ],
        },
    }


def _rate(events: int, trials: int) -> dict[str, Any]:
    interval = wilson(events, trials)
    return {
        "answers": events,
        "rate": events / trials if trials else None,
        "ci": None if interval is None else list(interval),
    }


def _ratio_dict(ratio: Ratio) -> dict[str, Any]:
    return {
        "value": ratio.ratio,
        "ci": [ratio.low, ratio.high],
        "excludes_one": ratio.excludes_one,
        "corrected": ratio.corrected,
    }


def _most_common(counts: Counter[_K], n: int) -> list[tuple[_K, int]]:
    # Ties in a stable, readable order (most common first, then by key), so replicas agree.
    return sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0])))[:n]
