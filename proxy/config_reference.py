"""docs/configuration.md, generated from the settings model: every setting with its flag,
environment variable, default and description, the command's own options, and the keys of each
structured setting's entries. `python -m proxy.config_reference > docs/configuration.md` writes it; a test keeps the
file equal to it."""

from __future__ import annotations

from typing import get_args

from pydantic import BaseModel

from proxy.config import settings_fields
from proxy.config_fields import one_line, shown, without_none


def _cell(text: str) -> str:
    return text.replace("|", "\\|") or " "


def reference() -> str:
    """docs/configuration.md: every setting with its flag, variable, default and description."""
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated from proxy/config.py by `python -m proxy.config_reference`; do not edit. -->",
        "",
        "Every setting can be given as a command-line flag of `toolsentry serve`, a `TOOLSENTRY_*`",
        "environment variable, or a key of the YAML file given with `--config`; precedence, highest",
        "first: flags, environment, file, defaults. A list is a repeated flag, and in the environment",
        'either JSON (`["a", "b"]`) or values separated by commas. Structured settings (marked',
        "*file*: their entries have several keys each, which a flag cannot spell) are YAML, or",
        "JSON in their environment variable, only; a list of plain client keys or base URLs may",
        "also be written comma-separated there. An invalid value stops the proxy with one line",
        "naming the setting (exit status 2).",
        "",
        "| Setting | Flag | Environment | Default | Description |",
        "| --- | --- | --- | --- | --- |",
    ]
    nested: list[tuple[str, type[BaseModel]]] = []
    for s in settings_fields():
        flag = f"`{s.flag} {s.metavar}`".replace(" `", "`") if s.flag else "*file*"
        if s.kind == "switch":
            flag = f"`{s.flag}`, `--no-{s.flag[2:]}`" if s.flag else flag
        lines.append(
            f"| `{s.key}` | {_cell(flag)} | `{s.env}` | `{_cell(s.default)}` | {_cell(s.description)} |"
        )
        items = get_args(without_none(s.field.annotation)) if s.kind == "file" else ()
        if len(items) == 1 and isinstance(items[0], type) and issubclass(items[0], BaseModel):
            nested.append((s.key, items[0]))
    lines += _command_options()
    for key, model in nested:
        lines += [
            "",
            f"## Entries of `{key}`",
            "",
            one_line(model.__doc__ or ""),
            "",
            "| Key | Default | Description |",
            "| --- | --- | --- |",
        ]
        lines += _entry_rows(model)
    return "\n".join(lines) + "\n"


def _command_options() -> list[str]:
    """The options of `toolsentry serve` that are not settings, as `--help` lists them."""
    import typer.main
    from typer.core import TyperGroup, TyperOption

    from proxy.cli import app, described

    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    settings = {"__".join(s.path) for s in settings_fields()}
    lines = [
        "",
        "## Options of `toolsentry serve` alone",
        "",
        "Not settings of the model: they say where the settings come from and what the command "
        "does with them.",
        "",
        "| Flag | Environment | Default | Description |",
        "| --- | --- | --- | --- |",
    ]
    for param in group.commands["serve"].params:
        if not isinstance(param, TyperOption) or param.name in settings or param.name == "help":
            continue
        long, *short = sorted(param.opts, key=len, reverse=True)
        flag = ", ".join(
            [f"`{long} {param.metavar or ''}`".replace(" `", "`"), *(f"`{s}`" for s in short)]
        )
        env = f"`{param.envvar}`" if isinstance(param.envvar, str) else " "
        lines.append(
            f"| {_cell(flag)} | {env} | `{shown(param.default)}` | "
            f"{_cell(described(param.help or ''))} |"
        )
    return lines


def _entry_rows(model: type[BaseModel], prefix: str = "") -> list[str]:
    """A table row per key of `model`, and after a key that is a model itself (an upstream's
    `tls`), a row per key of that one (`tls.verify`)."""
    rows = []
    for name, field in model.model_fields.items():
        default = (
            "required"
            if field.is_required()
            else shown(field.get_default(call_default_factory=True))
        )
        description = _cell(one_line(field.description or ""))
        rows.append(f"| `{prefix}{name}` | `{_cell(default)}` | {description} |")
        inner = without_none(field.annotation)
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            rows += _entry_rows(inner, f"{prefix}{name}.")
    return rows


if __name__ == "__main__":
    import sys

    if sys.argv[1:]:
        sys.exit("usage: python -m proxy.config_reference")
    sys.stdout.write(reference())
