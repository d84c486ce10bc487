import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionMessageParam
from pydantic import TypeAdapter

from proxy.guard.channels import Channel, Violation
from proxy.guard.repair import (
    NOT_EXECUTED,
    ConstraintSupport,
    OnUnrepaired,
    RepairMode,
    StructuredOutputs,
    closest_tool_name,
    corrective_messages,
    edit_distance,
    local_fix,
    mark_strict,
    plan_reask,
    recover_arguments,
    refuses_constraint,
    strip_invalid,
)
from proxy.guard.toolcheck import ToolIndex, compile_tools, validate
from tests.proxy.guard.builders import ORDER_ID, make_call, make_message, make_tool, retail_tools

CONVERSATION = TypeAdapter(list[ChatCompletionMessageParam])
REQUEST = [
    {"role": "system", "content": "You are a retail agent."},
    {"role": "user", "content": "Cancel #W1234567."},
]
VALID_ORDER_ARGS = {"order_id": "#W1234567"}


@pytest.fixture
def index() -> ToolIndex:
    return compile_tools(retail_tools())


def reask(message: dict[str, Any], index: ToolIndex, **check: Any) -> list[dict[str, Any]]:
    """The corrective messages for `message`, after checking they form a valid conversation."""
    added = corrective_messages(message, validate(message, None, index=index, **check), index)
    assert_valid_conversation([*REQUEST, *added])
    return added


def assert_valid_conversation(messages: list[dict[str, Any]]) -> None:
    """What an OpenAI-compatible server requires: the SDK's message shapes, every call has an id,
    and every call is answered by exactly one tool message right after it."""
    for parsed in CONVERSATION.validate_python(messages):
        list(parsed.get("tool_calls") or [])  # the SDK's type validates tool calls lazily
    pending: list[str] = []
    for message in messages:
        if message["role"] == "tool":
            assert message["tool_call_id"] == pending.pop(0)
            continue
        assert not pending, f"calls {pending} were not answered"
        if message["role"] == "assistant":
            pending = [call["id"] for call in message.get("tool_calls", [])]
            assert message.get("tool_calls") or isinstance(message["content"], str)
    assert not pending


def tool_answers(added: list[dict[str, Any]]) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in added if m["role"] == "tool"}


def user_notes(added: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in added if m["role"] == "user"]


# --- modes -----------------------------------------------------------------------------------------


def test_repair_modes_and_unrepaired_policies_have_their_configuration_names() -> None:
    assert [m.value for m in RepairMode] == ["off", "reask", "constrain"]
    assert [p.value for p in OnUnrepaired] == ["passthrough", "strip", "reject"]
    assert RepairMode("reask") is RepairMode.REASK
    assert [m.reasks for m in RepairMode] == [False, True, True]


# --- corrective_messages ---------------------------------------------------------------------------


def test_an_unknown_tool_is_answered_with_the_available_tools(index: ToolIndex) -> None:
    message = make_message(make_call("find_order", VALID_ORDER_ARGS, call_id="c1"))
    added = reask(message, index)
    assert added[0] == {"role": "assistant", "content": None, "tool_calls": message["tool_calls"]}
    assert tool_answers(added)["c1"] == (
        "Error: tool 'find_order' does not exist. Available tools: get_order_details, cancel_pending_order, "
        "modify_user_address, return_delivered_order_items, list_all_product_types. "
        "Call one of these, or answer without a tool."
    )
    assert user_notes(added) == []


def test_an_unknown_tool_close_to_one_declared_name_suggests_it(index: ToolIndex) -> None:
    added = reask(
        make_message(make_call("get_order_detail", VALID_ORDER_ARGS, call_id="c1")), index
    )
    assert tool_answers(added)["c1"].endswith("Did you mean 'get_order_details'?")


def test_a_valid_call_next_to_an_invalid_one_is_answered_as_not_executed(index: ToolIndex) -> None:
    good = make_call("get_order_details", VALID_ORDER_ARGS, call_id="good")
    bad = make_call("get_order_status", VALID_ORDER_ARGS, call_id="bad")
    answers = tool_answers(reask(make_message(good, bad), index))
    assert answers["good"] == NOT_EXECUTED
    assert answers["bad"].startswith("Error: tool 'get_order_status' does not exist")
    assert list(answers) == ["good", "bad"]


