import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.guard.leaks import LeakedCall, find_leaked_calls


def summary(calls: list[LeakedCall]) -> list[tuple[str, Any, str, bool]]:
    return [(c.name, c.arguments, c.format, c.complete) for c in calls]


def hermes(name: str, arguments: dict[str, Any], *, closed: bool = True) -> str:
    body = json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{body}\n</tool_call>" if closed else f"<tool_call>\n{body}"


ORDER = {"order_id": "#W1234567"}


def test_a_hermes_call_is_found_with_its_name_and_arguments() -> None:
    content = "Let me look that up.\n" + hermes("get_order_details", ORDER)
    [call] = find_leaked_calls(content)
    assert summary([call]) == [("get_order_details", ORDER, "hermes", True)]
    assert call.raw.startswith("<tool_call>")
    assert call.raw.endswith("</tool_call>")


def test_several_hermes_calls_are_found_in_order() -> None:
    content = hermes("a", {}) + hermes("b", {"x": 1})
    assert [c.name for c in find_leaked_calls(content)] == ["a", "b"]


def test_an_unterminated_hermes_call_is_incomplete() -> None:
    [call] = find_leaked_calls(
        '<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W'
    )
    assert (call.name, call.arguments, call.complete) == ("get_order_details", None, False)


def test_a_hermes_tag_with_nothing_after_it_is_an_incomplete_call() -> None:
    assert summary(find_leaked_calls("Checking now. <tool_call>")) == [("", None, "hermes", False)]


# What Gemma 3 270M wrote under the hermes template when re-asked (the live suite, refund_sampled).
UNREADABLE = (
    "<tool_call>plemented\n maddenin#waction\n</tool_call>去了\n maddenin#waction\n我的Answer"
)


@pytest.mark.parametrize(
    "content",
    [
        UNREADABLE,
        "Refunding now.\n  <tool_call>refund the order</tool_call>",
        '<tool_call>{"name": "get_order_details", "arguments": {"order_id": "#W1"}}</tool_call>\n'
        "<tool_call>name=cancel</tool_call>",
    ],
)
def test_a_closed_tool_call_element_opening_a_line_is_a_call_whatever_it_holds(
    content: str,
) -> None:
    # The model wrote its call syntax around a body nothing reads: the server passed it on as
    # content, the agent got neither a call nor an answer.
    *_, call = find_leaked_calls(content)
    assert summary([call]) == [("", None, "hermes", True)]
    assert call.raw.startswith("<tool_call>")
    assert call.raw.endswith("</tool_call>")


@pytest.mark.parametrize(
    "content",
    [
        "Calls go in a <tool_call>tag pair</tool_call> like this one.",
        "<tool_call>\n \n</tool_call>",
        "<tool_call>refund the order",
    ],
)
def test_a_tool_call_element_inside_a_sentence_blank_or_unclosed_is_not_an_unreadable_call(
    content: str,
) -> None:
    assert find_leaked_calls(content) == []


def test_an_element_another_format_reads_is_that_formats_call_and_only_that() -> None:
    calls = find_leaked_calls(
        "<tool_call>get_order<arg_key>order_id</arg_key><arg_value>#W1</arg_value></tool_call>"
    )
    assert summary(calls) == [("get_order", {"order_id": "#W1"}, "glm45", True)]


@pytest.mark.parametrize(
    ("content", "fmt"),
    [
        ("<|python_tag|>", "llama3"),
        ("Let me check. <|python_tag|>\n", "llama3"),
        ("[TOOL_CALLS]", "mistral"),
    ],
)
def test_a_call_tag_that_ends_the_content_is_an_incomplete_call(content: str, fmt: str) -> None:
    # The model emitted the token that starts a call and stopped: the call it began is broken,
    # and the agent got neither a call nor an answer, so it is a leak to repair.
    assert summary(find_leaked_calls(content)) == [("", None, fmt, False)]


def test_a_qwen_xml_call_is_found_inside_or_outside_tool_call_tags() -> None:
    xml = "<function=get_order_details>\n<parameter=order_id>\n#W1234567\n</parameter>\n<parameter=count>\n3\n</parameter>\n</function>"
    expected = ("get_order_details", {"order_id": "#W1234567", "count": 3}, "qwen_xml", True)
    assert summary(find_leaked_calls(f"<tool_call>\n{xml}\n</tool_call>")) == [expected]
    assert summary(find_leaked_calls(xml)) == [expected]


def test_an_unclosed_qwen_xml_call_is_incomplete() -> None:
    [call] = find_leaked_calls(
        "<tool_call>\n<function=get_order_details>\n<parameter=order_id>\n#W12"
    )
    assert (call.name, call.format, call.complete) == ("get_order_details", "qwen_xml", False)


def test_llama3_python_tag_calls_are_found_including_several_joined_by_semicolons() -> None:
    content = '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}'
    assert summary(find_leaked_calls(content)) == [
        ("a", {"x": 1}, "llama3", True),
        ("b", {}, "llama3", True),
    ]


def test_a_llama3_builtin_tool_call_is_found() -> None:
    assert summary(find_leaked_calls('<|python_tag|>brave_search.call(query="weather")')) == [
        ("brave_search", None, "llama3", True)
    ]


