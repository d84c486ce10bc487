"""The shipped telecom data is what the seeded generator writes; the tasks cover every tool and
every troubleshooting path, and the generator refuses a task whose gold path does not work."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from evalkit.domains.base import Domain
from evalkit.domains.telecom import DEFAULT_DATA_DIR, TelecomDomain
from evalkit.domains.telecom.generate import check_task, generate, write
from evalkit.domains.telecom.tools import TelecomTools
from evalkit.domains.telecom.user_tools import TelecomUserTools
from evalkit.tasks import Action


def test_generator_reproduces_the_committed_files(tmp_path: Path) -> None:
    write(tmp_path)
    for name in ("db.json", "user_db.json", "tasks.json"):
        assert (tmp_path / name).read_bytes() == (DEFAULT_DATA_DIR / name).read_bytes(), name


def test_another_seed_gives_other_data() -> None:
    assert generate(1)[0] != generate(2)[0]


def test_shipped_data_has_the_promised_size(telecom: Domain) -> None:
    db = json.loads((DEFAULT_DATA_DIR / "db.json").read_text())
    assert len(db["customers"]) >= 20
    assert len(db["lines"]) >= 30
    assert len(db["plans"]) >= 5
    assert any(b["status"] == "Overdue" for b in db["bills"])
    assert len(telecom.tasks) >= 40
    assert sum(f.stat().st_size for f in DEFAULT_DATA_DIR.iterdir()) < 400_000


def test_shipped_tasks_together_use_every_tool_of_both_sides(telecom: Domain) -> None:
    used = collections.defaultdict(set)
    for task in telecom.tasks:
        for action in task.gold_actions:
            used[action.requestor].add(action.name)
    assert used["assistant"] == set(TelecomTools.tool_names())
    assert used["user"] == set(TelecomUserTools.tool_names())


def test_shipped_tasks_cover_every_path_with_a_reward_basis(telecom: Domain) -> None:
    categories = collections.Counter(t.id.split("]")[0].lstrip("[") for t in telecom.tasks)
    assert categories["service_issue"] >= 8
    assert categories["mobile_data_issue"] >= 8
    assert categories["mms_issue"] >= 8
    assert categories["billing"] + categories["plan"] >= 6
    for task in telecom.tasks:
        instructions = task.user_scenario.instructions
        assert not isinstance(instructions, str)
        assert instructions.domain == "telecom"
        assert task.reward_basis
        assert any(a.requestor == "assistant" for a in task.gold_actions)
    troubleshooting = [t for t in telecom.tasks if t.id.startswith(("[service", "[mobile", "[mms"))]
    assert all(any(a.requestor == "user" for a in t.gold_actions) for t in troubleshooting)
    assert all("ENV_ASSERTION" in t.reward_basis for t in troubleshooting)


def test_a_task_whose_gold_path_does_not_fix_the_phone_is_refused(telecom: Domain) -> None:
    assert isinstance(telecom, TelecomDomain)
    task = next(t for t in telecom.tasks if "airplane_mode_on" in t.id)
    check_task(telecom, task, broken_before=True)
    assert task.evaluation_criteria is not None
    without_fix = task.model_copy(deep=True)
    assert without_fix.evaluation_criteria is not None
    without_fix.evaluation_criteria.actions = [
        a for a in task.gold_actions if a.name != "toggle_airplane_mode"
    ]
    with pytest.raises(RuntimeError, match="fails after the gold actions"):
        check_task(telecom, without_fix, broken_before=True)
    failing = task.model_copy(deep=True)
    assert failing.evaluation_criteria is not None
    failing.evaluation_criteria.actions = [
        Action(action_id="x", name="refuel_data", arguments={"customer_id": "C0"})
    ]
    with pytest.raises(RuntimeError, match="gold action refuel_data fails"):
        check_task(telecom, failing, broken_before=False)
