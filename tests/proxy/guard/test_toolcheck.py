import copy
import json
from typing import Any

import jsonschema
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.errors import BadRequestError
from proxy.guard import toolcheck
from proxy.guard.channels import Channel
from proxy.guard.dialect import FallbackReason, SchemaDialect
from proxy.guard.toolcheck import GuardLimits, compile_tools, parse_arguments, validate
from tests.proxy.guard.builders import (
    make_call,
    make_message,
    make_tool,
    named_choice,
    retail_tools,
)
from tests.proxy.guard.strategies import instances, json_values, object_schemas, wrong_type_value

STRICT = GuardLimits(schema_dialect=SchemaDialect.STRICT)
PROPERTY_SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def channels(violations: list[Any]) -> list[Channel]:
    return [v.channel for v in violations]


def reference_is_valid(schema: dict[str, Any], instance: Any) -> bool:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return bool(cls(schema).is_valid(instance))


# --- compile_tools ------------------------------------------------------------------------------


def test_no_tools_compile_to_an_empty_index() -> None:
    assert compile_tools(None).names == ()
    assert compile_tools([]).names == ()


def test_index_lists_names_in_declared_order_and_answers_lookups() -> None:
    index = compile_tools(retail_tools())
    assert index.names[:2] == ("get_order_details", "cancel_pending_order")
    assert index.has("cancel_pending_order")
    assert not index.has("cancel_order")
    assert index.schema("get_order_details")["required"] == ["order_id"]  # type: ignore[index]
    assert index.schema("nope") is None


def test_a_tool_without_parameters_accepts_any_arguments() -> None:
    index = compile_tools([make_tool("ping", parameters=None)])
    assert index.schema("ping") == {}
    assert validate(make_message(make_call("ping", {"anything": 1})), None, index=index) == []


def test_the_same_tools_are_compiled_once_whatever_their_key_order() -> None:
    tools = retail_tools()
    reordered = [json.loads(json.dumps(tool, sort_keys=True)) for tool in tools]
    reordered[0]["function"] = dict(reversed(list(reordered[0]["function"].items())))
    assert compile_tools(tools) is compile_tools(reordered)
    assert compile_tools(tools) is not compile_tools([*tools, make_tool("extra")])


def test_a_list_resent_byte_for_byte_is_compiled_once(monkeypatch: pytest.MonkeyPatch) -> None:
    toolcheck.clear_cache()
    builds: list[int] = []
    build = toolcheck._build

    def counting_build(tools: list[Any], limits: GuardLimits) -> toolcheck.ToolIndex:
        builds.append(len(tools))
        return build(tools, limits)

    monkeypatch.setattr(toolcheck, "_build", counting_build)
    first = compile_tools(retail_tools())
    assert compile_tools(retail_tools()) is first
    assert compile_tools(copy.deepcopy(retail_tools())) is first
    assert builds == [len(retail_tools())]


def test_a_cached_list_is_still_held_to_tighter_limits() -> None:
    tools = retail_tools()
    compile_tools(tools)
    with pytest.raises(BadRequestError, match="max_tools=1"):
        compile_tools(tools, GuardLimits(max_tools=1))


def test_the_cache_is_bounded_and_keeps_the_most_recent_lists() -> None:
    toolcheck.clear_cache()
    size = len(orjson.dumps([make_tool("tool_0")], option=orjson.OPT_SORT_KEYS))
    toolcheck.configure_cache(20 * size)
    try:
        first = compile_tools([make_tool("tool_0")])
        for n in range(1, 25):
            compile_tools([make_tool(f"tool_{n}")])
        assert toolcheck.cached_tool_bytes() <= 20 * size
        assert toolcheck.cached_tool_lists() >= 18  # the most recent ones
        assert compile_tools([make_tool("tool_0")]) is not first
    finally:
        toolcheck.configure_cache(toolcheck.CACHE_BYTES)
        toolcheck.clear_cache()


def test_changing_the_request_after_compiling_does_not_change_the_index() -> None:
    tools = retail_tools()
    index = compile_tools(tools)
    tools[0]["function"]["parameters"]["required"].append("injected")
    assert index.schema("get_order_details")["required"] == ["order_id"]  # type: ignore[index]


