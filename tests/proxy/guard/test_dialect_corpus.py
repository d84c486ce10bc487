"""The lenient schema dialect against real tool declarations: the Berkeley Function Calling
Leaderboard's (`bfcl-eval`, pinned in the Makefile's `corpus` target and read from its wheel in
.cache/corpus, never copied into the repository).

Over every distinct declaration, none is refused under the default dialect; the leaderboard's own
ground-truth calls that are valid under what their declarations mean (`meant`, written here from
the spellings' languages, not from the proxy's alias table) are never flagged; and a renamed tool,
a dropped required argument and a value of the wrong type are still detected, call for call as
the strict dialect detects them where it compiles the declaration (with its top-level `dict`
corrected, the one change the strict dialect needs for most of them).

The figures: `PYTHONPATH=$PWD .venv/bin/python -m tests.proxy.guard.test_dialect_corpus`.
"""

from __future__ import annotations

import ast
import functools
import json
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from proxy.errors import BadRequestError
from proxy.guard.channels import Channel
from proxy.guard.dialect import TYPE_ALIASES, SchemaDialect, normalise
from proxy.guard.toolcheck import GuardLimits, ToolIndex, compile_tools, validate
from tests.require import require

REPO = Path(__file__).resolve().parents[3]
WHEEL = REPO / ".cache" / "corpus" / "bfcl_eval-2026.3.23-py3-none-any.whl"
DATA = "bfcl_eval/data/"
STRICT = GuardLimits(schema_dialect=SchemaDialect.STRICT)
DEFAULT = GuardLimits()

# What each spelling the corpus uses means, as a test of a Python value parsed from JSON. Written
# from the languages the spellings come from; a spelling missing here is not judged.
_NUMBER = (int, float)
MEANT: dict[str, Callable[[Any], bool]] = {
    **dict.fromkeys(["string", "String", "char"], lambda v: isinstance(v, str)),
    **dict.fromkeys(
        ["integer", "long", "int"],
        lambda v: (
            not isinstance(v, bool)
            and (isinstance(v, int) or (isinstance(v, float) and v.is_integer()))
        ),
    ),
    **dict.fromkeys(
        ["float", "double", "number"],
        lambda v: isinstance(v, _NUMBER) and not isinstance(v, bool),
    ),
    **dict.fromkeys(["boolean", "Boolean", "bool"], lambda v: isinstance(v, bool)),
    **dict.fromkeys(["dict", "HashMap", "object"], lambda v: isinstance(v, dict)),
    **dict.fromkeys(
        ["array", "Array", "ArrayList", "tuple", "list"], lambda v: isinstance(v, list)
    ),
    **dict.fromkeys(["any", ""], lambda v: True),
}
# Values of each kind: a wrong type is the first of them that a property's type does not mean.
OTHER_KINDS: tuple[Any, ...] = ("12", 12345, True, {"an": "object"}, ["a list"])


def meant(schema: Any, value: Any) -> bool | None:
    """Whether `value` is what `schema` (a declaration's, as written) means: its type, `enum`,
    `required` keys and bounds, through properties and items, or null where the declared default
    is null; None where a spelling is unknown."""
    if not isinstance(schema, dict):
        return None
    if value is None and "default" in schema and schema["default"] is None:
        return True  # what the tool does without it: Python's `x: float = None`
    kind = schema.get("type", "any")
    test = MEANT.get(kind) if isinstance(kind, str) else None
    if test is None:
        return None
    checks: list[bool | None] = [test(value)]
    if "enum" in schema:
        checks.append(any(value == e and type(value) is type(e) for e in schema["enum"]))
    if isinstance(value, (int, float)) and "maximum" in schema:
        checks.append(value <= schema["maximum"])
    if isinstance(value, list):
        checks.append(len(value) >= schema.get("minItems", 0))
        checks.append(len(value) <= schema.get("maxItems", len(value)))
        checks.extend(meant(schema["items"], v) for v in value if "items" in schema)
    if isinstance(value, dict) and isinstance(schema.get("properties"), dict):
        checks.extend(name in value for name in schema.get("required", []))
        properties = schema["properties"]
        checks.extend(meant(properties[k], v) for k, v in value.items() if k in properties)
    if False in checks:
        return False
    return None if None in checks else True