def test_malformed_arguments_are_answered_with_the_need_for_a_json_object(index: ToolIndex) -> None:
    answers = tool_answers(
        reask(make_message(make_call("get_order_details", "order_id=#W1", call_id="c1")), index)
    )
    assert "must be one JSON object" in answers["c1"]
    assert '"order_id"' in answers["c1"]  # the expected schema is shown


def test_a_schema_violation_is_answered_with_the_failing_field_and_its_expected_schema(
    index: ToolIndex,
) -> None:
    arguments = {"order_id": "#W1234567", "reason": "changed my mind"}
    answers = tool_answers(
        reask(make_message(make_call("cancel_pending_order", arguments, call_id="c1")), index)
    )
    assert "/reason" in answers["c1"]
    assert '"enum":["no longer needed","ordered by mistake"]' in answers["c1"]


def test_a_missing_nested_field_is_answered_with_that_fields_schema(index: ToolIndex) -> None:
    arguments = {"user_id": "u1", "address": {"city": "Austin"}}
    answers = tool_answers(
        reask(make_message(make_call("modify_user_address", arguments, call_id="c1")), index)
    )
    assert (
        '/address/zip must match {"type":"string","pattern":"^\\\\d{5}$"}' in answers["c1"]
    )  # declared key order


def test_a_truncated_call_is_answered_asking_for_complete_arguments(index: ToolIndex) -> None:
    message = make_message(make_call("get_order_details", '{"order_id": "#W1', call_id="c1"))
    answers = tool_answers(reask(message, index, finish_reason="length"))
    assert "cut off at the token limit" in answers["c1"]


def test_a_call_forbidden_by_tool_choice_is_answered_as_not_executed(index: ToolIndex) -> None:
    message = make_message(make_call("get_order_details", VALID_ORDER_ARGS, call_id="c1"))
    answers = tool_answers(reask(message, index, tool_choice="none"))
    assert answers["c1"].startswith("Error: not executed: tool_choice is 'none'")


def test_a_leaked_call_keeps_the_content_and_gets_a_user_message(index: ToolIndex) -> None:
    content = '<tool_call>{"name": "get_order_details", "arguments": {"order_id": "#W1234567"}}</tool_call>'
    added = reask(make_message(content=content), index)
    assert added[0] == {"role": "assistant", "content": content}
    [note] = user_notes(added)
    assert "'get_order_details'" in note
    assert "as text" in note


def test_an_empty_response_gets_an_empty_assistant_turn_and_a_user_message(
    index: ToolIndex,
) -> None:
    added = reask(make_message(), index)
    assert added[0] == {"role": "assistant", "content": ""}
    [note] = user_notes(added)
    assert note.startswith("Your last reply was empty.")
    assert "get_order_details" in note


def test_a_required_tool_choice_without_a_call_gets_a_user_message(index: ToolIndex) -> None:
    [note] = user_notes(reask(make_message(content="Let me think."), index, tool_choice="required"))
    assert note.startswith("You must call a tool now")


def test_calls_without_an_id_leave_the_assistant_message_and_are_described_to_the_user(
    index: ToolIndex,
) -> None:
    good = make_call("get_order_details", VALID_ORDER_ARGS, call_id="good")
    bad = make_call("get_order_status", VALID_ORDER_ARGS, call_id=None)
    added = reask(make_message(good, bad), index)
    assert [call["id"] for call in added[0]["tool_calls"]] == ["good"]
    [note] = user_notes(added)
    assert (
        "Your tool call to 'get_order_status' was not executed. Error: tool 'get_order_status' does not exist"
        in note
    )


def test_when_no_call_has_an_id_the_assistant_message_carries_only_text(index: ToolIndex) -> None:
    added = reask(make_message(make_call("nope", call_id=None), content="Checking."), index)
    assert added[0] == {"role": "assistant", "content": "Checking."}
    assert len(user_notes(added)) == 1


def test_the_assistant_message_is_reduced_to_what_a_server_accepts_back(index: ToolIndex) -> None:
    call = make_call("nope", call_id="c1")
    call["index"] = 0
    message = {**make_message(call), "reasoning_content": "hmm", "refusal": None, "annotations": []}
    assistant = reask(message, index)[0]
    assert set(assistant) == {"role", "content", "tool_calls"}
    assert assistant["tool_calls"][0] == {
        "id": "c1",
        "type": "function",
        "function": {"name": "nope", "arguments": "{}"},
    }


def test_nothing_to_correct_gives_no_messages(index: ToolIndex) -> None:
    assert corrective_messages(make_message(content="Hi"), [], index) == []


