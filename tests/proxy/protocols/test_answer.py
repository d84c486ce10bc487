"""Tests for proxy/protocols/answer.py: the protocol-neutral answer every writer takes."""

from __future__ import annotations

from proxy.protocols.answer import Answer, Call, Usage, parsed_arguments, pieces
from proxy.protocols.base import Finish


def test_the_finish_is_derived_from_the_calls_unless_given() -> None:
    called = Answer(calls=(Call("get", "{}", "c1"),))
    assert called.finish_reason is Finish.TOOL_CALLS
    assert Answer("Hi").finish_reason is Finish.STOP
    assert Answer("Hi", finish=Finish.LENGTH).finish_reason is Finish.LENGTH


def test_text_is_cut_in_pieces_of_the_size_asked_or_whole() -> None:
    assert pieces("abcde", 2) == ["ab", "cd", "e"]
    assert pieces("abcde", None) == ["abcde"]
    assert pieces("", 3) == []


def test_arguments_are_parsed_when_they_are_json_and_kept_as_text_otherwise() -> None:
    assert parsed_arguments(Call("get", '{"a": 1}', "c")) == {"a": 1}
    assert parsed_arguments(Call("get", '{"a": ', "c")) == '{"a": '
    assert Usage(10, 5).total_tokens == 15
