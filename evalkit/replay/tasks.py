"""The tasks a replay plays: all of a domain's, a split of `split_tasks.json`, or ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evalkit.domains.base import Domain
from evalkit.errors import DataError, UsageError
from evalkit.tasks import Task


def select_tasks(domain: Domain, spec: str | None, data_dir: Path | None = None) -> list[Task]:
    """The tasks `spec` names: None for all, a split name, or comma-separated task ids.

    Splits come from `split_tasks.json` in the domain's data directory (τ²-bench's file).

    Raises:
        UsageError: when an id is not a task of the domain (the message shows valid ones).
    """
    if spec is None or not spec.strip():
        return list(domain.tasks)
    splits = _splits(domain.name, data_dir)
    if spec in splits:
        wanted = [str(i) for i in splits[spec]]
    else:
        wanted = [part.strip() for part in spec.split(",") if part.strip()]
    known = {t.id for t in domain.tasks}
    missing = [t for t in wanted if t not in known]
    if missing:
        sample = ", ".join(t.id for t in domain.tasks[:8])
        split_names = f"; splits: {', '.join(sorted(splits))}" if splits else ""
        raise UsageError(
            f"domain {domain.name!r} has no task {missing[0]!r} (tasks: {sample}, …{split_names})"
        )
    return [domain.get_task(t) for t in dict.fromkeys(wanted)]


def _splits(domain: str, data_dir: Path | None) -> dict[str, list[Any]]:
    import evalkit.domains

    directory = data_dir or Path(evalkit.domains.__file__).parent / domain / "data"
    path = directory / "split_tasks.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: cannot read the task splits: {exc}") from None
    return {k: v for k, v in data.items() if isinstance(v, list)} if isinstance(data, dict) else {}
