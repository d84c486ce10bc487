"""Every setting of the model is a flag of `toolsentry serve`, listed in `--help` with its variable
and default, and every configuration error is one line naming the setting, exit status 2."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import annotated_types
import pytest
import typer.main
from typer.testing import CliRunner

from proxy.cli import app
from proxy.config import settings_fields
from proxy.config_fields import SettingInfo

REPO = Path(__file__).resolve().parents[2]
UPSTREAM = "http://127.0.0.1:9/v1"
FLAGGED = [s for s in settings_fields() if s.flag is not None]


def toolsentry(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`toolsentry …` as a real process of this checkout, with no TOOLSENTRY_* from outside."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TOOLSENTRY_")}
    environ |= {"PYTHONPATH": str(REPO), "COLUMNS": "100", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "proxy.cli", *args],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_serve_help_lists_every_setting_with_its_variable_and_default() -> None:
    result = toolsentry("serve", "--help")
    assert result.returncode == 0, result.stderr
    # Help wraps lines (after a hyphen too): compare without whitespace.
    flat = "".join(result.stdout.split())
    for setting in FLAGGED:
        assert setting.flag in result.stdout
        shown = f"[envvar:{setting.env};default:{setting.default}]"
        assert "".join(shown.split()) in flat, setting.key
    epilog = " ".join(result.stdout.split())
    for setting in settings_fields():
        if setting.flag is None:
            assert f"{setting.key} ({setting.env})" in epilog
    # The command's own options too: each shows its default, and its variable where it has one.
    serve = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    for param in serve.params:
        if param.name != "help":
            assert re.search(r"\[(env var: TOOLSENTRY_[A-Z_]+; )?default: [^]]+\]$", param.help)
    # Nothing of a help text was swallowed as markup: no word followed by a lone " .".
    assert " ." not in epilog
    assert "Address to listen on." in epilog


def _bound(setting: SettingInfo, kind: type) -> float | None:
    return next(
        (getattr(m, "le", None) for m in setting.field.metadata if isinstance(m, kind)), None
    )


VALID_LISTS = {
    "public_endpoints": ["/healthz", "/metrics"],
    "passthrough.allow": ["/v1/extra", "POST /v1/load_lora_adapter"],
    "passthrough.deny": ["/v1/embeddings", "GET /version"],
}
"""Settings whose entries are validated: two entries each that their validator accepts."""
VALID_VALUES: dict[str, Any] = {"exhaustion_status": 429, "workers": 2}
"""Settings whose flag gives one value of a setting that also takes a mapping, or a count or a
word (`workers`: INTEGER|auto): one it accepts."""


def sample(setting: SettingInfo) -> tuple[list[str], Any]:
    """Arguments that set `setting` to a value other than its default, and that value as the
    resolved settings print it."""
    assert setting.flag is not None
    default = setting.field.get_default(call_default_factory=True)
    if setting.kind == "switch":
        return [f"--no-{setting.flag[2:]}" if default else setting.flag], not default
    if setting.kind == "repeat":
        masked = setting.metavar == "SECRET"
        values = VALID_LISTS.get(setting.key, ["sample-a", "sample-b"])
        return [setting.flag, values[0], setting.flag, values[1]], (
            ["**********"] * 2 if masked else values
        )
    if setting.key in VALID_VALUES:
        return [setting.flag, str(VALID_VALUES[setting.key])], VALID_VALUES[setting.key]
    if "|" in setting.metavar:
        current = getattr(default, "value", default)
        choice = next(c for c in setting.metavar.split("|") if c != current)
        return [setting.flag, choice], choice
    le = _bound(setting, annotated_types.Le)
    value: Any
    if setting.metavar == "INTEGER":
        value = (default or 0) + 1 if le is None or (default or 0) + 1 <= le else default - 1
    elif setting.metavar == "NUMBER":
        value = default * 2 if default and (le is None or default * 2 <= le) else 0.5
    elif setting.metavar == "SECRET":
        return [setting.flag, "s3cret"], "**********"
    elif setting.metavar == "PATH":
        value = "/tmp/toolsentry-sample.jsonl"
    else:
        value = "sample"
    return [setting.flag, str(value)], value


@pytest.mark.parametrize("setting", FLAGGED, ids=[s.key for s in FLAGGED])
def test_the_flag_of_every_setting_reaches_the_settings(setting: SettingInfo) -> None:
    args, expected = sample(setting)
    result = CliRunner().invoke(
        app, ["serve", "--upstream", UPSTREAM, "--print-settings", *args], env={}
    )
    assert result.exit_code == 0, result.output
    resolved: Any = json.loads(result.stdout)
    for part in setting.path:
        resolved = resolved[part]
    assert resolved == expected


@pytest.mark.parametrize(
    ("env", "args", "named"),
    [
        ({"TOOLSENTRY_PORT": "eighty"}, [], "TOOLSENTRY_PORT"),
        ({"TOOLSENTRY_API_KEYS": '["sk-unclosed'}, [], "TOOLSENTRY_API_KEYS"),
        ({"TOOLSENTRY_UPSTREAMS": "ftp://127.0.0.1/v1"}, [], "TOOLSENTRY_UPSTREAMS"),
        ({"TOOLSENTRY_SHADOW_SAMPLE": "2"}, ["-u", UPSTREAM], "TOOLSENTRY_SHADOW_SAMPLE"),
        ({"TOOLSENTRY_ENFORCE_STRICT": "maybe"}, ["-u", UPSTREAM], "TOOLSENTRY_ENFORCE_STRICT"),
        ({}, ["-u", UPSTREAM, "--max-reasks", "99"], "--max-reasks"),
        ({}, ["-u", UPSTREAM, "--repair", "sometimes"], "--repair"),
        # A section's own variable, broken as JSON: named as itself, not by its last part.
        ({"TOOLSENTRY_SHADOW_MODELS": '["m"'}, ["-u", UPSTREAM], "TOOLSENTRY_SHADOW_MODELS"),
        ({"TOOLSENTRY_SHADOW": "{sample: 1}"}, ["-u", UPSTREAM], "TOOLSENTRY_SHADOW "),
        ({"TOOLSENTRY_PASSTHROUGH": "all"}, ["-u", UPSTREAM], "TOOLSENTRY_PASSTHROUGH"),
        ({"TOOLSENTRY_SHADOW_NOPE": "1"}, ["-u", UPSTREAM], "TOOLSENTRY_SHADOW_NOPE"),
        ({"TOOLSENTRY_UPSTREAMS": '[{"name": "x"}]'}, [], "upstreams.0.base_url"),
        (
            {"TOOLSENTRY_TOOL_ERRORS": '[{"pattern": "("}]'},
            ["-u", UPSTREAM],
            "TOOLSENTRY_TOOL_ERRORS",
        ),
    ],
    ids=[
        "port",
        "api-keys-json",
        "upstream-scheme",
        "shadow-sample",
        "bool",
        "flag",
        "choice",
        "section-setting-json",
        "section-json",
        "section-not-a-mapping",
        "section-unknown-key",
        "upstream-entry",
        "tool-error-pattern",
    ],
)
def test_a_configuration_error_is_one_line_naming_the_setting_and_exits_2(
    env: dict[str, str], args: list[str], named: str
) -> None:
    result = toolsentry("serve", *args, env=env)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert named in lines[0]


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("max_erors: 3\n", "max_erors: Extra inputs are not permitted"),
        ("shadow:\n  sample: 5\n", "shadow.sample (--shadow-sample, TOOLSENTRY_SHADOW_SAMPLE)"),
        ("- max_errors\n", "must be a mapping of settings, not list"),
        ("upstreams: [{name: a, base_url: 'ftp://h/v1'}]\n", "upstreams.0.base_url"),
    ],
    ids=["unknown-key", "section-value", "not-a-mapping", "upstream-entry"],
)
def test_a_wrong_setting_in_the_config_file_is_one_line_naming_it_and_the_file(
    tmp_path: Path, text: str, named: str
) -> None:
    config = tmp_path / "wrong.yaml"
    config.write_text(text)
    result = toolsentry("serve", "--config", str(config))
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ")
    assert str(config) in line
    assert named in line


def test_a_broken_config_file_is_one_line_naming_the_file(tmp_path: Path) -> None:
    config = tmp_path / "broken.yaml"
    config.write_text("max_errors: [1\n")
    result = toolsentry("serve", "--config", str(config))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: config file {config} is not valid YAML: "
        "expected ',' or ']', but got '<stream end>' at line 2, column 1"
    ]


def test_plain_values_in_the_environment_give_keys_and_an_upstream() -> None:
    result = toolsentry(
        "serve",
        "--print-settings",
        env={
            "TOOLSENTRY_API_KEYS": "sk-abc",
            "TOOLSENTRY_UPSTREAMS": UPSTREAM,
            "TOOLSENTRY_SESSION_HEADERS": "x-a, x-b",
        },
    )
    assert result.returncode == 0, result.stderr
    resolved = json.loads(result.stdout)
    assert resolved["api_keys"] == [{"name": "key-1", "key": "**********"}]
    assert [(u["name"], u["base_url"]) for u in resolved["upstreams"]] == [
        ("127.0.0.1:9", UPSTREAM)
    ]
    assert resolved["session_headers"] == ["x-a", "x-b"]


def test_printed_settings_mask_the_password_of_an_upstreams_base_url() -> None:
    url = "http://ann:s3cret@127.0.0.1:9/v1?api-version=1"
    result = CliRunner().invoke(app, ["serve", "--upstream", url, "--print-settings"], env={})
    assert result.exit_code == 0, result.output
    assert "s3cret" not in result.stdout
    resolved = json.loads(result.stdout)
    assert [(u["name"], u["base_url"]) for u in resolved["upstreams"]] == [
        ("127.0.0.1:9", "http://ann:**********@127.0.0.1:9/v1?api-version=1")
    ]


def test_a_plain_unix_socket_upstream_is_named_after_its_socket() -> None:
    url = "unix:///run/vllm/vllm.sock:/v1"
    result = CliRunner().invoke(app, ["serve", "--upstream", url, "--print-settings"], env={})
    assert result.exit_code == 0, result.output
    resolved = json.loads(result.stdout)
    assert [(u["name"], u["base_url"]) for u in resolved["upstreams"]] == [("vllm.sock", url)]
