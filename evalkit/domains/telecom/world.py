"""The generated telecom world: the carrier's plans, customers, lines, devices and bills.

`generate.py` builds the shipped `db.json` from it; the same random generator state gives the same
world.
"""

from __future__ import annotations

import datetime
import random
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
