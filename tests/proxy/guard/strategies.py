"""Hypothesis strategies: tool parameter schemas in the shapes agents declare, and arguments for them.

`object_schemas()` draws an object schema (properties of strings with lengths, enums, patterns and
formats, bounded integers and numbers, booleans, arrays, nested objects; `required`;
`additionalProperties`), sometimes declaring draft-07. `instances(schema)` draws arguments that
satisfy it; `json_values()` draws anything JSON.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

DRAFT_07 = "http://json-schema.org/draft-07/schema#"
# Anchored at the start only: Python's `$` also matches before a final newline, ECMA-262's does
# not, and the reference validator uses Python's engine.
PATTERNS = ("^[a-z]{2,5}_[0-9]{1,4}", "^#W[0-9]{7}", "[A-Z][0-9]{3}")
NAMES = st.sampled_from(
    ["order_id", "user_id", "reason", "amount", "items", "address", "zip", "note", "a/b", "t~1"]
)
FORMATS = ("email", "date", "uri")

_text = st.text(max_size=12)
_small_ints = st.integers(min_value=-(2**40), max_value=2**40)
_floats = st.floats(allow_nan=False, allow_infinity=False, width=64)


def _string_schemas() -> st.SearchStrategy[dict[str, Any]]:
    lengths = st.tuples(st.integers(0, 3), st.integers(0, 8)).map(
        lambda t: {"minLength": t[0], "maxLength": t[0] + t[1]}
    )
    return st.one_of(
        st.just({"type": "string"}),
        lengths.map(lambda extra: {"type": "string", **extra}),
        st.lists(_text, min_size=1, max_size=4, unique=True).map(
            lambda values: {"type": "string", "enum": values}
        ),
        st.sampled_from(PATTERNS).map(lambda pattern: {"type": "string", "pattern": pattern}),
        st.sampled_from(FORMATS).map(lambda fmt: {"type": "string", "format": fmt}),
    )


def _number_schemas() -> st.SearchStrategy[dict[str, Any]]:
    bounds = st.tuples(st.integers(-1000, 1000), st.integers(0, 1000))
    return st.one_of(
        st.just({"type": "integer"}),
        bounds.map(lambda b: {"type": "integer", "minimum": b[0], "maximum": b[0] + b[1]}),
        st.just({"type": "number"}),
        bounds.map(
            lambda b: {"type": "number", "exclusiveMinimum": b[0], "maximum": b[0] + b[1] + 1}
        ),
        st.just({"type": "boolean"}),
    )


def _leaf_schemas() -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(_string_schemas(), _number_schemas())


@st.composite
def _object_schema(draw: st.DrawFn, children: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    properties = draw(st.dictionaries(NAMES, children, min_size=1, max_size=4))
    required = draw(st.lists(st.sampled_from(sorted(properties)), unique=True))
    schema: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
    closed = draw(st.sampled_from([True, False, None]))
    if closed is not None:
        schema["additionalProperties"] = not closed
    return schema


def _array_schema(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    sizes = st.tuples(st.integers(0, 2), st.integers(0, 3))
    return st.tuples(children, sizes).map(
        lambda t: {
            "type": "array",
            "items": t[0],
            "minItems": t[1][0],
            "maxItems": t[1][0] + t[1][1],
        }
    )


def _any_schema() -> st.SearchStrategy[dict[str, Any]]:
    return st.recursive(
        _leaf_schemas(),
        lambda children: st.one_of(_object_schema(children), _array_schema(children)),
        max_leaves=8,
    )


@st.composite
def object_schemas(draw: st.DrawFn) -> dict[str, Any]:
    """A tool's `parameters`: an object schema, sometimes declaring draft-07."""
    schema: dict[str, Any] = draw(_object_schema(_any_schema()))
    if draw(st.booleans()):
        schema = {"$schema": DRAFT_07, **schema}
    return schema


def instances(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values that satisfy `schema` (one drawn from `object_schemas`)."""
    kind = schema.get("type")
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if kind == "string":
        if "pattern" in schema:
            return st.from_regex(schema["pattern"])
        if "format" in schema:
            return st.sampled_from(["ana@example.com", "2024-05-01", "https://example.com/x"])
        return st.text(min_size=schema.get("minLength", 0), max_size=schema.get("maxLength", 12))
    if kind == "integer":
        return st.integers(schema.get("minimum", -(2**40)), schema.get("maximum", 2**40))
    if kind == "number":
        low = schema.get("exclusiveMinimum")
        high = schema.get("maximum")
        ints = st.integers(
            low + 1 if low is not None else -(2**40), high if high is not None else 2**40
        )
        floats = st.floats(
            low, high, exclude_min=low is not None, allow_nan=False, allow_infinity=False
        )
        return st.one_of(ints, floats)
    if kind == "boolean":
        return st.booleans()
    if kind == "array":
        return st.lists(
            instances(schema["items"]), min_size=schema["minItems"], max_size=schema["maxItems"]
        )
    return _object_instances(schema)


@st.composite
def _object_instances(draw: st.DrawFn, schema: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, child in schema["properties"].items():
        if name in schema["required"] or draw(st.booleans()):
            out[name] = draw(instances(child))
    return out


def json_values() -> st.SearchStrategy[Any]:
    """Any JSON value (integers kept within 64 bits, as a JSON parser returns them)."""
    scalars = st.one_of(st.none(), st.booleans(), _small_ints, _floats, _text)
    return st.recursive(
        scalars,
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.dictionaries(st.one_of(NAMES, _text), children, max_size=4),
        ),
        max_leaves=10,
    )


def wrong_type_value(schema: dict[str, Any]) -> Any:
    """A value no schema of this shape accepts: of a JSON type the schema does not allow."""
    kind = schema.get("type")
    if kind == "string":
        return 12345
    if kind in ("integer", "number"):
        return "12"
    if kind == "boolean":
        return "true"
    if kind == "array":
        return {"not": "a list"}
    return ["not", "an", "object"]
