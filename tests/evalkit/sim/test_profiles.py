"""Built-in damage profiles differ only in their channel rates; custom ones load from YAML."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from evalkit.errors import UsageError
from evalkit.sim.profiles import CHANNEL_FIELDS, builtin_profiles, load_profile


def test_int4_makes_the_same_mistakes_as_bf16_a_configurable_multiple_more_often() -> None:
    for multiplier in (2.5, 4.0):
        profiles = builtin_profiles(multiplier)
        bf16, fp8, int4 = profiles["bf16"], profiles["fp8"], profiles["int4"]
        for field in CHANNEL_FIELDS:
            assert getattr(int4, field) == pytest.approx(multiplier * getattr(bf16, field))
            assert getattr(bf16, field) < getattr(fp8, field) < getattr(int4, field)
        rest = set(type(bf16).model_fields) - set(CHANNEL_FIELDS) - {"name"}
        assert {f: getattr(int4, f) for f in rest} == {f: getattr(bf16, f) for f in rest}
    assert builtin_profiles()["int4"].model == "sim-int4"


def test_a_multiplier_that_leaves_no_right_calls_is_refused() -> None:
    with pytest.raises(UsageError, match="int4 multiplier 20"):
        builtin_profiles(20)


def test_a_custom_profile_scales_a_base_and_overrides_fields(tmp_path: Path) -> None:
    path = tmp_path / "awq.yaml"
    path.write_text("name: int4-awq\nbase: bf16\nmultiplier: 3\nrecover: 0.5\n")
    profile = load_profile(str(path))
    bf16 = builtin_profiles()["bf16"]
    assert profile.name == "int4-awq"
    assert profile.unknown_tool == pytest.approx(3 * bf16.unknown_tool)
    assert profile.recover == 0.5
    assert profile.reask_fix == bf16.reask_fix


def test_a_bad_profile_file_is_named_in_the_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("base: bf16\nrecover: 2\n")
    with pytest.raises(UsageError, match=r"bad\.yaml.*recover"):
        load_profile(str(path))
    with pytest.raises(UsageError, match=r"unknown profile 'int3'.*bf16, fp8, int4"):
        load_profile("int3")


def test_a_profile_without_a_base_needs_every_field(tmp_path: Path) -> None:
    path = tmp_path / "partial.yaml"
    path.write_text("unknown_tool: 0.1\n")
    with pytest.raises(UsageError, match=r"partial\.yaml"):
        load_profile(str(path))


def test_rates_adding_up_to_more_than_the_limit_are_invalid() -> None:
    bf16 = builtin_profiles()["bf16"]
    with pytest.raises(ValidationError, match="add up to"):
        bf16.scaled(12, name="broken")
