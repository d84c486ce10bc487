"""The carrier's tools behave as τ²-bench's: names, lookups, business rules, error texts, charges."""

from __future__ import annotations

import pytest

from evalkit.domains.base import Domain
from evalkit.domains.telecom.data_model import BillStatus, LineStatus
from evalkit.domains.telecom.tools import TelecomTools
from evalkit.env import Environment
from evalkit.messages import ToolCall


def make_tools(domain: Domain) -> TelecomTools:
    tools, _ = domain.fresh_toolkits()
    assert isinstance(tools, TelecomTools)
    return tools


def run(env: Environment, name: str, **arguments: object) -> str:
    message = env.execute(ToolCall(id="t", name=name, arguments=arguments))
    return message.content or ""


def test_tool_names_are_tau2_benchs() -> None:
    assert TelecomTools.tool_names() == sorted(
        [
            "disable_roaming",
            "enable_roaming",
            "get_bills_for_customer",
            "get_customer_by_id",
            "get_customer_by_name",
            "get_customer_by_phone",
            "get_data_usage",
            "get_details_by_id",
            "refuel_data",
            "resume_line",
            "send_payment_request",
            "suspend_line",
            "transfer_to_human_agents",
        ]
    )


def test_only_the_database_changing_tools_are_marked_as_mutating() -> None:
    mutating = {n for n in TelecomTools.tool_names() if TelecomTools.mutates(n)}
    assert mutating == {
        "disable_roaming",
        "enable_roaming",
        "refuel_data",
        "resume_line",
        "send_payment_request",
        "suspend_line",
    }


def test_schemas_carry_the_parameters_and_their_types() -> None:
    schemas = {
        s["function"]["name"]: s["function"]["parameters"] for s in TelecomTools.openai_tools()
    }
    refuel = schemas["refuel_data"]
    assert refuel["required"] == ["customer_id", "line_id", "gb_amount"]
    assert refuel["properties"]["gb_amount"]["type"] == "number"
    assert schemas["get_bills_for_customer"]["required"] == ["customer_id"]
    assert schemas["get_bills_for_customer"]["properties"]["limit"]["type"] == "integer"


@pytest.mark.parametrize("written", ["555-123-2002", "5551232002", "(555) 123 2002"])
def test_a_customer_is_found_by_any_written_form_of_a_line_number(
    tau2_telecom: Domain, written: str
) -> None:
    assert make_tools(tau2_telecom).get_customer_by_phone(written).customer_id == "C1001"


def test_lookup_by_name_ignores_case_and_accents_but_needs_the_date_of_birth(
    tau2_telecom: Domain,
) -> None:
    tools = make_tools(tau2_telecom)
    assert [c.customer_id for c in tools.get_customer_by_name("JOHN SMÍTH", "1985-06-15")] == [
        "C1001"
    ]
    assert tools.get_customer_by_name("John Smith", "1985-06-16") == []


def test_lookup_errors_are_tau2_benchs_texts(tau2_telecom: Domain) -> None:
    env = Environment(tau2_telecom)
    assert run(env, "get_customer_by_phone", phone_number="555-000-0000") == (
        "Error: Customer with phone number 555-000-0000 not found"
    )
    assert (
        run(env, "get_customer_by_id", customer_id="C9") == "Error: Customer with ID C9 not found"
    )
    assert run(env, "get_details_by_id", id="X1") == "Error: Unknown ID format or type: X1"
    assert run(env, "get_details_by_id", id="B404") == "Error: Bill with ID B404 not found"
    assert run(env, "suspend_line", customer_id="C1001", line_id="L1004", reason="x") == (
        "Error: Line L1004 not found for customer C1001"
    )
    assert run(env, "get_customer_by_id") == (
        "Error: TelecomTools.get_customer_by_id() missing 1 required positional argument: "
        "'customer_id'"
    )
    assert env.errors == 6


def test_details_serialise_as_tau2_bench_writes_them(tau2_telecom: Domain) -> None:
    env = Environment(tau2_telecom)
    assert run(env, "get_details_by_id", id="L1001") == (
        '{"line_id": "L1001", "phone_number": "555-123-2001", "status": "Active", "plan_id": '
        '"P1001", "device_id": "D1001", "data_used_gb": 3.2, "data_refueling_gb": 0.0, '
        '"roaming_enabled": false, "contract_end_date": "2026-12-31", "last_plan_change_date": '
        '"2025-01-10", "last_sim_replacement_date": null, "suspension_start_date": null}'
    )
    assert run(env, "get_data_usage", customer_id="C1001", line_id="L1001") == (
        '{"line_id": "L1001", "data_used_gb": "3.2", "data_limit_gb": "5.0", '
        '"data_refueling_gb": "0.0", "cycle_end_date": "2025-02-28"}'
    )


