"""Generate the telecom data shipped with evalkit: a seeded carrier database, the customer's phone,
and tasks with gold actions of both sides.

    python -m evalkit.domains.telecom.generate [--seed 11] [--out evalkit/domains/telecom/data]

The same seed writes the same `db.json`, `user_db.json` and `tasks.json` (the policy files
beside them are written by hand). Tasks are built like τ²-bench's: a task breaks the phone or
the account with set-up functions (`initialization_actions`), and its gold actions are the
diagnosis and the fixes, the agent's and the customer's, in an order that works. While
generating, every task is checked on a fresh environment: its assertions must fail before the
gold actions (for the troubleshooting tasks) and hold after them, with no gold action failing;
together the tasks must use every tool of both sides.
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evalkit.domains.telecom.data_model import TelecomDB
from evalkit.domains.telecom.domain import TelecomDomain
from evalkit.domains.telecom.tools import TelecomTools
from evalkit.domains.telecom.user_data_model import TelecomUserDB
from evalkit.domains.telecom.user_tools import TelecomUserTools
from evalkit.env import Environment
from evalkit.messages import ToolCall
from evalkit.tasks import Task, parse_tasks

DEFAULT_SEED = 11
DEFAULT_OUT = Path(__file__).parent / "data"
DEFAULT_MMSC = "http://mms.carrier.com/mms/wapenc"

PLANS = [
    ("Basic Plan", 5.0, 40.0, 5.0),
    ("Premium Plan", 15.0, 65.0, 2.0),
    ("Unlimited Plus", 999.0, 85.0, 0.1),
    ("Family Share", 25.0, 120.0, 3.0),
    ("IoT Basic", 1.0, 15.0, 10.0),
    ("Starter", 2.0, 25.0, 6.0),
    ("Traveler", 10.0, 55.0, 4.0),
    ("Student", 8.0, 35.0, 3.0),
]
FIRST_NAMES = [
    "Maria",
    "James",
    "Aisha",
    "Wei",
    "Olivia",
    "Mateo",
    "Priya",
    "Noah",
    "Fatima",
    "Lucas",
    "Hannah",
    "Kenji",
    "Sofia",
    "Omar",
    "Grace",
    "Diego",
    "Leila",
    "Ethan",
    "Chloe",
    "Samuel",
    "Nadia",
    "Victor",
    "Elena",
    "Tomas",
]
LAST_NAMES = [
    "Garcia",
    "Okafor",
    "Chen",
    "Novak",
    "Haddad",
    "Silva",
    "Kowalski",
    "Nguyen",
    "Dubois",
    "Fischer",
    "Rossi",
    "Tanaka",
    "Moreau",
    "Jensen",
    "Petrov",
    "Alvarez",
    "Schmidt",
    "Ibrahim",
    "Kim",
    "Larsen",
    "Costa",
    "Meyer",
    "Walsh",
    "Sato",
]
PLACES = [
    ("Portland", "OR", "97201"),
    ("Denver", "CO", "80203"),
    ("Austin", "TX", "73301"),
    ("Madison", "WI", "53703"),
    ("Raleigh", "NC", "27601"),
    ("Tucson", "AZ", "85701"),
    ("Boise", "ID", "83702"),
    ("Albany", "NY", "12207"),
    ("Omaha", "NE", "68102"),
    ("Savannah", "GA", "31401"),
]
STREETS = ["Main St", "Oak Ave", "Pine St", "Maple Dr", "Cedar Ln", "Elm St", "River Rd", "Hill Ct"]
COUNTRIES = ["France", "Japan", "Portugal", "Mexico", "Italy", "Canada", "Germany", "Spain"]
PHONE_MODELS = [
    ("phone", "Galaxy S23"),
    ("phone", "Pixel 7"),
    ("phone", "iPhone 14"),
    ("phone", "OnePlus 11"),
    ("phone", "Smartphone X"),
    ("tablet", "iPad Pro"),
    ("phone", "Smartphone Lite"),
]

GROUNDING = (
    "When the agent asks about your phone, always answer from what your tools show you; never "
    "make up what a tool would say. If a change does not show its effect, check again with "
    "another tool. If you are not sure an action is needed, ask the agent."
)

# -- the world --------------------------------------------------------------------------------


def _date(d: datetime.date) -> str:
    return d.isoformat()


def generate_db(rng: random.Random, customers: int = 24) -> dict[str, Any]:
    """The carrier's database: plans, customers with lines, devices and bills."""
    plans: list[dict[str, Any]] = [
        {
            "plan_id": f"P{2001 + i}",
            "name": name,
            "data_limit_gb": limit,
            "price_per_month": price,
            "data_refueling_price_per_gb": refuel,
        }
        for i, (name, limit, price, refuel) in enumerate(PLANS)
    ]
    numbers = iter(rng.sample(range(2000000, 2999999), customers * 4))
    names = rng.sample([(f, last) for f in FIRST_NAMES for last in LAST_NAMES], customers)
    out: dict[str, Any] = {"plans": plans, "customers": [], "lines": [], "bills": [], "devices": []}
    line_no = bill_no = 2001
    for c in range(customers):
        customer_id = f"C{2001 + c}"
        first, last = names[c]
        city, state, zip_code = rng.choice(PLACES)
        line_ids: list[str] = []
        monthly: list[tuple[str, float, str]] = []
        for _ in range(rng.choice([1, 1, 2, 2, 3])):
            line_id, device_id = f"L{line_no}", f"D{line_no}"
            line_no += 1
            digits = f"{next(numbers):07d}"
            phone = f"555-{digits[:3]}-{digits[3:]}"
            plan = rng.choice([p for p in plans if p["plan_id"] != "P2005"])
            kind, model = rng.choice(PHONE_MODELS)
            activated = datetime.datetime(2024, rng.randint(1, 12), rng.randint(1, 28), 10, 30)
            out["devices"].append(
                {
                    "device_id": device_id,
                    "device_type": kind,
                    "model": model,
                    "imei": "".join(str(rng.randint(0, 9)) for _ in range(15)),
                    "is_esim_capable": rng.random() < 0.7,
                    "activated": True,
                    "activation_date": activated.isoformat(),
                }
            )
            limit = plan["data_limit_gb"]
            used = round(rng.uniform(0.1, 0.8) * min(limit, 30.0), 1)
            out["lines"].append(
                {
                    "line_id": line_id,
                    "phone_number": phone,
                    "status": "Active",
                    "plan_id": plan["plan_id"],
                    "device_id": device_id,
                    "data_used_gb": used,
                    "data_refueling_gb": 0.0,
                    "roaming_enabled": rng.random() < 0.4,
                    "contract_end_date": _date(
                        datetime.date(rng.choice([2025, 2026, 2027]), rng.randint(6, 12), 28)
                    ),
                    "last_plan_change_date": _date(
                        datetime.date(2024, rng.randint(1, 12), rng.randint(1, 28))
                    ),
                }
            )
            line_ids.append(line_id)
            monthly.append((plan["name"], plan["price_per_month"], phone))
        bill_ids: list[str] = []
        # Every sixth customer has not paid January's bill.
        january = "Overdue" if c % 6 == 4 else "Paid"
        for month, status in ((1, january), (2, "Issued"), (3, "Draft")):
            if status == "Draft" and rng.random() < 0.5:
                continue
            start = datetime.date(2025, month, 1)
            end = (start + datetime.timedelta(days=32)).replace(day=1) - datetime.timedelta(days=1)
            issued = start + datetime.timedelta(days=4)
            items: list[dict[str, Any]] = (
                []
                if status == "Draft"
                else [
                    {
                        "description": f"{name} - Line {phone}",
                        "amount": price,
                        "date": _date(issued),
                        "item_type": "Plan Charge",
                    }
                    for name, price, phone in monthly
                ]
            )
            if items and rng.random() < 0.25:
                items.append(
                    {
                        "description": f"Data Overage - Line {monthly[0][2]}",
                        "amount": 12.5,
                        "date": _date(issued),
                        "item_type": "Overage",
                    }
                )
            bill_id = f"B{bill_no}"
            bill_no += 1
            out["bills"].append(
                {
                    "bill_id": bill_id,
                    "customer_id": customer_id,
                    "period_start": _date(start),
                    "period_end": _date(end),
                    "issue_date": _date(start if status == "Draft" else issued),
                    "total_due": round(sum(i["amount"] for i in items), 2),
                    "due_date": _date(issued + datetime.timedelta(days=14)),
                    "line_items": items,
                    "status": status,
                }
            )
            bill_ids.append(bill_id)
        out["customers"].append(
            {
                "customer_id": customer_id,
                "full_name": f"{first} {last}",
                "date_of_birth": _date(
                    datetime.date(rng.randint(1955, 2003), rng.randint(1, 12), rng.randint(1, 28))
                ),
                "email": f"{first.lower()}.{last.lower()}@example.com",
                "phone_number": monthly[0][2],
                "address": {
                    "street": f"{rng.randint(10, 999)} {rng.choice(STREETS)}",
                    "city": city,
                    "state": state,
                    "zip_code": zip_code,
                },
                "account_status": "Active",
                "payment_methods": [
                    {
                        "method_type": rng.choice(["Credit Card", "Debit Card", "PayPal"]),
                        "account_number_last_4": f"{rng.randint(0, 9999):04d}",
                        "expiration_date": f"{rng.randint(1, 12):02d}/{rng.randint(2026, 2029)}",
                    }
                ],
                "line_ids": line_ids,
                "bill_ids": bill_ids,
                "created_at": datetime.datetime(
                    rng.randint(2021, 2024), rng.randint(1, 12), rng.randint(1, 28), 9, 15
                ).isoformat(),
                "goodwill_credit_used_this_year": rng.choice([0.0, 0.0, 25.0]),
            }
        )
    return out


