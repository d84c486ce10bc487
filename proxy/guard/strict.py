"""Strict forms of a tool's JSON Schema, for asking an upstream to decode a call under a grammar.

OpenAI's strict function calling (and every server that follows it) wants each object closed
(`additionalProperties: false`) and every property listed in `required`. `strict_form` rewrites a
tool's `parameters` into that form when it can do so without letting through an argument object
the declared schema rejects, and otherwise says why it cannot:

- An optional property becomes required and nullable (`anyOf: [its schema, {"type": "null"}]`),
  so a strict answer writes `null` where the model leaves it out. `restore` removes those nulls
  again before the call is checked or reaches the client, so that every object valid under the
  strict form is, once restored, valid under the declared schema (tested by property).
- Objects are closed. An object with no `properties` (a free-form map: `{"type": "object"}`,
  `additionalProperties: {schema}`, `patternProperties`) would be closed to `{}` only, which
  changes its meaning: such a tool is left as declared.
- Keywords whose meaning depends on which keys are present (`minProperties`, `dependentRequired`,
  `if`, `allOf`, `not`, …) are not rewritten: such a tool is left as declared.
- Inside `anyOf`/`oneOf` branches and `$defs`, an object must already list every property as
  required (a null there could not be told apart from a branch's own value, nor followed through
  a `$ref`); otherwise the tool is left as declared.

Pure: no I/O; the declared schema is never changed.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from proxy.guard.toolcheck import ToolIndex

# Keywords that constrain a value without depending on which keys an object has: they mean the
# same in the strict form.
_NEUTRAL: Final = frozenset(
    {
        "type",
        "description",
        "title",
        "default",
        "examples",
        "$comment",
        "$schema",
        "$id",
        "format",
        "pattern",
        "enum",
        "const",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "uniqueItems",
        "contentEncoding",
        "contentMediaType",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$ref",
    }
)
# Keywords the rewrite follows into.
_STRUCTURAL: Final = frozenset(
    {"properties", "required", "additionalProperties", "items", "prefixItems", "anyOf", "oneOf"}
)
_DEFINITIONS: Final = ("$defs", "definitions")


@dataclass(frozen=True, slots=True)
class StrictForm:
    """A tool's parameters as a strict upstream accepts them, or why it keeps its own.

    `schema` is the strict form (None when the tool is left as declared); `reason` says why it
    was left (None when converted); `placeholders` is true when some optional property became
    required-and-nullable, so answers must go through `restore`.
    """

    schema: dict[str, Any] | None
    reason: str | None = None
    placeholders: bool = False

    @property
    def convertible(self) -> bool:
        """Whether the tool can be declared strict."""
        return self.schema is not None


class _Unconvertible(Exception):
    """Raised inside the rewrite with the reason a schema cannot be made strict."""


def strict_form(parameters: Mapping[str, Any] | None) -> StrictForm:
    """The strict form of a tool's declared `parameters` (None or `{}`: no arguments).

    Returns a `StrictForm` whose schema is a new object (the declared one is not changed), or
    one with `schema=None` and the reason when it cannot be made strict without changing what it
    accepts.
    """
    if not parameters:
        return StrictForm(
            {"type": "object", "properties": {}, "required": [], "additionalProperties": False}
        )
    rewrite = _Rewrite()
    try:
        schema = rewrite.node(parameters, "", placeholders_allowed=True)
        if not _is_object(parameters):
            raise _Unconvertible("its parameters are not an object schema")
        for key in _DEFINITIONS:
            definitions = parameters.get(key)
            if isinstance(definitions, Mapping):
                schema[key] = {
                    name: rewrite.node(part, f"/{key}/{name}", placeholders_allowed=False)
                    for name, part in definitions.items()
                }
    except _Unconvertible as exc:
        return StrictForm(None, str(exc))
    except RecursionError:
        return StrictForm(None, "its parameters nest too deeply to rewrite")
    return StrictForm(schema, None, rewrite.placeholders)


def restore(arguments: object, parameters: Mapping[str, Any] | None) -> object:
    """`arguments` of a call decoded under the strict form, as the declared `parameters` mean them.

    Drops every `null` the strict form asked for in place of a property the declared schema
    leaves optional (unless the declared property itself allows `null`); follows `properties`
    and `items`. Returns a new value when something was dropped, else `arguments` itself.
    """
    if not isinstance(parameters, Mapping):
        return arguments
    if isinstance(arguments, dict):
        properties = parameters.get("properties")
        if not isinstance(properties, Mapping):
            return arguments
        required = _required(parameters)
        out: dict[str, Any] = {}
        changed = False
        for key, value in arguments.items():
            declared = properties.get(key)
            if value is None and key not in required and not _allows_null(declared):
                changed = True
                continue
            restored = restore(value, declared) if isinstance(declared, Mapping) else value
            changed = changed or restored is not value
            out[key] = restored
        return out if changed else arguments
    if isinstance(arguments, list):
        items = parameters.get("items")
        if not isinstance(items, Mapping):
            return arguments
        restored_items = [restore(item, items) for item in arguments]
        if all(new is old for new, old in zip(restored_items, arguments, strict=True)):
            return arguments
        return restored_items
    return arguments


def restore_calls(
    message: dict[str, Any], forms: Mapping[str, StrictForm], index: ToolIndex
) -> dict[str, Any]:
    """`message` with each call to a tool of `forms` restored to its declared meaning.

    A call decoded under a strict form writes `null` for an optional property it leaves out;
    `restore` drops those, so that the call is checked, and reaches the
    client, as the declared schema means it. Arguments that are not a JSON object are left as
    they are (validation reports them). Returns a changed copy, or `message` itself when nothing
    changed.
    """
    if not forms:  # no tool was declared strict (a first attempt without enforce_strict)
        return message
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not any(form.placeholders for form in forms.values()):
        return message
    out_calls: list[object] = []
    changed = False
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        form = forms.get(name) if isinstance(name, str) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if form is None or not form.placeholders or not isinstance(arguments, str):
            out_calls.append(call)
            continue
        try:
            value = json.loads(arguments)
        except (ValueError, RecursionError):
            out_calls.append(call)
            continue
        restored = restore(value, index.schema(str(name)))
        if restored is value:
            out_calls.append(call)
            continue
        changed = True
        text = json.dumps(restored, ensure_ascii=False)
        out_calls.append({**call, "function": {**function, "arguments": text}})  # type: ignore[dict-item]
    if not changed:
        return message
    return {**message, "tool_calls": out_calls}


class _Rewrite:
    def __init__(self) -> None:
        self.placeholders = False

    def node(self, schema: object, where: str, *, placeholders_allowed: bool) -> Any:
        if isinstance(schema, bool):
            return schema
        if not isinstance(schema, Mapping):
            raise _Unconvertible(f"{where or '/'} is not a schema")
        unknown = sorted(
            key
            for key in schema
            if key not in _NEUTRAL and key not in _STRUCTURAL and key not in _DEFINITIONS
        )
        if unknown:
            raise _Unconvertible(
                f"{where or '/'} uses {', '.join(unknown)}, whose meaning depends on which keys are present"
            )
        if where and any(key in schema for key in _DEFINITIONS):
            raise _Unconvertible(f"{where} declares definitions below the top level")
        out = {key: copy.deepcopy(value) for key, value in schema.items() if key in _NEUTRAL}
        if _is_object(schema):
            out.update(self._object(schema, where, placeholders_allowed=placeholders_allowed))
        elif "additionalProperties" in schema or "properties" in schema or "required" in schema:
            raise _Unconvertible(f"{where or '/'} has object keywords but is not an object schema")
        if "items" in schema:
            out["items"] = self.node(
                schema["items"], f"{where}/items", placeholders_allowed=placeholders_allowed
            )
        if "prefixItems" in schema:
            parts = schema["prefixItems"]
            if not isinstance(parts, list):
                raise _Unconvertible(f"{where}/prefixItems is not a list of schemas")
            # restore does not follow tuple positions, so nothing in them may become a placeholder
            out["prefixItems"] = [
                self.node(part, f"{where}/prefixItems/{n}", placeholders_allowed=False)
                for n, part in enumerate(parts)
            ]
        for key in ("anyOf", "oneOf"):
            if key in schema:
                branches = schema[key]
                if not isinstance(branches, list):
                    raise _Unconvertible(f"{where}/{key} is not a list of schemas")
                out[key] = [
                    self.node(branch, f"{where}/{key}/{n}", placeholders_allowed=False)
                    for n, branch in enumerate(branches)
                ]
        return out

    def _object(
        self, schema: Mapping[str, Any], where: str, *, placeholders_allowed: bool
    ) -> dict[str, Any]:
        properties = schema.get("properties")
        extra = schema.get("additionalProperties", True)
        if not isinstance(properties, Mapping):
            if extra is False:
                # already closed: it accepts only {} and says so
                return {"properties": {}, "required": [], "additionalProperties": False}
            raise _Unconvertible(f"{where or '/'} is an object with free-form keys")
        if extra is not True and extra is not False and extra != {}:
            raise _Unconvertible(f"{where or '/'} gives additionalProperties a schema of its own")
        required = _required(schema)
        unknown_required = sorted(required - set(properties))
        if unknown_required:
            raise _Unconvertible(
                f"{where or '/'} requires {', '.join(unknown_required)}, which it does not declare"
            )
        converted: dict[str, Any] = {}
        for name, part in properties.items():
            value = self.node(
                part, f"{where}/properties/{name}", placeholders_allowed=placeholders_allowed
            )
            if name not in required:
                if not placeholders_allowed:
                    raise _Unconvertible(
                        f"{where or '/'} leaves '{name}' optional inside a branch or definition"
                    )
                self.placeholders = True
                value = {"anyOf": [value, {"type": "null"}]}
            converted[name] = value
        return {
            "properties": converted,
            "required": list(properties),
            "additionalProperties": False,
        }


def _is_object(schema: Mapping[str, Any]) -> bool:
    kind = schema.get("type")
    if kind == "object":
        return True
    if isinstance(kind, list) and "object" in kind:
        return True
    return kind is None and ("properties" in schema or "additionalProperties" in schema)


def _required(schema: Mapping[str, Any]) -> set[str]:
    required = schema.get("required")
    if not isinstance(required, list):
        return set()
    return {name for name in required if isinstance(name, str)}


def _allows_null(schema: object) -> bool:
    """Whether the declared property says it takes `null` (an explicit `null` is kept)."""
    if not isinstance(schema, Mapping):
        return schema is True
    kind = schema.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    enum = schema.get("enum")
    if isinstance(enum, list) and None in enum:
        return True
    if "const" in schema and schema["const"] is None:
        return True
    branches = [
        branch
        for key in ("anyOf", "oneOf")
        if isinstance(schema.get(key), list)
        for branch in schema[key]
    ]
    return any(_allows_null(branch) for branch in branches)
