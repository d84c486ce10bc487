"""The generated telecom world: the carrier's plans, customers, lines, devices and bills.

`generate.py` builds the shipped `db.json` from it; the same random generator state gives the same
world.
"""

from __future__ import annotations

import datetime
import itertools
import random
from collections.abc import Iterator
from typing import Any

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
    line_numbers, bill_numbers = itertools.count(2001), itertools.count(2001)
    for c in range(customers):
        customer_id = f"C{2001 + c}"
        place = rng.choice(PLACES)
        lines: list[dict[str, Any]] = []
        monthly: list[tuple[str, float, str]] = []  # each line's plan, price and phone number
        for _ in range(rng.choice([1, 1, 2, 2, 3])):
            device, line, plan = _line(rng, next(line_numbers), next(numbers), plans)
            out["devices"].append(device)
            lines.append(line)
            monthly.append((plan["name"], plan["price_per_month"], line["phone_number"]))
        out["lines"].extend(lines)
        # Every sixth customer has not paid January's bill.
        january = "Overdue" if c % 6 == 4 else "Paid"
        bills = _bills(rng, customer_id, january, monthly, bill_numbers)
        out["bills"].extend(bills)
        out["customers"].append(
            _customer(rng, customer_id, names[c], place, monthly[0][2], lines, bills)
        )
    return out


def _line(
    rng: random.Random, number: int, digits: int, plans: list[dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Line `number`'s device, the line on phone number `digits`, and its plan (any but P2005)."""
    line_id, device_id = f"L{number}", f"D{number}"
    text = f"{digits:07d}"
    phone = f"555-{text[:3]}-{text[3:]}"
    plan = rng.choice([p for p in plans if p["plan_id"] != "P2005"])
    kind, model = rng.choice(PHONE_MODELS)
    activated = datetime.datetime(2024, rng.randint(1, 12), rng.randint(1, 28), 10, 30)
    device = {
        "device_id": device_id,
        "device_type": kind,
        "model": model,
        "imei": "".join(str(rng.randint(0, 9)) for _ in range(15)),
        "is_esim_capable": rng.random() < 0.7,
        "activated": True,
        "activation_date": activated.isoformat(),
    }
    limit = plan["data_limit_gb"]
    used = round(rng.uniform(0.1, 0.8) * min(limit, 30.0), 1)
    line = {
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
        "last_plan_change_date": _date(datetime.date(2024, rng.randint(1, 12), rng.randint(1, 28))),
    }
    return device, line, plan


def _bills(
    rng: random.Random,
    customer_id: str,
    january: str,
    monthly: list[tuple[str, float, str]],
    bill_numbers: Iterator[int],
) -> list[dict[str, Any]]:
    """A customer's bills of 2025: January's (`january`: Paid or Overdue), February's (Issued) and,
    half the time, March's draft; a plan charge per line, sometimes an overage."""
    bills: list[dict[str, Any]] = []
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
        bills.append(
            {
                "bill_id": f"B{next(bill_numbers)}",
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
    return bills


def _customer(
    rng: random.Random,
    customer_id: str,
    name: tuple[str, str],
    place: tuple[str, str, str],
    phone: str,
    lines: list[dict[str, Any]],
    bills: list[dict[str, Any]],
) -> dict[str, Any]:
    """The customer record: `name` living in `place`, reached on `phone`, with `lines` and `bills`."""
    first, last = name
    city, state, zip_code = place
    return {
        "customer_id": customer_id,
        "full_name": f"{first} {last}",
        "date_of_birth": _date(
            datetime.date(rng.randint(1955, 2003), rng.randint(1, 12), rng.randint(1, 28))
        ),
        "email": f"{first.lower()}.{last.lower()}@example.com",
        "phone_number": phone,
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
        "line_ids": [line["line_id"] for line in lines],
        "bill_ids": [bill["bill_id"] for bill in bills],
        "created_at": datetime.datetime(
            rng.randint(2021, 2024), rng.randint(1, 12), rng.randint(1, 28), 9, 15
        ).isoformat(),
        "goodwill_credit_used_this_year": rng.choice([0.0, 0.0, 25.0]),
    }
