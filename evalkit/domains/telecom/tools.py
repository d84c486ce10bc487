"""The telecom agent's tools, with τ²-bench's names, signatures, error texts and database effects.

Business errors raise `ValueError` with τ²-bench's message (the environment shows it as
`Error: <message>`); wrong or missing arguments raise Python's own `TypeError`, whose text names
`TelecomTools.<tool>()` as τ²-bench's does. Besides the tools, the class holds the set-up
functions τ²-bench's tasks call (`set_data_usage`, `suspend_line_for_overdue_bill`) and the
assertions they check (`assert_*`).

One deliberate difference: a refuel charge on a customer without a draft bill opens a new draft
bill whose id τ²-bench draws at random; ours is derived from the customer and the number of
bills, so the same calls always give the same database (τ²-bench's released data never takes
this path: its only refuelling customer has a draft bill).
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import unicodedata
from typing import Any

from evalkit.domains.base import Toolkit, tool
from evalkit.domains.telecom.data_model import (
    TODAY,
    Bill,
    BillStatus,
    Customer,
    Device,
    Line,
    LineItem,
    LineStatus,
    Plan,
    TelecomDB,
)

log = logging.getLogger(__name__)


def phone_digits(phone_number: str) -> str:
    """The digits of a phone number: '555-123-2002', '(555) 123 2002' and '5551232002' agree."""
    return "".join(ch for ch in phone_number if ch.isdigit())


def _folded(name: str) -> str:
    # Names match without regard to case or accents ('Álvaro' is 'alvaro').
    decomposed = unicodedata.normalize("NFKD", name.strip())
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch)).casefold()


def _first_of_next_month(day: datetime.date) -> datetime.date:
    return (day.replace(day=1) + datetime.timedelta(days=32)).replace(day=1)


class TelecomTools(Toolkit):
    """The carrier's tools over a `TelecomDB`."""

    db: TelecomDB

    def __init__(self, db: TelecomDB) -> None:
        super().__init__(db)

    # -- lookups shared by the tools ---------------------------------------------------------

    def _get_line_by_phone(self, phone_number: str) -> Line:
        wanted = phone_digits(phone_number)
        for alias, canonical in self.db.phone_number_aliases.items():
            if phone_digits(alias) == wanted:
                wanted = phone_digits(canonical)
                break
        for line in self.db.lines:
            if wanted and phone_digits(line.phone_number) == wanted:
                return line
        raise ValueError(f"Line with phone number {phone_number} not found")

    def _get_line_by_id(self, line_id: str) -> Line:
        for line in self.db.lines:
            if line.line_id == line_id:
                return line
        raise ValueError(f"Line with ID {line_id} not found")

    def _get_plan_by_id(self, plan_id: str) -> Plan:
        for plan in self.db.plans:
            if plan.plan_id == plan_id:
                return plan
        raise ValueError(f"Plan with ID {plan_id} not found")

    def _get_device_by_id(self, device_id: str) -> Device:
        for device in self.db.devices:
            if device.device_id == device_id:
                return device
        raise ValueError(f"Device with ID {device_id} not found")

    def _get_bill_by_id(self, bill_id: str) -> Bill:
        for bill in self.db.bills:
            if bill.bill_id == bill_id:
                return bill
        raise ValueError(f"Bill with ID {bill_id} not found")

    def _get_target_line(self, customer_id: str, line_id: str) -> Line:
        customer = self.get_customer_by_id(customer_id)
        if line_id not in customer.line_ids:
            raise ValueError(f"Line {line_id} not found for customer {customer_id}")
        return self._get_line_by_id(line_id)

    def _get_bills_awaiting_payment(self, customer: Customer) -> list[Bill]:
        bills = [self._get_bill_by_id(bill_id) for bill_id in customer.bill_ids]
        return [b for b in bills if b.status == BillStatus.AWAITING_PAYMENT]

    def _set_bill_to_paid(self, bill_id: str) -> str:
        self._get_bill_by_id(bill_id).status = BillStatus.PAID
        return f"Bill {bill_id} set to paid"

    def _apply_one_time_charge(self, customer_id: str, amount: float, description: str) -> None:
        """Add a charge (or, negative, a credit) to the customer's draft bill, opening one for
        next month when there is none."""
        customer = self.get_customer_by_id(customer_id)
        draft = next(
            (
                bill
                for bill in map(self._get_bill_by_id, customer.bill_ids)
                if bill.status == BillStatus.DRAFT
            ),
            None,
        )
        if draft is None:
            start = _first_of_next_month(TODAY)
            seed = f"{customer_id}:{len(self.db.bills)}".encode()
            draft = Bill(
                bill_id=f"B{hashlib.sha256(seed).hexdigest()[:8]}",
                customer_id=customer_id,
                period_start=start,
                period_end=_first_of_next_month(start) - datetime.timedelta(days=1),
                issue_date=start,
                total_due=0,
                due_date=start + datetime.timedelta(days=14),
                status=BillStatus.DRAFT,
            )
            self.db.bills.append(draft)
            customer.bill_ids.append(draft.bill_id)
        draft.line_items.append(
            LineItem(
                description=description,
                amount=amount,
                date=TODAY,
                item_type="Credit" if amount < 0 else "Charge",
            )
        )
        draft.total_due += amount

    # -- customer lookup ---------------------------------------------------------------------

    @tool()
    def get_customer_by_phone(self, phone_number: str) -> Customer:
        """Find the customer whose contact number, or one of whose lines, is this phone number.

        Args:
            phone_number: The phone number to look up.
        """
        wanted = phone_digits(phone_number)
        if wanted:
            for customer in self.db.customers:
                if phone_digits(customer.phone_number) == wanted:
                    return customer
                for line_id in customer.line_ids:
                    if phone_digits(self._get_line_by_id(line_id).phone_number) == wanted:
                        return customer
        raise ValueError(f"Customer with phone number {phone_number} not found")

    @tool()
    def get_customer_by_id(self, customer_id: str) -> Customer:
        """Get a customer by their customer ID.

        Args:
            customer_id: The customer's unique ID.
        """
        for customer in self.db.customers:
            if customer.customer_id == customer_id:
                return customer
        raise ValueError(f"Customer with ID {customer_id} not found")

    @tool()
    def get_customer_by_name(self, full_name: str, dob: str) -> list[Customer]:
        """Find customers by full name and date of birth; the list may hold several matches, or none.

        Args:
            full_name: The customer's full name.
            dob: The customer's date of birth, as YYYY-MM-DD, to tell people of the same name apart.
        """
        wanted = _folded(full_name)
        return [
            c
            for c in self.db.customers
            if _folded(c.full_name) == wanted and c.date_of_birth == dob
        ]

    @tool()
    def get_details_by_id(self, id: str) -> Line | Device | Bill | Customer | Plan:
        """Get the record behind an ID: a customer (C…), line (L…), device (D…), bill (B…) or plan (P…).

        Args:
            id: The ID to look up.
        """
        if id.startswith("L"):
            return self._get_line_by_id(id)
        if id.startswith("D"):
            return self._get_device_by_id(id)
        if id.startswith("B"):
            return self._get_bill_by_id(id)
        if id.startswith("C"):
            return self.get_customer_by_id(id)
        if id.startswith("P"):
            return self._get_plan_by_id(id)
        raise ValueError(f"Unknown ID format or type: {id}")

    def get_available_plan_ids(self) -> list[str]:
        """The IDs of every plan the carrier offers."""
        return [plan.plan_id for plan in self.db.plans]

    # -- line status -------------------------------------------------------------------------

    @tool(mutates=True)
    def suspend_line(self, customer_id: str, line_id: str, reason: str) -> dict[str, Any]:
        """Suspend an active line (for at most 6 months; a $5 monthly holding fee applies).

        The line becomes Suspended from today.

        Args:
            customer_id: The ID of the customer who owns the line.
            line_id: The ID of the line to suspend.
            reason: Why the line is suspended.
        """
        line = self._get_target_line(customer_id, line_id)
        if line.status != LineStatus.ACTIVE:
            raise ValueError("Line must be active to suspend")
        line.status = LineStatus.SUSPENDED
        line.suspension_start_date = TODAY
        log.info("line %s suspended: %s", line_id, reason)
        return {
            "message": "Line suspended successfully. $5/month holding fee will apply.",
            "line": line,
        }

    @tool(mutates=True)
    def resume_line(self, customer_id: str, line_id: str) -> dict[str, Any]:
        """Resume a line that is Suspended or Pending Activation; it becomes Active again.

        Args:
            customer_id: The ID of the customer who owns the line.
            line_id: The ID of the line to resume.
        """
        line = self._get_target_line(customer_id, line_id)
        if line.status not in (LineStatus.SUSPENDED, LineStatus.PENDING_ACTIVATION):
            raise ValueError("Line must be suspended to resume")
        line.status = LineStatus.ACTIVE
        line.suspension_start_date = None
        return {"message": "Line resumed successfully", "line": line}

    # -- bills and payments ------------------------------------------------------------------

    @tool()
    def get_bills_for_customer(self, customer_id: str, limit: int = 12) -> list[Bill]:
        """List a customer's bills, newest issue date first.

        Args:
            customer_id: The customer's ID.
            limit: The most bills to return.
        """
        customer = self.get_customer_by_id(customer_id)
        bills = [self._get_bill_by_id(bill_id) for bill_id in customer.bill_ids]
        return sorted(bills, key=lambda b: b.issue_date, reverse=True)[:limit]

    @tool(mutates=True)
    def send_payment_request(self, customer_id: str, bill_id: str) -> str:
        """Send the customer a request to pay one of their bills; the bill becomes Awaiting Payment.

        Fails when another bill of the customer is already awaiting payment. It does not check
        whether the bill is already paid or overdue: check the bill's status first.

        Args:
            customer_id: The ID of the customer who owns the bill.
            bill_id: The ID of the bill to be paid.
        """
        customer = self.get_customer_by_id(customer_id)
        if self._get_bills_awaiting_payment(customer):
            raise ValueError("A bill is already awaiting payment for this customer")
        if bill_id not in customer.bill_ids:
            raise ValueError(f"Bill {bill_id} not found for customer {customer_id}")
        bill = self._get_bill_by_id(bill_id)
        bill.status = BillStatus.AWAITING_PAYMENT
        return f"Payment request sent to the customer for bill {bill.bill_id}"

    # -- data usage, roaming, refuelling -----------------------------------------------------

    @tool()
    def get_data_usage(self, customer_id: str, line_id: str) -> dict[str, Any]:
        """Get a line's data use in the current billing cycle, its data limit, the data refuelled
        this cycle, and the cycle's end date.

        Args:
            customer_id: The ID of the customer who owns the line.
            line_id: The ID of the line.
        """
        line = self._get_target_line(customer_id, line_id)
        plan = self._get_plan_by_id(line.plan_id)
        return {
            "line_id": line_id,
            "data_used_gb": line.data_used_gb,
            "data_limit_gb": plan.data_limit_gb,
            "data_refueling_gb": line.data_refueling_gb,
            "cycle_end_date": _first_of_next_month(TODAY) - datetime.timedelta(days=1),
        }

    def set_data_usage(self, customer_id: str, line_id: str, data_used_gb: float) -> str:
        """Set a line's data use this cycle (a task's set-up)."""
        line = self._get_target_line(customer_id, line_id)
        line.data_used_gb = data_used_gb
        return f"Data usage set to {data_used_gb} GB for line {line_id}"

    @tool(mutates=True)
    def enable_roaming(self, customer_id: str, line_id: str) -> str:
        """Turn international roaming on for a line.

        Args:
            customer_id: The ID of the customer who owns the line.
            line_id: The ID of the line.
        """
        line = self._get_target_line(customer_id, line_id)
        if line.roaming_enabled:
            return "Roaming was already enabled"
        line.roaming_enabled = True
        return "Roaming enabled successfully"

    @tool(mutates=True)
    def disable_roaming(self, customer_id: str, line_id: str) -> str:
        """Turn international roaming off for a line.

        Args:
            customer_id: The ID of the customer who owns the line.
            line_id: The ID of the line.
        """
        line = self._get_target_line(customer_id, line_id)
        if not line.roaming_enabled:
            return "Roaming was already disabled"
        line.roaming_enabled = False
        return "Roaming disabled successfully"

    @tool(mutates=True)
    def refuel_data(self, customer_id: str, line_id: str, gb_amount: float) -> dict[str, Any]:
        """Add data to a line for this billing cycle, charged to the customer's next bill at the
        plan's refuelling price per GB.

        Args:
            customer_id: The ID of the customer who owns the line.
            line_id: The ID of the line.
            gb_amount: How many GB to add.
        """
        line = self._get_target_line(customer_id, line_id)
        if gb_amount <= 0:
            raise ValueError("Refuel amount must be positive")
        plan = self._get_plan_by_id(line.plan_id)
        charge = gb_amount * plan.data_refueling_price_per_gb
        line.data_refueling_gb += gb_amount
        self._apply_one_time_charge(
            customer_id,
            charge,
            f"Data refueling: {gb_amount} GB at ${plan.data_refueling_price_per_gb}/GB",
        )
        return {
            "message": f"Successfully added {gb_amount} GB of data for line {line_id} for ${charge:.2f}",
            "new_data_refueling_gb": line.data_refueling_gb,
            "charge": charge,
        }

    @tool()
    def transfer_to_human_agents(self, summary: str) -> str:
        """Hand the customer over to a human agent, with a summary of their issue.

        Transfer only when the customer explicitly asks for a human, or when the policy and
        your tools do not let you solve the issue.

        Args:
            summary: A summary of the customer's issue.
        """
        return "Transfer successful"

    # -- set-up functions of tasks -----------------------------------------------------------

    def suspend_line_for_overdue_bill(
        self, customer_id: str, line_id: str, new_bill_id: str, contract_ended: bool
    ) -> str:
        """Suspend an active line for an unpaid bill: add last month's plan charge as an overdue
        bill `new_bill_id`; with `contract_ended`, the contract ended last month too."""
        line = self._get_line_by_id(line_id)
        if line.status != LineStatus.ACTIVE:
            raise ValueError("Line must be active to suspend for unpaid bill")
        amount = self._get_plan_by_id(line.plan_id).price_per_month
        if amount <= 0:
            raise ValueError("Amount must be positive for overdue bill")
        customer = self.get_customer_by_id(customer_id)
        if any(self._get_bill_by_id(b).status == BillStatus.OVERDUE for b in customer.bill_ids):
            raise ValueError("Customer already has an overdue bill")
        last_day = TODAY.replace(day=1) - datetime.timedelta(days=1)
        first_day = last_day.replace(day=1)
        bill = Bill(
            bill_id=new_bill_id,
            customer_id=customer_id,
            period_start=first_day,
            period_end=last_day,
            issue_date=first_day,
            total_due=0,
            due_date=first_day + datetime.timedelta(days=14),
            status=BillStatus.OVERDUE,
        )
        bill.line_items.append(
            LineItem(
                description=f"Charge for line {line.line_id}",
                amount=amount,
                date=TODAY,
                item_type="Charge",
            )
        )
        bill.total_due += amount
        self.db.bills.append(bill)
        customer.bill_ids.append(new_bill_id)
        line.status = LineStatus.SUSPENDED
        line.suspension_start_date = TODAY
        if contract_ended:
            line.contract_end_date = last_day
        return f"Line {line_id} suspended for unpaid bill {new_bill_id}. Contract ended: {contract_ended}"

    # -- assertions of tasks -----------------------------------------------------------------

    def assert_data_refueling_amount(
        self, customer_id: str, line_id: str, expected_amount: float
    ) -> bool:
        """Whether the line's refuelled data this cycle is `expected_amount` GB."""
        line = self._get_target_line(customer_id, line_id)
        return abs(line.data_refueling_gb - expected_amount) < 1e-6

    def assert_line_status(self, customer_id: str, line_id: str, expected_status: str) -> bool:
        """Whether the line's status is `expected_status` (e.g. 'Active')."""
        return self._get_target_line(customer_id, line_id).status == expected_status

    def assert_overdue_bill_exists(self, customer_id: str, overdue_bill_id: str) -> bool:
        """True when the customer has the bill and it is overdue; raises otherwise."""
        customer = self.get_customer_by_id(customer_id)
        if overdue_bill_id not in customer.bill_ids:
            raise ValueError(f"Overdue bill {overdue_bill_id} not found")
        if self._get_bill_by_id(overdue_bill_id).status != BillStatus.OVERDUE:
            raise ValueError(f"Overdue bill {overdue_bill_id} is not overdue")
        return True

    def assert_no_overdue_bill(self, overdue_bill_id: str) -> bool:
        """Whether the bill is gone or paid."""
        try:
            bill = self._get_bill_by_id(overdue_bill_id)
        except ValueError:
            return True
        return bill.status == BillStatus.PAID