# -- tasks ------------------------------------------------------------------------------------

Call = tuple[str, str, dict[str, Any]]  # (requestor or env_type, function, arguments)


@dataclass
class _Case:
    """Who the task is about: a customer and one of their lines."""

    customer: dict[str, Any]
    line: dict[str, Any]
    plan: dict[str, Any]

    @property
    def cid(self) -> str:
        return str(self.customer["customer_id"])

    @property
    def lid(self) -> str:
        return str(self.line["line_id"])

    @property
    def name(self) -> str:
        return str(self.customer["full_name"])

    @property
    def phone(self) -> str:
        return str(self.line["phone_number"])


@dataclass
class _Draft:
    category: str
    issues: list[str]
    case: _Case
    reason: str
    known: str
    instructions: str
    purpose: str
    unknown: str | None = None
    setup: list[Call] = field(default_factory=list)
    gold: list[Call] = field(default_factory=list)
    compare: dict[str, list[str]] = field(default_factory=dict)
    assertions: list[Call] = field(default_factory=list)
    basis: list[str] = field(default_factory=lambda: ["ENV_ASSERTION"])
    communicate: list[str] | None = None
    user_data: dict[str, Any] | None = None
    phone_known: bool = True  # the phone is set up (sync) in the environment
    broken_before: bool = True  # the assertions fail before the gold actions


