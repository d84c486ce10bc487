"""The retail domain object: loads `db.json`, `tasks.json` and `policy.md` from a directory."""

from __future__ import annotations

from pathlib import Path

from evalkit.domains.base import BaseDomain, Toolkit, load_json_db
from evalkit.domains.retail.data_model import RetailDB
from evalkit.domains.retail.tools import RetailTools
from evalkit.errors import DataError
from evalkit.tasks import Task, load_tasks

DEFAULT_DATA_DIR = Path(__file__).parent / "data"


class RetailDomain(BaseDomain):
    """Retail: the agent has `RetailTools`; the user has no tools."""

    def __init__(self, db: RetailDB, policy: str, tasks: list[Task]) -> None:
        super().__init__("retail", policy, tasks)
        self._db = db
        # Validating a plain copy is three times faster than deep-copying the model.
        self._db_data = db.model_dump()

    @property
    def db(self) -> RetailDB:
        """The initial database (do not mutate; episodes get copies)."""
        return self._db

    def toolkit_classes(self) -> tuple[type[Toolkit], type[Toolkit] | None]:
        return RetailTools, None

    def fresh_toolkits(self) -> tuple[Toolkit, Toolkit | None]:
        return RetailTools(RetailDB.model_validate(self._db_data)), None


def load_retail(data_dir: Path | None = None) -> RetailDomain:
    """Load the retail domain from `data_dir` (default: the data shipped with evalkit).

    The directory holds `db.json`, `tasks.json` and `policy.md` — τ²-bench's own
    `data/tau2/domains/retail` directory works unchanged.

    Raises:
        DataError: when a file is missing or does not fit.
    """
    directory = DEFAULT_DATA_DIR if data_dir is None else Path(data_dir)
    if not directory.is_dir():
        raise DataError(f"{directory}: no such domain directory")
    db = load_json_db(RetailDB, directory / "db.json")
    tasks = load_tasks(directory / "tasks.json")
    policy_path = directory / "policy.md"
    try:
        policy = policy_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"{policy_path}: no such policy file") from None
    return RetailDomain(db, policy, tasks)
