"""Prometheus metrics (DESIGN §9), the per-model ranking of hallucinated tool names and the tools
whose schemas are checked only in part.

Hallucinated names are unbounded, so they are never labels; `UnknownToolStats` keeps a bounded
count per model for `GET /v1/stats/unknown-tools` instead, and `SchemaFallbackStats` the tools
behind `toolsentry_schema_fallbacks_total` for `GET /v1/stats/schema-fallbacks`. Every series carries the wire
protocol of its requests as the label `api` (`chat`, `responses`, `messages`).

With several worker processes (`serve --workers N`) each worker writes its values to files in
one directory (prometheus_client's multiprocess mode) and `/metrics`, whichever worker answers
it, sums them all. One process keeps its values in memory, as fast as plain counters.
"""

from __future__ import annotations

import enum
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
    values,
)
from prometheus_client import Counter as PromCounter

from proxy.errors import ConfigError
from proxy.guard.dialect import SchemaFallback

_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
)
_OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class CallOutcome(enum.StrEnum):
    """What became of a tool call the client received: the `outcome` label of
    `toolsentry_tool_calls_total`."""

    VALID = "valid"  # valid as the model made it (or as a strict tool's form restored it)
    REPAIRED = "repaired"  # a call of an answer repaired by a local fix or a re-ask
    INVALID = (
        "invalid"  # passed to the client with its violation (`on_unrepaired: passthrough|reject`)
    )
    STRIPPED = "stripped"  # removed from the answer (`on_unrepaired: strip`)


class RepairResult(enum.StrEnum):
    """How repairing one violation went: the `result` label of `toolsentry_repairs_total`, which
    counts only repairs tried (a violation under `repair: off` counts in `toolsentry_violations_total`
    alone)."""

    SUCCESS = "success"  # the answer the client got has no violation left
    FAILURE = "failure"  # violations remained after every repair allowed
    LOCAL_FIX = "local_fix"  # fixed in place, without asking the model again
    FALLBACK = "fallback"  # the upstream refused a constrained re-ask; it was re-asked plainly


@dataclass(frozen=True)
class Family:
    """A metric family as /metrics shows it: its name (a counter's samples add `_total`), its help
    line, its label names in the order `labels()` takes them, and a histogram's buckets."""

    name: str
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()

    def counter(self, registry: CollectorRegistry | None) -> PromCounter:
        return PromCounter(self.name, self.help, self.labels, registry=registry)

    def histogram(self, registry: CollectorRegistry | None) -> Histogram:
        return Histogram(self.name, self.help, self.labels, buckets=self.buckets, registry=registry)

    def gauge(self, registry: CollectorRegistry | None) -> Gauge:
        # Several workers: the live ones' values summed, as one process would count them.
        return Gauge(
            self.name, self.help, self.labels, registry=registry, multiprocess_mode="livesum"
        )


