"""The lenient schema dialect: the spellings real tool lists use, read as the JSON Schema their
authors meant, and what is left to check of a schema that still does not compile."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.guard.dialect import (
    TYPE_ALIASES,
    FallbackReason,
    Uncompilable,
    normalise,
    partial_schema,
    read_leniently,
)
from proxy.guard.toolcheck import compile_tools
from tests.proxy.guard.builders import make_tool
from tests.proxy.guard.strategies import object_schemas

PROPERTY_SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def loose(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    """A BFCL-style declaration's `parameters`: a `dict` of properties."""
    schema: dict[str, Any] = {"type": "dict", "properties": properties}
    if required is not None:
        schema["required"] = required
    return schema


# --- normalise ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spelling", "meant"),
    [
        ("dict", "object"),
        ("float", "number"),
        ("double", "number"),
        ("long", "integer"),
        ("int", "integer"),
        ("tuple", "array"),
        ("list", "array"),
        ("String", "string"),
        ("STRING", "string"),  # Gemini's OpenAPI subset
        ("Boolean", "boolean"),
        ("HashMap", "object"),
        ("ArrayList", "array"),
        ("Array", "array"),
        ("char", "string"),
        ("str", "string"),
        ("bool", "boolean"),
    ],
)
def test_a_type_spelled_in_python_java_or_javascript_reads_as_its_json_schema_type(
    spelling: str, meant: str
) -> None:
    read = normalise(loose({"x": {"type": spelling, "description": "d"}}))
    assert read.schema == {
        "type": "object",
        "properties": {"x": {"type": meant, "description": "d"}},
    }
    assert read.unknown_types == ()


@pytest.mark.parametrize("spelling", ["any", "Any", "", "unknown"])
def test_a_type_that_means_any_value_is_no_type_constraint(spelling: str) -> None:
    assert normalise(loose({"x": {"type": spelling}})).schema["properties"]["x"] == {}


def test_a_list_of_types_is_read_member_by_member_and_any_member_lifts_the_constraint() -> None:
    read = normalise(
        loose({"a": {"type": ["String", "float", "number"]}, "b": {"type": ["any", "int"]}})
    )
    assert read.schema["properties"] == {"a": {"type": ["string", "number"]}, "b": {}}


def test_required_true_on_a_property_moves_to_the_objects_required_list() -> None:
    read = normalise(
        loose(
            {
                "order_id": {"type": "string", "required": True},
                "note": {"type": "string", "required": False},
                "amount": {"type": "float"},
            },
            required=["amount"],
        )
    )
    assert read.schema == {
        "type": "object",
        "properties": {
            "order_id": {"type": "string"},
            "note": {"type": "string"},
            "amount": {"type": "number"},
        },
        "required": ["amount", "order_id"],
    }


def test_required_true_is_read_at_every_depth() -> None:
    nested = {"type": "dict", "properties": {"zip": {"type": "String", "required": True}}}
    read = normalise({"type": "object", "properties": {"address": {**nested, "required": True}}})
    assert read.schema == {
        "type": "object",
        "properties": {
            "address": {
                "type": "object",
                "properties": {"zip": {"type": "string"}},
                "required": ["zip"],
            }
        },
        "required": ["address"],
    }


def test_nullable_lets_null_through_as_openapi_3_means() -> None:
    read = normalise(loose({"x": {"type": "STRING", "nullable": True, "enum": ["a"]}}))
    assert read.schema["properties"]["x"] == {
        "type": ["string", "null"],
        "nullable": True,
        "enum": ["a", None],
    }


def test_a_default_of_null_lets_null_through_as_pythons_optional_arguments_mean() -> None:
    read = normalise(loose({"x": {"type": "float", "default": None}}))
    assert read.schema["properties"]["x"] == {"type": ["number", "null"], "default": None}
    already = {"type": "object", "properties": {"x": {"type": ["string", "null"], "default": None}}}
    assert normalise(already).schema is already


def test_a_list_of_item_schemas_is_prefix_items_unless_the_schema_names_its_draft() -> None:
    tuple_form = {"type": "tuple", "items": [{"type": "float"}, {"type": "float"}]}
    assert normalise(loose({"point": tuple_form})).schema["properties"]["point"] == {
        "type": "array",
        "prefixItems": [{"type": "number"}, {"type": "number"}],
    }
    draft_07 = {"$schema": "http://json-schema.org/draft-07/schema#", **loose({"p": tuple_form})}
    assert normalise(draft_07).schema["properties"]["p"]["items"] == [
        {"type": "number"},
        {"type": "number"},
    ]