@pytest.mark.parametrize(
    ("tools", "fragment"),
    [
        ({"type": "function"}, "must be a list"),
        (["get_order"], "tools[0] must be a tool object"),
        (
            [{"type": "function", "function": {"description": "x"}}],
            "name must be a non-empty string",
        ),
        ([{"type": "function"}], "tools[0].function must be an object"),
        ([make_tool("t", parameters=["not", "a", "schema"])], "must be a JSON Schema object"),
        (
            [make_tool("t", {"a": {"type": "string"}}), make_tool("t", {"b": {"type": "string"}})],
            "two different tools",
        ),
    ],
)
def test_invalid_tool_definitions_are_a_bad_request_about_tools(tools: Any, fragment: str) -> None:
    with pytest.raises(BadRequestError) as caught:
        compile_tools(tools)
    assert fragment in caught.value.message
    assert caught.value.param == "tools"


UNCOMPILABLE = [
    pytest.param({"type": "strin"}, FallbackReason.UNKNOWN_TYPE, id="unknown-type"),
    pytest.param({"pattern": "(("}, FallbackReason.INVALID_SCHEMA, id="bad-pattern"),
    pytest.param(
        {"$ref": "https://example.com/schema.json"}, FallbackReason.UNRESOLVED_REF, id="remote-ref"
    ),
]


@pytest.mark.parametrize(("parameters", "reason"), UNCOMPILABLE)
def test_a_schema_the_validator_cannot_compile_is_a_bad_request_in_the_strict_dialect(
    parameters: dict[str, Any], reason: FallbackReason
) -> None:
    with pytest.raises(BadRequestError) as caught:
        compile_tools([make_tool("t", parameters=parameters)], STRICT)
    assert "tools[0] ('t'): parameters is not a valid JSON Schema" in caught.value.message
    assert caught.value.param == "tools"


@pytest.mark.parametrize(("parameters", "reason"), UNCOMPILABLE)
def test_a_schema_the_validator_cannot_compile_falls_back_to_names_and_required_keys_by_default(
    parameters: dict[str, Any], reason: FallbackReason
) -> None:
    index = compile_tools([make_tool("t", parameters={**parameters, "required": ["id"]})])
    assert [(f.tool, f.reason) for f in index.fallbacks] == [("t", reason)]
    assert index.check("t", {"id": 1, "anything": "else"}) == []
    assert [e.pointer for e in index.check("t", {"other": 1})] == ["/id"]


def test_a_standard_schema_compiles_as_declared_without_a_fallback() -> None:
    tools = retail_tools()
    index = compile_tools(tools)
    assert index.fallbacks == ()
    assert index.schema("get_order_details") == tools[0]["function"]["parameters"]


def test_the_same_tool_declared_twice_is_accepted_once() -> None:
    tool = make_tool("get_order_details", {"order_id": {"type": "string"}})
    assert compile_tools([tool, copy.deepcopy(tool)]).names == ("get_order_details",)


def test_tools_of_other_types_are_declared_names_without_a_schema() -> None:
    index = compile_tools([{"type": "custom", "custom": {"name": "shell"}}, make_tool("ping")])
    assert index.names == ("shell", "ping")
    custom_call = {"id": "c1", "type": "custom", "custom": {"name": "shell", "input": "ls"}}
    assert validate(make_message(custom_call), None, index=index) == []


@pytest.mark.parametrize(
    ("limits", "tools", "limit_name"),
    [
        (GuardLimits(max_tools=2), [make_tool(f"t{n}") for n in range(3)], "max_tools=2"),
        (
            GuardLimits(max_schema_bytes=100),
            [make_tool("t", {f"field_{n}": {"type": "string"} for n in range(10)})],
            "max_schema_bytes=100",
        ),
        (
            GuardLimits(max_schema_depth=3),
            [make_tool("t", {"a": {"type": "object", "properties": {"b": {"type": "string"}}}})],
            "max_schema_depth=3",
        ),
    ],
)
def test_tool_lists_beyond_a_limit_are_rejected_naming_the_limit(
    limits: GuardLimits, tools: Any, limit_name: str
) -> None:
    with pytest.raises(BadRequestError) as caught:
        compile_tools(tools, limits)
    assert limit_name in caught.value.message
    assert caught.value.param == "tools"