@dataclass(frozen=True)
class GroundTruth:
    """One call of a ground-truth answer, and the tools its request declared."""

    category: str
    tools: tuple[str, ...]  # each declaration's canonical JSON
    name: str
    arguments: dict[str, Any]

    def declaration(self) -> dict[str, Any]:
        return by_name(self.tools)[self.name]


@functools.cache
def by_name(tools: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """The declarations of a tool list by name (the first of a name)."""
    declared: dict[str, dict[str, Any]] = {}
    for text in tools:
        function = json.loads(text)
        declared.setdefault(function["name"], function)
    return declared


@dataclass
class Corpus:
    declarations: dict[str, dict[str, Any]] = field(default_factory=dict)  # by canonical JSON
    tool_lists: set[tuple[str, ...]] = field(default_factory=set)
    calls: list[GroundTruth] = field(default_factory=list)


def canonical(declaration: dict[str, Any]) -> str:
    return json.dumps(declaration, sort_keys=True)


def as_tools(tools: tuple[str, ...], fix: bool = False) -> list[dict[str, Any]]:
    """A request's `tools`; `fix`: each top-level `dict` spelled `object`."""
    out = []
    for text in tools:
        function = json.loads(text)
        if fix and function.get("parameters", {}).get("type") == "dict":
            function["parameters"]["type"] = "object"
        out.append({"type": "function", "function": function})
    return out


def json_lines(archive: zipfile.ZipFile, name: str) -> Iterator[dict[str, Any]]:
    for line in archive.read(name).decode().splitlines():
        if line.strip():
            yield json.loads(line)


def chosen(options: Any) -> Any:
    """A value the leaderboard accepts for one argument: its first listed option that is not
    `""` (which means "may be left out"); a nested object's own arguments chosen alike."""
    if not isinstance(options, list):  # a few nested values are given as they are
        return options
    return _arguments_of(next((o for o in options if o != ""), ""))


def _arguments_of(value: Any) -> Any:
    """A value whose nested objects, in lists too, list options for each of their keys."""
    if isinstance(value, dict):
        return {k: chosen(v) for k, v in value.items() if chosen(v) != ""}
    if isinstance(value, list):
        return [_arguments_of(v) if isinstance(v, dict) else v for v in value]
    return value


def python_call(text: str) -> tuple[str, dict[str, Any]] | None:
    """`cd(folder='document')` as a name and arguments; None for anything but keyword literals."""
    try:
        node = ast.parse(text, mode="eval").body
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return None
        return node.func.id, {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
    except (SyntaxError, ValueError):
        return None


@functools.cache
def load() -> Corpus:
    if not WHEEL.exists():
        require(
            "corpus",
            f"the bfcl-eval wheel is not at {WHEEL.relative_to(REPO)}: `make corpus` downloads it "
            "(pip download bfcl-eval==2026.3.23 --no-deps -d .cache/corpus)",
        )
    corpus = Corpus()
    with zipfile.ZipFile(WHEEL) as archive:
        names = [n for n in archive.namelist() if n.startswith(DATA) and n.endswith(".json")]
        per_class = _class_docs(archive)
        questions: dict[str, tuple[str, ...]] = {}
        for name in names:
            if "possible_answer/" in name or name.endswith("format_sensitivity.json"):
                continue
            for entry in json_lines(archive, name):
                functions = entry.get("function")
                if "multi_turn_func_doc/" in name:
                    functions = [entry]
                elif "involved_classes" in entry and not functions:
                    functions = [d for c in entry["involved_classes"] for d in per_class.get(c, [])]
                if not isinstance(functions, list) or not functions:
                    continue
                tools = tuple(canonical(f) for f in functions)
                corpus.declarations.update(zip(tools, functions, strict=True))
                corpus.tool_lists.add(tools)
                if "id" in entry:
                    questions[entry["id"]] = tools
        for name in names:
            if "possible_answer/" in name:
                corpus.calls.extend(_ground_truth(archive, name, questions))
    return corpus


def _class_docs(archive: zipfile.ZipFile) -> dict[str, list[dict[str, Any]]]:
    """The declarations of each multi-turn class, by the leaderboard's own mapping."""
    source = archive.read("bfcl_eval/constants/executable_backend_config.py").decode()
    tree = ast.parse(source)
    mapping: dict[str, str] = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and getattr(node.targets[0], "id", "") == "MULTI_TURN_FUNC_DOC_FILE_MAPPING"
    )
    return {
        cls: list(json_lines(archive, f"{DATA}multi_turn_func_doc/{file}"))
        for cls, file in mapping.items()
    }


def _ground_truth(
    archive: zipfile.ZipFile, name: str, questions: dict[str, tuple[str, ...]]
) -> Iterator[GroundTruth]:
    category = name.rsplit("/", 1)[-1].removesuffix(".json")
    for entry in json_lines(archive, name):
        tools = questions.get(entry["id"])
        if tools is None:
            continue
        declared = by_name(tools)
        for item in entry["ground_truth"]:
            if isinstance(item, dict):  # {name: {argument: [options]}}
                calls = [(n, {k: chosen(v) for k, v in a.items()}) for n, a in item.items()]
                calls = [(n, {k: v for k, v in a.items() if v != ""}) for n, a in calls]
            elif isinstance(item, list):  # one multi-turn step: Python call texts
                calls = [c for c in map(python_call, item) if c is not None]
            else:
                continue
            for call_name, arguments in calls:
                if call_name in declared:
                    yield GroundTruth(category, tools, call_name, arguments)


def flagged(index: ToolIndex, name: str, arguments: dict[str, Any]) -> list[Channel]:
    """The channels the guard reports for one call of `name` with `arguments`."""
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ],
    }
    return [v.channel for v in validate(message, None, index=index)]