def test_names_and_values_that_only_look_like_types_are_left_as_they_are() -> None:
    schema = {
        "type": "object",
        "properties": {
            "type": {"type": "string", "enum": ["dict", "float"], "default": "dict"},
            "required": {"type": "boolean"},
        },
        "examples": [{"type": "dict"}],
    }
    read = normalise(schema)
    assert read.schema is schema


def test_every_schema_keyword_that_holds_schemas_is_read() -> None:
    schema = {
        "anyOf": [{"type": "float"}],
        "$defs": {"Point": {"type": "tuple"}},
        "items": {"type": "long"},
        "additionalProperties": {"type": "double"},
        "not": {"type": "String"},
        "patternProperties": {"^x": {"type": "dict"}},
    }
    assert normalise(schema).schema == {
        "anyOf": [{"type": "number"}],
        "$defs": {"Point": {"type": "array"}},
        "items": {"type": "integer"},
        "additionalProperties": {"type": "number"},
        "not": {"type": "string"},
        "patternProperties": {"^x": {"type": "object"}},
    }


def test_spellings_the_table_does_not_know_are_reported_and_left_for_the_validator() -> None:
    read = normalise(
        loose({"when": {"type": "datetime"}, "p": {"type": "Point"}, "q": {"type": "Point"}})
    )
    assert read.unknown_types == ("datetime", "Point")
    assert read.schema["properties"]["when"] == {"type": "datetime"}


def test_the_alias_table_maps_only_to_json_schema_types() -> None:
    standard = {"string", "number", "integer", "boolean", "object", "array", "null"}
    assert set(TYPE_ALIASES.values()) <= standard | {None}
    assert all(spelling == spelling.lower() for spelling in TYPE_ALIASES)


@given(object_schemas())
@PROPERTY_SETTINGS
def test_a_standard_schema_is_returned_as_the_very_object_given(schema: dict[str, Any]) -> None:
    assert normalise(schema).schema is schema


@given(st.sampled_from(["dict", "float", "any", "String", "tuple"]), object_schemas())
@PROPERTY_SETTINGS
def test_the_declared_schema_is_never_changed(spelling: str, inner: dict[str, Any]) -> None:
    schema = loose({"a": {"type": spelling, "required": True}, "b": inner})
    before = copy.deepcopy(schema)
    normalise(schema)
    assert schema == before


# --- calls under the intended meaning -----------------------------------------------------------

# Each spelling, the values its authors meant it to take, and a value of another kind. Written
# from what the spellings mean in their languages, not from the alias table.
_JSON_OBJECTS = st.dictionaries(
    st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3
)
MEANT: dict[str, tuple[st.SearchStrategy[Any], Any]] = {
    "dict": (_JSON_OBJECTS, "an object"),
    "HashMap": (_JSON_OBJECTS, ["a list"]),
    "float": (st.floats(allow_nan=False, allow_infinity=False) | st.integers(), "1.5"),
    "double": (st.floats(allow_nan=False, allow_infinity=False), True),
    "long": (st.integers(), "12"),
    "int": (st.integers(), 1.5),
    "String": (st.text(max_size=8), 12),
    "char": (st.text(min_size=1, max_size=1), 1),
    "Boolean": (st.booleans(), "true"),
    "tuple": (st.lists(st.integers(), max_size=3), {"an": "object"}),
    "ArrayList": (st.lists(st.text(max_size=3), max_size=3), "a,b"),
    "Array": (st.lists(st.integers(), max_size=3), 3),
    "any": (st.integers() | st.text() | st.none() | st.lists(st.integers()) | _JSON_OBJECTS, None),
}


@st.composite
def loose_declarations(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """A loose declaration, arguments valid under its intended meaning, and each property's
    spelling."""
    names = draw(st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=5, unique=True))
    spellings = {name: draw(st.sampled_from(sorted(MEANT))) for name in names}
    case = draw(st.sampled_from(["as written", "lower", "upper"]))
    spelled = {
        n: s.lower() if case == "lower" else s.upper() if case == "upper" else s
        for n, s in spellings.items()
    }
    properties = {n: {"type": spelled[n], "description": n} for n in names}
    required = draw(st.lists(st.sampled_from(names), unique=True))
    arguments = {n: draw(MEANT[s][0]) for n, s in spellings.items()}
    return loose(properties, required), arguments, spellings


