import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.errors import BadRequestError
from proxy.guard.toolcheck import GuardLimits, compile_tools
from proxy.http.jsonbody import MAX_CANDIDATES, PREFIX_BYTES, BodyParser
from tests.proxy.builders import RETAIL_TOOLS, make_request, make_tool

OTHER_TOOLS = [
    make_tool("get_user_details", {"user_id": {"type": "string"}}, ["user_id"]),
    make_tool("transfer_to_human_agents", {"summary": {"type": "string"}}, ["summary"]),
]
# Same first bytes as RETAIL_TOOLS for longer than the bucket prefix, different after.
SIBLING_TOOLS = [
    *RETAIL_TOOLS[:2],
    make_tool("find_user_id_by_name_zip", {"zip": {"type": "string"}}),
]


def dumps(body: Any, style: str = "sdk") -> bytes:
    """A body as a client would send it: the openai SDK's compact JSON, Python's default
    separators, or indented."""
    if style == "sdk":
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    if style == "spaced":
        return json.dumps(body).encode()
    return json.dumps(body, indent=2).encode()


def seen(
    *tool_lists: list[dict[str, Any]], styles: tuple[str, ...] = ("sdk",), **kwargs: Any
) -> BodyParser:
    """A parser that has already served one request with each tool list, in each style."""
    parser = BodyParser(**kwargs)
    for style in styles:
        for tools in tool_lists:
            parser.parse(dumps(make_request(tools=tools), style))
    return parser


def test_the_first_sight_of_tools_is_a_full_parse_and_the_next_reuses_their_parse_and_index() -> (
    None
):
    parser = BodyParser()
    raw = dumps(make_request())

    first = parser.parse(raw)
    second = parser.parse(dumps(make_request("Where is my order?")))

    assert first.index is None
    assert first.body == orjson.loads(raw)
    assert second.index is compile_tools(RETAIL_TOOLS)
    assert second.body == make_request("Where is my order?")
    assert second.body["tools"] is parser.parse(raw).body["tools"]  # one parse, shared


@pytest.mark.parametrize("style", ["sdk", "spaced", "indented"])
def test_tools_are_recognised_however_the_client_formats_its_json(style: str) -> None:
    parser = BodyParser()
    parser.parse(dumps(make_request(), style))

    again = parser.parse(dumps(make_request("next turn"), style))

    assert again.index is not None
    assert again.body == make_request("next turn")


def test_non_ascii_text_before_and_inside_the_tools_keeps_the_byte_offsets_right() -> None:
    tools = [
        make_tool("réserver_vol", {"ville": {"type": "string", "description": "Zürich → 東京"}})
    ]
    parser = BodyParser()
    parser.parse(dumps(make_request("Ça va? 東京へ", tools=tools)))

    again = parser.parse(dumps(make_request("Encore 🚀", tools=tools)))

    assert again.index is not None
    assert again.body == make_request("Encore 🚀", tools=tools)


def test_a_nested_tools_key_with_the_same_bytes_before_the_real_one_does_not_fool_it() -> None:
    parser = seen(RETAIL_TOOLS)
    body = make_request(tools=OTHER_TOOLS)
    body["messages"].insert(1, {"role": "user", "content": "x", "tools": RETAIL_TOOLS})

    parsed = parser.parse(dumps(body))

    assert parsed.body == body
    assert parsed.index is None or parsed.index is compile_tools(OTHER_TOOLS)


def test_a_nested_copy_of_known_tools_with_top_level_tools_null_stays_null() -> None:
    parser = seen(RETAIL_TOOLS)
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi", "tools": RETAIL_TOOLS}],
        "tools": None,
    }

    parsed = parser.parse(dumps(body))

    assert parsed.body == body
    assert parsed.index is None


def test_known_tools_quoted_inside_a_string_are_text_not_tools() -> None:
    parser = seen(RETAIL_TOOLS)
    text = '"tools":' + dumps(RETAIL_TOOLS).decode()
    body = make_request(text, tools=OTHER_TOOLS)

    parsed = parser.parse(dumps(body))

    assert parsed.body == body
    assert parsed.body["tools"] == OTHER_TOOLS


def test_a_repeated_top_level_tools_key_means_the_last_one_as_in_a_full_parse() -> None:
    parser = seen(RETAIL_TOOLS, OTHER_TOOLS)
    for first, last in ((RETAIL_TOOLS, OTHER_TOOLS), (OTHER_TOOLS, RETAIL_TOOLS)):
        raw = (
            b'{"messages":[{"role":"user","content":"hi"}],"tools":'
            + dumps(first)
            + b',"tools":'
            + dumps(last)
            + b"}"
        )

        parsed = parser.parse(raw)

        assert parsed.body == orjson.loads(raw)
        assert parsed.body["tools"] == last
        assert parsed.index is None or parsed.index is compile_tools(last)