class _Issue:
    """One way the phone or the account can be broken: set-up, diagnosis, fix, task text."""

    def __init__(self, rng: random.Random, case: _Case) -> None:
        self.rng = rng
        self.case = case

    def setup(self, name: str) -> list[Call]:
        c = self.case
        u = "user"
        table: dict[str, list[Call]] = {
            "airplane_mode_on": [(u, "turn_airplane_mode_on", {})],
            "unseat_sim_card": [(u, "unseat_sim_card", {})],
            "break_apn_settings": [(u, "break_apn_settings", {})],
            "lock_sim_card_pin": [(u, "lock_sim_card", {"mode": "pin"})],
            "lock_sim_card_puk": [(u, "lock_sim_card", {"mode": "puk"})],
            "overdue_bill_suspension": [
                (
                    "assistant",
                    "suspend_line_for_overdue_bill",
                    {
                        "customer_id": c.cid,
                        "line_id": c.lid,
                        "new_bill_id": self.overdue_bill,
                        "contract_ended": False,
                    },
                ),
                (u, "simulate_network_search", {}),
            ],
            "contract_end_suspension": [
                (
                    "assistant",
                    "suspend_line_for_overdue_bill",
                    {
                        "customer_id": c.cid,
                        "line_id": c.lid,
                        "new_bill_id": self.overdue_bill,
                        "contract_ended": True,
                    },
                ),
                (u, "simulate_network_search", {}),
            ],
            "data_mode_off": [(u, "turn_data_off", {})],
            "data_usage_exceeded": [
                (
                    "assistant",
                    "set_data_usage",
                    {"customer_id": c.cid, "line_id": c.lid, "data_used_gb": self.exceeded_usage},
                )
            ],
            "data_saver_mode_on": [(u, "turn_data_saver_mode_on", {})],
            "bad_network_preference": [
                (u, "set_network_mode_preference", {"mode": self.slow_mode})
            ],
            "mms_2g_preference": [(u, "set_network_mode_preference", {"mode": "2g_only"})],
            "bad_vpn": [(u, "break_vpn", {})],
            "bad_vpn_reconnect": [(u, "break_vpn", {})],
            "user_abroad_roaming_enabled_off": [
                (u, "set_user_location", {"abroad": True}),
                (u, "turn_roaming_off", {}),
                ("assistant", "enable_roaming", {"customer_id": c.cid, "line_id": c.lid}),
            ],
            "user_abroad_roaming_disabled_off": [
                (u, "set_user_location", {"abroad": True}),
                (u, "turn_roaming_off", {}),
                ("assistant", "disable_roaming", {"customer_id": c.cid, "line_id": c.lid}),
                (u, "simulate_network_search", {}),
            ],
            "user_abroad_roaming_disabled_on": [
                (u, "set_user_location", {"abroad": True}),
                (u, "turn_roaming_on", {}),
                ("assistant", "disable_roaming", {"customer_id": c.cid, "line_id": c.lid}),
                (u, "simulate_network_search", {}),
            ],
            "wifi_connected_home": [],
            "bad_wifi_calling": [(u, "set_wifi_calling", {"enabled": True, "mms_over_wifi": True})],
            "break_app_sms_permission": [
                (u, "remove_app_permission", {"app_name": "messaging", "permission": "sms"})
            ],
            "break_app_storage_permission": [
                (u, "remove_app_permission", {"app_name": "messaging", "permission": "storage"})
            ],
            "break_app_both_permissions": [
                (u, "remove_app_permission", {"app_name": "messaging", "permission": "sms"}),
                (u, "remove_app_permission", {"app_name": "messaging", "permission": "storage"}),
            ],
            "break_apn_mms_setting": [(u, "break_apn_mms_setting", {})],
            "break_apn_mms_setting_no_reboot": [(u, "break_apn_mms_setting", {})],
        }
        return table[name]

    def fix(self, name: str) -> list[Call]:
        c = self.case
        a, u = "assistant", "user"
        line = {"customer_id": c.cid, "line_id": c.lid}
        table: dict[str, list[Call]] = {
            "airplane_mode_on": [(u, "check_network_status", {}), (u, "toggle_airplane_mode", {})],
            "unseat_sim_card": [(u, "check_sim_status", {}), (u, "reseat_sim_card", {})],
            "break_apn_settings": [
                (u, "check_apn_settings", {}),
                (u, "reset_apn_settings", {}),
                (u, "reboot_device", {}),
            ],
            "lock_sim_card_pin": [(u, "check_sim_status", {})],
            "lock_sim_card_puk": [(u, "check_sim_status", {})],
            "overdue_bill_suspension": [
                (a, "get_details_by_id", {"id": c.lid}),
                (a, "get_bills_for_customer", {"customer_id": c.cid}),
                (a, "send_payment_request", {"customer_id": c.cid, "bill_id": self.overdue_bill}),
                (u, "check_payment_request", {}),
                (u, "make_payment", {}),
                (a, "get_details_by_id", {"id": self.overdue_bill}),
                (a, "resume_line", line),
                (u, "reboot_device", {}),
            ],
            "contract_end_suspension": [(a, "get_details_by_id", {"id": c.lid})],
            "data_mode_off": [(u, "check_network_status", {}), (u, "toggle_data", {})],
            "data_usage_exceeded": [
                (a, "get_data_usage", line),
                (a, "refuel_data", {**line, "gb_amount": self.refuel_gb}),
            ],
            "data_saver_mode_on": [
                (u, "check_data_restriction_status", {}),
                (u, "toggle_data_saver_mode", {}),
            ],
            "bad_network_preference": [
                (u, "check_network_mode_preference", {}),
                (u, "set_network_mode_preference", {"mode": "4g_5g_preferred"}),
            ],
            "mms_2g_preference": [
                (u, "check_network_mode_preference", {}),
                (u, "set_network_mode_preference", {"mode": "4g_5g_preferred"}),
            ],
            "bad_vpn": [(u, "check_vpn_status", {}), (u, "disconnect_vpn", {})],
            "bad_vpn_reconnect": [
                (u, "check_vpn_status", {}),
                (u, "disconnect_vpn", {}),
                (u, "run_speed_test", {}),
                (u, "connect_vpn", {}),
            ],
            "user_abroad_roaming_enabled_off": [
                (u, "check_network_status", {}),
                (u, "toggle_roaming", {}),
            ],
            "user_abroad_roaming_disabled_off": [
                (a, "get_details_by_id", {"id": c.lid}),
                (a, "enable_roaming", line),
                (u, "toggle_roaming", {}),
            ],
            "user_abroad_roaming_disabled_on": [
                (u, "check_network_status", {}),
                (a, "get_details_by_id", {"id": c.lid}),
                (a, "enable_roaming", line),
            ],
            "wifi_connected_home": [(u, "check_wifi_status", {}), (u, "toggle_wifi", {})],
            "bad_wifi_calling": [
                (u, "check_wifi_calling_status", {}),
                (u, "toggle_wifi_calling", {}),
            ],
            "break_app_sms_permission": [
                (u, "check_app_permissions", {"app_name": "messaging"}),
                (u, "grant_app_permission", {"app_name": "messaging", "permission": "sms"}),
            ],
            "break_app_storage_permission": [
                (u, "check_installed_apps", {}),
                (u, "check_app_status", {"app_name": "messaging"}),
                (u, "grant_app_permission", {"app_name": "messaging", "permission": "storage"}),
            ],
            "break_app_both_permissions": [
                (u, "check_app_permissions", {"app_name": "messaging"}),
                (u, "grant_app_permission", {"app_name": "messaging", "permission": "sms"}),
                (u, "grant_app_permission", {"app_name": "messaging", "permission": "storage"}),
            ],
            "break_apn_mms_setting": [
                (u, "check_apn_settings", {}),
                (u, "reset_apn_settings", {}),
                (u, "reboot_device", {}),
            ],
            "break_apn_mms_setting_no_reboot": [
                (u, "check_apn_settings", {}),
                (
                    u,
                    "set_apn_settings",
                    {
                        "apn_settings": {
                            "apn_name": "internet",
                            "mms_apn": "mms",
                            "mmsc_url": DEFAULT_MMSC,
                        }
                    },
                ),
            ],
        }
        return table[name]

    @property
    def overdue_bill(self) -> str:
        return f"B{9000 + int(self.case.lid[1:])}"

    @property
    def exceeded_usage(self) -> float:
        return round(float(self.case.plan["data_limit_gb"]) + self._overage, 1)

    @property
    def refuel_gb(self) -> float:
        return self._refuel

    @property
    def slow_mode(self) -> str:
        return self._slow_mode

    def draw(self) -> None:
        """Draw the task's numbers (same order every time: the output depends on the seed only)."""
        self._overage = self.rng.choice([0.2, 0.4, 0.6, 0.8])
        self._refuel = self.rng.choice([1.0, 1.5, 2.0])
        self._slow_mode = self.rng.choice(["2g_only", "3g_only"])
        self.country = self.rng.choice(COUNTRIES)