def test_corrective_messages_do_not_change_the_message(index: ToolIndex) -> None:
    message = make_message(
        make_call("nope", call_id=None), make_call("get_order_details", "x", call_id="c2")
    )
    before = copy.deepcopy(message)
    corrective_messages(message, validate(message, None, index=index), index)
    assert message == before


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["get_order_details", "get_order_status", "list_all_product_types"]),
            st.sampled_from(['{"order_id": "#W1234567"}', "{}", "not json", '{"order_id": 1}']),
            st.booleans(),
        ),
        max_size=4,
    ),
    st.sampled_from([None, "", "Sure.", '{"name": "get_order_details", "arguments": {}}']),
    st.sampled_from([None, "auto", "none", "required"]),
)
def test_any_reask_is_a_valid_conversation(
    calls: list[tuple[str, str, bool]], content: str | None, choice: str | None
) -> None:
    index = compile_tools(retail_tools())
    message = make_message(
        *(
            make_call(name, args, call_id=f"c{n}" if has_id else None)
            for n, (name, args, has_id) in enumerate(calls)
        ),
        content=content,
    )
    violations = validate(message, None, choice, index=index)
    added = corrective_messages(message, violations, index)
    if violations:
        assert_valid_conversation([*REQUEST, *added])
    else:
        assert added == []


# --- strip_invalid ---------------------------------------------------------------------------------


def test_strip_removes_only_the_invalid_calls() -> None:
    good = make_call("get_order_details", VALID_ORDER_ARGS, call_id="good")
    message = make_message(make_call("nope", call_id="bad"), good, content="Working on it.")
    violations = validate(message, retail_tools())
    before = copy.deepcopy(message)
    stripped = strip_invalid(message, violations)
    assert stripped == {"role": "assistant", "content": "Working on it.", "tool_calls": [good]}
    assert message == before


def test_strip_with_no_valid_call_left_removes_tool_calls_and_keeps_content() -> None:
    message = make_message(make_call("nope"), content="Let me check.")
    stripped = strip_invalid(message, validate(message, retail_tools()))
    assert stripped == {"role": "assistant", "content": "Let me check."}


def test_strip_leaves_a_message_with_only_message_level_violations_as_it_was() -> None:
    content = '{"name": "get_order_details", "arguments": {"order_id": "#W1234567"}}'
    message = make_message(content=content)
    assert strip_invalid(message, validate(message, retail_tools())) == message


# --- local fixes -----------------------------------------------------------------------------------


def test_a_near_miss_tool_name_is_fixed_to_the_declared_one(index: ToolIndex) -> None:
    message = make_message(make_call("get_order_detail", VALID_ORDER_ARGS))
    before = copy.deepcopy(message)
    violations = validate(message, None, index=index)
    fixed, done = local_fix(message, violations, index)
    assert done == violations
    assert fixed["tool_calls"][0]["function"]["name"] == "get_order_details"
    assert validate(fixed, None, index=index) == []
    assert message == before


def test_a_tool_name_differing_only_in_case_is_fixed(index: ToolIndex) -> None:
    message = make_message(make_call("Get_Order_Details", VALID_ORDER_ARGS))
    fixed, done = local_fix(message, validate(message, None, index=index), index)
    assert len(done) == 1
    assert fixed["tool_calls"][0]["function"]["name"] == "get_order_details"


def test_an_ambiguous_near_miss_is_not_fixed() -> None:
    index = compile_tools([make_tool("get_user"), make_tool("get_users"), make_tool("set_user")])
    message = make_message(make_call("get_usr"))
    fixed, done = local_fix(message, validate(message, None, index=index), index)
    assert done == []
    assert fixed == message


def test_a_name_too_far_from_every_tool_is_not_fixed(index: ToolIndex) -> None:
    message = make_message(make_call("lookup_order", VALID_ORDER_ARGS))
    assert local_fix(message, validate(message, None, index=index), index)[1] == []


@pytest.mark.parametrize(
    "arguments",
    [
        '```json\n{"order_id": "#W1234567"}\n```',
        '```\n{"order_id": "#W1234567"}\n```',
        '{"order_id": "#W1234567"} I will look this order up now.',
        '{"order_id": "#W1234567"}}',
    ],
)
def test_fenced_arguments_or_trailing_text_are_fixed(index: ToolIndex, arguments: str) -> None:
    message = make_message(make_call("get_order_details", arguments))
    violations = validate(message, None, index=index)
    assert [v.channel for v in violations] == [Channel.MALFORMED_ARGUMENTS]
    fixed, done = local_fix(message, violations, index)
    assert done == violations
    assert json.loads(fixed["tool_calls"][0]["function"]["arguments"]) == VALID_ORDER_ARGS
    assert validate(fixed, None, index=index) == []