def test_a_schema_nested_beyond_what_the_json_encoder_handles_is_rejected_as_too_deep() -> None:
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(300):
        deep = {"type": "object", "properties": {"x": deep}}
    with pytest.raises(BadRequestError) as caught:
        compile_tools([make_tool("t", parameters=deep)])
    assert "max_schema_depth" in caught.value.message


def test_default_limits_accept_a_realistic_tool_set() -> None:
    assert len(compile_tools(retail_tools(), GuardLimits()).names) == 5


# --- plain chat and empty responses ----------------------------------------------------------------


def test_plain_chat_without_tools_is_never_flagged() -> None:
    for content in ["Hello!", '{"name": "x", "arguments": {}}', "<tool_call>{}</tool_call>"]:
        assert validate(make_message(content=content), None) == []


@pytest.mark.parametrize("content", [None, "", "  \n\t "])
@pytest.mark.parametrize("tools", [None, retail_tools()])
def test_a_message_without_content_or_calls_is_an_empty_response(
    content: str | None, tools: Any
) -> None:
    violations = validate(make_message(content=content), tools)
    assert channels(violations) == [Channel.EMPTY_RESPONSE]
    assert violations[0].call_index is None


def test_a_refusal_is_not_an_empty_response() -> None:
    message = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
    assert validate(message, retail_tools()) == []


def test_a_text_answer_with_tools_declared_is_not_flagged() -> None:
    assert validate(make_message(content="Your order has shipped."), retail_tools()) == []


# --- unknown tools ---------------------------------------------------------------------------------


def test_a_call_to_an_undeclared_tool_is_an_unknown_tool_with_its_raw_name_index_and_id() -> None:
    message = make_message(
        make_call("get_order_status", {"order_id": "#W1234567"}, call_id="call_9")
    )
    [violation] = validate(message, retail_tools())
    assert violation.channel is Channel.UNKNOWN_TOOL
    assert (violation.tool_name, violation.call_index, violation.call_id) == (
        "get_order_status",
        0,
        "call_9",
    )
    assert "get_order_status" in violation.message


def test_a_call_when_no_tools_were_declared_is_an_unknown_tool() -> None:
    assert channels(validate(make_message(make_call("get_weather")), None)) == [
        Channel.UNKNOWN_TOOL
    ]


def test_a_call_with_a_null_type_is_checked_as_a_function_call() -> None:
    call = {**make_call("nope"), "type": None}
    assert channels(validate(make_message(call), retail_tools())) == [Channel.UNKNOWN_TOOL]


def test_a_call_without_a_function_name_is_an_unknown_tool() -> None:
    call = {"id": "c1", "type": "function", "function": {"arguments": "{}"}}
    [violation] = validate(make_message(call), retail_tools())
    assert violation.channel is Channel.UNKNOWN_TOOL
    assert violation.tool_name is None


def test_a_call_to_a_declared_tool_with_valid_arguments_is_not_flagged() -> None:
    message = make_message(
        make_call("cancel_pending_order", {"order_id": "#W1234567", "reason": "ordered by mistake"})
    )
    assert validate(message, retail_tools()) == []


# --- malformed arguments ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arguments",
    [
        '{"order_id": "#W1234567"',
        "order_id=#W1234567",
        '["#W1234567"]',
        '"#W1234567"',
        "42",
        "null",
        "NaN",
    ],
)
def test_arguments_that_are_not_a_json_object_are_malformed(arguments: str) -> None:
    [violation] = validate(
        make_message(make_call("get_order_details", arguments, call_id="c1")), retail_tools()
    )
    assert violation.channel is Channel.MALFORMED_ARGUMENTS
    assert (violation.tool_name, violation.call_index, violation.call_id) == (
        "get_order_details",
        0,
        "c1",
    )


def test_arguments_that_are_not_a_string_are_malformed() -> None:
    call = make_call("get_order_details")
    call["function"]["arguments"] = {"order_id": "#W1234567"}
    assert channels(validate(make_message(call), retail_tools())) == [Channel.MALFORMED_ARGUMENTS]


@pytest.mark.parametrize("arguments", ["", "  ", "{}"])
def test_empty_arguments_count_as_an_empty_object(arguments: str) -> None:
    assert parse_arguments(arguments) == ({}, None)
    assert (
        validate(make_message(make_call("list_all_product_types", arguments)), retail_tools()) == []
    )


