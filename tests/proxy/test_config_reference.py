"""docs/configuration.md is what the settings model generates, it lists every option `serve --help`
lists, and every setting describes itself."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from proxy.cli import app
from proxy.config import settings_fields
from proxy.config_fields import SettingInfo
from proxy.config_reference import reference
from proxy.config_upstream import UpstreamConfig

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
SETTINGS = settings_fields()


def test_the_configuration_reference_is_what_the_model_generates() -> None:
    assert REFERENCE.read_text(encoding="utf-8") == reference(), (
        "docs/configuration.md is stale: python -m proxy.config_reference > docs/configuration.md"
    )


@pytest.mark.parametrize("setting", SETTINGS, ids=[s.key for s in SETTINGS])
def test_every_setting_has_a_description_for_help_and_the_reference(setting: SettingInfo) -> None:
    assert setting.description, f"{setting.key} needs a description= or a docstring"
    assert f"`{setting.env}`" in reference()


@pytest.mark.parametrize("name", list(UpstreamConfig.model_fields))
def test_every_upstream_key_has_a_description(name: str) -> None:
    assert UpstreamConfig.model_fields[name].description


def test_the_reference_lists_every_option_of_serve_help_and_no_other() -> None:
    result = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    # An option's line starts with its flags: `  -u, --upstream URL`, `  --x / --no-x`.
    in_help = {
        flag
        for line in result.stdout.splitlines()
        if line.startswith("  -")
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*", line.split("  ")[1])
    } - {"--help"}
    in_reference = set(re.findall(r"`(--[a-z][a-z-]*)", REFERENCE.read_text(encoding="utf-8")))
    assert len(in_help) > 50
    assert in_help == in_reference
