"""The retail domain loads its own data and τ²-bench's directory unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalkit.domains.base import Domain
from evalkit.domains.retail import load_retail
from evalkit.errors import DataError


def test_tau2_retail_directory_loads_unchanged(tau2_retail: Domain) -> None:
    assert len(tau2_retail.tasks) == 114
    assert "Retail agent policy" in tau2_retail.policy
    tools, user_tools = tau2_retail.fresh_toolkits()
    assert user_tools is None
    assert tools.call("find_user_id_by_email", {"email": "isabella.lopez3271@example.com"}) == (
        "isabella_lopez_6490"
    )


def test_fresh_toolkits_share_no_state(retail: Domain) -> None:
    first, _ = retail.fresh_toolkits()
    second, _ = retail.fresh_toolkits()
    assert first.db is not None
    assert second.db is not None
    user = next(iter(first.db.model_dump()["users"]))
    first.call(
        "modify_user_address",
        {
            "user_id": user,
            "address1": "1 New Road",
            "address2": "",
            "city": "Boise",
            "state": "ID",
            "country": "USA",
            "zip": "83701",
        },
    )
    assert first.db_hash() != second.db_hash()
    assert retail.fresh_toolkits()[0].db_hash() == second.db_hash()


def test_missing_directory_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such domain directory"):
        load_retail(tmp_path / "absent")


def test_corrupt_db_is_a_data_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "db.json").write_text('{"products": {', encoding="utf-8")
    (tmp_path / "tasks.json").write_text("[]", encoding="utf-8")
    (tmp_path / "policy.md").write_text("policy", encoding="utf-8")
    with pytest.raises(DataError, match=r"db\.json: not valid JSON \(line 1"):
        load_retail(tmp_path)


def test_tasks_that_are_not_tasks_are_a_data_error(tmp_path: Path) -> None:
    (tmp_path / "db.json").write_text(
        json.dumps({"products": {}, "users": {}, "orders": {}}), encoding="utf-8"
    )
    (tmp_path / "tasks.json").write_text('[{"id": "1"}]', encoding="utf-8")
    (tmp_path / "policy.md").write_text("policy", encoding="utf-8")
    with pytest.raises(DataError, match=r"tasks\.json: not a list of tasks"):
        load_retail(tmp_path)
