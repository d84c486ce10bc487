import copy
import json
from typing import Any

import jsonschema_rs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evalkit.domains.retail.tools import RetailTools
from evalkit.domains.telecom.tools import TelecomTools
from evalkit.domains.telecom.user_tools import TelecomUserTools
from proxy.guard.strict import StrictForm, restore, restore_calls, strict_form
from proxy.guard.toolcheck import compile_tools

BILLS = {
    "type": "object",
    "properties": {"customer_id": {"type": "string"}, "limit": {"type": "integer"}},
    "required": ["customer_id"],
}
PLAIN = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
DOMAIN_TOOLS = [
    tool["function"]
    for kit in (RetailTools, TelecomTools, TelecomUserTools)
    for tool in kit.openai_tools()
]


def valid(schema: Any, value: object) -> bool:
    return bool(jsonschema_rs.validator_for(schema, validate_formats=False).is_valid(value))


def assert_strict(schema: dict[str, Any]) -> None:
    """What strict function calling asks of every object: closed, every property required."""
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        if "properties" in node:
            assert node["additionalProperties"] is False, node
            assert sorted(node["required"]) == sorted(node["properties"]), node
        stack.extend(
            v for k, v in node.items() if k not in ("enum", "const", "default", "examples")
        )


# --- what is converted, and how ---------------------------------------------------------------------


def test_optional_property_becomes_required_and_nullable_and_objects_are_closed() -> None:
    declared = {
        "type": "object",
        "properties": {"customer_id": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["customer_id"],
    }
    form = strict_form(declared)
    assert form.convertible
    assert form.placeholders
    assert form.schema == {
        "type": "object",
        "properties": {
            "customer_id": {"type": "string"},
            "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        },
        "required": ["customer_id", "limit"],
        "additionalProperties": False,
    }
    assert declared["required"] == ["customer_id"]  # the declared schema is not changed


def test_already_strict_schema_is_kept_as_it_is_without_placeholders() -> None:
    declared = {
        "type": "object",
        "properties": {"q": {"type": "string", "description": "what to find"}},
        "required": ["q"],
        "additionalProperties": False,
    }
    assert strict_form(declared) == StrictForm(declared, None, False)


def test_nested_objects_and_arrays_of_objects_are_converted() -> None:
    item = {"type": "object", "properties": {"sku": {"type": "string"}, "n": {"type": "integer"}}}
    declared = {
        "type": "object",
        "properties": {"items": {"type": "array", "items": item, "minItems": 1}},
        "required": ["items"],
    }
    form = strict_form(declared)
    assert form.schema is not None
    converted_item = form.schema["properties"]["items"]["items"]
    assert converted_item["required"] == ["sku", "n"]
    assert converted_item["additionalProperties"] is False
    assert_strict(form.schema)


def test_no_parameters_and_empty_properties_become_a_closed_empty_object() -> None:
    closed_empty = {
        "type": "object",
        "properties": {},
        "required": [],
        "additionalProperties": False,
    }
    assert strict_form(None).schema == closed_empty
    assert strict_form({}).schema == closed_empty
    assert strict_form({"type": "object", "properties": {}}).schema == closed_empty


def test_local_refs_into_strict_definitions_are_kept_and_definitions_converted() -> None:
    declared = {
        "type": "object",
        "properties": {"address": {"$ref": "#/$defs/Address"}},
        "required": ["address"],
        "$defs": {
            "Address": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            }
        },
    }
    form = strict_form(declared)
    assert form.schema is not None
    assert form.schema["$defs"]["Address"]["additionalProperties"] is False
    assert valid(form.schema, {"address": {"city": "Oslo"}})
    assert not valid(form.schema, {"address": {"city": "Oslo", "zip": "0150"}})


@pytest.mark.parametrize(
    ("declared", "reason"),
    [
        (
            {"type": "object", "properties": {"m": {"type": "object"}}, "required": ["m"]},
            "/properties/m is an object with free-form keys",
        ),
        (
            {
                "type": "object",
                "properties": {
                    "m": {"type": "object", "additionalProperties": {"type": "integer"}}
                },
            },
            "/properties/m is an object with free-form keys",
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "string"}},
                "additionalProperties": {"type": "string"},
            },
            "/ gives additionalProperties a schema of its own",
        ),
        ({"type": "object", "properties": {"a": {}}, "minProperties": 1}, "/ uses minProperties"),
        (
            {"type": "object", "properties": {"a": {}}, "dependentRequired": {"a": ["b"]}},
            "/ uses dependentRequired",
        ),
        (
            {"type": "object", "properties": {"a": {}}, "allOf": [{"required": ["a"]}]},
            "/ uses allOf",
        ),
        ({"type": "object", "patternProperties": {"^x": {}}}, "/ uses patternProperties"),
        (
            {
                "type": "object",
                "properties": {
                    "a": {
                        "anyOf": [{"type": "object", "properties": {"b": {}}}, {"type": "string"}]
                    }
                },
            },
            "/properties/a/anyOf/0 leaves 'b' optional inside a branch or definition",
        ),
        (
            {"type": "object", "properties": {"a": {}}, "required": ["b"]},
            "/ requires b, which it does not declare",
        ),
        ({"type": "string"}, "its parameters are not an object schema"),
    ],
)
def test_schemas_that_cannot_be_strict_without_changing_meaning_are_left_with_the_reason(
    declared: dict[str, Any], reason: str
) -> None:
    form = strict_form(declared)
    assert form.schema is None
    assert form.reason is not None
    assert form.reason.startswith(reason)


