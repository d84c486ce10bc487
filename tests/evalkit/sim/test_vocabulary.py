"""Wrong tool names are drawn from a fixed, weighted vocabulary, never from the declared tools."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from evalkit.sim.profiles import load_profile
from evalkit.sim.vocabulary import GENERIC_WRONG_TOOL_NAMES, vocabulary, wrong_tool_name


def test_draws_follow_the_weights_in_order() -> None:
    names = vocabulary("retail")
    total = sum(w for _, w in names)
    counts = Counter(wrong_tool_name("retail", (), (i + 0.5) / total) for i in range(total))
    assert counts == dict(names)
    assert wrong_tool_name("retail", (), 0.0) == names[0][0]


def test_declared_names_are_never_drawn() -> None:
    first, second = vocabulary("telecom")[0][0], vocabulary("telecom")[1][0]
    drawn = {wrong_tool_name("telecom", {first}, i / 100) for i in range(100)}
    assert first not in drawn
    assert wrong_tool_name("telecom", {first}, 0.0) == second


def test_a_domain_without_a_list_uses_the_generic_one_and_may_run_out() -> None:
    assert vocabulary("shipping") == GENERIC_WRONG_TOOL_NAMES
    everything = {name for name, _ in GENERIC_WRONG_TOOL_NAMES}
    assert wrong_tool_name("shipping", everything, 0.3) is None


def test_a_profile_may_bring_its_own_weighted_wrong_names(tmp_path: Path) -> None:
    own = {"purge_account": 3, "wire_money": 1}
    drawn = Counter(wrong_tool_name("retail", (), (i + 0.5) / 4, own) for i in range(4))
    assert drawn == own
    assert not set(drawn) & {name for name, _ in vocabulary("retail")}
    path = tmp_path / "other.yaml"
    path.write_text("base: int4\nwrong_tool_names: {purge_account: 3, wire_money: 1}\n")
    assert load_profile(str(path)).wrong_tool_names == own
    assert load_profile("int4").wrong_tool_names is None
