"""The telecom domain object: two databases, two toolkits, and the sync step between them.

The agent works on the carrier's database (`TelecomTools`), the customer on their phone
(`TelecomUserTools`). After every tool call and set-up function the environment calls
`sync_tools`, which copies onto the phone what it reflects of the carrier's side, as τ²-bench's
telecom environment does: whether the line is active, whether it may roam, whether its data
allowance is used up, and payment requests — a paid request marks its bill paid, and a bill
awaiting payment appears on the phone as a request.

A domain directory holds the carrier's database (`db.json` or τ²-bench's `db.toml`), the
phone's (`user_db.json` or `user_db.toml`), `tasks.json`, and the policy: `main_policy.md` plus
a tech-support guide, `tech_support_manual.md` or `tech_support_workflow.md`. τ²-bench's own
`data/tau2/domains/telecom` directory works unchanged.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from evalkit.domains.base import DB, BaseDomain, Toolkit, load_json_db
from evalkit.domains.telecom.data_model import LineStatus, TelecomDB
from evalkit.domains.telecom.device_requests import TelecomDeviceRequests
from evalkit.domains.telecom.tools import TelecomTools
from evalkit.domains.telecom.user_data_model import PaymentRequest, TelecomUserDB
from evalkit.domains.telecom.user_tools import TelecomUserTools
from evalkit.errors import DataError
from evalkit.tasks import Task, load_tasks

DEFAULT_DATA_DIR = Path(__file__).parent / "data"
TECH_SUPPORT_FILES = {
    "manual": "tech_support_manual.md",
    "workflow": "tech_support_workflow.md",
}
TechSupport = Literal["manual", "workflow"]


def sync_device(agent_tools: TelecomTools, user_tools: TelecomUserTools) -> None:
    """Copy onto the phone what it reflects of the carrier's side (τ²-bench's sync step).

    Does nothing before the phone knows its number. Only the phone's surroundings change; the
    phone's own connection follows at its next network search (a reboot, a toggle, …).

    Raises:
        ValueError: when the phone's number has no line, or the line's plan does not exist.
    """
    around = user_tools.surroundings
    if around.phone_number is None:
        return
    line = agent_tools._get_line_by_phone(around.phone_number)
    around.line_active = line.status == LineStatus.ACTIVE
    around.roaming_allowed = line.roaming_enabled
    plan = agent_tools._get_plan_by_id(line.plan_id)
    around.mobile_data_usage_exceeded = (
        line.data_used_gb >= plan.data_limit_gb + line.data_refueling_gb
    )
    if around.payment_request is not None and around.payment_request.paid:
        agent_tools._set_bill_to_paid(around.payment_request.bill_id)
        around.payment_request = None
    if around.payment_request is None:
        customer = agent_tools.get_customer_by_phone(around.phone_number)
        waiting = agent_tools._get_bills_awaiting_payment(customer)
        if waiting:
            around.payment_request = PaymentRequest(
                bill_id=waiting[0].bill_id, amount_due=waiting[0].total_due
            )


class TelecomDomain(BaseDomain):
    """Telecom: the agent has `TelecomTools`, the customer `TelecomUserTools` on their phone."""

    def __init__(
        self, db: TelecomDB, user_db: TelecomUserDB, policy: str, tasks: list[Task]
    ) -> None:
        super().__init__("telecom", policy, tasks)
        self._db = db
        self._user_db = user_db
        # Validating a plain copy is faster than deep-copying the model.
        self._db_data = db.model_dump()
        self._user_db_data = user_db.model_dump()

    @property
    def db(self) -> TelecomDB:
        """The carrier's initial database (do not mutate; episodes get copies)."""
        return self._db

    @property
    def user_db(self) -> TelecomUserDB:
        """The phone's initial state (do not mutate; episodes get copies)."""
        return self._user_db

    def toolkit_classes(self) -> tuple[type[Toolkit], type[Toolkit] | None]:
        return TelecomTools, TelecomUserTools

    def fresh_toolkits(self) -> tuple[Toolkit, Toolkit | None]:
        return (
            TelecomTools(TelecomDB.model_validate(self._db_data)),
            TelecomUserTools(TelecomUserDB.model_validate(self._user_db_data)),
        )

    def sync_tools(self, agent_tools: Toolkit, user_tools: Toolkit | None) -> None:
        """`sync_device` on the episode's toolkits.

        Raises:
            TypeError: when the toolkits are not telecom's.
            ValueError: what `sync_device` raises.
        """
        if not isinstance(agent_tools, TelecomTools) or not isinstance(
            user_tools, TelecomUserTools
        ):
            raise TypeError("telecom needs TelecomTools and TelecomUserTools")
        sync_device(agent_tools, user_tools)

    def device_requests(self) -> TelecomDeviceRequests:
        """How a scripted customer turns the agent's requests into actions on the phone."""
        return TelecomDeviceRequests()


def _load_db(cls: type[DB], directory: Path, stem: str) -> DB:
    json_path = directory / f"{stem}.json"
    if json_path.is_file():
        return load_json_db(cls, json_path)
    toml_path = directory / f"{stem}.toml"
    if not toml_path.is_file():
        raise DataError(f"{directory}: no {stem}.json or {stem}.toml")
    try:
        data = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise DataError(f"{toml_path}: not valid TOML: {exc}") from exc
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise DataError(f"{toml_path}: not a {cls.__name__}: {exc}") from exc


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"{path}: no such policy file") from None


def telecom_policy(directory: Path, tech_support: TechSupport | None = None) -> str:
    """The agent's policy as τ²-bench assembles it: the main policy, then the tech-support guide.

    `tech_support` picks the guide; None takes the manual when the directory has one (τ²-bench's
    `telecom`), else the workflow.

    Raises:
        DataError: when a policy file is missing.
    """
    if tech_support is None:
        manual = directory / TECH_SUPPORT_FILES["manual"]
        tech_support = "manual" if manual.is_file() else "workflow"
    main = _read(directory / "main_policy.md")
    guide = _read(directory / TECH_SUPPORT_FILES[tech_support])
    return (
        f"<main_policy>\n{main}\n</main_policy>\n"
        f"<tech_support_policy>\n{guide}\n</tech_support_policy>"
    )


def load_telecom(
    data_dir: Path | None = None, *, tech_support: TechSupport | None = None
) -> TelecomDomain:
    """Load the telecom domain from `data_dir` (default: the data shipped with evalkit).

    Raises:
        DataError: when a file is missing or does not fit.
    """
    directory = DEFAULT_DATA_DIR if data_dir is None else Path(data_dir)
    if not directory.is_dir():
        raise DataError(f"{directory}: no such domain directory")
    db = _load_db(TelecomDB, directory, "db")
    user_db = _load_db(TelecomUserDB, directory, "user_db")
    tasks = load_tasks(directory / "tasks.json")
    return TelecomDomain(db, user_db, telecom_policy(directory, tech_support), tasks)


__all__ = [
    "DEFAULT_DATA_DIR",
    "TelecomDomain",
    "load_telecom",
    "sync_device",
    "telecom_policy",
]