def test_lists_sharing_their_first_bytes_are_told_apart() -> None:
    assert dumps(SIBLING_TOOLS)[:PREFIX_BYTES] == dumps(RETAIL_TOOLS)[:PREFIX_BYTES]
    parser = seen(RETAIL_TOOLS, SIBLING_TOOLS)

    for tools in (RETAIL_TOOLS, SIBLING_TOOLS):
        parsed = parser.parse(dumps(make_request(tools=tools)))
        assert parsed.body["tools"] == tools
        assert parsed.index is compile_tools(tools)


def test_tools_followed_by_more_of_an_array_are_not_mistaken_for_a_known_list() -> None:
    parser = seen(RETAIL_TOOLS)
    longer = [*RETAIL_TOOLS, make_tool("extra")]

    parsed = parser.parse(dumps(make_request(tools=longer)))

    assert parsed.body["tools"] == longer


def test_a_body_that_is_not_json_or_not_an_object_is_a_bad_request_even_with_known_tools() -> None:
    parser = seen(RETAIL_TOOLS)
    broken = dumps(make_request())[:-1]

    with pytest.raises(BadRequestError, match="not valid JSON"):
        parser.parse(broken)
    with pytest.raises(BadRequestError, match="must be a JSON object"):
        parser.parse(b"[1, 2]")


def test_tools_that_do_not_compile_are_not_remembered_and_parse_as_sent() -> None:
    parser = BodyParser()
    bad = [make_tool("same"), make_tool("same", {"x": {"type": "string"}})]

    for _ in range(2):
        parsed = parser.parse(dumps(make_request(tools=bad)))
        assert parsed.index is None
        assert parsed.body["tools"] == bad
    assert len(parser) == 0


def test_tools_over_the_guard_limits_are_not_remembered() -> None:
    parser = BodyParser(GuardLimits(max_tools=2))

    parser.parse(dumps(make_request()))

    assert len(parser) == 0


def test_short_tool_lists_are_not_worth_remembering() -> None:
    parser = BodyParser()
    tiny = [{"type": "function", "function": {"name": "f"}}]

    parser.parse(dumps(make_request(tools=tiny)))

    assert len(dumps(tiny)) <= PREFIX_BYTES
    assert len(parser) == 0


def test_the_least_recently_used_list_is_forgotten_first() -> None:
    parser = seen(RETAIL_TOOLS, OTHER_TOOLS, max_entries=2)
    parser.parse(dumps(make_request(tools=RETAIL_TOOLS)))  # used again: OTHER_TOOLS is oldest

    parser.parse(dumps(make_request(tools=SIBLING_TOOLS)))

    assert len(parser) == 2
    assert parser.parse(dumps(make_request(tools=RETAIL_TOOLS))).index is not None
    assert parser.parse(dumps(make_request(tools=SIBLING_TOOLS))).index is not None
    assert parser.parse(dumps(make_request(tools=OTHER_TOOLS))).index is None


TOOL_LISTS = [RETAIL_TOOLS, OTHER_TOOLS, SIBLING_TOOLS]
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53), st.text(max_size=20))
_values = st.recursive(
    _scalars | st.sampled_from(TOOL_LISTS),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["tools", "content", "role", "x", '"tools"']), inner, max_size=3
        )
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=st.lists(
        st.dictionaries(st.sampled_from(["role", "content", "tools"]), _values),
        min_size=1,
        max_size=3,
    ),
    tools=st.one_of(st.sampled_from(TOOL_LISTS), _values),
    style=st.sampled_from(["sdk", "spaced", "indented"]),
    tools_first=st.booleans(),
)
def test_whatever_the_body_the_parse_equals_a_full_parse(
    messages: list[Any], tools: Any, style: str, tools_first: bool
) -> None:
    parser = seen(*TOOL_LISTS, styles=("sdk", "spaced", "indented"))
    body = (
        {"tools": tools, "messages": messages}
        if tools_first
        else {"messages": messages, "tools": tools}
    )
    raw = dumps(body, style)

    parsed = parser.parse(raw)

    assert parsed.body == orjson.loads(raw)
    if parsed.index is not None:
        assert parsed.index is compile_tools(parsed.body["tools"])


