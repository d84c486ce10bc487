"""What the telecom task makers share: a task's draft, the customer line it is about, and the
customer's words every task uses."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

GROUNDING = (
    "When the agent asks about your phone, always answer from what your tools show you; never "
    "make up what a tool would say. If a change does not show its effect, check again with "
    "another tool. If you are not sure an action is needed, ask the agent."
)

Call = tuple[str, str, dict[str, Any]]  # (requestor or env_type, function, arguments)


@dataclass
class Case:
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
class Draft:
    """One task before it is written as τ²-bench JSON."""

    category: str
    issues: list[str]
    case: Case
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


def draw_cases(db: dict[str, Any], rng: random.Random) -> Iterator[Case]:
    """Customer lines for the tasks, endlessly: each task gets its own line, drawn without
    repetition while lines last."""
    lines = {line["line_id"]: line for line in db["lines"]}
    plans = {plan["plan_id"]: plan for plan in db["plans"]}
    pairs = [(c, lines[lid]) for c in db["customers"] for lid in c["line_ids"]]
    while True:
        for customer, line in rng.sample(pairs, len(pairs)):
            yield Case(customer, line, plans[line["plan_id"]])


def identify_by_phone(case: Case) -> Call:
    """The agent's call that finds the customer by the line's phone number."""
    return ("assistant", "get_customer_by_phone", {"phone_number": case.phone})


def known_info(case: Case, where: str | None) -> str:
    """What the customer knows: who they are, their number, and where they are (when given)."""
    text = f"You are {case.name} with phone number {case.phone}."
    return f"{text} {where}" if where else text