def test_empty_arguments_for_a_tool_with_required_fields_are_a_schema_violation() -> None:
    [violation] = validate(make_message(make_call("get_order_details", "")), retail_tools())
    assert violation.channel is Channel.SCHEMA_VIOLATION
    assert violation.pointers == ("/order_id",)


# --- schema violations -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "arguments", "pointer"),
    [
        ("get_order_details", {}, "/order_id"),
        ("get_order_details", {"order_id": 1234567}, "/order_id"),
        ("get_order_details", {"order_id": "1234567"}, "/order_id"),
        ("get_order_details", {"order_id": "#W1234567", "extra": True}, "/extra"),
        ("cancel_pending_order", {"order_id": "#W1234567", "reason": "changed my mind"}, "/reason"),
        (
            "modify_user_address",
            {"user_id": "u1", "address": {"city": "Austin", "zip": "7870"}},
            "/address/zip",
        ),
        ("modify_user_address", {"user_id": "u1", "address": {"city": "Austin"}}, "/address/zip"),
        ("return_delivered_order_items", {"order_id": "#W1234567", "item_ids": []}, "/item_ids"),
        (
            "return_delivered_order_items",
            {"order_id": "#W1234567", "item_ids": ["a", 2]},
            "/item_ids/1",
        ),
    ],
)
def test_arguments_that_fail_the_schema_are_reported_with_the_pointer_of_the_field(
    name: str, arguments: dict[str, Any], pointer: str
) -> None:
    [violation] = validate(make_message(make_call(name, arguments)), retail_tools())
    assert violation.channel is Channel.SCHEMA_VIOLATION
    assert violation.pointers[0] == pointer
    assert violation.tool_name == name


def test_a_schema_violation_reports_at_most_the_first_few_errors() -> None:
    tool = make_tool(
        "t", {f"f{n}": {"type": "string"} for n in range(10)}, [f"f{n}" for n in range(10)]
    )
    [violation] = validate(make_message(make_call("t", {})), [tool])
    assert len(violation.pointers) == toolcheck.MAX_REPORTED_ERRORS


def test_pointers_escape_slash_and_tilde_in_field_names() -> None:
    tool = make_tool("t", {"a/b": {"type": "string"}, "c~d": {"type": "string"}}, ["a/b", "c~d"])
    [violation] = validate(make_message(make_call("t", {})), [tool])
    assert set(violation.pointers) == {"/a~1b", "/c~0d"}


def test_a_schema_declaring_draft_07_is_checked_by_draft_07_rules() -> None:
    # `dependentRequired` arrived in 2019-09: draft-07 ignores it, 2020-12 enforces it.
    properties = {"a": {"type": "string"}, "b": {"type": "string"}}
    schema = {"type": "object", "properties": properties, "dependentRequired": {"a": ["b"]}}
    draft7 = make_tool(
        "t7", parameters={"$schema": "http://json-schema.org/draft-07/schema#", **schema}
    )
    latest = make_tool("t12", parameters=schema)
    message7 = make_message(make_call("t7", {"a": "x"}))
    message12 = make_message(make_call("t12", {"a": "x"}))
    assert validate(message7, [draft7, latest]) == []
    assert channels(validate(message12, [draft7, latest])) == [Channel.SCHEMA_VIOLATION]


def test_formats_are_annotations_not_assertions() -> None:
    tool = make_tool("t", {"email": {"type": "string", "format": "email"}}, ["email"])
    assert validate(make_message(make_call("t", {"email": "not an email"})), [tool]) == []


def test_a_dollar_anchor_matches_only_at_the_very_end_as_in_ecma_262() -> None:
    message = make_message(make_call("get_order_details", {"order_id": "#W1234567\n"}))
    assert channels(validate(message, retail_tools())) == [Channel.SCHEMA_VIOLATION]


def test_a_catastrophic_pattern_cannot_hang_validation() -> None:
    tool = make_tool("t", {"s": {"type": "string", "pattern": "(a+)+$"}}, ["s"])
    message = make_message(make_call("t", {"s": "a" * 50_000 + "!"}))
    assert channels(validate(message, [tool])) == [Channel.SCHEMA_VIOLATION]


