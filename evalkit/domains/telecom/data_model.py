"""The telecom carrier's database: plans, devices, lines, bills and customers (the agent's side).

Field names, their order, enum values and defaults follow τ²-bench's telecom `db.toml`, so its
database loads unchanged and tool results serialise to the same JSON text. The carrier's clock
is fixed, as τ²-bench's is: today is 2025-02-25.
"""

from __future__ import annotations

import datetime
import enum

from pydantic import BaseModel, ConfigDict, Field

from evalkit.domains.base import DomainDB

TODAY = datetime.date(2025, 2, 25)
NOW = datetime.datetime(2025, 2, 25, 12, 8, 0)
ACCOUNT_EPOCH = datetime.datetime(2025, 1, 1)


class _Record(BaseModel):
    # τ²-bench rejects unknown fields in its telecom records; so do we, so a typo in a data file
    # is an error rather than a silently ignored field.
    model_config = ConfigDict(extra="forbid")


class Address(_Record):
    street: str
    city: str
    state: str
    zip_code: str


class Plan(_Record):
    plan_id: str
    name: str
    data_limit_gb: float
    price_per_month: float
    data_refueling_price_per_gb: float


class DeviceType(enum.StrEnum):
    PHONE = "phone"
    ROUTER = "router"
    TABLET = "tablet"
    WATCH = "watch"
    OTHER = "other"


class Device(_Record):
    device_id: str
    device_type: DeviceType
    model: str
    imei: str | None = None
    is_esim_capable: bool
    activated: bool = False
    activation_date: datetime.datetime | None = None
    last_esim_transfer_date: datetime.datetime | None = None


class LineStatus(enum.StrEnum):
    ACTIVE = "Active"
    SUSPENDED = "Suspended"
    PENDING_ACTIVATION = "Pending Activation"
    CLOSED = "Closed"


class Line(_Record):
    line_id: str
    phone_number: str
    status: LineStatus = LineStatus.PENDING_ACTIVATION
    plan_id: str
    device_id: str | None = None
    data_used_gb: float = 0.0
    data_refueling_gb: float = 0.0
    roaming_enabled: bool = False
    contract_end_date: datetime.date | None = None
    last_plan_change_date: datetime.date | None = None
    last_sim_replacement_date: datetime.date | None = None
    suspension_start_date: datetime.date | None = None


class LineItem(_Record):
    description: str
    amount: float
    date: datetime.date
    item_type: str


class BillStatus(enum.StrEnum):
    DRAFT = "Draft"
    ISSUED = "Issued"
    AWAITING_PAYMENT = "Awaiting Payment"
    PAID = "Paid"
    OVERDUE = "Overdue"
    DISPUTED = "Disputed"


class Bill(_Record):
    bill_id: str
    customer_id: str
    period_start: datetime.date
    period_end: datetime.date
    issue_date: datetime.date
    total_due: float
    due_date: datetime.date
    line_items: list[LineItem] = Field(default_factory=list)
    status: BillStatus = BillStatus.DRAFT


class AccountStatus(enum.StrEnum):
    ACTIVE = "Active"
    SUSPENDED = "Suspended"
    PENDING_VERIFICATION = "Pending Verification"
    CLOSED = "Closed"


class PaymentMethodType(enum.StrEnum):
    CREDIT_CARD = "Credit Card"
    DEBIT_CARD = "Debit Card"
    PAYPAL = "PayPal"


class PaymentMethod(_Record):
    method_type: PaymentMethodType
    account_number_last_4: str
    expiration_date: str


class Customer(_Record):
    customer_id: str
    full_name: str
    date_of_birth: str
    email: str
    phone_number: str
    address: Address
    account_status: AccountStatus = AccountStatus.PENDING_VERIFICATION
    payment_methods: list[PaymentMethod] = Field(default_factory=list)
    line_ids: list[str] = Field(default_factory=list)
    bill_ids: list[str] = Field(default_factory=list)
    created_at: datetime.datetime = ACCOUNT_EPOCH
    last_extension_date: datetime.date | None = None
    goodwill_credit_used_this_year: float = 0.0


class TelecomDB(DomainDB):
    """Everything the carrier knows. `phone_number_aliases` maps another written form of a
    number onto the line's own (empty in τ²-bench's released data)."""

    model_config = ConfigDict(extra="forbid")

    plans: list[Plan] = Field(default_factory=list)
    customers: list[Customer] = Field(default_factory=list)
    lines: list[Line] = Field(default_factory=list)
    bills: list[Bill] = Field(default_factory=list)
    devices: list[Device] = Field(default_factory=list)
    phone_number_aliases: dict[str, str] = Field(default_factory=dict)