def test_every_domain_tool_is_converted_or_left_with_a_reason() -> None:
    results = {tool["name"]: strict_form(tool.get("parameters")) for tool in DOMAIN_TOOLS}
    loose = {name: form.reason for name, form in results.items() if not form.convertible}
    # telecom's user tool takes a free-form settings object: that is the one tool left as declared
    assert loose == {
        "set_apn_settings": "/properties/apn_settings is an object with free-form keys"
    }
    for form in results.values():
        if form.schema is not None:
            assert_strict(form.schema)


# --- restore -------------------------------------------------------------------------------------


def test_restore_drops_the_placeholder_nulls_of_optional_properties_only() -> None:
    declared = {
        "type": "object",
        "properties": {
            "id": {"type": ["string", "null"]},
            "limit": {"type": "integer"},
            "note": {"type": ["string", "null"]},
            "rows": {
                "type": "array",
                "items": {"type": "object", "properties": {"k": {"type": "string"}}},
            },
        },
        "required": ["id"],
    }
    arguments = {"id": None, "limit": None, "note": None, "rows": [{"k": None}, {"k": "a"}]}
    assert restore(arguments, declared) == {"id": None, "note": None, "rows": [{}, {"k": "a"}]}
    untouched = {"id": "x", "limit": 3}
    assert restore(untouched, declared) is untouched


# --- the property: strict answers are answers the declared schema accepts -------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=2), inner, max_size=2)
    ),
    max_leaves=4,
)


