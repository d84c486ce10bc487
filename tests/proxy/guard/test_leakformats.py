"""The conformance suite every leak format passes: vLLM's parsers' own examples found exactly,
cut-off calls reported, prose left alone, the streamed path at every split."""

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from proxy.guard.leakformats import FAMILIES, FORMATS, NOT_APPLICABLE, VLLM_PARSERS
from proxy.guard.leaks import LeakedCall, find_leaked_calls, find_leaked_calls_in_reasoning
from proxy.protocols.chat.stream import ChunkAssembler
from proxy.sse import SSEDecoder, SSEEvent, encode_event

FIXTURES = Path(__file__).parents[2] / "fixtures" / "leaks"
DATA = json.loads((FIXTURES / "formats.json").read_text())
EXAMPLES: list[dict[str, Any]] = DATA["examples"]
PROSE: list[dict[str, str]] = DATA["prose"]
BARE = {f.name for f in FORMATS if f.bare}
# A bare format is the whole text by definition: it is neither repeated nor preceded by prose.
MARKED_EXAMPLES = [e for e in EXAMPLES if e["format"] not in BARE]
# A call without arguments is cut off only once its closing tag is: its name alone is prose.
WITH_ARGUMENTS = [e for e in EXAMPLES if e["calls"][-1][1]]


def example_id(example: dict[str, Any]) -> str:
    return f"{example['format']}:{example['parser']}:{EXAMPLES.index(example)}"


def summary(calls: list[LeakedCall]) -> list[tuple[str, Any, str, bool]]:
    return [(c.name, c.arguments, c.format, c.complete) for c in calls]


def expected(example: dict[str, Any]) -> list[tuple[str, Any, str, bool]]:
    return [(name, arguments, example["format"], True) for name, arguments in example["calls"]]


def pinned_parsers() -> list[str]:
    lines = (FIXTURES / "vllm_parsers.txt").read_text().splitlines()
    return [line for line in lines if line and not line.startswith("#")]


def test_every_parser_of_the_pinned_vllm_is_covered_or_named_not_applicable() -> None:
    parsers = pinned_parsers()
    assert len(parsers) == len(set(parsers)) == 54
    assert set(VLLM_PARSERS).isdisjoint(NOT_APPLICABLE)
    assert set(VLLM_PARSERS) | set(NOT_APPLICABLE) == set(parsers)


def test_every_format_has_vllm_examples_for_each_of_its_parsers() -> None:
    covered = {(e["format"], e["parser"]) for e in EXAMPLES}
    formats = {e["format"] for e in EXAMPLES}
    assert formats == {f.name for f in FORMATS}
    assert {VLLM_PARSERS[p] for _, p in covered} <= formats
    assert all(VLLM_PARSERS[e["parser"]] == e["format"] for e in EXAMPLES)
    assert all(e["source"] for e in EXAMPLES)


def test_the_readme_lists_every_format_with_its_parsers() -> None:
    readme = (Path(__file__).parents[3] / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("| `")]
    for fmt in FORMATS:
        [row] = [r for r in rows if r.startswith(f"| `{fmt.name}` |")]
        assert all(f"`{parser}`" in row for parser in fmt.parsers), fmt.name
    assert all(
        any(f"`{p}` | not applicable" in r for r in readme.splitlines()) for p in NOT_APPLICABLE
    )


def test_every_marker_holds_a_family_so_text_without_any_family_skips_every_marked_format() -> None:
    for fmt in FORMATS:
        assert fmt.bare == (not fmt.markers)
        for marker in fmt.markers:
            assert any(family in marker for family in FAMILIES), (fmt.name, marker)


@pytest.mark.parametrize("example", MARKED_EXAMPLES, ids=example_id)
def test_an_example_written_twice_in_one_message_is_found_twice(example: dict[str, Any]) -> None:
    text = example["text"] + "\n" + example["text"]
    assert summary(find_leaked_calls(text)) == expected(example) * 2


@pytest.mark.parametrize("example", EXAMPLES, ids=example_id)
def test_a_vllm_example_is_found_with_its_names_and_arguments(example: dict[str, Any]) -> None:
    calls = find_leaked_calls(example["text"])
    assert summary(calls) == expected(example)
    text = example["text"]
    assert all(text[c.start : c.end] == c.raw for c in calls)


@pytest.mark.parametrize("example", EXAMPLES, ids=example_id)
def test_a_vllm_example_in_the_reasoning_is_found_unless_its_format_is_bare(
    example: dict[str, Any],
) -> None:
    calls = find_leaked_calls_in_reasoning(example["text"])
    assert summary(calls) == ([] if example["format"] in BARE else expected(example))


@pytest.mark.parametrize("example", MARKED_EXAMPLES, ids=example_id)
def test_a_vllm_example_after_an_answer_is_still_found(example: dict[str, Any]) -> None:
    text = "Sure, let me look that up for you.\n\n" + example["text"]
    assert summary(find_leaked_calls(text)) == expected(example)