def test_suspend_and_resume_follow_the_line_status_rules(tau2_telecom: Domain) -> None:
    tools = make_tools(tau2_telecom)
    result = tools.suspend_line("C1001", "L1001", "travel")
    assert result["message"] == "Line suspended successfully. $5/month holding fee will apply."
    line = tools._get_line_by_id("L1001")
    assert line.status == LineStatus.SUSPENDED
    assert str(line.suspension_start_date) == "2025-02-25"
    with pytest.raises(ValueError, match="Line must be active to suspend"):
        tools.suspend_line("C1001", "L1001", "again")
    assert tools.resume_line("C1001", "L1001")["message"] == "Line resumed successfully"
    assert line.status == LineStatus.ACTIVE
    assert line.suspension_start_date is None
    with pytest.raises(ValueError, match="Line must be suspended to resume"):
        tools.resume_line("C1001", "L1001")


def test_bills_come_newest_first_and_payment_requests_are_one_at_a_time(
    tau2_telecom: Domain,
) -> None:
    tools = make_tools(tau2_telecom)
    assert [b.bill_id for b in tools.get_bills_for_customer("C1001")] == ["B1003", "B1002", "B1001"]
    assert [b.bill_id for b in tools.get_bills_for_customer("C1001", limit=1)] == ["B1003"]
    assert tools.send_payment_request("C1001", "B1002") == (
        "Payment request sent to the customer for bill B1002"
    )
    assert tools._get_bill_by_id("B1002").status == BillStatus.AWAITING_PAYMENT
    with pytest.raises(ValueError, match="A bill is already awaiting payment for this customer"):
        tools.send_payment_request("C1001", "B1001")
    with pytest.raises(ValueError, match="Bill B1001 not found for customer C1002"):
        make_tools(tau2_telecom).send_payment_request("C1002", "B1001")


def test_refuel_adds_data_and_charges_the_draft_bill(tau2_telecom: Domain) -> None:
    tools = make_tools(tau2_telecom)
    result = tools.refuel_data("C1001", "L1002", 2)
    assert result["message"] == "Successfully added 2 GB of data for line L1002 for $4.00"
    assert result["charge"] == 4.0
    draft = tools._get_bill_by_id("B1003")
    assert draft.total_due == 4.0
    assert draft.line_items[-1].description == "Data refueling: 2 GB at $2.0/GB"
    assert tools.assert_data_refueling_amount("C1001", "L1002", 2.0)
    with pytest.raises(ValueError, match="Refuel amount must be positive"):
        tools.refuel_data("C1001", "L1002", 0)


def test_a_refuel_without_a_draft_bill_opens_one_with_a_reproducible_id(
    tau2_telecom: Domain,
) -> None:
    ids = []
    for _ in range(2):
        tools = make_tools(tau2_telecom)
        tools.refuel_data("C1002", "L1004", 1.0)
        draft = tools._get_bill_by_id(tools.get_customer_by_id("C1002").bill_ids[-1])
        assert draft.status == BillStatus.DRAFT
        assert (str(draft.period_start), str(draft.period_end)) == ("2025-03-01", "2025-03-31")
        assert draft.total_due == pytest.approx(0.1)
        ids.append(draft.bill_id)
    assert ids[0] == ids[1]


def test_roaming_switches_report_when_nothing_changes(tau2_telecom: Domain) -> None:
    tools = make_tools(tau2_telecom)
    assert tools.enable_roaming("C1001", "L1001") == "Roaming enabled successfully"
    assert tools.enable_roaming("C1001", "L1001") == "Roaming was already enabled"
    assert tools.disable_roaming("C1001", "L1001") == "Roaming disabled successfully"
    assert tools.disable_roaming("C1001", "L1001") == "Roaming was already disabled"
    assert tools.transfer_to_human_agents("help") == "Transfer successful"


def test_an_overdue_bill_suspension_is_set_up_and_cleared_by_payment(tau2_telecom: Domain) -> None:
    tools = make_tools(tau2_telecom)
    text = tools.suspend_line_for_overdue_bill("C1001", "L1002", "B77", contract_ended=True)
    assert text == "Line L1002 suspended for unpaid bill B77. Contract ended: True"
    bill = tools._get_bill_by_id("B77")
    assert (bill.status, bill.total_due, str(bill.period_start)) == (
        BillStatus.OVERDUE,
        65.0,
        "2025-01-01",
    )
    assert str(tools._get_line_by_id("L1002").contract_end_date) == "2025-01-31"
    assert tools.assert_overdue_bill_exists("C1001", "B77")
    assert tools.assert_line_status("C1001", "L1002", "Suspended")
    assert not tools.assert_no_overdue_bill("B77")
    with pytest.raises(ValueError, match="Customer already has an overdue bill"):
        tools.suspend_line_for_overdue_bill("C1001", "L1001", "B78", contract_ended=False)
    tools._set_bill_to_paid("B77")
    assert tools.assert_no_overdue_bill("B77")
    assert tools.assert_no_overdue_bill("B-never-issued")