# Every family the proxy exposes. The dashboard, the alert rules and the tests read these names
# and labels: a change here is a change of the proxy's interface (DESIGN §9).
REQUESTS = Family(
    "toolsentry_requests",
    "Requests to the turn routes by final status (499: the client went away first).",
    ("model", "status", "api"),
)
TOOL_CALLS = Family(
    "toolsentry_tool_calls",
    "Tool calls delivered to clients, by outcome (valid, repaired, invalid, stripped).",
    ("model", "outcome", "api"),
)
VIOLATIONS = Family(
    "toolsentry_violations", "Violations found, by channel.", ("model", "channel", "api")
)
LEAKED_CALLS = Family(
    "toolsentry_leaked_calls",
    "Tool calls written as text instead of made, by wire format and where (content or reasoning).",
    ("model", "format", "where", "api"),
)
REPAIRS = Family(
    "toolsentry_repairs",
    "Repairs tried, per violation channel (result: success, failure, local_fix, fallback); a "
    "violation no repair was tried for (repair: off) is not counted here.",
    ("model", "channel", "result", "api"),
)
TRACE_SPANS_DROPPED = Family(
    "toolsentry_trace_spans_dropped",
    "Trace spans not delivered to the OTLP endpoint (reason: queue_full, export_failed).",
    ("reason",),
)
KEY_REQUESTS = Family(
    "toolsentry_key_requests",
    "Requests to the turn routes by client key (its configured name, never the key; only where "
    "api_keys are set) and final status.",
    ("key", "status"),
)
BUDGET_EXHAUSTED = Family(
    "toolsentry_budget_exhausted",
    "Sessions whose error budget ran out, each counted once: by the request whose failures "
    "spent its last unit (whatever the exhaustion policy).",
    ("model", "api"),
)
BUDGET_REFUSALS = Family(
    "toolsentry_budget_refusals",
    "Requests not sent upstream because their session's error budget was spent (reject: the "
    "refusal, at the protocol's exhaustion_status; finish: the closing answer); a session "
    "refused twice counts twice.",
    ("model", "api"),
)
SCHEMA_FALLBACKS = Family(
    "toolsentry_schema_fallbacks",
    "Requests with a tool whose schema the validator could not compile even in the lenient "
    "schema_dialect, by reason (unknown_type, unresolved_ref, invalid_schema): its calls are "
    "checked for the name, an object of arguments, the required keys and each property that "
    "compiles.",
    ("model", "reason"),
)
SESSION_STORE_ERRORS = Family(
    "toolsentry_session_store_errors",
    "Session store failures while serving a request, by phase: begin (the request was refused "
    "503 before it reached an upstream) or count (an answer's counts could not be written: "
    "the client got the protocol's error instead of the answer, or of the rest of its stream).",
    ("phase", "api"),
)
UPSTREAM_SECONDS = Family(
    "toolsentry_upstream_seconds",
    "Time spent waiting for upstreams, all attempts of a request together.",
    ("model", "api"),
    _LATENCY_BUCKETS,
)
OVERHEAD_SECONDS = Family(
    "toolsentry_overhead_seconds",
    "Time the proxy added: total minus upstream wait.",
    ("model", "api"),
    _OVERHEAD_BUCKETS,
)
SHADOW_PAIRS = Family(
    "toolsentry_shadow_pairs",
    "Shadow pairs by outcome (agree, diverge, primary_only, reference_only, both).",
    ("model", "reference", "outcome", "api"),
)
SHADOW_FAILURES = Family(
    "toolsentry_shadow_failures",
    "Shadowed answers that failed in a channel, per side (primary or reference).",
    ("model", "reference", "side", "channel", "api"),
)
SHADOW_DROPPED = Family(
    "toolsentry_shadow_dropped",
    "Shadow pairs dropped because max_in_flight shadow requests were running.",
    ("model", "reference", "api"),
)
SHADOW_SKIPPED = Family(
    "toolsentry_shadow_skipped",
    "Sampled requests not sent to the reference because they lean on state stored at the "
    "primary's upstream, by reason (previous_response_id, conversation, item_reference).",
    ("model", "reference", "reason", "api"),
)
SHADOW_ERRORS = Family(
    "toolsentry_shadow_errors",
    "Shadow requests without a usable reference answer, by kind (timeout, connect, "
    "status_N, invalid_answer, upstream, store).",
    ("model", "reference", "kind", "api"),
)
# The replicas of a deployment (proxy.upstream_replicas), by its upstream entry's name and the
# replica's URL without credentials or query: both come from the configuration, so are bounded.
# A deployment of one replica has none of these series (its requests take no detour).
REPLICA_OUTSTANDING = Family(
    "toolsentry_replica_outstanding",
    "Requests under way on each replica of a balanced deployment (the balancer picks the fewest).",
    ("upstream", "replica"),
)
REPLICA_TRIES = Family(
    "toolsentry_replica_tries",
    "Tries sent to each replica of a balanced deployment (a request retried counts each try).",
    ("upstream", "replica"),
)
REPLICA_COOLDOWNS = Family(
    "toolsentry_replica_cooldowns",
    "Cool-downs of each replica: a try failed before its answer's first byte (connection "
    "refused or reset, a timeout), and the replica was passed over for cooldown_seconds.",
    ("upstream", "replica"),
)


