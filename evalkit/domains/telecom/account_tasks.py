"""The telecom account tasks: billing and plan questions, bill payments, and line changes the
customer asks for, on a working phone."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from evalkit.domains.telecom.task_drafts import (
    GROUNDING,
    Call,
    Case,
    Draft,
    identify_by_phone,
    known_info,
)


def account_tasks(db: dict[str, Any], cases: Iterator[Case], rng: random.Random) -> list[Draft]:
    """The account tasks, each on the next line from `cases` that fits it."""
    bills = {b["bill_id"]: b for b in db["bills"]}
    drafts: list[Draft] = []

    def case_where(pred: Any) -> Case:
        for case in cases:
            if pred(case):
                return case
        raise RuntimeError("no such case")  # pragma: no cover - the generator is infinite

    # The order of these draws decides which line each task gets: the output depends on it.
    for _ in range(2):
        case = case_where(lambda c: _has_bill(c, bills, "Overdue"))
        drafts.append(_pay_overdue_bill(case, bills))
    for _ in range(2):
        case = case_where(lambda c: _has_bill(c, bills, "Issued"))
        drafts.append(_latest_bill_amount(case, bills))
    for by_name in (False, True):
        drafts.append(_plan_details(next(cases), by_name=by_name))
    drafts.append(_data_usage_question(case_where(lambda c: c.plan["data_limit_gb"] < 100)))
    drafts.append(_suspend_line(next(cases)))
    drafts.append(_resume_line(next(cases)))
    drafts.append(_disable_roaming(next(cases)))
    drafts.append(_change_plan(next(cases)))
    return drafts


def _has_bill(case: Case, bills: dict[str, Any], status: str) -> bool:
    return any(bills[b]["status"] == status for b in case.customer["bill_ids"])


def _pay_overdue_bill(case: Case, bills: dict[str, Any]) -> Draft:
    """Pay an overdue bill (no suspension): a payment request, paid on the phone."""
    bill_id = next(b for b in case.customer["bill_ids"] if bills[b]["status"] == "Overdue")
    return Draft(
        category="billing",
        issues=["pay_overdue_bill"],
        case=case,
        reason="You received a notice that one of your bills is overdue, and you want to pay it today.",
        known=known_info(case, None),
        instructions="\n".join(
            [
                "You accept a payment request for the overdue bill and pay it on your phone.",
                "You consider the matter done when the agent confirms the bill is paid.",
                GROUNDING,
            ]
        ),
        purpose="Overdue bill payment: a payment request, paid on the phone.",
        setup=[("user", "set_user_info", {"name": case.name, "phone_number": case.phone})],
        gold=[
            identify_by_phone(case),
            ("assistant", "get_bills_for_customer", {"customer_id": case.cid}),
            ("assistant", "get_details_by_id", {"id": bill_id}),
            (
                "assistant",
                "send_payment_request",
                {"customer_id": case.cid, "bill_id": bill_id},
            ),
            ("user", "check_payment_request", {}),
            ("user", "make_payment", {}),
            ("assistant", "get_details_by_id", {"id": bill_id}),
        ],
        assertions=[("assistant", "assert_no_overdue_bill", {"overdue_bill_id": bill_id})],
    )


def _latest_bill_amount(case: Case, bills: dict[str, Any]) -> Draft:
    """The amount of the latest issued bill."""
    issued = next(bills[b] for b in case.customer["bill_ids"] if bills[b]["status"] == "Issued")
    amount = str(issued["total_due"])
    return Draft(
        category="billing",
        issues=["latest_bill_amount"],
        case=case,
        reason="You want to know how much your latest bill is and when it is due.",
        known=known_info(case, None),
        instructions="Ask for the total amount due of your most recent issued bill and its due date. You do not want to pay it now.",
        purpose="Billing question: the amount of the latest issued bill.",
        gold=[
            identify_by_phone(case),
            ("assistant", "get_bills_for_customer", {"customer_id": case.cid}),
        ],
        basis=["DB", "COMMUNICATE"],
        communicate=[amount],
        phone_known=False,
        broken_before=False,
    )


def _plan_details(case: Case, *, by_name: bool) -> Draft:
    """Plan details of a line; the customer found by phone, or by name and date of birth."""
    identify: Call = (
        (
            "assistant",
            "get_customer_by_name",
            {"full_name": case.name, "dob": case.customer["date_of_birth"]},
        )
        if by_name
        else identify_by_phone(case)
    )
    known = (
        f"You are {case.name}, born on {case.customer['date_of_birth']}. You do not remember "
        f"which of your numbers this is about, but the line's number is {case.phone}."
        if by_name
        else known_info(case, None)
    )
    return Draft(
        category="plan",
        issues=["plan_details"],
        case=case,
        reason="You want to know which plan your line is on, its monthly data allowance and what extra data costs.",
        known=known,
        instructions="Ask for the plan's name, its data allowance and the price of one extra GB. You do not want to change anything.",
        purpose="Plan question: the plan of a line and its prices.",
        gold=[
            identify,
            ("assistant", "get_details_by_id", {"id": case.lid}),
            ("assistant", "get_details_by_id", {"id": case.plan["plan_id"]}),
        ],
        basis=["DB", "COMMUNICATE"],
        communicate=[str(case.plan["name"])],
        phone_known=False,
        broken_before=False,
    )


def _data_usage_question(case: Case) -> Draft:
    """Data used this cycle."""
    return Draft(
        category="plan",
        issues=["data_usage_question"],
        case=case,
        reason="You want to know how much mobile data your line has used this billing cycle.",
        known=known_info(case, None),
        instructions="Ask how much data you have used and what your allowance is. You do not want to buy more data.",
        purpose="Usage question: data used this cycle.",
        gold=[
            identify_by_phone(case),
            ("assistant", "get_data_usage", {"customer_id": case.cid, "line_id": case.lid}),
        ],
        basis=["DB", "COMMUNICATE"],
        communicate=[str(case.line["data_used_gb"])],
        phone_known=False,
        broken_before=False,
    )


def _suspend_line(case: Case) -> Draft:
    """Suspend a line for a long trip."""
    return Draft(
        category="plan",
        issues=["suspend_line"],
        case=case,
        reason=f"You will be away for four months and want to suspend your line {case.phone} while you are gone.",
        known=known_info(case, None),
        instructions="You accept the $5 monthly holding fee. You want only this line suspended.",
        purpose="Line suspension at the customer's request.",
        gold=[
            identify_by_phone(case),
            ("assistant", "get_details_by_id", {"id": case.lid}),
            (
                "assistant",
                "suspend_line",
                {
                    "customer_id": case.cid,
                    "line_id": case.lid,
                    "reason": "Customer travelling for four months",
                },
            ),
        ],
        compare={"suspend_line": ["customer_id", "line_id"]},
        assertions=[line_status_assertion(case, "Suspended")],
        basis=["DB", "ENV_ASSERTION"],
        phone_known=False,
    )


def _resume_line(case: Case) -> Draft:
    """Resume a line the customer suspended earlier (found by customer ID)."""
    return Draft(
        category="plan",
        issues=["resume_line"],
        case=case,
        reason=f"You suspended your line {case.phone} before a long trip; you are back and want it working again.",
        known=f"Your customer ID is {case.cid}; you are {case.name}.",
        instructions="Give your customer ID when asked. You want the line resumed today.",
        purpose="Resuming a line the customer suspended.",
        setup=[
            (
                "assistant",
                "suspend_line",
                {"customer_id": case.cid, "line_id": case.lid, "reason": "travel"},
            ),
        ],
        gold=[
            ("assistant", "get_customer_by_id", {"customer_id": case.cid}),
            ("assistant", "get_details_by_id", {"id": case.lid}),
            ("assistant", "resume_line", {"customer_id": case.cid, "line_id": case.lid}),
        ],
        assertions=[line_status_assertion(case, "Active")],
        basis=["DB", "ENV_ASSERTION"],
        phone_known=False,
    )


def _disable_roaming(case: Case) -> Draft:
    """Turn roaming off after a trip."""
    return Draft(
        category="plan",
        issues=["disable_roaming"],
        case=case,
        reason="You are back from a trip abroad and want international roaming turned off on your line.",
        known=known_info(case, "You are at home in the United States."),
        instructions="You want roaming off on this line only.",
        purpose="Roaming off at the customer's request.",
        setup=[("assistant", "enable_roaming", {"customer_id": case.cid, "line_id": case.lid})],
        gold=[
            identify_by_phone(case),
            ("assistant", "disable_roaming", {"customer_id": case.cid, "line_id": case.lid}),
        ],
        basis=["DB"],
        phone_known=False,
        broken_before=False,
    )


def _change_plan(case: Case) -> Draft:
    """A plan change: only a human agent can do it, so a transfer."""
    return Draft(
        category="plan",
        issues=["change_plan"],
        case=case,
        reason="You want to move your line to a plan with more data.",
        known=known_info(case, None),
        instructions="Insist on changing your plan today. If the agent transfers you to a human agent, you accept.",
        purpose="Plan change: outside the agent's tools, so a transfer.",
        gold=[
            identify_by_phone(case),
            ("assistant", "get_details_by_id", {"id": case.lid}),
            (
                "assistant",
                "transfer_to_human_agents",
                {"summary": "The customer wants to change plans."},
            ),
        ],
        compare={"transfer_to_human_agents": []},
        basis=["ACTION"],
        phone_known=False,
        broken_before=False,
    )


def line_status_assertion(case: Case, expected_status: str) -> Call:
    """The environment's check that the case's line ends up with `expected_status`."""
    return (
        "assistant",
        "assert_line_status",
        {"customer_id": case.cid, "line_id": case.lid, "expected_status": expected_status},
    )