ABROAD = {
    "user_abroad_roaming_enabled_off",
    "user_abroad_roaming_disabled_off",
    "user_abroad_roaming_disabled_on",
}
UNSOLVABLE = {"lock_sim_card_pin", "lock_sim_card_puk", "contract_end_suspension"}
SUSPENSIONS = {"overdue_bill_suspension", "contract_end_suspension"}

SERVICE = [
    ["airplane_mode_on"],
    ["unseat_sim_card"],
    ["break_apn_settings"],
    ["overdue_bill_suspension"],
    ["airplane_mode_on", "unseat_sim_card"],
    ["break_apn_settings", "unseat_sim_card"],
    ["airplane_mode_on", "overdue_bill_suspension"],
    ["airplane_mode_on", "break_apn_settings", "overdue_bill_suspension"],
    ["lock_sim_card_pin"],
    ["airplane_mode_on", "lock_sim_card_puk"],
    ["contract_end_suspension"],
    ["contract_end_suspension", "unseat_sim_card"],
]
MOBILE_DATA = [
    ["data_mode_off"],
    ["data_usage_exceeded"],
    ["data_saver_mode_on"],
    ["bad_network_preference"],
    ["bad_vpn"],
    ["user_abroad_roaming_enabled_off"],
    ["user_abroad_roaming_disabled_off"],
    ["user_abroad_roaming_disabled_on"],
    ["airplane_mode_on", "data_saver_mode_on"],
    ["data_mode_off", "data_usage_exceeded"],
    ["bad_network_preference", "bad_vpn"],
    ["unseat_sim_card", "user_abroad_roaming_disabled_on"],
    ["wifi_connected_home", "data_mode_off"],
    ["bad_vpn_reconnect"],
]
MMS = [
    ["bad_wifi_calling"],
    ["break_app_sms_permission"],
    ["break_app_storage_permission"],
    ["break_app_both_permissions"],
    ["break_apn_mms_setting"],
    ["break_apn_mms_setting_no_reboot"],
    ["mms_2g_preference"],
    ["data_mode_off", "break_app_sms_permission"],
    ["airplane_mode_on", "bad_wifi_calling"],
    ["data_usage_exceeded", "break_apn_mms_setting"],
    ["user_abroad_roaming_disabled_off", "mms_2g_preference"],
    ["unseat_sim_card", "break_app_storage_permission"],
]