def answers(schema: Any) -> st.SearchStrategy[Any]:
    """Values for the schema subset a strict form is written in: what a grammar-decoding
    upstream may answer. Each drawn value is checked against the strict form by the test."""
    if schema is True or schema == {}:
        return _json
    if "anyOf" in schema:
        return st.one_of([answers(branch) for branch in schema["anyOf"]])
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([answers({**schema, "type": k}) for k in kind])
    if kind == "object":
        properties = schema["properties"]
        return st.fixed_dictionaries(
            {name: answers(properties[name]) for name in schema["required"]}
        )
    if kind == "array":
        return st.lists(answers(schema.get("items", True)), max_size=schema.get("maxItems", 3))
    if kind == "string":
        return st.text(max_size=schema.get("maxLength", 6))
    if kind == "integer":
        return st.integers(schema.get("minimum"), schema.get("maximum"))
    if kind == "number":
        return st.floats(allow_nan=False, allow_infinity=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    raise AssertionError(f"no answers for {schema}")


_leaf = st.sampled_from(
    [
        {"type": "string"},
        {"type": "string", "maxLength": 4},
        {"type": "string", "enum": ["a", "b"]},
        {"type": "integer", "minimum": 0, "maximum": 9},
        {"type": "number"},
        {"type": "boolean"},
        {"type": ["string", "null"]},
        {"const": 3},
        {},
    ]
)


def _object(children: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        names: list[str] = draw(st.lists(st.sampled_from("abcde"), unique=True, max_size=4))
        properties = {name: draw(children) for name in names}
        flags: list[bool] = draw(st.lists(st.booleans(), min_size=len(names), max_size=len(names)))
        required = [name for name, flag in zip(names, flags, strict=True) if flag]
        schema: dict[str, Any] = {"type": "object", "properties": properties}
        if required or draw(st.booleans()):
            schema["required"] = required
        if draw(st.booleans()):
            schema["additionalProperties"] = draw(st.sampled_from([True, False]))
        if draw(st.booleans()):
            schema["description"] = "generated"
        return schema

    return build()


def _strict_object(children: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return _object(children).map(lambda s: {**s, "required": list(s["properties"])})


_schemas = st.recursive(
    _leaf,
    lambda children: st.one_of(
        _object(children),
        st.builds(lambda items: {"type": "array", "items": items, "maxItems": 3}, children),
        st.builds(
            lambda a, b: {"anyOf": [a, b]},
            _strict_object(_leaf),
            st.sampled_from([{"type": "string"}, {"type": "integer"}]),
        ),
    ),
    max_leaves=8,
)
_tool_parameters = _object(_schemas)


def _assert_strict_answers_are_declared_answers(
    declared: dict[str, Any], data: st.DataObject
) -> None:
    pristine = copy.deepcopy(declared)
    form = strict_form(declared)
    assert declared == pristine
    if form.schema is None:
        assert form.reason
        return
    assert_strict(form.schema)
    answer = data.draw(answers(form.schema), label="strict answer")
    assert valid(form.schema, answer)
    restored = restore(answer, declared)
    assert valid(declared, restored), (answer, restored)
    if not form.placeholders:
        assert restored is answer
        assert valid(declared, answer)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(declared=_tool_parameters, data=st.data())
def test_every_answer_valid_under_a_generated_strict_form_is_valid_under_the_declared_schema(
    declared: dict[str, Any], data: st.DataObject
) -> None:
    _assert_strict_answers_are_declared_answers(declared, data)


@settings(
    max_examples=len(DOMAIN_TOOLS) * 4, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(tool=st.sampled_from(DOMAIN_TOOLS), data=st.data())
def test_every_answer_valid_under_a_domain_tools_strict_form_is_valid_under_its_declared_schema(
    tool: dict[str, Any], data: st.DataObject
) -> None:
    _assert_strict_answers_are_declared_answers(tool["parameters"], data)


def test_restore_calls_restores_only_calls_to_tools_whose_strict_form_has_placeholders() -> None:
    tools = [
        {"type": "function", "function": {"name": "bills", "parameters": BILLS}},
        {"type": "function", "function": {"name": "plain", "parameters": PLAIN}},
    ]
    index = compile_tools(tools)
    forms = {"bills": strict_form(BILLS), "plain": strict_form(PLAIN)}
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "a",
                "type": "function",
                "function": {"name": "bills", "arguments": '{"customer_id": "C1", "limit": null}'},
            },
            {
                "id": "b",
                "type": "function",
                "function": {"name": "plain", "arguments": '{"q": "x"}'},
            },
            {"id": "c", "type": "function", "function": {"name": "bills", "arguments": "[1"}},
        ],
    }
    before = copy.deepcopy(message)
    restored = restore_calls(message, forms, index)
    assert message == before
    calls = restored["tool_calls"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"customer_id": "C1"}
    assert calls[0]["id"] == "a"
    assert (
        calls[1:] == before["tool_calls"][1:]
    )  # no placeholders there; not JSON is left to validation
    untouched: dict[str, Any] = {"role": "assistant", "content": "hi"}
    assert restore_calls(untouched, forms, index) is untouched
    valid_only = {"role": "assistant", "tool_calls": before["tool_calls"][1:]}
    assert restore_calls(valid_only, forms, index) is valid_only