@pytest.mark.parametrize(
    "arguments", ['order: {"order_id": "#W1234567"}', '{"order_id": "#W12', '["#W1234567"] done']
)
def test_arguments_without_a_leading_json_object_are_not_fixed(
    index: ToolIndex, arguments: str
) -> None:
    message = make_message(make_call("get_order_details", arguments))
    assert local_fix(message, validate(message, None, index=index), index)[1] == []


def test_local_fix_leaves_channels_it_cannot_fix(index: ToolIndex) -> None:
    message = make_message(make_call("get_order_details", {"order_id": 5}))
    violations = validate(message, None, index=index)
    assert local_fix(message, violations, index) == (message, [])


def test_closest_tool_name_does_not_guess_short_names() -> None:
    assert closest_tool_name("get", ["set", "pet"]) is None
    assert closest_tool_name("calculat", ["calculate", "transfer"]) == "calculate"


def test_edit_distance_is_levenshtein_capped_above_the_limit() -> None:
    assert edit_distance("kitten", "sitting", 5) == 3
    assert edit_distance("kitten", "sitting", 2) == 3
    assert edit_distance("abc", "abc", 2) == 0


def test_recover_arguments_returns_nothing_for_what_is_already_an_object_or_not_text() -> None:
    assert recover_arguments('{"a": 1}') is None
    assert recover_arguments({"a": 1}) is None


def test_a_violation_without_a_matching_call_is_ignored_by_local_fix(index: ToolIndex) -> None:
    ghost = Violation(Channel.UNKNOWN_TOOL, "x", "get_order_detail", 3, "c3")
    message = make_message(make_call("get_order_details", VALID_ORDER_ARGS))
    assert local_fix(message, [ghost], index) == (message, [])


# --- plan_reask: which constrained re-ask each channel gets ---------------------------------------


def plan_for(
    message: dict[str, Any], index: ToolIndex, tool_choice: Any = None, **check: Any
) -> Any:
    violations = validate(message, None, tool_choice, index=index, **check)
    assert violations, "the message must be invalid"
    return plan_reask(message, violations, index, tool_choice)


def named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


ALL_STRICT = {
    "get_order_details",
    "cancel_pending_order",
    "modify_user_address",
    "return_delivered_order_items",
    "list_all_product_types",
}


@pytest.mark.parametrize(
    ("call", "finish_reason"),
    [
        (make_call("cancel_pending_order", {"order_id": "#W1234567"}), None),  # schema violation
        (
            make_call("cancel_pending_order", '{"order_id": "#W1234567", "reason"'),
            None,
        ),  # malformed
        (make_call("cancel_pending_order", '["#W1234567"]'), None),  # an array, not an object
        (make_call("cancel_pending_order", '{"order_id": "#W12'), "length"),  # truncated call
        (make_call("cancel_pendng_order", VALID_ORDER_ARGS), None),  # unknown, one close match
    ],
)
def test_a_single_call_whose_tool_is_clear_is_reasked_with_that_tool_named_and_strict(
    call: dict[str, Any], finish_reason: str | None, index: ToolIndex
) -> None:
    plan = plan_for(make_message(call), index, finish_reason=finish_reason)
    assert plan.tool_choice == named("cancel_pending_order")
    assert plan.named == "cancel_pending_order"
    assert set(plan.strict) == {"cancel_pending_order"}
    assert plan.strict["cancel_pending_order"].schema["additionalProperties"] is False
    assert plan.loose == {}
    assert plan.single_call


def test_an_unknown_name_without_one_close_match_is_reasked_with_required_and_every_tool_strict(
    index: ToolIndex,
) -> None:
    plan = plan_for(make_message(make_call("refund_everything", {})), index)
    assert plan.tool_choice == "required"
    assert set(plan.strict) == ALL_STRICT
    assert plan.named is None
    assert plan.single_call  # one call was meant: no room to repeat it until the token limit


