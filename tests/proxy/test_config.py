from __future__ import annotations

import os
from pathlib import Path

import pytest

from proxy.config import load_settings
from proxy.errors import ConfigError
from proxy.guard.repair import StructuredOutputs
from proxy.guard.tool_errors import Client, ToolErrorTable


def test_flags_beat_environment_which_beats_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("max_errors: 3\nport: 9001\nhost: 0.0.0.0\n")
    monkeypatch.setenv("TOOLSENTRY_PORT", "9002")
    monkeypatch.setenv("TOOLSENTRY_MAX_ERRORS", "4")
    settings = load_settings(config, max_errors=5)
    assert (settings.max_errors, settings.port, settings.host) == (5, 9002, "0.0.0.0")


def test_upstreams_come_from_the_environment_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "TOOLSENTRY_UPSTREAMS",
        '[{"name": "v", "base_url": "http://127.0.0.1:1/v1/", "models": ["m"]}]',
    )
    settings = load_settings()
    assert settings.upstreams[0].base_url == "http://127.0.0.1:1/v1"
    assert settings.upstreams[0].models == ["m"]


def test_a_missing_file_is_a_config_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.yaml"):
        load_settings(tmp_path / "missing.yaml")


def test_secrets_survive_the_hand_over_to_workers_but_not_the_printout() -> None:
    settings = load_settings(admin_key="s3cret", api_keys=["k1"])
    assert "s3cret" in settings.to_json_with_secrets()
    assert "s3cret" not in str(settings.redacted())


def test_structured_outputs_on_and_off_mean_themselves_in_yaml_and_enforce_strict_is_off(
    tmp_path: Path,
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "upstreams:\n"
        "  - {name: a, base_url: 'http://127.0.0.1:1/v1', structured_outputs: off}\n"
        "  - {name: b, base_url: 'http://127.0.0.1:2/v1', structured_outputs: on}\n"
        "  - {name: c, base_url: 'http://127.0.0.1:3/v1'}\n"
    )
    settings = load_settings(config)
    assert [u.structured_outputs for u in settings.upstreams] == [
        StructuredOutputs.OFF,
        StructuredOutputs.ON,
        StructuredOutputs.AUTO,
    ]
    assert settings.enforce_strict is False
    with pytest.raises(ConfigError, match="structured_outputs"):
        load_settings(
            upstreams=[
                {
                    "name": "a",
                    "base_url": "http://127.0.0.1:1/v1",
                    "structured_outputs": "sometimes",
                }
            ]
        )


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ("sk-abc", ["sk-abc"]),
        ("sk-a, sk-b", ["sk-a", "sk-b"]),
        ('["sk-a", "sk-b"]', ["sk-a", "sk-b"]),
    ],
)
def test_api_keys_come_from_the_environment_as_one_value_a_list_or_json(
    monkeypatch: pytest.MonkeyPatch, keys: str, expected: list[str]
) -> None:
    monkeypatch.setenv("TOOLSENTRY_API_KEYS", keys)
    assert [k.key.get_secret_value() for k in load_settings().api_keys] == expected


