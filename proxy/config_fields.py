"""The settings as the command line and the reference see them: each setting of a model with
where it lives, its flag, its variable and how its value is shown (`fields_of`; `proxy.config`'s
`settings_fields` lists the proxy's own)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

ENV_PREFIX = "TOOLSENTRY_"


def one_line(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class SettingInfo:
    """One setting: where it lives in the model and how it is spelled as a flag and a variable.

    `kind` is `flag` (one value), `switch` (a boolean: --x/--no-x), `repeat` (a list of values,
    the flag repeated) or `file` (structured: YAML, or JSON in the environment, only).
    """

    path: tuple[str, ...]
    field: FieldInfo
    kind: Literal["flag", "switch", "repeat", "file"]
    metavar: str

    @property
    def key(self) -> str:
        """The YAML key, dotted for a section's setting: `shadow.sample`."""
        return ".".join(self.path)

    @property
    def env(self) -> str:
        """The environment variable: `TOOLSENTRY_SHADOW_SAMPLE`."""
        return ENV_PREFIX + "_".join(self.path).upper()

    @property
    def flag(self) -> str | None:
        """The command-line flag, None for a `file` setting: `--shadow-sample`."""
        return None if self.kind == "file" else "--" + "-".join(self.path).replace("_", "-")

    @property
    def description(self) -> str:
        return one_line(self.field.description or "")

    @property
    def default(self) -> str:
        """The default as the reference and `--help` print it."""
        return shown(self.field.get_default(call_default_factory=True))


def shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, list):
        return ",".join(shown(v) for v in value) if value else "none"
    if isinstance(value, dict):
        return ", ".join(f"{shown(k)}: {shown(v)}" for k, v in value.items())
    if isinstance(value, BaseModel):
        return "see below"
    return str(value)


def _scalar_metavar(annotation: Any) -> str | None:
    """How a one-value setting's flag names its value, None when it is not one value."""
    if annotation is bool:
        return ""
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "|".join(str(m.value) for m in annotation)
    if get_origin(annotation) is Literal:
        return "|".join(str(a) for a in get_args(annotation))
    names = {int: "INTEGER", float: "NUMBER", str: "TEXT", SecretStr: "SECRET", Path: "PATH"}
    return names.get(annotation)


def without_none(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, UnionType):
        rest = [a for a in get_args(annotation) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return annotation


def fields_of(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[SettingInfo]:
    """Every setting of `model`, in the model's order, a section's (a nested model's) settings in
    its place. Derived from the model, so a setting added there is a flag, a variable and a line
    of the reference without more code."""
    out: list[SettingInfo] = []
    for name, field in model.model_fields.items():
        path = (*prefix, name)
        annotation = without_none(field.annotation)
        metavar = _scalar_metavar(annotation)
        if metavar is None and get_origin(annotation) in (Union, UnionType):
            # One value or a mapping (on_unrepaired): the flag gives the one value.
            metavar = _scalar_metavar(get_args(annotation)[0])
        extra = field.json_schema_extra
        if metavar is not None and isinstance(extra, dict) and "metavar" in extra:
            metavar = str(extra["metavar"])  # a value the type alone does not say (`auto`)
        if metavar is not None:
            out.append(
                SettingInfo(path, field, "switch" if annotation is bool else "flag", metavar)
            )
            continue
        if get_origin(annotation) is list:
            (item,) = get_args(annotation) or (Any,)
            item_metavar = _scalar_metavar(item)
            if item_metavar:
                out.append(SettingInfo(path, field, "repeat", item_metavar))
                continue
        if not prefix and isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out += fields_of(annotation, path)
            continue
        out.append(SettingInfo(path, field, "file", "JSON"))
    return out