def test_a_pattern_that_exceeds_the_backtrack_limit_is_not_reported() -> None:
    # A backreference forces the backtracking engine; past its limit the call cannot be proved wrong.
    tool = make_tool("t", {"s": {"type": "string", "pattern": r"^(\w+\s?)*\1$"}}, ["s"])
    message = make_message(make_call("t", {"s": "a" * 5_000 + "!"}))
    assert validate(message, [tool]) == []


# --- parallel calls --------------------------------------------------------------------------------


def test_of_parallel_calls_only_the_invalid_one_is_reported() -> None:
    good = make_call("get_order_details", {"order_id": "#W1234567"}, call_id="good")
    bad = make_call("get_order_status", {"order_id": "#W1234567"}, call_id="bad")
    [violation] = validate(make_message(good, bad), retail_tools())
    assert (violation.channel, violation.call_index, violation.call_id) == (
        Channel.UNKNOWN_TOOL,
        1,
        "bad",
    )


def test_each_invalid_parallel_call_gets_its_own_violation_in_call_order() -> None:
    message = make_message(
        make_call("nope"),
        make_call("get_order_details", "not json"),
        make_call("get_order_details", {"order_id": 5}),
    )
    violations = validate(message, retail_tools())
    assert channels(violations) == [
        Channel.UNKNOWN_TOOL,
        Channel.MALFORMED_ARGUMENTS,
        Channel.SCHEMA_VIOLATION,
    ]
    assert [v.call_index for v in violations] == [0, 1, 2]


# --- tool_choice ------------------------------------------------------------------------------------


def valid_order_call(call_id: str = "c1") -> dict[str, Any]:
    return make_call("get_order_details", {"order_id": "#W1234567"}, call_id=call_id)


@pytest.mark.parametrize(
    "tool_choice", [None, "auto", "required", named_choice("get_order_details")]
)
def test_a_valid_call_satisfies_tool_choice(tool_choice: object) -> None:
    assert validate(make_message(valid_order_call()), retail_tools(), tool_choice) == []


@pytest.mark.parametrize("tool_choice", [None, "auto", "none"])
def test_a_text_answer_satisfies_tool_choice_that_does_not_require_a_call(
    tool_choice: object,
) -> None:
    assert validate(make_message(content="Done."), retail_tools(), tool_choice) == []


def test_a_call_when_tool_choice_is_none_is_a_tool_choice_violation() -> None:
    [violation] = validate(make_message(valid_order_call("c7")), retail_tools(), "none")
    assert violation.channel is Channel.TOOL_CHOICE_VIOLATION
    assert (violation.call_index, violation.call_id) == (0, "c7")


@pytest.mark.parametrize("tool_choice", ["required", named_choice("get_order_details")])
def test_no_call_when_tool_choice_requires_one_is_a_tool_choice_violation(
    tool_choice: object,
) -> None:
    [violation] = validate(make_message(content="Let me check."), retail_tools(), tool_choice)
    assert violation.channel is Channel.TOOL_CHOICE_VIOLATION
    assert violation.call_index is None


def test_a_named_tool_choice_names_the_required_tool() -> None:
    [violation] = validate(
        make_message(content="Hi"), retail_tools(), named_choice("get_order_details")
    )
    assert violation.tool_name == "get_order_details"


def test_calling_another_tool_than_the_named_one_is_a_tool_choice_violation() -> None:
    message = make_message(make_call("list_all_product_types", call_id="other"))
    [violation] = validate(message, retail_tools(), named_choice("get_order_details"))
    assert (violation.channel, violation.call_id) == (Channel.TOOL_CHOICE_VIOLATION, "other")


def test_allowed_tools_limit_which_tools_may_be_called() -> None:
    choice = {
        "type": "allowed_tools",
        "allowed_tools": {
            "mode": "required",
            "tools": [{"type": "function", "function": {"name": "get_order_details"}}],
        },
    }
    assert validate(make_message(valid_order_call()), retail_tools(), choice) == []
    other = make_message(make_call("list_all_product_types"))
    assert channels(validate(other, retail_tools(), choice)) == [Channel.TOOL_CHOICE_VIOLATION]
    assert channels(validate(make_message(content="x"), retail_tools(), choice)) == [
        Channel.TOOL_CHOICE_VIOLATION
    ]


def test_an_empty_response_under_required_tool_choice_is_reported_once_as_empty() -> None:
    assert channels(validate(make_message(), retail_tools(), "required")) == [
        Channel.EMPTY_RESPONSE
    ]