@given(loose_declarations())
@PROPERTY_SETTINGS
def test_a_call_valid_under_the_intended_meaning_is_never_flagged(
    drawn: tuple[dict[str, Any], dict[str, Any], dict[str, str]],
) -> None:
    parameters, arguments, _ = drawn
    index = compile_tools([make_tool("t", parameters=parameters)])
    assert index.fallbacks == ()
    assert index.check("t", arguments) == []


@given(loose_declarations(), st.data())
@PROPERTY_SETTINGS
def test_a_value_of_another_kind_or_a_missing_required_key_is_still_flagged(
    drawn: tuple[dict[str, Any], dict[str, Any], dict[str, str]], data: st.DataObject
) -> None:
    parameters, arguments, spellings = drawn
    index = compile_tools([make_tool("t", parameters=parameters)])
    typed = sorted(n for n, s in spellings.items() if s != "any")
    if typed:
        name = data.draw(st.sampled_from(typed))
        wrong = {**arguments, name: MEANT[spellings[name]][1]}
        assert [e.pointer for e in index.check("t", wrong)] == [f"/{name}"]
    for name in parameters.get("required", []):
        missing = {k: v for k, v in arguments.items() if k != name}
        assert [e.pointer for e in index.check("t", missing)] == [f"/{name}"]


# --- what is left of a schema that does not compile ----------------------------------------------


def compiles_only_standard_types(schema: dict[str, Any]) -> Uncompilable | None:
    """A stand-in validator: refuses a type outside JSON Schema's, a `$ref` without its target."""
    text = repr(schema)
    if "'Point'" in text:
        return Uncompilable("'Point' is not a type")
    if "#/$defs/" in text and "$defs" not in schema:
        return Uncompilable("no $defs", unresolved_ref=True)
    return None


def test_a_schema_that_does_not_compile_keeps_every_property_that_does() -> None:
    schema = {
        "type": "object",
        "properties": {
            "at": {"type": "Point"},
            "zip": {"type": "string"},
            "home": {"$ref": "#/$defs/Address"},
        },
        "required": ["at", "zip", 7],
        "$defs": {"Address": {"type": "object"}},
    }
    assert partial_schema(schema, compiles_only_standard_types) == {
        "type": "object",
        "properties": {"at": {}, "zip": {"type": "string"}, "home": {"$ref": "#/$defs/Address"}},
        "required": ["at", "zip"],
        "$defs": {"Address": {"type": "object"}},
    }


def test_a_property_whose_reference_leads_nowhere_is_left_unchecked() -> None:
    schema = {"type": "object", "properties": {"home": {"$ref": "#/$defs/Address"}}}
    assert partial_schema(schema, compiles_only_standard_types)["properties"] == {"home": {}}


def test_a_tool_checked_in_part_says_why_and_still_checks_the_rest() -> None:
    parameters = loose(
        {
            "at": {"type": "Point"},
            "amount": {"type": "float"},
            "id": {"type": "long", "required": True},
        }
    )
    index = compile_tools([make_tool("t", parameters=parameters)])
    [fallback] = index.fallbacks
    assert (fallback.tool, fallback.reason) == ("t", FallbackReason.UNKNOWN_TYPE)
    assert fallback.detail == "unknown type 'Point'"
    assert index.check("t", {"id": 1, "at": [1, 2], "amount": 2}) == []
    assert [e.pointer for e in index.check("t", {"id": "1", "at": 0})] == ["/id"]
    assert [e.pointer for e in index.check("t", {"amount": 1.5})] == ["/id"]
    assert [e.pointer for e in index.check("t", {"id": 1, "amount": "1.5"})] == ["/amount"]


def test_read_leniently_compiles_a_standard_schema_as_it_is() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    seen: list[dict[str, Any]] = []

    def compile(candidate: dict[str, Any]) -> str:
        seen.append(candidate)
        return "compiled"

    assert read_leniently("t", schema, compile) == (schema, "compiled", None)
    assert len(seen) == 1
    assert seen[0] is schema