class Metrics:
    """The proxy's metric families, on a registry of their own (one per app, so tests can count).

    `multiprocess_dir`: the directory every worker of this proxy writes its values to. It must
    be the `PROMETHEUS_MULTIPROC_DIR` the process had before prometheus_client was imported
    (the library chooses where values live at import); the families are then registered nowhere,
    and `render` reads every worker's files.

    Raises:
        ConfigError: `multiprocess_dir` is given but prometheus_client was imported without
            `PROMETHEUS_MULTIPROC_DIR`.
    """

    def __init__(
        self, registry: CollectorRegistry | None = None, *, multiprocess_dir: str | None = None
    ) -> None:
        self.multiprocess_dir = multiprocess_dir
        r: CollectorRegistry | None
        if multiprocess_dir is not None:
            if values.ValueClass is values.MutexValue:
                raise ConfigError(
                    "multiprocess metrics need PROMETHEUS_MULTIPROC_DIR set before "
                    "prometheus_client is imported"
                )
            self.registry = CollectorRegistry(auto_describe=True)
            r = None
        else:
            self.registry = registry or CollectorRegistry(auto_describe=True)
            r = self.registry
        self.requests = REQUESTS.counter(r)
        self.tool_calls = TOOL_CALLS.counter(r)
        self.violations = VIOLATIONS.counter(r)
        self.leaked_calls = LEAKED_CALLS.counter(r)
        self.repairs = REPAIRS.counter(r)
        self.trace_spans_dropped = TRACE_SPANS_DROPPED.counter(r)
        self.budget_exhausted = BUDGET_EXHAUSTED.counter(r)
        self.budget_refusals = BUDGET_REFUSALS.counter(r)
        self.schema_fallbacks = SCHEMA_FALLBACKS.counter(r)
        self.schema_fallback_tools = SchemaFallbackStats()
        self.key_requests = KEY_REQUESTS.counter(r)
        self.session_store_errors = SESSION_STORE_ERRORS.counter(r)
        self._keys: dict[tuple[str, str], PromCounter] = {}
        self.upstream_seconds = UPSTREAM_SECONDS.histogram(r)
        self.overhead_seconds = OVERHEAD_SECONDS.histogram(r)
        self._models: dict[tuple[str, str], ModelSeries] = {}
        self.replica_outstanding = REPLICA_OUTSTANDING.gauge(r)
        self.replica_tries = REPLICA_TRIES.counter(r)
        self.replica_cooldowns = REPLICA_COOLDOWNS.counter(r)

    def for_model(self, model: str, api: str) -> ModelSeries:
        """The series of one model and protocol, resolved once and kept (both are bounded)."""
        series = self._models.get((model, api))
        if series is None:
            series = self._models[(model, api)] = ModelSeries(self, model, api)
        return series

    def for_key(self, key: str, status: str) -> PromCounter:
        """`toolsentry_key_requests_total{key, status}`, resolved once and kept (the key names are
        the configured ones)."""
        child = self._keys.get((key, status))
        if child is None:
            child = self._keys[(key, status)] = self.key_requests.labels(key, status)
        return child

    def count_schema_fallbacks(self, model: str, fallbacks: Sequence[SchemaFallback]) -> bool:
        """Count one request of `model` whose tools are checked only in part, once per reason,
        and keep its tools for `GET /v1/stats/schema-fallbacks`. True when its tool list was not
        seen before (to be logged once)."""
        for reason in dict.fromkeys(f.reason for f in fallbacks):
            self.schema_fallbacks.labels(model, reason.value).inc()
        return self.schema_fallback_tools.add(model, fallbacks)

    def render(self) -> bytes:
        """The exposition text for /metrics: this process's values, or every worker's summed."""
        if self.multiprocess_dir is None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=self.multiprocess_dir)  # type: ignore[no-untyped-call]
        return generate_latest(registry)


class ModelSeries:
    """The series every request of one model touches. `labels()` takes a lock, checks and
    converts its arguments on every call; these are looked up once per label value and kept.
    A series appears in /metrics when it is first used, as with `labels()`.
    """

    def __init__(self, metrics: Metrics, model: str, api: str) -> None:
        self._metrics = metrics
        self._model = model
        self._api = api
        self._requests: dict[str, PromCounter] = {}
        self._tool_calls: dict[CallOutcome, PromCounter] = {}
        self._upstream_seconds: Histogram | None = None
        self._overhead_seconds: Histogram | None = None

    def requests(self, status: str) -> PromCounter:
        """`toolsentry_requests_total{model, status, api}`."""
        child = self._requests.get(status)
        if child is None:
            child = self._requests[status] = self._metrics.requests.labels(
                self._model, status, self._api
            )
        return child

    def tool_calls(self, outcome: CallOutcome) -> PromCounter:
        """`toolsentry_tool_calls_total{model, outcome, api}`."""
        child = self._tool_calls.get(outcome)
        if child is None:
            child = self._metrics.tool_calls.labels(self._model, outcome, self._api)
            self._tool_calls[outcome] = child
        return child

    @property
    def upstream_seconds(self) -> Histogram:
        """`toolsentry_upstream_seconds{model, api}`."""
        if self._upstream_seconds is None:
            self._upstream_seconds = self._metrics.upstream_seconds.labels(self._model, self._api)
        return self._upstream_seconds

    @property
    def overhead_seconds(self) -> Histogram:
        """`toolsentry_overhead_seconds{model, api}`."""
        if self._overhead_seconds is None:
            self._overhead_seconds = self._metrics.overhead_seconds.labels(self._model, self._api)
        return self._overhead_seconds