class CountingLoads:
    """orjson.loads, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self._loads = orjson.loads

    def __call__(self, data: Any) -> Any:
        self.calls += 1
        return self._loads(data)


def test_a_body_of_many_nested_tools_keys_costs_a_bounded_number_of_parses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parser = seen(RETAIL_TOOLS)
    messages = [{"role": "user", "content": "x", "tools": RETAIL_TOOLS} for _ in range(200)]
    raw = dumps({"messages": messages, "tools": OTHER_TOOLS})
    expected = orjson.loads(raw)
    loads = CountingLoads()
    monkeypatch.setattr(orjson, "loads", loads)

    parsed = parser.parse(raw)

    assert parsed.body == expected
    # Each of the first MAX_CANDIDATES keys is tried as the known list (a parse of the rest of
    # the body) and as a first sight of the body's tools, then the body is parsed whole: the
    # 200 nested keys do not cost 200 parses of the body.
    assert loads.calls <= 2 * MAX_CANDIDATES + 1
    assert loads.calls < len(messages) / 4


SYSTEM = [
    {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
    {"type": "text", "text": "Working directory: /repo", "cache_control": {"type": "ephemeral"}},
]
OTHER_SYSTEM = [{"type": "text", "text": "You are a careful retail agent. " * 4}]


def messages_body(text: str = "List files.", **fields: Any) -> dict[str, Any]:
    body = {
        "model": "m",
        "max_tokens": 64,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}],
        "tools": RETAIL_TOOLS,
    }
    return {**body, **fields}


def test_a_resent_system_is_parsed_once_and_shared_beside_the_known_tools() -> None:
    parser = BodyParser(resent=("system",))
    first = parser.parse(dumps(messages_body()))
    second = parser.parse(dumps(messages_body("And now?")))
    third = parser.parse(dumps(messages_body("Once more.", system=OTHER_SYSTEM)))
    fourth = parser.parse(dumps(messages_body("Back.", tools=OTHER_TOOLS)))

    assert second.body == messages_body("And now?")
    assert second.index is compile_tools(RETAIL_TOOLS)
    assert second.body["system"] is not first.body["system"]  # the first sight's own parse
    assert parser.parse(dumps(messages_body())).body["system"] is second.body["system"]
    assert third.body == messages_body("Once more.", system=OTHER_SYSTEM)
    assert third.body["system"] is not second.body["system"]
    # A system known with tools not yet seen: the system is reused, the tools learnt.
    assert fourth.body == messages_body("Back.", tools=OTHER_TOOLS)
    assert fourth.body["system"] is second.body["system"]
    assert fourth.index is None
    assert parser.parse(dumps(messages_body(tools=OTHER_TOOLS))).index is not None


def test_a_system_is_remembered_only_on_a_route_that_names_it() -> None:
    parser = BodyParser()
    first = parser.parse(dumps(messages_body()))
    second = parser.parse(dumps(messages_body()))

    assert second.body == first.body
    assert second.body["system"] is not first.body["system"]


def test_a_nested_copy_of_a_known_system_before_the_real_one_does_not_fool_it() -> None:
    parser = BodyParser(resent=("system",))
    parser.parse(dumps(messages_body()))
    body = messages_body(system=OTHER_SYSTEM)
    body["messages"].insert(0, {"role": "user", "content": "x", "system": SYSTEM})
    text = messages_body('"system":' + dumps(SYSTEM).decode(), system="plain")

    for sent in (body, text, {**body, "tools": RETAIL_TOOLS}, messages_body(system=None)):
        assert parser.parse(dumps(sent)).body == sent


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=st.lists(
        st.dictionaries(
            st.sampled_from(["role", "content", "system", "tools"]),
            _values | st.sampled_from([SYSTEM, OTHER_SYSTEM]),
        ),
        min_size=1,
        max_size=3,
    ),
    tools=st.one_of(st.sampled_from(TOOL_LISTS), _values),
    system=st.one_of(st.sampled_from([SYSTEM, OTHER_SYSTEM]), _values),
    order=st.permutations(["messages", "system", "tools"]),
    style=st.sampled_from(["sdk", "spaced", "indented"]),
)
def test_whatever_the_body_with_a_resent_system_the_parse_equals_a_full_parse(
    messages: list[Any], tools: Any, system: Any, order: list[str], style: str
) -> None:
    parser = BodyParser(resent=("system",))
    for known in (SYSTEM, OTHER_SYSTEM):
        for tool_list in TOOL_LISTS:
            for seen_style in ("sdk", "spaced", "indented"):
                parser.parse(dumps(messages_body(system=known, tools=tool_list), seen_style))
    fields = {"messages": messages, "system": system, "tools": tools}
    raw = dumps({key: fields[key] for key in order}, style)

    parsed = parser.parse(raw)

    assert parsed.body == orjson.loads(raw)
    if parsed.index is not None:
        assert parsed.index is compile_tools(parsed.body["tools"])