@pytest.mark.parametrize("example", EXAMPLES, ids=example_id)
def test_an_example_cut_anywhere_in_its_last_call_never_reads_that_call_as_complete(
    example: dict[str, Any],
) -> None:
    text = example["text"]
    whole = find_leaked_calls(text)
    known = {name for name, _ in example["calls"]}
    for cut in range(whole[-1].start, whole[-1].end):
        calls = find_leaked_calls(text[:cut])
        assert sum(c.complete for c in calls) < len(whole), text[:cut]
        assert all(c.name in known for c in calls if c.complete)


@pytest.mark.parametrize("example", WITH_ARGUMENTS, ids=example_id)
def test_an_example_cut_inside_its_last_arguments_reports_a_call_cut_off(
    example: dict[str, Any],
) -> None:
    text = example["text"]
    whole = find_leaked_calls(text)
    start = text.rindex(example["cut_after"]) + len(example["cut_after"])
    for cut in range(start, whole[-1].end):
        calls = find_leaked_calls(text[:cut])
        assert any(not c.complete for c in calls), text[:cut]


@pytest.mark.parametrize("example", EXAMPLES, ids=example_id)
def test_a_text_cut_before_the_last_call_reports_only_the_calls_before_it(
    example: dict[str, Any],
) -> None:
    text = example["text"]
    whole = find_leaked_calls(text)
    last = whole[-1]
    calls = find_leaked_calls(text[: last.start])
    before = [c for c in whole if c.end <= last.start]
    assert [c for c in calls if c.complete] == before


@pytest.mark.parametrize("case", PROSE, ids=[p["why"] for p in PROSE])
def test_prose_that_names_a_marker_is_not_a_call(case: dict[str, str]) -> None:
    assert find_leaked_calls(case["text"]) == []
    assert find_leaked_calls_in_reasoning(case["text"]) == []


OPENING_MARKERS = sorted({m for f in FORMATS for m in f.markers})
WORD = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCXYZ0123456789.,;:!?'-_", min_size=1, max_size=12
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(WORD, WORD, st.sampled_from(OPENING_MARKERS)), min_size=1, max_size=30),
    WORD,
)
@example(["<|tools_prefix|>", "[TOOL_CALLS]"], "0")  # a marker, then another's `[`: prose
def test_arbitrary_prose_with_markers_among_its_words_never_produces_a_call(
    words: list[str], last: str
) -> None:
    text = " ".join([*words, last])
    assert find_leaked_calls(text) == []
    assert find_leaked_calls_in_reasoning(text) == []


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_never_breaks_the_scan(text: str) -> None:
    for call in find_leaked_calls(text) + find_leaked_calls_in_reasoning(text):
        assert text[call.start : call.end] == call.raw
        assert call.format in {f.name for f in FORMATS}


# -- streamed: the relay assembles content and reasoning deltas, and the scan reads the result --


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": [choice]}


def sse_body(field: str, pieces: list[str]) -> bytes:
    events = [chunk({"role": "assistant"})]
    events += [chunk({field: piece}) for piece in pieces]
    events.append(chunk({}, "stop"))
    return b"".join(encode_event(e) for e in events) + b"data: [DONE]\n\n"


def assembled(body_pieces: list[bytes]) -> dict[str, Any]:
    """The message the stream relay hands to the guard when the choice finishes."""
    decoder, assembler = SSEDecoder(), ChunkAssembler()
    messages = []
    for piece in [*body_pieces, None]:
        items = decoder.feed(piece) if piece is not None else decoder.flush()
        for item in items:
            if isinstance(item, SSEEvent) and item.payload is not None:
                assembler.add(item.payload)
                messages += [f.message for f in assembler.take_finished()]
    [message] = messages
    return message


def streamed_scan(field: str, message: dict[str, Any]) -> list[LeakedCall]:
    if field == "content":
        return find_leaked_calls(message.get("content"))
    return find_leaked_calls_in_reasoning(message.get(field))


@pytest.mark.parametrize("field", ["content", "reasoning_content"])
@pytest.mark.parametrize("example", EXAMPLES, ids=example_id)
def test_streamed_text_split_into_two_deltas_at_every_character_scans_as_the_whole(
    example: dict[str, Any], field: str
) -> None:
    text = example["text"]
    whole = streamed_scan(field, {field: text})
    for split in range(1, len(text)):
        body = sse_body(field, [text[:split], text[split:]])
        assert streamed_scan(field, assembled([body])) == whole


ONE_PER_FORMAT = list({e["format"]: e for e in reversed(EXAMPLES)}.values())


@pytest.mark.parametrize("example", ONE_PER_FORMAT, ids=example_id)
def test_the_streamed_bytes_split_at_every_byte_scan_as_the_whole(example: dict[str, Any]) -> None:
    # Deltas of 32 characters, as a tokenizer's pieces; the byte stream is cut at every byte,
    # inside events, inside markers and inside multi-byte characters.
    text = example["text"]
    body = sse_body("content", [text[i : i + 32] for i in range(0, len(text), 32)])
    whole = find_leaked_calls(text)
    for split in range(1, len(body)):
        message = assembled([body[:split], body[split:]])
        assert find_leaked_calls(message["content"]) == whole