class ModelLabels:
    """The `model` label of a request's metrics, bounded whatever clients send: a configured
    model (an upstream's `models`) by its name, any other `other`; where no upstream lists its
    models, the first `unlisted` names seen, then `other`. A request whose model is not known
    (refused before its body was read, or naming none) is labelled `""`."""

    def __init__(self, configured: Iterable[str], *, unlisted: int = 64) -> None:
        self._named = {"", *configured}
        self._room = 0 if len(self._named) > 1 else unlisted

    def __call__(self, model: object) -> str:
        """The label of a request's `model` (any JSON value as sent)."""
        name = model if isinstance(model, str) else ""
        if name in self._named:
            return name
        if self._room > 0:
            self._room -= 1
            self._named.add(name)
            return name
        return OTHER_MODEL


OTHER_MODEL = "other"
"""The `model` label of every model past the bound (see ModelLabels)."""


class UnknownToolStats:
    """Counts hallucinated tool names per model, keeping at most `max_names` names per model,
    and calls written as text per model and wire format (formats are a bounded set)."""

    def __init__(self, max_names: int = 1000) -> None:
        self._max_names = max_names
        self._counts: dict[str, Counter[str]] = {}
        self._leaks: dict[str, Counter[str]] = {}

    def add_leak(self, model: str, fmt: str) -> None:
        """Count one call by `model` written as text in wire format `fmt`."""
        self._leaks.setdefault(model, Counter())[fmt] += 1

    def add(self, model: str, name: str) -> None:
        """Count one call to the unknown tool `name` by `model`."""
        counts = self._counts.setdefault(model, Counter())
        if name in counts or len(counts) < self._max_names:
            counts[name] += 1

    def top(self, limit: int = 20) -> dict[str, Any]:
        """`{"models": {model: [{"name", "count"}, ...]}, "leaked_formats": {model: [{"format",
        "count"}, ...]}}`, most frequent first."""
        return {
            "models": {
                model: [{"name": n, "count": c} for n, c in counts.most_common(limit)]
                for model, counts in sorted(self._counts.items())
            },
            "leaked_formats": {
                model: [{"format": f, "count": c} for f, c in counts.most_common(limit)]
                for model, counts in sorted(self._leaks.items())
            },
        }


class SchemaFallbackStats:
    """The tools checked only in part (`proxy.guard.dialect`), per model: each with its reason,
    the validator's words and the requests that declared it; at most `max_tools` a model."""

    def __init__(self, max_tools: int = 1000, max_lists: int = 1024) -> None:
        self._max_tools = max_tools
        self._tools: dict[str, dict[tuple[str, str, str], int]] = {}
        # The fallbacks of the tool lists already reported, by identity: a compiled tool list
        # holds one tuple of them, shared by every request that sends that list. Each is kept
        # while remembered, so that its id is not reused.
        self._lists: OrderedDict[int, Sequence[SchemaFallback]] = OrderedDict()
        self._max_lists = max_lists

    def add(self, model: str, fallbacks: Sequence[SchemaFallback]) -> bool:
        """Count one request of `model` whose tools fell back; True when this tool list (its
        `ToolIndex.fallbacks`) was not seen before, so that it is logged once."""
        tools = self._tools.setdefault(model, {})
        for fallback in fallbacks:
            key = (fallback.tool, fallback.reason.value, fallback.detail)
            if key in tools or len(tools) < self._max_tools:
                tools[key] = tools.get(key, 0) + 1
        if id(fallbacks) in self._lists:
            self._lists.move_to_end(id(fallbacks))
            return False
        self._lists[id(fallbacks)] = fallbacks
        if len(self._lists) > self._max_lists:
            self._lists.popitem(last=False)
        return True

    def report(self, limit: int = 100) -> dict[str, Any]:
        """`{"models": {model: [{"tool", "reason", "detail", "requests"}, ...]}}`, most requests
        first."""
        models = {}
        for model, tools in sorted(self._tools.items()):
            ranked = sorted(tools.items(), key=lambda item: -item[1])[:limit]
            models[model] = [
                {"tool": tool, "reason": reason, "detail": detail, "requests": requests}
                for (tool, reason, detail), requests in ranked
            ]
        return {"object": "schema_fallbacks.stats", "models": models}


class ShadowMetrics:
    """The shadow comparison's families (proxy/shadow.py), on the registry of the proxy's
    `Metrics` (or, in multiprocess mode, in its files). The reference's name is a label: it
    comes from the configuration, so it is bounded."""

    def __init__(self, metrics: Metrics) -> None:
        r = None if metrics.multiprocess_dir is not None else metrics.registry
        self.pairs = SHADOW_PAIRS.counter(r)
        self.failures = SHADOW_FAILURES.counter(r)
        self.dropped = SHADOW_DROPPED.counter(r)
        self.skipped = SHADOW_SKIPPED.counter(r)
        self.errors = SHADOW_ERRORS.counter(r)
