"""Tool schemas as real tool lists write them, read as the JSON Schema their authors meant.

Function-calling datasets, API wrappers and agent frameworks declare `parameters` loosely:
`{"type": "dict"}`, properties typed `float`, `any`, `String`, `long`, `HashMap` (Python, Java and
JavaScript spellings), OpenAPI's `required: true` on a property, `nullable: true` or a `default`
of null on a type without null (Python's `x: float = None`), a `type` left out or empty. vLLM
takes them as plain objects and the model calls such tools; the guard must not be stricter than
the server it stands in front of.

`normalise` rewrites those spellings into a standard schema (a new object only where something
changed: a standard schema comes back as the very object given). `partial_schema` is what is left
to check of a schema that still does not compile: the arguments are an object holding the
required keys, and each property whose own schema compiles is checked against it.

`SchemaDialect` is the setting `schema_dialect`: `strict` refuses a schema the validator cannot
compile (400), `lenient` (the default) reads it this way. Pure: no I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

V = TypeVar("V")


class SchemaDialect(enum.StrEnum):
    """How the guard reads a tool's `parameters` (the setting `schema_dialect`)."""

    LENIENT = (
        "lenient"  # the common non-standard spellings too; what cannot compile is checked in part
    )
    STRICT = "strict"  # JSON Schema only: a schema that does not compile is refused with 400


class FallbackReason(enum.StrEnum):
    """Why a tool's schema was checked only in part: the `reason` label of
    `toolsentry_schema_fallbacks_total` (a bounded set)."""

    UNKNOWN_TYPE = "unknown_type"  # a `type` spelling the alias table does not know
    UNRESOLVED_REF = "unresolved_ref"  # a `$ref` that leads nowhere the validator can follow
    INVALID_SCHEMA = "invalid_schema"  # any other keyword the validator cannot compile


@dataclass(frozen=True, slots=True)
class SchemaFallback:
    """A tool whose schema the guard checks only in part, why, and the validator's own words."""

    tool: str
    reason: FallbackReason
    detail: str


class Uncompilable(Exception):
    """Raised by the compile function `read_leniently` is given when the validator cannot take a
    schema: its first line of explanation, and whether a `$ref` could not be followed. Never
    leaves the guard."""

    def __init__(self, message: str, *, unresolved_ref: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.unresolved_ref = unresolved_ref


JSON_TYPES: Final = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})

# Each spelling, lower-cased, and the JSON Schema type it means (None: any value). Decided from
# the Berkeley Function Calling Leaderboard's 3,526 declarations (`bfcl-eval`, the corpus test in
# tests/proxy/guard/test_dialect_corpus.py checks every spelling it uses is here), whose
# spellings by count are: dict 3,826, float 955, any 187, String 115, tuple 35, Array 13,
# HashMap 7, long 7, ArrayList 6, Boolean 4, double 1, char 1, "" 1 — and completed with the
# other names of the same primitives in the languages those come from.
TYPE_ALIASES: Final[Mapping[str, str | None]] = {
    **{name: name for name in JSON_TYPES},  # any case: Gemini's OpenAPI subset writes STRING
    # Python (typing and builtins)
    "str": "string",
    "int": "integer",
    "float": "number",
    "bool": "boolean",
    "dict": "object",
    "list": "array",
    "tuple": "array",
    "set": "array",
    "none": "null",
    "nonetype": "null",
    "any": None,
    # Java (primitives, boxes and the collections BFCL's Java tools use)
    "long": "integer",
    "short": "integer",
    "byte": "integer",
    "biginteger": "integer",
    "double": "number",
    "bigdecimal": "number",
    "char": "string",
    "character": "string",
    "arraylist": "array",
    "linkedlist": "array",
    "hashset": "array",
    "map": "object",
    "hashmap": "object",
    "linkedhashmap": "object",
    "treemap": "object",
    # JavaScript and TypeScript
    "bigint": "integer",
    "unknown": None,
    # OpenAPI 2: a form's file upload is sent as its content or its path
    "file": "string",
    # a type written but left empty
    "": None,
}