def _cases(db: dict[str, Any], rng: random.Random) -> Iterator[_Case]:
    # Each task gets its own customer line, drawn without repetition while lines last.
    lines = {line["line_id"]: line for line in db["lines"]}
    plans = {plan["plan_id"]: plan for plan in db["plans"]}
    pairs = [(c, lines[lid]) for c in db["customers"] for lid in c["line_ids"]]
    while True:
        for customer, line in rng.sample(pairs, len(pairs)):
            yield _Case(customer, line, plans[line["plan_id"]])


def _identify(case: _Case) -> Call:
    return ("assistant", "get_customer_by_phone", {"phone_number": case.phone})


def _known(case: _Case, where: str | None) -> str:
    text = f"You are {case.name} with phone number {case.phone}."
    return f"{text} {where}" if where else text


def _troubleshooting(category: str, issues: list[str], case: _Case, rng: random.Random) -> _Draft:
    issue = _Issue(rng, case)
    issue.draw()
    abroad = any(i in ABROAD for i in issues)
    unsolvable = any(i in UNSOLVABLE for i in issues)
    where = (
        f"You are currently abroad in {issue.country}."
        if abroad
        else "You are at home in the United States."
    )
    setup: list[Call] = [("user", "set_user_info", {"name": case.name, "phone_number": case.phone})]
    for name in issues:
        setup += issue.setup(name)
    first_check, last_check = {
        "service_issue": ("check_status_bar", "check_status_bar"),
        "mobile_data_issue": ("run_speed_test", "run_speed_test"),
        "mms_issue": ("can_send_mms", "can_send_mms"),
    }[category]
    gold: list[Call] = [_identify(case), ("user", first_check, {})]
    for name in issues:
        gold += issue.fix(name)
    compare: dict[str, list[str]] = {}
    if unsolvable:
        gold.append(
            ("assistant", "transfer_to_human_agents", {"summary": "The customer has no service."})
        )
        compare["transfer_to_human_agents"] = []
    else:
        gold.append(("user", last_check, {}))
    refuel = any(i == "data_usage_exceeded" for i in issues)
    assertions: list[Call]
    if unsolvable:
        assertions = [("user", "assert_service_status", {"expected_status": "no_service"})]
    elif category == "service_issue":
        assertions = [("user", "assert_service_status", {"expected_status": "connected"})]
    elif category == "mobile_data_issue":
        assertions = [
            ("user", "assert_mobile_data_status", {"expected_status": True}),
            (
                "user",
                "assert_internet_speed",
                {"expected_speed": 200, "expected_desc": "excellent"},
            ),
        ]
    else:
        assertions = [("user", "assert_can_send_mms", {"expected_status": True})]
    if any(i in SUSPENSIONS for i in issues) and not unsolvable:
        assertions.append(
            ("assistant", "assert_no_overdue_bill", {"overdue_bill_id": issue.overdue_bill})
        )
    if refuel:
        assertions.append(
            (
                "assistant",
                "assert_data_refueling_amount",
                {"customer_id": case.cid, "line_id": case.lid, "expected_amount": issue.refuel_gb},
            )
        )
    reason = {
        "service_issue": "Your phone shows 'No Service': you cannot make or receive calls.",
        "mobile_data_issue": (
            "Mobile data on your phone does not work properly: it is very slow or does not "
            "work at all. You want it fixed, and you will only accept an excellent internet "
            "speed on your phone, nothing less."
        ),
        "mms_issue": "You cannot send picture messages (MMS) from your phone, and you want that fixed.",
    }[category]
    done = {
        "service_issue": "You consider the issue solved when the status bar shows that you have signal.",
        "mobile_data_issue": "You consider the issue solved only when a speed test gives an excellent speed.",
        "mms_issue": "You consider the issue solved when your phone says it can send MMS messages.",
    }[category]
    steps = [
        "Follow the agent's guidance on your phone; if a step does not fix the issue at once, say "
        "you are a little frustrated, but carry on.",
        done,
    ]
    if "wifi_connected_home" in issues:
        reason += " It is only a problem when you are away from your home Wi-Fi."
    if refuel:
        steps.append(
            f"If necessary you are willing to refuel {issue.refuel_gb} GB of data, but you do not "
            "want to change your plan."
        )
    if any(i in SUSPENSIONS for i in issues):
        steps.append("If the agent asks you to pay a bill, you accept and pay it.")
    if "bad_vpn_reconnect" in issues:
        steps.append(
            "You need your VPN for work: if the agent asks you to disconnect it, you do, but then "
            "you ask whether you may connect it again, and you connect it again."
        )
    if "break_apn_mms_setting_no_reboot" in issues:
        steps.append(
            "You are waiting for an important call and cannot restart your phone today; refuse "
            "any restart and ask for another way."
        )
    if "wifi_connected_home" in issues:
        known_wifi = {
            "device": {
                "wifi_enabled": True,
                "wifi_connected": True,
                "wifi_ssid": f"HomeNet-{rng.randint(10, 99)}",
                "wifi_signal_strength": "good",
            }
        }
    else:
        known_wifi = None
    if unsolvable:
        steps.append("If the agent transfers you to a human agent, you accept.")
    steps.append(GROUNDING)
    return _Draft(
        category=category,
        issues=issues,
        case=case,
        reason=reason,
        known=_known(case, where),
        instructions="\n".join(steps),
        purpose=f"Troubleshooting path: {category.replace('_', ' ')} ({', '.join(issues)}).",
        setup=setup,
        gold=gold,
        compare=compare,
        assertions=assertions,
        basis=["ENV_ASSERTION", "ACTION"] if unsolvable else ["ENV_ASSERTION"],
        user_data=known_wifi,
        broken_before=not unsolvable,
    )