@functools.cache
def compiled(
    tools: tuple[str, ...], limits: GuardLimits = DEFAULT, fix: bool = False
) -> ToolIndex | None:
    """The tool list compiled under `limits` (`fix`: each top-level `dict` spelled `object`),
    None where it is refused."""
    try:
        return compile_tools(as_tools(tools, fix), limits)
    except BadRequestError:
        return None


def mutations(call: GroundTruth) -> Iterator[tuple[str, str, dict[str, Any], Channel]]:
    """(kind, name, arguments, the channel expected) for each mutation of a valid call."""
    yield "renamed tool", f"{call.name}_renamed", call.arguments, Channel.UNKNOWN_TOOL
    parameters = call.declaration().get("parameters", {})
    required = [r for r in parameters.get("required", []) if r in call.arguments]
    if required:
        dropped = {k: v for k, v in call.arguments.items() if k != required[0]}
        yield "dropped required argument", call.name, dropped, Channel.SCHEMA_VIOLATION
    for key in call.arguments:
        declared = parameters.get("properties", {}).get(key, {})
        test = MEANT.get(declared.get("type", "any"))
        if test is None or "enum" in declared or all(test(v) for v in OTHER_KINDS):
            continue  # an enum rejects anything else anyway; an `any` takes every kind
        wrong = {**call.arguments, key: next(v for v in OTHER_KINDS if not test(v))}
        assert meant(parameters, wrong) is False
        yield "wrong type", call.name, wrong, Channel.SCHEMA_VIOLATION
        break


@dataclass
class Figures:
    declarations: int = 0
    non_standard: int = 0  # normalise changes them
    non_standard_below_top: int = 0  # still non-standard with the top-level `dict` corrected
    refused_strict: int = 0
    refused_strict_top_fixed: int = 0
    refused_default: int = 0
    fallbacks_default: int = 0
    tool_lists: int = 0
    tool_lists_refused_default: int = 0
    calls: int = 0
    checked: int = 0  # valid under `meant`
    not_meant: int = 0  # the leaderboard's code-as-text arguments (Java, JavaScript) and the like
    unjudged: int = 0
    flagged: list[GroundTruth] = field(default_factory=list)
    mutated: dict[str, list[int]] = field(default_factory=dict)  # kind: [cases, detected]
    compared: dict[str, list[int]] = field(default_factory=dict)  # kind: [cases, strict, lenient]