# The keywords whose value is a schema, a list of schemas, or a map of names to schemas.
_SCHEMA_VALUED: Final = frozenset(
    {
        "additionalProperties",
        "unevaluatedProperties",
        "unevaluatedItems",
        "contains",
        "propertyNames",
        "not",
        "if",
        "then",
        "else",
        "additionalItems",
    }
)
_SCHEMA_LISTS: Final = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_SCHEMA_MAPS: Final = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)
_READ: Final = _SCHEMA_VALUED | _SCHEMA_LISTS | _SCHEMA_MAPS | {"type", "items"}


@dataclass(frozen=True, slots=True)
class Normalised:
    """A schema read in the lenient dialect: `schema` (the object given when nothing changed),
    and the `type` spellings left as written because the alias table does not know them."""

    schema: dict[str, Any]
    unknown_types: tuple[str, ...] = ()


def normalise(schema: dict[str, Any]) -> Normalised:
    """`schema` with the non-standard spellings of `TYPE_ALIASES`, property-level `required:
    true`, OpenAPI's `nullable: true` (and a `default` of null, which means the same), and a
    list-valued `items` (when the schema names no `$schema`) rewritten as standard JSON Schema.

    Returns the very `schema` given when it is standard already; never changes it.
    """
    reader = _Reader(tuple_items="$schema" not in schema)
    return Normalised(reader.node(schema), tuple(dict.fromkeys(reader.unknown)))


class _Reader:
    def __init__(self, *, tuple_items: bool) -> None:
        self.unknown: list[str] = []
        self._tuple_items = tuple_items  # 2020-12: a list of item schemas is `prefixItems`

    def node(self, schema: object) -> Any:
        if not isinstance(schema, dict):
            return schema
        out: dict[str, Any] | None = None  # the copy, once something changes
        for key, value in schema.items():
            if key not in _READ:  # most keys of a schema (description, enum, …): nothing to read
                continue
            new = self._keyword(key, value)
            if new is not value:
                out = dict(schema) if out is None else out
                out[key] = new
        if out is not None and out.get("type", "") is _ANY:
            del out["type"]
        # A property's own `required: true` is its object's to list (read from `schema`, whose
        # properties still hold it); a flag left anywhere else means nothing.
        if isinstance(schema.get("required"), bool):
            out = dict(schema) if out is None else out
            del out["required"]
        flagged = _flagged(schema.get("properties"))
        if flagged:
            out = dict(schema) if out is None else out
            listed = out.get("required")
            names = [n for n in listed if isinstance(n, str)] if isinstance(listed, list) else []
            out["required"] = list(dict.fromkeys([*names, *flagged]))
        if self._tuple_items and isinstance(schema.get("items"), list):
            out = dict(schema) if out is None else out
            if "prefixItems" not in out:
                out["prefixItems"] = out.pop("items")
        if schema.get("nullable") is True or ("default" in schema and schema["default"] is None):
            changes = _null_allowed(schema if out is None else out)
            if changes:
                out = dict(schema) if out is None else out
                out.update(changes)
        return schema if out is None else out

    def _keyword(self, key: str, value: Any) -> Any:
        if key == "type":
            return self._type(value)
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            return _changed_only(value, {k: self.node(v) for k, v in value.items()})
        if key in _SCHEMA_LISTS or key == "items":
            if isinstance(value, list):
                return _changed_only(value, [self.node(v) for v in value])
            return self.node(value) if key == "items" else value
        if key in _SCHEMA_VALUED:
            return self.node(value)
        return value

    def _type(self, value: object) -> object:
        if isinstance(value, str):
            return self._one_type(value)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            return value  # not a type the validator takes either way: left for it to refuse
        read = [self._one_type(v) for v in value]
        if any(v is _ANY for v in read):
            return _ANY
        unique = list(dict.fromkeys(read))
        return value if unique == value else unique

    def _one_type(self, spelling: str) -> object:
        if spelling in JSON_TYPES:
            return spelling
        meant = TYPE_ALIASES.get(spelling.strip().lower(), _UNKNOWN)
        if meant is _UNKNOWN:
            self.unknown.append(spelling)
            return spelling
        return _ANY if meant is None else meant


