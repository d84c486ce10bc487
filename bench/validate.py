"""Which JSON Schema validator should check tool-call arguments? Measures it.

For a τ²-bench-sized tool set (retail and telecom-like tools: nested objects, arrays, enums,
patterns, required fields) this prints, per library, the cold cost of compiling every tool's
`parameters` and the warm cost of checking one call's arguments, both on valid arguments
(`is_valid`) and on invalid ones while collecting the first errors (what the proxy reports).
The last rows are the proxy's own costs: `compile_tools` (a cache miss compiles, a hit looks up
the tools by their JSON as sent) and `validate` per call with JSON parsing and error reporting.

    python -m bench.validate [--repeat 5]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import fastjsonschema
import jsonschema
import jsonschema_rs
import orjson

from proxy.guard import toolcheck

ID = {"type": "string", "minLength": 1}
ORDER_ID = {"type": "string", "pattern": r"^#W\d{7}$", "description": "e.g. '#W0000000'"}
ADDRESS = {
    "type": "object",
    "properties": {
        "address1": {"type": "string"},
        "address2": {"type": "string"},
        "city": {"type": "string"},
        "state": {"type": "string", "minLength": 2, "maxLength": 2},
        "country": {"type": "string", "enum": ["USA", "Canada"]},
        "zip": {"type": "string", "pattern": r"^\d{5}$"},
    },
    "required": ["address1", "address2", "city", "state", "country", "zip"],
    "additionalProperties": False,
}


def _tool(name: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.replace('_', ' ')}.",
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }


TOOLS: list[dict[str, Any]] = [
    _tool("find_user_id_by_email", {"email": {"type": "string", "format": "email"}}, ["email"]),
    _tool(
        "find_user_id_by_name_zip",
        {"first_name": ID, "last_name": ID, "zip": ADDRESS["properties"]["zip"]},
        ["first_name", "last_name", "zip"],
    ),
    _tool("get_user_details", {"user_id": ID}, ["user_id"]),
    _tool("get_order_details", {"order_id": ORDER_ID}, ["order_id"]),
    _tool(
        "get_product_details",
        {"product_id": {"type": "string", "pattern": r"^\d+$"}},
        ["product_id"],
    ),
    _tool("list_all_product_types", {}, []),
    _tool(
        "cancel_pending_order",
        {
            "order_id": ORDER_ID,
            "reason": {"type": "string", "enum": ["no longer needed", "ordered by mistake"]},
        },
        ["order_id", "reason"],
    ),
    _tool(
        "exchange_delivered_order_items",
        {
            "order_id": ORDER_ID,
            "item_ids": {"type": "array", "items": ID, "minItems": 1, "uniqueItems": True},
            "new_item_ids": {"type": "array", "items": ID, "minItems": 1},
            "payment_method_id": {
                "type": "string",
                "pattern": r"^(credit_card|paypal|gift_card)_\d+$",
            },
        },
        ["order_id", "item_ids", "new_item_ids", "payment_method_id"],
    ),
    _tool(
        "modify_pending_order_address",
        {"order_id": ORDER_ID, "address": ADDRESS},
        ["order_id", "address"],
    ),
    _tool("modify_user_address", {"user_id": ID, "address": ADDRESS}, ["user_id", "address"]),
    _tool(
        "return_delivered_order_items",
        {
            "order_id": ORDER_ID,
            "item_ids": {"type": "array", "items": ID, "minItems": 1},
            "payment_method_id": ID,
        },
        ["order_id", "item_ids", "payment_method_id"],
    ),
    _tool("calculate", {"expression": {"type": "string", "maxLength": 200}}, ["expression"]),
    _tool("transfer_to_human_agents", {"summary": {"type": "string"}}, ["summary"]),
    _tool(
        "get_bills_for_customer",
        {"customer_id": ID, "limit": {"type": "integer", "minimum": 1, "maximum": 50}},
        ["customer_id"],
    ),
    _tool(
        "suspend_line",
        {
            "customer_id": ID,
            "line_id": ID,
            "reason": {"type": "string", "enum": ["lost", "stolen", "travel", "other"]},
        },
        ["customer_id", "line_id", "reason"],
    ),
    _tool(
        "refuel_data",
        {
            "customer_id": ID,
            "line_id": ID,
            "gb_amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 2},
        },
        ["customer_id", "line_id", "gb_amount"],
    ),
    _tool(
        "send_payment_request",
        {
            "customer_id": ID,
            "bill_id": ID,
            "payment": {
                "type": "object",
                "properties": {
                    "method": {"type": "string", "enum": ["card", "bank", "credit"]},
                    "amount": {"type": "number", "minimum": 0},
                    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
                },
                "required": ["method", "amount"],
            },
        },
        ["customer_id", "bill_id", "payment"],
    ),
]

PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
_ADDR = {
    "address1": "1 Main St",
    "address2": "Apt 2",
    "city": "Austin",
    "state": "TX",
    "country": "USA",
    "zip": "78701",
}
VALID_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("find_user_id_by_email", {"email": "ana@example.com"}),
    ("get_user_details", {"user_id": "ana_4521"}),
    ("get_order_details", {"order_id": "#W1234567"}),
    ("cancel_pending_order", {"order_id": "#W1234567", "reason": "ordered by mistake"}),
    (
        "exchange_delivered_order_items",
        {
            "order_id": "#W7654321",
            "item_ids": ["1", "2"],
            "new_item_ids": ["3", "4"],
            "payment_method_id": "paypal_7",
        },
    ),
    ("modify_pending_order_address", {"order_id": "#W1234567", "address": _ADDR}),
    ("get_bills_for_customer", {"customer_id": "C100", "limit": 3}),
    ("refuel_data", {"customer_id": "C100", "line_id": "L1", "gb_amount": 1.5}),
    (
        "send_payment_request",
        {
            "customer_id": "C1",
            "bill_id": "B2",
            "payment": {"method": "card", "amount": 12.5, "tags": ["x"]},
        },
    ),
    ("list_all_product_types", {}),
]
INVALID_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("get_order_details", {"order_id": "W1234567"}),
    ("cancel_pending_order", {"order_id": "#W1234567", "reason": "changed my mind"}),
    (
        "exchange_delivered_order_items",
        {"order_id": "#W7654321", "item_ids": [], "payment_method_id": "cash"},
    ),
    (
        "modify_pending_order_address",
        {"order_id": "#W1234567", "address": {**_ADDR, "zip": 78701, "extra": 1}},
    ),
    ("refuel_data", {"customer_id": "C100", "line_id": "L1", "gb_amount": "2GB"}),
]


def _per_call_us(fn: Callable[[], None], calls: int, repeat: int) -> float:
    """Median µs per call over `repeat` runs of `fn` (which performs `calls` checks)."""
    fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - start) / 1000 / calls)
    return statistics.median(samples)


def _compile_ms(compile_one: Callable[[dict[str, Any]], Any], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter_ns()
        for schema in PARAMS.values():
            compile_one(schema)
        samples.append((time.perf_counter_ns() - start) / 1e6)
    return statistics.median(samples)


def _rs(schema: dict[str, Any]) -> Any:
    return jsonschema_rs.validator_for(
        schema,
        pattern_options=jsonschema_rs.FancyRegexOptions(backtrack_limit=10_000),
        offline=True,
    )


def _ref(schema: dict[str, Any]) -> Any:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema)


def _fast(schema: dict[str, Any]) -> Any:
    return fastjsonschema.compile(schema, use_formats=False)


def _fast_errors(fn: Callable[[Any], Any], args: Any) -> list[str]:
    try:
        fn(args)
    except fastjsonschema.JsonSchemaValueException as exc:
        return [exc.message]
    return []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeat", type=int, default=5, help="runs per figure; the median is printed"
    )
    parser.add_argument("--loops", type=int, default=200, help="passes over the call mix per run")
    opts = parser.parse_args()
    rep, loops = opts.repeat, opts.loops
    valid = VALID_CALLS * loops
    invalid = INVALID_CALLS * loops * 2

    libraries: dict[
        str,
        tuple[
            Callable[[dict[str, Any]], Any],
            Callable[[Any, Any], bool],
            Callable[[Any, Any], list[str]],
        ],
    ] = {
        "jsonschema (reference)": (
            _ref,
            lambda v, a: v.is_valid(a),
            lambda v, a: [e.message for e in v.iter_errors(a)][:3],
        ),
        "jsonschema-rs": (
            _rs,
            lambda v, a: v.is_valid(a),
            lambda v, a: [e.message for e in v.iter_errors(a)][:3],
        ),
        "fastjsonschema": (_fast, lambda v, a: not _fast_errors(v, a), _fast_errors),
    }
    rows = []
    for label, (compile_one, is_valid, errors) in libraries.items():
        compiled = {name: compile_one(schema) for name, schema in PARAMS.items()}

        def run_valid(compiled: dict[str, Any] = compiled, is_valid: Any = is_valid) -> None:
            for name, args in valid:
                assert is_valid(compiled[name], args)

        def run_invalid(compiled: dict[str, Any] = compiled, errors: Any = errors) -> None:
            for name, args in invalid:
                assert errors(compiled[name], args)

        rows.append(
            (
                label,
                _compile_ms(compile_one, rep),
                _per_call_us(run_valid, len(valid), rep),
                _per_call_us(run_invalid, len(invalid), rep),
            )
        )

    def message_for(name: str, args: dict[str, Any]) -> dict[str, Any]:
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": name, "arguments": orjson.dumps(args).decode()},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}

    valid_messages = [message_for(n, a) for n, a in valid]
    invalid_messages = [message_for(n, a) for n, a in invalid]
    index = toolcheck.compile_tools(TOOLS)

    def run_proxy_valid() -> None:
        for message in valid_messages:
            assert not toolcheck.validate(message, TOOLS, index=index)

    def run_proxy_invalid() -> None:
        for message in invalid_messages:
            assert toolcheck.validate(message, TOOLS, index=index)

    def compile_proxy_cold() -> None:
        toolcheck.clear_cache()
        toolcheck.compile_tools(TOOLS)

    def compile_proxy_hits() -> None:
        for _ in range(loops):
            toolcheck.compile_tools(TOOLS)

    rows.append(
        (
            "proxy: validate(message, index=…) per call",
            statistics.median(_timed_ms(compile_proxy_cold) for _ in range(rep)),
            _per_call_us(run_proxy_valid, len(valid_messages), rep),
            _per_call_us(run_proxy_invalid, len(invalid_messages), rep),
        )
    )
    hit_us = _per_call_us(compile_proxy_hits, loops, rep)

    libraries_used = ("jsonschema", "jsonschema-rs", "fastjsonschema")
    versions = ", ".join(f"{d} {importlib.metadata.version(d)}" for d in libraries_used)
    print(f"Python {platform.python_version()}; {versions}")
    print(
        f"{len(TOOLS)} tools; median of {rep} runs; warm figures per call over {len(valid)} valid / {len(invalid)} invalid calls"
    )
    header = f"{'validator':<52} {'cold compile (ms)':>18} {'warm valid (µs)':>16} {'warm invalid+errors (µs)':>25}"
    print(header)
    print("-" * len(header))
    for label, cold_ms, warm_ok, warm_bad in rows:
        print(f"{label:<52} {cold_ms:>18.2f} {warm_ok:>16.2f} {warm_bad:>25.2f}")
    print(f"proxy: compile_tools cache hit (once per request): {hit_us:.2f} µs")


def _timed_ms(fn: Callable[[], None]) -> float:
    start = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - start) / 1e6


if __name__ == "__main__":
    main()
