"""The environment answers every call with a tool message and counts failures as τ²-bench does."""

from __future__ import annotations

import json

from evalkit.domains.base import Domain
from evalkit.env import Environment, to_json_str
from evalkit.messages import ToolCall
from evalkit.tasks import EnvFunctionCall


def call(name: str, **arguments: object) -> ToolCall:
    return ToolCall(id=f"call_{name}", name=name, arguments=dict(arguments))


def test_unknown_tool_answers_tau2_text_and_counts_one_error(retail: Domain) -> None:
    env = Environment(retail)
    answer = env.execute(call("get_weather", city="Paris"))
    assert answer.content == "Error: Tool 'get_weather' not found."
    assert answer.error is True
    assert answer.id == "call_get_weather"
    assert env.errors == 1


def test_wrong_arguments_answer_pythons_text_and_count(retail: Domain) -> None:
    env = Environment(retail)
    answer = env.execute(call("get_order_details", id="#W1"))
    assert answer.content == (
        "Error: RetailTools.get_order_details() got an unexpected keyword argument 'id'"
    )
    assert answer.error
    assert env.errors == 1


def test_business_errors_count_and_successes_do_not(retail: Domain) -> None:
    env = Environment(retail)
    assert env.execute(call("get_order_details", order_id="#W0")).content == (
        "Error: Order not found"
    )
    ok = env.execute(call("list_all_product_types"))
    assert ok.error is False
    assert isinstance(json.loads(ok.content or ""), dict)
    assert env.errors == 1


def test_arguments_that_are_not_json_are_an_error_naming_the_tool(retail: Domain) -> None:
    env = Environment(retail)
    broken = ToolCall(id="c1", name="get_order_details", raw_arguments='{"order_id": "#W1')
    answer = env.execute(broken)
    assert answer.error
    assert (answer.content or "").startswith(
        "Error: Arguments of tool 'get_order_details' are not a JSON object"
    )
    assert env.errors == 1


def test_errors_accumulate_and_are_never_reset(retail: Domain) -> None:
    env = Environment(retail)
    for n in range(3):
        env.execute(call("nope"))
        env.execute(call("list_all_product_types"))
        assert env.errors == n + 1


def test_models_serialise_as_tau2_json_and_strings_pass_through(retail: Domain) -> None:
    env = Environment(retail)
    user_id = next(iter(env.agent_tools.db.model_dump()["users"]))  # type: ignore[union-attr]
    answer = env.execute(call("get_user_details", user_id=user_id))
    data = json.loads(answer.content or "")
    assert list(data) == ["user_id", "name", "address", "email", "payment_methods", "orders"]
    assert to_json_str("Transfer successful") == "Transfer successful"
    assert to_json_str(3) == '"3"'


def test_a_replay_without_sync_leaves_the_users_side_untouched(tau2_telecom: Domain) -> None:
    env = Environment(tau2_telecom)
    env.run_function(
        EnvFunctionCall(
            env_type="user",
            func_name="set_user_info",
            arguments={"name": "John Smith", "phone_number": "555-123-2002"},
        )
    )
    suspend = ToolCall(
        id="s",
        name="suspend_line",
        arguments={"customer_id": "C1001", "line_id": "L1002", "reason": "x"},
    )
    before = env.db_hashes()[1]
    env.replay(suspend, sync=False)
    assert env.db_hashes()[1] == before
    env.sync()
    assert env.db_hashes()[1] != before