_ANY: Final = object()  # the type of a spelling that means any value: the keyword is dropped
_UNKNOWN: Final = object()


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _flagged(properties: object) -> list[str]:
    """The properties that carry OpenAPI 2's `required: true` themselves."""
    if not isinstance(properties, dict):
        return []
    return [
        name
        for name, sub in properties.items()
        if isinstance(sub, dict) and sub.get("required") is True
    ]


def _changed_only(original: Any, rebuilt: Any) -> Any:
    """`rebuilt` where one of its members is a new object, else `original` itself."""
    members = rebuilt.values() if isinstance(rebuilt, dict) else rebuilt
    old = original.values() if isinstance(original, dict) else original
    return original if all(a is b for a, b in zip(members, old, strict=True)) else rebuilt


def _null_allowed(schema: dict[str, Any]) -> dict[str, Any]:
    """What to change so that `schema` takes null too, as OpenAPI 3's `nullable: true` (Gemini's
    schemas too) or a `default` of null (Python's `x: float = None`) means: empty when it does."""
    changes: dict[str, Any] = {}
    kind = schema.get("type")
    if isinstance(kind, str) and kind != "null":
        changes["type"] = [kind, "null"]
    elif isinstance(kind, list) and "null" not in kind:
        changes["type"] = [*kind, "null"]
    enum_values = schema.get("enum")
    if isinstance(enum_values, list) and None not in enum_values:
        changes["enum"] = [*enum_values, None]
    return changes


def read_leniently(
    tool: str, schema: dict[str, Any], compile: Callable[[dict[str, Any]], V]
) -> tuple[dict[str, Any], V, SchemaFallback | None]:
    """Tool `tool`'s `parameters` read in the lenient dialect: the schema the guard checks calls
    against, its compiled form (`compile` raises `Uncompilable`), and why it is checked only in
    part (None when it is checked whole).

    `compile` must take `{"type": "object", "required": [names]}`; nothing else is raised.
    """
    normalised = normalise(schema)
    try:
        return normalised.schema, compile(normalised.schema), None
    except Uncompilable as exc:
        if normalised.unknown_types:
            reason = FallbackReason.UNKNOWN_TYPE
            detail = f"unknown type {', '.join(map(repr, normalised.unknown_types))}"
        elif exc.unresolved_ref:
            reason, detail = FallbackReason.UNRESOLVED_REF, exc.message
        else:
            reason, detail = FallbackReason.INVALID_SCHEMA, exc.message

    def failure(candidate: dict[str, Any]) -> Uncompilable | None:
        try:
            compile(candidate)
        except Uncompilable as exc:
            return exc
        return None

    partial = partial_schema(normalised.schema, failure)
    try:
        compiled = compile(partial)
    except Uncompilable:  # the parts compile but not together: the required keys at least
        partial = {"type": "object", "required": partial["required"]}
        compiled = compile(partial)
    return partial, compiled, SchemaFallback(tool, reason, _clip(detail))


def partial_schema(
    schema: dict[str, Any], failure: Callable[[dict[str, Any]], Uncompilable | None]
) -> dict[str, Any]:
    """What can still be checked of `schema` (normalised) when it does not compile as a whole:
    an object holding its `required` keys, each property checked by its own schema where that
    compiles and unchecked (`{}`) where it does not. `failure` says why a schema does not
    compile (None when it does).

    Each property is compiled alone; those whose `$ref`s lead into the schema's `$defs` or
    `definitions` are compiled once more, together, beside them: the cost stays linear in the
    schema's size, however many properties fail.
    """
    listed = schema.get("required")
    required = [n for n in listed if isinstance(n, str)] if isinstance(listed, list) else []
    declared = schema.get("properties")
    properties: dict[str, Any] = {}
    referring: dict[str, Any] = {}
    for name, sub in declared.items() if isinstance(declared, dict) else ():
        why = failure({"type": "object", "properties": {name: sub}})
        properties[name] = sub if why is None else {}
        if why is not None and why.unresolved_ref:
            referring[name] = sub
    partial: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
    defs = {k: schema[k] for k in ("$defs", "definitions") if isinstance(schema.get(k), dict)}
    if referring and defs:
        beside = {"type": "object", "properties": referring, **defs}
        if failure(beside) is None:
            properties.update(referring)
            partial.update(defs)
    return partial