def test_an_upstream_comes_from_the_environment_as_a_plain_url(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TOOLSENTRY_UPSTREAMS", "http://127.0.0.1:1/v1,http://127.0.0.1:2/v1")
    upstreams = load_settings().upstreams
    assert [(u.name, u.base_url) for u in upstreams] == [
        ("127.0.0.1:1#0", "http://127.0.0.1:1/v1"),
        ("127.0.0.1:2#1", "http://127.0.0.1:2/v1"),
    ]


def test_broken_json_in_the_environment_is_a_config_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TOOLSENTRY_UPSTREAMS", '[{"name": "v"')
    with pytest.raises(ConfigError, match="TOOLSENTRY_UPSTREAMS is not valid JSON"):
        load_settings()


def test_tool_error_patterns_come_from_the_file_and_a_bad_one_is_a_config_error(
    tmp_path: Path,
) -> None:
    path = tmp_path / "toolsentry.yaml"
    path.write_text(
        "tool_errors:\n  - pattern: '^FAILED'\n    clients: [codex]\n    apis: [responses]\n"
    )
    [rule] = load_settings(path).tool_errors
    assert (rule.clients, rule.apis) == (["codex"], ["responses"])
    assert rule.compiled().applies(Client.CODEX, "responses")
    path.write_text("tool_errors:\n  - pattern: '(unclosed'\n")
    with pytest.raises(ConfigError, match=r"tool_errors\.0\.pattern.*not a regular expression"):
        load_settings(path)
    path.write_text("tool_errors:\n  - pattern: x\n    clients: [cursor]\n")
    with pytest.raises(ConfigError, match=r"tool_errors\.0\.clients"):
        load_settings(path)


def test_the_tool_errors_example_in_the_docs_loads_and_reads_its_forms(tmp_path: Path) -> None:
    doc = (Path(__file__).parents[2] / "docs" / "tool-errors.md").read_text(encoding="utf-8")
    example = tmp_path / "toolsentry.yaml"
    example.write_text(doc.split("```yaml\n")[1].split("```")[0])
    settings = load_settings(example)
    table = ToolErrorTable(settings.tool_error_prefix, [p.compiled() for p in settings.tool_errors])
    assert table.judge(Client.OTHER, "chat")("Traceback (most recent call last):\n", None)
    assert table.judge(Client.CODEX, "responses")("apply_patch verification failed: x", None)
    assert not table.judge(Client.OTHER, "chat")("apply_patch verification failed: x", None)
    assert table.judge(Client.CLAUDE_CODE, "messages")("cat: x: Permission denied", False)


@pytest.mark.parametrize("given", ["auto", "AUTO"])
def test_workers_auto_is_one_worker_per_cpu_this_process_may_run_on(
    given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpus = len(os.sched_getaffinity(0))
    assert load_settings(workers=given).workers == cpus
    monkeypatch.setenv("TOOLSENTRY_WORKERS", given)
    assert load_settings().workers == cpus
    monkeypatch.delenv("TOOLSENTRY_WORKERS")
    config = tmp_path / "c.yaml"
    config.write_text(f"workers: {given}\n")
    assert load_settings(config).workers == cpus


def test_workers_is_a_count_or_auto() -> None:
    assert load_settings(workers="3").workers == 3
    with pytest.raises(ConfigError, match="workers"):
        load_settings(workers="all")


@pytest.mark.parametrize(
    ("variable", "expected"),
    [
        ("strip", "strip"),
        (
            '{"default": "reject", "unknown_tool": "strip"}',
            {"default": "reject", "unknown_tool": "strip"},
        ),
    ],
    ids=["one-value", "per-channel"],
)
def test_on_unrepaired_comes_from_the_environment_as_one_value_or_a_mapping(
    monkeypatch: pytest.MonkeyPatch, variable: str, expected: object
) -> None:
    monkeypatch.setenv("TOOLSENTRY_ON_UNREPAIRED", variable)
    assert load_settings().on_unrepaired == expected


def test_exhaustion_status_comes_from_the_environment_as_one_status_or_per_protocol(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TOOLSENTRY_EXHAUSTION_STATUS", "429")
    assert load_settings().exhaustion_status == 429
    monkeypatch.setenv("TOOLSENTRY_EXHAUSTION_STATUS", '{"responses": 429}')
    assert load_settings().exhaustion_status == {"responses": 429}


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"on_unrepaired": {"unknown_tol": "strip"}}, "unknown channel 'unknown_tol'"),
        ({"on_unrepaired": {"default": "drop"}}, "should be 'passthrough', 'strip' or 'reject'"),
        ({"exhaustion_status": 200}, "a refusal's status is a 4xx"),
        ({"exhaustion_status": {"responses": 503}}, "a refusal's status is a 4xx"),
    ],
)
def test_a_setting_of_what_a_client_gets_that_names_nothing_known_stops_the_proxy(
    overrides: dict[str, object], named: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        load_settings(**overrides)
    assert named in str(raised.value)