def test_several_calls_are_reasked_with_required_even_when_each_tool_is_clear(
    index: ToolIndex,
) -> None:
    message = make_message(
        make_call("get_order_details", VALID_ORDER_ARGS),
        make_call("cancel_pending_order", VALID_ORDER_ARGS),  # reason missing
    )
    plan = plan_for(message, index)
    assert plan.tool_choice == "required"
    assert plan.reason == "2 calls were meant"
    assert not plan.single_call


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (
            '<tool_call>{"name": "get_order_details", "arguments": {"order_id": "#W1234567"}}</tool_call>',
            named("get_order_details"),
        ),
        (
            '<tool_call>{"name": "get_ordr_details", "arguments": {}}</tool_call>',
            named("get_order_details"),
        ),
        ('<tool_call>{"name": "wire_money", "arguments": {}}</tool_call>', "required"),
    ],
)
def test_a_leaked_call_is_named_when_it_names_a_declared_tool_or_one_close_match(
    content: str, expected: Any, index: ToolIndex
) -> None:
    plan = plan_for(make_message(content=content), index)
    assert plan.tool_choice == expected


def test_a_leaked_call_cut_off_at_the_token_limit_is_named_after_its_tool(index: ToolIndex) -> None:
    message = make_message(
        content='<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W1'
    )
    violations = validate(message, None, index=index, finish_reason="length")
    assert [v.channel for v in violations] == [Channel.TRUNCATED]
    assert plan_reask(message, violations, index).tool_choice == named("get_order_details")


LEAKED_LOOKUP = '<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W1234567"}}\n</tool_call>'


@pytest.mark.parametrize(
    "content",
    [
        # written whole, then again until the token limit cut it off (the CPU vLLM's answer)
        LEAKED_LOOKUP + LEAKED_LOOKUP + '<tool_call>\n{"name": "get_order_details", "argum',
        LEAKED_LOOKUP + "\n" + LEAKED_LOOKUP,
    ],
    ids=["repeated-then-cut-off", "repeated"],
)
def test_one_call_written_again_and_again_is_reasked_as_that_one_tool_named(
    content: str, index: ToolIndex
) -> None:
    message = make_message(content=content)
    violations = validate(message, None, "required", index=index, finish_reason="length")
    assert len(violations) >= 2
    plan = plan_reask(message, violations, index, "required")
    assert plan.tool_choice == named("get_order_details")
    assert plan.single_call
    assert set(plan.strict) == {"get_order_details"}


@pytest.mark.parametrize(
    "message",
    [
        # the CPU vLLM's answer to `required`: a call written whole, another cut off
        make_message(content=LEAKED_LOOKUP + '<tool_call>\n{"name": "cancel_pending_order'),
        make_message(
            make_call("get_order_details", {"order_id": "#W1234567"}),
            make_call("cancel_pending_order", '{"order_id": "#W12'),
        ),
    ],
    ids=["written", "parsed"],
)
def test_a_call_cut_off_after_a_whole_one_is_left_out_of_what_was_meant(
    message: dict[str, Any], index: ToolIndex
) -> None:
    violations = validate(message, None, "required", index=index, finish_reason="length")
    assert Channel.TRUNCATED in [v.channel for v in violations]
    plan = plan_reask(message, violations, index, "required")
    assert plan.tool_choice == named("get_order_details")
    assert plan.single_call


def test_calls_written_as_text_to_one_tool_with_different_arguments_are_several_calls(
    index: ToolIndex,
) -> None:
    other = LEAKED_LOOKUP.replace("#W1234567", "#W7654321")
    plan = plan_for(make_message(content=LEAKED_LOOKUP + "\n" + other), index)
    assert plan.tool_choice == "required"
    assert plan.reason == "2 calls were meant"
    assert not plan.single_call


def test_calls_written_as_text_whose_names_cannot_be_read_count_one_each(index: ToolIndex) -> None:
    unnamed = '<tool_call>\n{"name": "", "arguments": {}}\n</tool_call>'
    message = make_message(content=unnamed + "\n" + unnamed)
    violations = validate(message, None, index=index)
    assert [v.tool_name for v in violations] == [None, None]
    plan = plan_reask(message, violations, index)
    assert plan.tool_choice == "required"
    assert not plan.single_call


def test_an_empty_answer_is_reasked_with_required(index: ToolIndex) -> None:
    plan = plan_for(make_message(content=""), index)
    assert plan.tool_choice == "required"
    assert set(plan.strict) == ALL_STRICT


def test_a_required_call_not_made_is_reasked_with_required_or_the_named_tool(
    index: ToolIndex,
) -> None:
    text = make_message(content="I will look it up.")
    assert plan_for(text, index, "required").tool_choice == "required"
    assert plan_for(text, index, named("get_order_details")).tool_choice == named(
        "get_order_details"
    )