@functools.cache
def figures() -> Figures:
    corpus = load()
    out = Figures(declarations=len(corpus.declarations), tool_lists=len(corpus.tool_lists))
    for declaration in corpus.declarations.values():
        parameters = declaration.get("parameters", {})
        out.non_standard += normalise(parameters).schema is not parameters
        fixed = {**parameters, "type": "object"} if parameters.get("type") == "dict" else parameters
        out.non_standard_below_top += normalise(fixed).schema is not fixed
        text = (canonical(declaration),)
        out.refused_strict += compiled(text, STRICT) is None
        out.refused_strict_top_fixed += compiled(text, STRICT, fix=True) is None
        index = compiled(text)
        out.refused_default += index is None
        out.fallbacks_default += bool(index is not None and index.fallbacks)
    out.tool_lists_refused_default = sum(compiled(t) is None for t in corpus.tool_lists)
    for call in corpus.calls:
        out.calls += 1
        verdict = meant(call.declaration().get("parameters", {}), call.arguments)
        if verdict is None:
            out.unjudged += 1
            continue
        if verdict is False:
            out.not_meant += 1
            continue
        out.checked += 1
        lenient = compiled(call.tools)
        assert lenient is not None
        if flagged(lenient, call.name, call.arguments):
            out.flagged.append(call)
        strict = compiled(call.tools, STRICT, fix=True)
        for kind, name, arguments, channel in mutations(call):
            detected = channel in flagged(lenient, name, arguments)
            tally = out.mutated.setdefault(kind, [0, 0])
            tally[0] += 1
            tally[1] += detected
            if strict is not None:
                both = out.compared.setdefault(kind, [0, 0, 0])
                both[0] += 1
                both[1] += channel in flagged(strict, name, arguments)
                both[2] += detected
    return out


# --- the tests ----------------------------------------------------------------------------------


def test_the_corpus_holds_at_least_a_thousand_declarations_with_non_standard_spellings() -> None:
    found = figures()
    assert found.non_standard >= 1000
    assert found.non_standard_below_top >= 100  # `float`, `any`, nested `dict`, Java types, …


def test_every_spelling_the_corpus_uses_is_in_the_alias_table() -> None:
    spellings: set[str] = set()

    def walk(schema: Any) -> None:
        if isinstance(schema, dict):
            if isinstance(schema.get("type"), str):
                spellings.add(schema["type"])
            for sub in (schema.get("properties") or {}).values():
                walk(sub)
            walk(schema.get("items"))

    for declaration in load().declarations.values():
        walk(declaration.get("parameters"))
    assert {s for s in spellings if s.lower() not in TYPE_ALIASES} == set()


def test_no_declaration_of_the_corpus_is_refused_under_the_default_dialect() -> None:
    found = figures()
    assert found.refused_strict == found.non_standard  # what the strict dialect refused
    assert found.refused_default == 0
    assert found.tool_lists_refused_default == 0
    assert found.fallbacks_default == 0  # every one read whole, none checked only in part


def test_no_ground_truth_call_valid_under_its_declarations_meaning_is_flagged() -> None:
    found = figures()
    assert found.checked >= 3000
    assert [(c.category, c.name, c.arguments) for c in found.flagged] == []


@pytest.mark.parametrize("kind", ["renamed tool", "dropped required argument", "wrong type"])
def test_mutated_calls_are_detected_as_the_strict_dialect_detects_them(kind: str) -> None:
    found = figures()
    cases, detected = found.mutated[kind]
    assert cases >= 500
    assert detected == cases
    compared, strict, lenient = found.compared[kind]
    assert compared >= 300
    assert lenient == strict == compared


def report(found: Figures) -> str:
    lines = [
        f"declarations (distinct): {found.declarations}",
        f"  non-standard spellings: {found.non_standard}; still with the top-level dict "
        f"corrected: {found.non_standard_below_top}",
        f"  refused, strict: {found.refused_strict}; strict with the top-level dict corrected: "
        f"{found.refused_strict_top_fixed}; default (lenient): {found.refused_default} "
        f"({found.fallbacks_default} checked in part)",
        f"tool lists (distinct requests): {found.tool_lists}; refused under the default: "
        f"{found.tool_lists_refused_default}",
        f"ground-truth calls: {found.calls}; valid under their declaration's meaning (checked): "
        f"{found.checked}; flagged: {len(found.flagged)}; not as declared (code written as text, a string for an integer, …; not checked): "
        f"{found.not_meant}; not judged: {found.unjudged}",
    ]
    for kind, (cases, detected) in found.mutated.items():
        compared, strict, lenient = found.compared.get(kind, [0, 0, 0])
        lines.append(
            f"{kind}: detected {detected}/{cases}; where strict compiles: strict {strict}/"
            f"{compared}, lenient {lenient}/{compared}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(figures()))