# --- leaked calls and truncation --------------------------------------------------------------------


def test_a_call_written_into_content_is_a_leaked_tool_call() -> None:
    content = '<tool_call>{"name": "get_order_details", "arguments": {"order_id": "#W1234567"}}</tool_call>'
    [violation] = validate(make_message(content=content), retail_tools())
    assert violation.channel is Channel.LEAKED_TOOL_CALL
    assert violation.tool_name == "get_order_details"
    assert violation.call_index is None


def test_a_leaked_call_under_required_tool_choice_is_reported_only_as_leaked() -> None:
    content = '{"name": "get_order_details", "arguments": {"order_id": "#W1234567"}}'
    assert channels(validate(make_message(content=content), retail_tools(), "required")) == [
        Channel.LEAKED_TOOL_CALL
    ]


def test_the_text_of_a_call_the_server_parsed_is_not_a_leak() -> None:
    text = '<tool_call>{"name": "get_order_details", "arguments": {"order_id": "#W1234567"}}</tool_call>'
    message = make_message(valid_order_call(), content=text)
    assert validate(message, retail_tools()) == []
    other = make_message(valid_order_call(), content=text.replace("#W1234567", "#W7654321"))
    assert channels(validate(other, retail_tools())) == [Channel.LEAKED_TOOL_CALL]


def test_a_tool_call_element_no_format_reads_is_a_leaked_call_that_names_no_tool() -> None:
    content = "<tool_call>plemented\n maddenin#waction\n</tool_call>\nI could not refund it."
    [violation] = validate(make_message(content=content), retail_tools(), finish_reason="stop")
    assert (violation.channel, violation.tool_name, violation.format) == (
        Channel.LEAKED_TOOL_CALL,
        None,
        "hermes",
    )
    assert violation.message == (
        "an unreadable tool call was written into the content as hermes text instead of a tool call"
    )


def test_prose_about_json_is_not_a_leaked_call() -> None:
    content = 'I would call it like {"name": "get_order_details", "arguments": {}} if I needed to.'
    assert validate(make_message(content=content), retail_tools()) == []


def test_a_call_cut_off_at_the_token_limit_is_truncated_not_malformed() -> None:
    message = make_message(make_call("get_order_details", '{"order_id": "#W12'))
    assert channels(validate(message, retail_tools(), finish_reason="length")) == [
        Channel.TRUNCATED
    ]
    assert channels(validate(message, retail_tools(), finish_reason="stop")) == [
        Channel.MALFORMED_ARGUMENTS
    ]


def test_a_last_call_with_no_arguments_yet_at_the_token_limit_is_truncated() -> None:
    message = make_message(make_call("get_order_details", ""))
    assert channels(validate(message, retail_tools(), finish_reason="length")) == [
        Channel.TRUNCATED
    ]


def test_only_the_last_call_can_be_truncated() -> None:
    message = make_message(
        make_call("get_order_details", "{oops"), make_call("get_order_details", '{"order_id')
    )
    violations = validate(message, retail_tools(), finish_reason="length")
    assert channels(violations) == [Channel.MALFORMED_ARGUMENTS, Channel.TRUNCATED]


def test_a_complete_call_at_the_token_limit_is_not_truncated() -> None:
    assert validate(make_message(valid_order_call()), retail_tools(), finish_reason="length") == []


def test_a_leaked_call_cut_off_at_the_token_limit_is_truncated() -> None:
    content = '<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W'
    assert channels(
        validate(make_message(content=content), retail_tools(), finish_reason="length")
    ) == [Channel.TRUNCATED]
    assert channels(
        validate(make_message(content=content), retail_tools(), finish_reason="stop")
    ) == [Channel.LEAKED_TOOL_CALL]


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_a_call_written_into_the_reasoning_is_a_leaked_tool_call_flagged_as_in_reasoning(
    field: str,
) -> None:
    message = make_message(content=None)
    message[field] = (
        "The user wants order #W1234567, so I call the tool.\n"
        '<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W1234567"}}\n'
        "</tool_call>"
    )
    [violation] = validate(message, retail_tools())
    assert violation.channel is Channel.LEAKED_TOOL_CALL
    assert (violation.tool_name, violation.format, violation.in_reasoning) == (
        "get_order_details",
        "hermes",
        True,
    )
    assert violation.to_dict()["in_reasoning"] is True
    assert "reasoning" in violation.message