def test_a_cut_off_llama3_call_is_incomplete() -> None:
    [call] = find_leaked_calls('<|python_tag|>{"name": "get_order_details", "parameters": {"order_')
    assert (call.name, call.complete) == ("get_order_details", False)


def test_mistral_json_list_calls_are_found() -> None:
    content = '[TOOL_CALLS] [{"name": "a", "arguments": {"x": 1}, "id": "abcdefghi"}, {"name": "b", "arguments": {}}]'
    assert summary(find_leaked_calls(content)) == [
        ("a", {"x": 1}, "mistral", True),
        ("b", {}, "mistral", True),
    ]


def test_mistral_name_args_calls_are_found() -> None:
    content = '[TOOL_CALLS]get_order_details[ARGS]{"order_id": "#W1234567"}[TOOL_CALLS]list_all_product_types[ARGS]{}'
    assert summary(find_leaked_calls(content)) == [
        ("get_order_details", ORDER, "mistral", True),
        ("list_all_product_types", {}, "mistral", True),
    ]


@pytest.mark.parametrize(
    ("content", "name"),
    [
        ('[TOOL_CALLS]get_order_details[ARGS]{"order_id": "#W', "get_order_details"),
        ("[TOOL_CALLS]get_ord", "get_ord"),
    ],
)
def test_a_cut_off_mistral_call_is_incomplete(content: str, name: str) -> None:
    [call] = find_leaked_calls(content)
    assert (call.name, call.format, call.complete) == (name, "mistral", False)


@pytest.mark.parametrize(
    "content",
    [
        '{"name": "get_order_details", "arguments": {"order_id": "#W1234567"}}',
        '  {"name": "get_order_details", "parameters": {"order_id": "#W1234567"}}\n',
        '```json\n{"name": "get_order_details", "arguments": {"order_id": "#W1234567"}}\n```',
        '{"type": "function", "name": "get_order_details", "parameters": {"order_id": "#W1234567"}}',
        '{"name": "get_order_details", "arguments": "{\\"order_id\\": \\"#W1234567\\"}"}',
    ],
)
def test_a_bare_json_call_as_the_whole_content_is_found(content: str) -> None:
    assert summary(find_leaked_calls(content)) == [("get_order_details", ORDER, "json", True)]


def test_a_bare_json_list_of_calls_is_found() -> None:
    content = '[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}]'
    assert [c.name for c in find_leaked_calls(content)] == ["a", "b"]


@pytest.mark.parametrize(
    "content",
    [
        '{"name": "get_order_details", "arguments": {"order_id": "#W12',
        '```json\n{"name": "get_order_details", "parameters": {"order_id": "#W1234567"}}',
    ],
)
def test_a_cut_off_bare_json_call_is_incomplete(content: str) -> None:
    [call] = find_leaked_calls(content)
    assert (call.name, call.format, call.complete) == ("get_order_details", "json", False)


@pytest.mark.parametrize(
    "content",
    [
        None,
        "",
        "Your order #W1234567 has shipped.",
        'To call a tool, send {"name": "get_order_details", "arguments": {"order_id": "..."}} as the call.',
        '```json\n{"name": "a", "arguments": {}}\n```\nThat is what a call looks like.',
        '{"name": "Ana Silva", "age": 31, "orders": 4}',
        '{"name": "widget", "parameters": {"size": 3}, "price": 9.99}',
        '{"name": "Ana", "age": 3',
        "[1, 2, 3]",
        "Hermes models wrap calls in <tool_call> tags.",
        "The [TOOL_CALLS] token starts a Mistral call.",
        "Llama emits <|python_tag|> before code.",
        "In Python, a function looks like <function=f> in some templates.",
    ],
)
def test_prose_and_json_answers_are_not_calls(content: str | None) -> None:
    assert find_leaked_calls(content) == []


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="<[{`"), max_size=200))
def test_text_without_any_call_marker_is_never_a_call(content: str) -> None:
    assert find_leaked_calls(content) == []


@settings(max_examples=100, deadline=None)
@given(
    name=st.from_regex(r"[a-z_]{1,20}", fullmatch=True),
    arguments=st.dictionaries(
        st.from_regex(r"[a-z]{1,8}", fullmatch=True),
        st.integers() | st.text(max_size=10),
        max_size=3,
    ),
    cut=st.integers(min_value=1, max_value=30),
)
def test_any_prefix_of_a_hermes_call_is_found_and_only_the_whole_call_is_complete(
    name: str, arguments: dict[str, Any], cut: int
) -> None:
    whole = hermes(name, arguments)
    [complete] = find_leaked_calls(whole)
    assert (complete.name, complete.arguments, complete.complete) == (name, arguments, True)
    prefix = whole[: max(len("<tool_call>"), len(whole) - cut)]
    assert [c.complete for c in find_leaked_calls(prefix)] == [False]


def test_every_marker_holds_a_screened_string_so_the_screen_never_hides_a_call() -> None:
    from proxy.guard.leakformats import FORMATS
    from proxy.guard.leaks import _SCREEN

    markers = [(f.name, m) for f in FORMATS if not f.bare for m in f.markers]
    assert markers
    assert [(name, m) for name, m in markers if not any(s in m for s in _SCREEN)] == []