def test_a_call_to_another_tool_than_the_named_one_is_reasked_naming_the_requests_tool(
    index: ToolIndex,
) -> None:
    message = make_message(make_call("cancel_pending_order", VALID_ORDER_ARGS))
    plan = plan_for(message, index, named("get_order_details"))
    assert plan.tool_choice == named("get_order_details")
    assert set(plan.strict) == {"get_order_details"}


def test_a_call_where_tool_choice_was_none_is_reasked_with_none_and_nothing_strict(
    index: ToolIndex,
) -> None:
    message = make_message(make_call("get_order_details", VALID_ORDER_ARGS))
    plan = plan_for(message, index, "none")
    assert plan.tool_choice == "none"
    assert plan.strict == {}
    assert plan_for(make_message(content=""), index, "none").tool_choice == "none"


def test_without_tools_the_plan_leaves_the_requests_tool_choice() -> None:
    message = make_message(content="")
    violations = validate(message, None)
    plan = plan_reask(message, violations, compile_tools(None))
    assert plan.tool_choice is None
    assert plan.strict == {}
    assert plan.loose == {}


def test_a_tool_that_cannot_be_strict_is_left_as_declared_and_the_plan_says_why() -> None:
    tools = [
        make_tool("get_order_details", {"order_id": ORDER_ID}, ["order_id"]),
        make_tool("set_settings", {"settings": {"type": "object"}}, ["settings"]),
    ]
    index = compile_tools(tools)
    plan = plan_for(make_message(make_call("set_setings", {"settings": 3})), index)
    assert plan.tool_choice == named("set_settings")
    assert plan.strict == {}
    assert plan.loose == {"set_settings": "/properties/settings is an object with free-form keys"}
    required = plan_for(make_message(content=""), index)
    assert set(required.strict) == {"get_order_details"}
    assert set(required.loose) == {"set_settings"}
    assert required.to_dict() == {
        "tool_choice": "required",
        "reason": "the intended tool is not clear",
        "strict": ["get_order_details"],
        "loose": {"set_settings": "/properties/settings is an object with free-form keys"},
        "single_call": True,
    }


def test_mark_strict_declares_the_planned_tools_strict_in_their_strict_form(
    index: ToolIndex,
) -> None:
    tools = retail_tools()
    before = copy.deepcopy(tools)
    plan = plan_for(make_message(make_call("cancel_pending_order", VALID_ORDER_ARGS)), index)
    marked = mark_strict(tools, plan.strict)
    assert tools == before
    by_name = {t["function"]["name"]: t["function"] for t in marked}  # type: ignore[index]
    assert by_name["cancel_pending_order"]["strict"] is True
    assert (
        by_name["cancel_pending_order"]["parameters"] == plan.strict["cancel_pending_order"].schema
    )
    assert by_name["cancel_pending_order"]["description"] == "cancel_pending_order tool"
    assert "strict" not in by_name["get_order_details"]
    assert by_name["get_order_details"] == before[0]["function"]


# --- structured outputs: refusals and what is remembered ------------------------------------------


@pytest.mark.parametrize(
    ("status", "body", "refused"),
    [
        (400, {"error": {"message": "Unrecognized request argument supplied: strict"}}, True),
        (400, {"error": {"message": "invalid value", "param": "tool_choice"}}, True),
        (
            400,
            {
                "detail": [
                    {
                        "loc": ["body", "tools", 0, "function", "strict"],
                        "msg": "Extra inputs are not permitted",
                    }
                ]
            },
            True,
        ),
        (400, "'required' tool_choice is not supported", True),
        (400, {"error": {"message": "max_tokens is too large"}}, False),
        (500, {"error": {"message": "strict decoding crashed"}}, False),
        (422, {"error": {"message": "tool_choice"}}, False),
    ],
)
def test_a_refusal_is_a_400_that_names_the_constrained_fields(
    status: int, body: object, refused: bool
) -> None:
    assert refuses_constraint(status, body) is refused


def test_auto_remembers_an_upstream_that_refused_on_always_asks_off_never_asks() -> None:
    support = ConstraintSupport()
    assert support.allows("vllm", StructuredOutputs.AUTO)
    assert not support.allows("vllm", StructuredOutputs.OFF)
    assert support.refuse("vllm") is True
    assert support.refuse("vllm") is False
    assert not support.allows("vllm", StructuredOutputs.AUTO)
    assert support.allows("vllm", StructuredOutputs.ON)
    assert support.allows("other", StructuredOutputs.AUTO)
    assert support.refused() == frozenset({"vllm"})