def test_reasoning_that_drafts_json_or_names_a_marker_is_not_a_leak() -> None:
    message = make_message(content="Your order has shipped.")
    message["reasoning"] = (
        'I could send {"name": "get_order_details", "arguments": {}} but the answer is known; '
        "no <tool_call> is needed."
    )
    assert validate(message, retail_tools()) == []


def test_a_call_in_the_reasoning_that_the_server_also_parsed_is_not_a_leak() -> None:
    message = make_message(valid_order_call(), content=None)
    message["reasoning"] = (
        '<tool_call>{"name": "get_order_details", "arguments": {"order_id": "#W1234567"}}</tool_call>'
    )
    assert validate(message, retail_tools()) == []


def test_a_leaked_call_carries_its_format_in_the_content_and_a_cut_off_one_too() -> None:
    content = '[TOOL_CALLS]get_order_details[ARGS]{"order_id": "#W1234567"}'
    [violation] = validate(make_message(content=content), retail_tools())
    assert (violation.format, violation.in_reasoning) == ("mistral", False)
    assert violation.to_dict()["format"] == "mistral"
    assert "in_reasoning" not in violation.to_dict()
    cut = '<|tool_call_begin|>functions.get_order_details:0<|tool_call_argument_begin|>{"order_id'
    [truncated] = validate(make_message(content=cut), retail_tools(), finish_reason="length")
    assert (truncated.channel, truncated.format) == (Channel.TRUNCATED, "kimi_k2")


def test_plain_text_cut_off_at_the_token_limit_is_not_flagged() -> None:
    assert (
        validate(make_message(content="The order was"), retail_tools(), finish_reason="length")
        == []
    )


# --- properties -------------------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(data=st.data(), schema=object_schemas())
def test_arguments_generated_to_satisfy_the_schema_are_never_flagged(
    data: st.DataObject, schema: dict[str, Any]
) -> None:
    arguments = data.draw(instances(schema))
    assert reference_is_valid(schema, arguments), "the generator must only produce valid arguments"
    message = make_message(make_call("tool", arguments))
    assert validate(message, [make_tool("tool", parameters=schema)]) == []


@PROPERTY_SETTINGS
@given(data=st.data(), schema=object_schemas())
def test_removing_a_required_key_is_always_flagged(
    data: st.DataObject, schema: dict[str, Any]
) -> None:
    missing = data.draw(st.sampled_from(sorted(schema["properties"])))
    schema["required"] = sorted({*schema["required"], missing})
    arguments = data.draw(instances(schema))
    del arguments[missing]
    [violation] = validate(
        make_message(make_call("tool", arguments)), [make_tool("tool", parameters=schema)]
    )
    assert violation.channel is Channel.SCHEMA_VIOLATION
    assert "/" + missing.replace("~", "~0").replace("/", "~1") in violation.pointers


@PROPERTY_SETTINGS
@given(data=st.data(), schema=object_schemas())
def test_breaking_a_type_is_always_flagged(data: st.DataObject, schema: dict[str, Any]) -> None:
    arguments = data.draw(instances(schema))
    field = data.draw(st.sampled_from(sorted(schema["properties"])))
    arguments[field] = wrong_type_value(schema["properties"][field])
    [violation] = validate(
        make_message(make_call("tool", arguments)), [make_tool("tool", parameters=schema)]
    )
    assert violation.channel is Channel.SCHEMA_VIOLATION


@PROPERTY_SETTINGS
@given(data=st.data(), schema=object_schemas())
def test_the_fast_validator_agrees_with_reference_jsonschema(
    data: st.DataObject, schema: dict[str, Any]
) -> None:
    valid = data.draw(instances(schema))
    candidates = st.one_of(
        st.just(valid),
        json_values(),
        st.dictionaries(
            st.sampled_from(sorted(schema["properties"])), json_values(), max_size=4
        ).map(lambda extra: {**valid, **extra}),
    )
    arguments = data.draw(candidates)
    index = compile_tools([make_tool("tool", parameters=schema)])
    assert (index.check("tool", arguments) == []) == reference_is_valid(schema, arguments)
