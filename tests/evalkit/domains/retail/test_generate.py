"""The shipped retail data is what the seeded generator writes, and big and varied enough."""

from __future__ import annotations

import json
from pathlib import Path

from evalkit.domains.base import Domain
from evalkit.domains.retail import DEFAULT_DATA_DIR
from evalkit.domains.retail.generate import generate, write
from evalkit.domains.retail.tools import RetailTools


def test_generator_reproduces_the_committed_files(tmp_path: Path) -> None:
    write(tmp_path)
    for name in ("db.json", "tasks.json", "policy.md"):
        assert (tmp_path / name).read_bytes() == (DEFAULT_DATA_DIR / name).read_bytes(), name


def test_another_seed_gives_other_data() -> None:
    assert generate(1)[0] != generate(2)[0]


def test_shipped_data_has_the_promised_size(retail: Domain) -> None:
    db = json.loads((DEFAULT_DATA_DIR / "db.json").read_text())
    assert len(db["users"]) >= 60
    assert len(db["orders"]) >= 150
    assert len(db["products"]) >= 20
    assert all(len(p["variants"]) >= 2 for p in db["products"].values())
    assert len(retail.tasks) >= 40
    assert sum(f.stat().st_size for f in DEFAULT_DATA_DIR.iterdir()) < 500_000


def test_shipped_tasks_together_use_every_tool(retail: Domain) -> None:
    used = {a.name for t in retail.tasks for a in t.gold_actions}
    assert used == set(RetailTools.tool_names())


def test_shipped_tasks_are_in_tau2_format(retail: Domain) -> None:
    for task in retail.tasks:
        instructions = task.user_scenario.instructions
        assert not isinstance(instructions, str)
        assert instructions.domain == "retail"
        assert instructions.reason_for_call
        assert instructions.known_info
        assert task.evaluation_criteria is not None
        assert task.reward_basis
        ids = [a.action_id for a in task.gold_actions]
        assert ids == [f"{task.id}_{i}" for i in range(len(ids))]