def _account_tasks(db: dict[str, Any], cases: Iterator[_Case], rng: random.Random) -> list[_Draft]:
    bills = {b["bill_id"]: b for b in db["bills"]}
    drafts: list[_Draft] = []

    def case_where(pred: Any) -> _Case:
        for case in cases:
            if pred(case):
                return case
        raise RuntimeError("no such case")  # pragma: no cover - the generator is infinite

    # Overdue bills the customer pays (no suspension).
    for _ in range(2):
        case = case_where(
            lambda c: any(bills[b]["status"] == "Overdue" for b in c.customer["bill_ids"])
        )
        bill_id = next(b for b in case.customer["bill_ids"] if bills[b]["status"] == "Overdue")
        drafts.append(
            _Draft(
                category="billing",
                issues=["pay_overdue_bill"],
                case=case,
                reason="You received a notice that one of your bills is overdue, and you want to pay it today.",
                known=_known(case, None),
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
                    _identify(case),
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
        )

    # The amount of the latest issued bill.
    for _ in range(2):
        case = case_where(
            lambda c: any(bills[b]["status"] == "Issued" for b in c.customer["bill_ids"])
        )
        issued = next(bills[b] for b in case.customer["bill_ids"] if bills[b]["status"] == "Issued")
        amount = str(issued["total_due"])
        drafts.append(
            _Draft(
                category="billing",
                issues=["latest_bill_amount"],
                case=case,
                reason="You want to know how much your latest bill is and when it is due.",
                known=_known(case, None),
                instructions="Ask for the total amount due of your most recent issued bill and its due date. You do not want to pay it now.",
                purpose="Billing question: the amount of the latest issued bill.",
                gold=[
                    _identify(case),
                    ("assistant", "get_bills_for_customer", {"customer_id": case.cid}),
                ],
                basis=["DB", "COMMUNICATE"],
                communicate=[amount],
                phone_known=False,
                broken_before=False,
            )
        )

    # Plan details, one customer found by name and date of birth.
    for by_name in (False, True):
        case = case_where(lambda c: True)
        identify: Call = (
            (
                "assistant",
                "get_customer_by_name",
                {"full_name": case.name, "dob": case.customer["date_of_birth"]},
            )
            if by_name
            else _identify(case)
        )
        known = (
            f"You are {case.name}, born on {case.customer['date_of_birth']}. You do not remember "
            f"which of your numbers this is about, but the line's number is {case.phone}."
            if by_name
            else _known(case, None)
        )
        drafts.append(
            _Draft(
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
        )

    # Data used this cycle.
    case = case_where(lambda c: c.plan["data_limit_gb"] < 100)
    drafts.append(
        _Draft(
            category="plan",
            issues=["data_usage_question"],
            case=case,
            reason="You want to know how much mobile data your line has used this billing cycle.",
            known=_known(case, None),
            instructions="Ask how much data you have used and what your allowance is. You do not want to buy more data.",
            purpose="Usage question: data used this cycle.",
            gold=[
                _identify(case),
                ("assistant", "get_data_usage", {"customer_id": case.cid, "line_id": case.lid}),
            ],
            basis=["DB", "COMMUNICATE"],
            communicate=[str(case.line["data_used_gb"])],
            phone_known=False,
            broken_before=False,
        )
    )

    # Suspend a line for a long trip.
    case = case_where(lambda c: True)
    drafts.append(
        _Draft(
            category="plan",
            issues=["suspend_line"],
            case=case,
            reason=f"You will be away for four months and want to suspend your line {case.phone} while you are gone.",
            known=_known(case, None),
            instructions="You accept the $5 monthly holding fee. You want only this line suspended.",
            purpose="Line suspension at the customer's request.",
            gold=[
                _identify(case),
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
            assertions=[
                (
                    "assistant",
                    "assert_line_status",
                    {"customer_id": case.cid, "line_id": case.lid, "expected_status": "Suspended"},
                )
            ],
            basis=["DB", "ENV_ASSERTION"],
            phone_known=False,
        )
    )

    # Resume a line the customer suspended earlier (found by customer ID).
    case = case_where(lambda c: True)
    drafts.append(
        _Draft(
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
            assertions=[
                (
                    "assistant",
                    "assert_line_status",
                    {"customer_id": case.cid, "line_id": case.lid, "expected_status": "Active"},
                )
            ],
            basis=["DB", "ENV_ASSERTION"],
            phone_known=False,
        )
    )

    # Turn roaming off after a trip.
    case = case_where(lambda c: True)
    drafts.append(
        _Draft(
            category="plan",
            issues=["disable_roaming"],
            case=case,
            reason="You are back from a trip abroad and want international roaming turned off on your line.",
            known=_known(case, "You are at home in the United States."),
            instructions="You want roaming off on this line only.",
            purpose="Roaming off at the customer's request.",
            setup=[("assistant", "enable_roaming", {"customer_id": case.cid, "line_id": case.lid})],
            gold=[
                _identify(case),
                ("assistant", "disable_roaming", {"customer_id": case.cid, "line_id": case.lid}),
            ],
            basis=["DB"],
            phone_known=False,
            broken_before=False,
        )
    )

    # A plan change: only a human agent can do it.
    case = case_where(lambda c: True)
    drafts.append(
        _Draft(
            category="plan",
            issues=["change_plan"],
            case=case,
            reason="You want to move your line to a plan with more data.",
            known=_known(case, None),
            instructions="Insist on changing your plan today. If the agent transfers you to a human agent, you accept.",
            purpose="Plan change: outside the agent's tools, so a transfer.",
            gold=[
                _identify(case),
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
    )
    return drafts


def _drafts(db: dict[str, Any], rng: random.Random) -> list[_Draft]:
    overdue = {b["customer_id"] for b in db["bills"] if b["status"] == "Overdue"}
    cases = _cases(db, rng)
    drafts = []
    for category, combos in (
        ("service_issue", SERVICE),
        ("mobile_data_issue", MOBILE_DATA),
        ("mms_issue", MMS),
    ):
        for issues in combos:
            suspended = any(i in SUSPENSIONS for i in issues)
            for case in cases:
                if suspended and case.cid in overdue:
                    continue
                if "data_usage_exceeded" in issues and case.plan["data_limit_gb"] >= 100:
                    continue
                break
            drafts.append(_troubleshooting(category, issues, case, rng))
    return drafts + _account_tasks(db, cases, rng)


def _function(call: Call, *, assertion: bool = False) -> dict[str, Any]:
    env_type, name, arguments = call
    out: dict[str, Any] = {"env_type": env_type, "func_name": name, "arguments": arguments}
    if assertion:
        out.update({"assert_value": True, "message": None})
    return out


def _task(draft: _Draft) -> dict[str, Any]:
    case = draft.case
    task_id = f"[{draft.category}]{'|'.join(draft.issues)}[{case.cid}/{case.lid}]"
    setup = list(draft.setup)
    if draft.phone_known and not any(f == "set_user_info" for _, f, _ in setup):
        setup.insert(0, ("user", "set_user_info", {"name": case.name, "phone_number": case.phone}))
    return {
        "id": task_id,
        "description": {"purpose": draft.purpose, "relevant_policies": None, "notes": None},
        "user_scenario": {
            "persona": None,
            "instructions": {
                "domain": "telecom",
                "reason_for_call": draft.reason,
                "known_info": draft.known,
                "unknown_info": draft.unknown,
                "task_instructions": draft.instructions,
            },
        },
        "initial_state": {
            "initialization_data": (
                None
                if draft.user_data is None
                else {"agent_data": None, "user_data": draft.user_data}
            ),
            "initialization_actions": [_function(c) for c in setup],
            "message_history": None,
        },
        "evaluation_criteria": {
            "actions": [
                {
                    "action_id": f"{name}_{i}",
                    "requestor": requestor,
                    "name": name,
                    "arguments": arguments,
                    "info": None,
                    "compare_args": draft.compare.get(name),
                }
                for i, (requestor, name, arguments) in enumerate(draft.gold)
            ],
            "env_assertions": [_function(c, assertion=True) for c in draft.assertions] or None,
            "communicate_info": draft.communicate,
            "nl_assertions": None,
            "reward_basis": draft.basis,
        },
    }


def check_task(domain: TelecomDomain, task: Task, *, broken_before: bool) -> None:
    """Check that the gold actions of `task` run without error and make its assertions hold
    (and, with `broken_before`, that some assertion fails before them).

    Raises:
        RuntimeError: naming the task and what is wrong.
    """
    criteria = task.evaluation_criteria
    assertions = (criteria.env_assertions if criteria else None) or []
    if broken_before and assertions:
        before = Environment(domain, task)
        if all(before.check_assertion(a) for a in assertions):
            raise RuntimeError(f"task {task.id}: the assertions hold before any gold action")
    env = Environment(domain, task)
    texts = []
    for action in task.gold_actions:
        call = ToolCall(id=action.action_id, name=action.name, arguments=action.arguments)
        call.requestor = action.requestor
        answer = env.replay(call)
        if answer.error:
            raise RuntimeError(f"task {task.id}: gold action {action.name} fails: {answer.content}")
        texts.append(answer.content or "")
    for assertion in assertions:
        if not env.check_assertion(assertion):
            raise RuntimeError(
                f"task {task.id}: {assertion.func_name} fails after the gold actions"
            )
    for info in (criteria.communicate_info if criteria else None) or []:
        if not any(info in text for text in texts):
            raise RuntimeError(f"task {task.id}: no tool result tells the agent {info!r}")


def generate(
    seed: int = DEFAULT_SEED,
) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """The carrier's database, the phone and the tasks for `seed`, each task checked.

    Raises:
        RuntimeError: when a task fails its check or the tasks leave a tool unused.
    """
    rng = random.Random(seed)
    db = generate_db(rng)
    user_db = TelecomUserDB().model_dump(mode="json")
    drafts = _drafts(db, rng)
    raw = [_task(d) for d in drafts]
    tasks = parse_tasks(raw, source="generated telecom tasks")
    domain = TelecomDomain(
        TelecomDB.model_validate(db), TelecomUserDB.model_validate(user_db), "", tasks
    )
    for draft, task in zip(drafts, tasks, strict=True):
        check_task(domain, task, broken_before=draft.broken_before)
    used = {(a.requestor, a.name) for t in tasks for a in t.gold_actions}
    unused = [
        f"{side} {name}"
        for side, toolkit in (("assistant", TelecomTools), ("user", TelecomUserTools))
        for name in toolkit.tool_names()
        if (side, name) not in used
    ]
    if unused:
        raise RuntimeError(f"no task uses: {', '.join(unused)}")
    return db, user_db, raw


def write(out: Path, seed: int = DEFAULT_SEED) -> None:
    """Write `db.json`, `user_db.json` and `tasks.json` into `out`."""
    db, user_db, tasks = generate(seed)
    out.mkdir(parents=True, exist_ok=True)
    for name, data in (("db.json", db), ("user_db.json", user_db), ("tasks.json", tasks)):
        (out / name).write_text(
            json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
        )


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    write(args.out, args.seed)


if __name__ == "__main__":
    main()
