"""Tests for proxy/sse.py: SSE decoding and encoding, whatever the stream's cut."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.errors import UpstreamProtocolError
from proxy.sse import (
    DONE,
    DONE_DATA,
    SSEComment,
    SSEDecoder,
    SSEEvent,
    encode_comment,
    encode_event,
    encode_typed_event,
)

Item = SSEEvent | SSEComment


def decode_all(pieces: Iterable[bytes]) -> list[Item]:
    decoder = SSEDecoder()
    items: list[Item] = []
    for piece in pieces:
        items += decoder.feed(piece)
    return items + decoder.flush()


# ---------------------------------------------------------------- decoder

SHORT_STREAM = (
    b": ping\r\n"
    b'data: {"text": "caf\xc3\xa9 \xf0\x9f\x9a\x80"}\r\n\r\n'
    b"event: message\n"
    b"id: 7\n"
    b"retry: 3000\n"
    b'data: {"a":\n'
    b"data: 1}\n\n"
    b'data: {"b": 2}\r\r'
    b"x-unknown: field\n"
    b"data: [DONE]\n\n"
)
SHORT_STREAM_ITEMS: list[Item] = [
    SSEComment("ping"),
    SSEEvent('{"text": "café 🚀"}', {"text": "café 🚀"}),
    SSEEvent('{"a":\n1}', {"a": 1}, event="message", id="7", retry=3000),
    SSEEvent('{"b": 2}', {"b": 2}, id="7"),
    SSEEvent("[DONE]", None, id="7"),
]


def test_decoder_reads_comments_fields_multiline_data_and_all_line_endings() -> None:
    assert decode_all([SHORT_STREAM]) == SHORT_STREAM_ITEMS


def test_decoder_yields_the_same_items_wherever_the_stream_is_cut_once_or_twice() -> None:
    for first in range(len(SHORT_STREAM) + 1):
        assert decode_all([SHORT_STREAM[:first], SHORT_STREAM[first:]]) == SHORT_STREAM_ITEMS, first
        for second in range(first, len(SHORT_STREAM) + 1, 7):
            pieces = [SHORT_STREAM[:first], SHORT_STREAM[first:second], SHORT_STREAM[second:]]
            assert decode_all(pieces) == SHORT_STREAM_ITEMS, (first, second)


def test_decoder_fed_one_byte_at_a_time_yields_the_same_items() -> None:
    assert (
        decode_all(SHORT_STREAM[i : i + 1] for i in range(len(SHORT_STREAM))) == SHORT_STREAM_ITEMS
    )


def test_a_multibyte_character_cut_between_pieces_is_decoded_whole() -> None:
    rocket = "🚀".encode()
    stream = b'data: {"t": "' + rocket + b'"}\n\n'
    cut = stream.index(rocket) + 2
    assert decode_all([stream[:cut], stream[cut:]]) == [SSEEvent('{"t": "🚀"}', {"t": "🚀"})]


def test_a_cr_ending_one_piece_and_a_lf_starting_the_next_are_one_line_ending() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"a":\r') == []
    assert decoder.feed(b"\ndata: 1}\r\n\r\n") == [SSEEvent('{"a":\n1}', {"a": 1})]


def test_a_byte_order_mark_at_the_start_is_skipped_even_when_cut() -> None:
    stream = b"\xef\xbb\xbfdata: {}\n\n"
    assert decode_all([stream[:1], stream[1:2], stream[2:]]) == [SSEEvent("{}", {})]


def test_an_event_without_its_closing_blank_line_is_dispatched_at_the_end() -> None:
    assert decode_all([b"data: [DONE]"]) == [SSEEvent("[DONE]", None)]


def test_a_comment_inside_an_event_comes_out_before_the_event() -> None:
    items = decode_all([b'data: {"a":\n: keep-alive\ndata: 1}\n\n'])
    assert items == [SSEComment("keep-alive"), SSEEvent('{"a":\n1}', {"a": 1})]


@pytest.mark.parametrize(
    ("stream", "complaint"),
    [
        (b"data: not json\n\n", "invalid JSON in an SSE data payload"),
        (b"data: [1, 2]\n\n", "a JSON list in an SSE data payload, expected an object"),
        (b'data: "[DONE]"\n\n', "a JSON str"),
        (b"data: {}\xff\n\n", "not UTF-8"),
        (b'data: {"id": "chatcmpl-1", "choi', "invalid JSON in an event the stream ended inside"),
    ],
)
def test_malformed_sse_raises_upstream_protocol_error_naming_the_problem(
    stream: bytes, complaint: str
) -> None:
    with pytest.raises(UpstreamProtocolError, match=r"^upstream sent") as caught:
        decode_all([stream])
    assert complaint in caught.value.message
    assert caught.value.status_code == 502


def test_a_long_malformed_payload_is_quoted_only_in_part() -> None:
    with pytest.raises(UpstreamProtocolError) as caught:
        decode_all([b"data: " + b"x" * 5000 + b"\n\n"])
    assert "x" * 120 in caught.value.message
    assert len(caught.value.message) < 400


SSE_LINE_ENDINGS = st.sampled_from([b"\n", b"\r\n", b"\r"])
# orjson, the proxy's JSON library, reads integers beyond 64 bits as floats; chat chunks carry
# none (token counts, indexes and timestamps all fit), so the generated payloads stay within them.
INT64 = st.integers(-(2**63), 2**63 - 1)
JSON_OBJECTS = st.dictionaries(
    st.text(max_size=5),
    st.none() | st.booleans() | INT64 | st.text(max_size=12),
    max_size=4,
)


@given(
    events=st.lists(
        st.one_of(
            JSON_OBJECTS, st.text(max_size=10).map(lambda t: t.replace("\r", "").replace("\n", ""))
        ),
        max_size=8,
    ),
    eol=SSE_LINE_ENDINGS,
    rnd=st.randoms(use_true_random=False),
)
def test_decoder_is_independent_of_how_a_generated_stream_is_cut(
    events: list[Any], eol: bytes, rnd: random.Random
) -> None:
    stream, expected = b"", []
    for event in events:
        if isinstance(event, str):
            stream += b":" + event.encode() + eol
            expected.append(SSEComment(event.removeprefix(" ")))
        else:
            data = json.dumps(event, ensure_ascii=rnd.random() < 0.5)
            stream += b"data: " + data.encode() + eol + eol
            expected.append(SSEEvent(data, event))
    cuts = sorted(rnd.sample(range(len(stream) + 1), min(len(stream) + 1, rnd.randint(0, 12))))
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    assert decode_all(pieces) == expected


# ---------------------------------------------------------------- encoders


def test_encoded_events_and_comments_decode_to_what_was_encoded() -> None:
    payload = {"text": "line one\nline two\r", "emoji": "🚀"}
    stream = encode_comment("ping") + encode_event(payload) + encode_event(b'{"a":\n1}') + DONE
    assert decode_all([stream]) == [
        SSEComment("ping"),
        SSEEvent(json.dumps(payload, ensure_ascii=False, separators=(",", ":")), payload),
        SSEEvent('{"a":\n1}', {"a": 1}),
        SSEEvent("[DONE]", None),
    ]


def test_encoded_dict_event_is_one_compact_data_line() -> None:
    assert encode_event({"a": [1, "é"]}) == 'data: {"a":[1,"é"]}\n\n'.encode()
    assert DONE == b"data: [DONE]\n\n"


def test_a_multiline_comment_becomes_one_comment_line_per_line() -> None:
    assert encode_comment("a\r\nb") == b": a\n: b\n\n"
    assert decode_all([encode_comment("a\nb")]) == [SSEComment("a"), SSEComment("b")]


def test_a_typed_event_is_named_after_its_type_and_an_untyped_one_is_not() -> None:
    assert encode_typed_event({"type": "ping"}) == b'event: ping\ndata: {"type":"ping"}\n\n'
    assert encode_typed_event({"a": 1}) == encode_event({"a": 1})
    (event,) = decode_all([encode_event({"type": "x"}, "error")])
    assert event == SSEEvent('{"type":"x"}', {"type": "x"}, event="error")


def test_the_end_of_an_openai_stream_is_read_as_an_event_without_payload() -> None:
    assert decode_all([DONE]) == [SSEEvent(DONE_DATA, None)]


@given(
    events=st.lists(
        st.fixed_dictionaries(
            {"type": st.sampled_from(["response.created", "message_start", "ping"])},
            optional={"text": st.text(max_size=12)},
        ),
        max_size=4,
    ),
    done=st.booleans(),
)
def test_written_events_split_at_every_point_read_back_as_the_events_written(
    events: list[dict[str, Any]], done: bool
) -> None:
    stream = b"".join(encode_typed_event(e) for e in events) + (DONE if done else b"")
    written = [SSEEvent(orjson.dumps(e).decode(), e, e["type"]) for e in events]
    written += [SSEEvent(DONE_DATA, None)] if done else []
    for cut in range(len(stream) + 1):
        assert decode_all([stream[:cut], stream[cut:]]) == written, cut
