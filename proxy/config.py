"""The proxy's settings: one typed object, built at the edge (cli.py) and handed to the app factory.

Precedence, highest first: explicit overrides (command-line flags), `TOOLSENTRY_*` environment
variables, the YAML file given with `--config`, defaults. Nested values come from the environment
as JSON (`TOOLSENTRY_UPSTREAMS='[{"name": "vllm", "base_url": "http://127.0.0.1:8001/v1"}]'`).
"""

from __future__ import annotations

import ipaddress
import json
import os
from pathlib import Path
from typing import Any, ClassVar, Literal, get_origin
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from proxy.config_fields import ENV_PREFIX, SettingInfo, fields_of, one_line, without_none
from proxy.config_upstream import MASK, UpstreamConfig
from proxy.errors import EXHAUSTION_STATUS, ConfigError
from proxy.guard.dialect import SchemaDialect
from proxy.guard.repair import OnUnrepaired, RepairMode
from proxy.guard.tool_errors import (
    HEAD_CHARS,
    MAX_PATTERN_CHARS,
    Client,
    ToolErrorPattern,
    compile_pattern,
    tool_error_pattern,
)
from proxy.guard.unrepaired import DEFAULT_ON_UNREPAIRED, UnrepairedPolicy
from proxy.protocols.base import API
from proxy.session.budget import DEFAULT_SESSION_HEADERS, ExhaustionPolicy, SessionTracking

LogLevel = Literal["debug", "info", "warning", "error"]


class ShadowConfig(BaseModel):
    """Shadow comparison (DESIGN §11): a sample of sessions is answered by a reference upstream
    too, in the background, and the two answers' tool decisions are compared. Off while
    `reference` is unset. From the environment: `TOOLSENTRY_SHADOW_REFERENCE`,
    `TOOLSENTRY_SHADOW_SAMPLE`, … (one variable per field) or `TOOLSENTRY_SHADOW` as JSON."""

    model_config = ConfigDict(extra="forbid")

    reference: str | None = Field(
        default=None, description="Name of the upstream that answers the shadow copies."
    )
    models: list[str] = Field(
        default_factory=list,
        description="Models whose requests are shadowed; empty means all. Requests the reference "
        "upstream serves itself are never shadowed.",
    )
    sample: float = Field(
        default=0.05, ge=0.0, le=1.0, description="Share of sessions shadowed on every turn."
    )
    seed: int = Field(default=0, description="Which sessions the sample picks, deterministically.")
    max_in_flight: int = Field(
        default=16, ge=1, description="Shadow requests at once; beyond it a pair is dropped."
    )
    timeout: float = Field(default=60.0, gt=0, description="Seconds the reference may take.")
    log: Path | None = Field(default=None, description="JSONL file with one line per pair.")
    log_max_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1024, description="Size at which the log is rotated."
    )
    log_backups: int = Field(default=3, ge=0, description="Rotated logs kept (log.1, log.2, …).")
    log_bodies: bool = Field(
        default=False, description="Also write both answers' message bodies to the log."
    )

    @property
    def enabled(self) -> bool:
        """Whether shadowing is on: a reference is named and some sessions are sampled."""
        return self.reference is not None and self.sample > 0


class PassthroughConfig(BaseModel):
    """The raw pass-through's allowlist (DESIGN §9): which methods and paths other than the turn
    routes go to the upstream as they are. By default only the public inference endpoints vLLM
    serves for clients (`proxy.http.edge.DEFAULT_ALLOWED`: /v1/completions, /v1/embeddings,
    /v1/models, /tokenize, /detokenize, /v1/score, /v1/rerank, /pooling, /health, …); everything
    else answers 404. An entry is `"/path"` or `"METHOD /path"`; `"/prefix/*"` covers a subtree.
    The turn routes are never passed through. From the environment:
    `TOOLSENTRY_PASSTHROUGH='{"allow": ["POST /v1/load_lora_adapter"]}'`."""

    model_config = ConfigDict(extra="forbid")

    allow: list[str] = Field(
        default_factory=list, description="Endpoints passed through besides the defaults."
    )
    deny: list[str] = Field(
        default_factory=list, description="Endpoints refused even when allowed (404)."
    )
    defaults: bool = Field(
        default=True, description="Whether vLLM's public client endpoints are allowed."
    )

    @field_validator("allow", "deny")
    @classmethod
    def _entries(cls, value: list[str]) -> list[str]:
        from proxy.http.edge import validate_entries  # the one parser of an entry

        return validate_entries(value)


class ToolErrorConfig(BaseModel):
    """One more form of a failed tool result (docs/tool-errors.md): a regular expression searched
    in the head of a tool result's text, on the requests of the clients and protocols named
    (every one where empty). It reads Messages results too, whose `is_error` flag otherwise
    decides alone."""

    model_config = ConfigDict(extra="forbid")

    pattern: str = Field(
        max_length=MAX_PATTERN_CHARS,
        description=f"A Python regular expression, searched in a result's first {HEAD_CHARS} "
        f"characters (at most {MAX_PATTERN_CHARS} characters long).",
    )
    clients: list[Client] = Field(
        default_factory=list,
        description=f"Clients it applies to, of {', '.join(Client)}; empty means all.",
    )
    apis: list[API] = Field(
        default_factory=list,
        description=f"Protocols it applies to, of {', '.join(API)}; empty means all.",
    )

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        compile_pattern(value)
        return value

    def compiled(self) -> ToolErrorPattern:
        """The pattern as the recognisers' table takes it."""
        return tool_error_pattern(self.pattern, self.clients, self.apis)


PUBLIC_ENDPOINTS = ("/healthz", "/readyz", "/metrics", "/openapi.json")
"""The proxy's own endpoints `public_endpoints` may open; every other route needs a key."""


class ClientKey(BaseModel):
    """A client key and the name it is known by in sessions, metrics and logs (never the key)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9._-]{1,64}$", description="Letters, digits, . _ -")
    key: SecretStr = Field(min_length=1)


def is_loopback(host: str) -> bool:
    """Whether binding `host` listens on this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Settings(BaseSettings):
    """Everything the proxy can be told. Field descriptions are what `--help` and docs show."""

    model_config = SettingsConfigDict(
        env_prefix="TOOLSENTRY_",
        extra="forbid",
        validate_default=True,
        # TOOLSENTRY_SHADOW_SAMPLE=0.1 sets shadow.sample: one split after the field's name.
        env_nested_delimiter="_",
        env_nested_max_split=1,
        # A field's docstring is its description when it has no `description=`.
        use_attribute_docstrings=True,
    )

    upstreams: list[UpstreamConfig] = Field(default_factory=list)
    """The servers to forward to, each with a name, base_url, models, API key variable and timeouts (see the entries of upstreams). A plain base URL (`--upstream URL`, repeatable; comma-separated URLs in the environment) is an entry serving every model; several are replicas, balanced (as an entry's `base_urls` are)."""
    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = Field(default=8000, ge=0, le=65535)
    """Port to listen on; 0 takes a free one, named in the startup line and the --port-file."""
    workers: int = Field(default=1, ge=1, json_schema_extra={"metavar": "INTEGER|auto"})
    """Worker processes, or `auto`: one per CPU this process may run on (its CPU affinity, which taskset and a container's cpuset narrow). More than one needs a shared store (sqlite or redis)."""
    # What a client connection may hold, and for how long (DESIGN §9; proxy.http.clients).
    client_idle_timeout: float = Field(
        default=75.0,
        gt=0,
        description="Seconds a client connection may stay open with no request under way: from "
        "its start, and after each answer (uvicorn's keep-alive timeout). Keep it longer than "
        "the clients' own keep-alive (httpx and the openai/anthropic SDKs 5 s, aiohttp 15 s): a "
        "client reusing a connection the proxy is closing gets a connection error. Idle "
        "connections are closed first past max_client_connections.",
    )
    client_header_timeout: float = Field(
        default=10.0,
        gt=0,
        description="Seconds a request's line and headers may take once its first byte is in; "
        "then it is answered 408 and its connection closed.",
    )
    client_body_timeout: float = Field(
        default=60.0,
        gt=0,
        description="Seconds a request's whole body may take once its headers are in; then it is "
        "answered 408 and its connection closed.",
    )
    max_client_connections: int = Field(
        default=512,
        ge=1,
        description="Open client connections per worker; past it, one with no request under way "
        "is closed to make room, else the new one is answered 503. Keep it below the open-file "
        "limit (ulimit -n) less the upstreams' max_connections.",
    )

    store: str = Field(
        default="memory", description="memory | sqlite:///path | redis://host:port/db"
    )
    session_ttl_seconds: int = Field(default=86_400, ge=1)
    """Seconds a session's counts are kept after its last request."""
    session_headers: list[str] = Field(
        default_factory=lambda: list(DEFAULT_SESSION_HEADERS),
        description="Request headers that name the session, tried in order.",
    )
    session_tracking: SessionTracking = SessionTracking.HISTORY
    """The session of a request that names none (no session header, `metadata.session_id`, chained response or `user`). history: the conversation its history continues, a new session for a new opening, even with the same words as another (conversations identical so far share one until they differ); fingerprint: one session per (model, first system text, first user text), as earlier releases did."""

    max_errors: int = Field(default=10, ge=1, description="Errors a session may experience.")
    exhaustion_policy: ExhaustionPolicy = ExhaustionPolicy.REJECT
    """What happens once a session's error budget is spent."""
    exhaustion_status: int | dict[API, int] = Field(
        default_factory=lambda: {API(api): n for api, n in EXHAUSTION_STATUS.items()}
    )
    """The 4xx status a spent session's request is refused with (`reject`): one for every protocol (429 for all, as earlier releases answered), or per protocol; default 429 for chat and messages, 400 for responses, so that each protocol's clients show the message once, without retrying (docs/clients.md)."""
    tool_error_prefix: str = Field(
        default="Error",
        description="A tool result starting with this reports a tool error, whatever the client "
        "(τ²-bench's form; empty turns it off).",
    )
    tool_errors: list[ToolErrorConfig] = Field(default_factory=list)
    """More forms of a failed tool result, each `{pattern, clients, apis}`, besides each client's own (docs/tool-errors.md)."""

    repair: RepairMode = RepairMode.REASK
    """reask: re-ask the model when a tool call fails validation; constrain: re-ask under the upstream's structured outputs (a named or required call, strict schemas), plainly where the upstream refuses them; off: pass failures through and count them."""
    max_reasks: int = Field(default=2, ge=0, le=10)
    """Re-asks per failed tool call before on_unrepaired applies."""
    on_unrepaired: OnUnrepaired | dict[str, OnUnrepaired] = Field(
        default_factory=lambda: {k: OnUnrepaired(v) for k, v in DEFAULT_ON_UNREPAIRED.items()}
    )
    """What the client gets when repair gives up on a tool call: passthrough, strip or reject, for every channel or per channel (`{default: passthrough, unknown_tool: strip}`, the default: docs/clients.md). With repair off, only a value set here changes a call; unset, every call passes on (validated and counted only)."""
    enforce_strict: bool = Field(
        default=False,
        description="Declare the client's own tools strict on the first attempt (tool_choice "
        "unchanged), where the upstream's structured_outputs allow it.",
    )
    local_fixes: bool = Field(
        default=False,
        description="Fix near-miss tool names and fenced arguments without a model call.",
    )
    allow_overrides: bool = Field(
        default=True,
        description="Honour x-toolsentry-max-errors (lower only) and x-toolsentry-repair per request.",
    )

    retries: int = Field(default=2, ge=0, le=10, description="Retries before the first byte.")

    # Keys, sessions and public endpoints (DESIGN §9).
    api_keys: list[ClientKey] = Field(
        default_factory=list,
        description="Client keys, each `{name, key}`; a plain string is named key-1, key-2, … "
        "by its position. Sessions belong to the key that used them. None lets every request "
        "through. From the environment as a JSON list or comma-separated.",
    )
    admin_key: SecretStr | None = None
    """Key for the admin endpoints (bearer token or x-admin-key). Unset, they are open while no api_keys are set and refused once some are."""
    insecure_admin: bool = Field(
        default=False,
        description="Serve on a non-loopback address without an admin key (the session API's "
        "list and reset stay closed; the risk is logged at every start).",
    )
    public_endpoints: list[str] | None = Field(
        default=None,
        description="Paths answered without a key (of /healthz, /readyz, /metrics, "
        "/openapi.json); default: /healthz and /readyz, and /metrics on a loopback bind.",
    )

    @field_validator("api_keys", mode="before")
    @classmethod
    def _named_keys(cls, value: Any) -> Any:
        # A plain key is named by its position, never by anything derived from the key.
        if not isinstance(value, list):
            return value
        return [
            {"name": f"key-{i}", "key": item} if isinstance(item, str) else item
            for i, item in enumerate(value, 1)
        ]

    @field_validator("api_keys")
    @classmethod
    def _distinct_keys(cls, value: list[ClientKey]) -> list[ClientKey]:
        names = [k.name for k in value]
        if len(set(names)) != len(names):
            raise ValueError("two client keys share a name")
        if len({k.key.get_secret_value() for k in value}) != len(value):
            raise ValueError("two client keys are the same key")
        return value

    @field_validator("public_endpoints")
    @classmethod
    def _known_endpoints(cls, value: list[str] | None) -> list[str] | None:
        unknown = set(value or ()) - set(PUBLIC_ENDPOINTS)
        if unknown:
            raise ValueError(
                f"public_endpoints may name {', '.join(PUBLIC_ENDPOINTS)}, not {sorted(unknown)}"
            )
        return value

    def public(self, path: str) -> bool:
        """Whether `path` (one of PUBLIC_ENDPOINTS) answers without a key."""
        if self.public_endpoints is not None:
            return path in self.public_endpoints
        return path in ("/healthz", "/readyz") or (path == "/metrics" and is_loopback(self.host))

    max_body_bytes: int = Field(default=10 * 1024 * 1024, ge=1024)
    """Largest request body accepted, in bytes."""
    max_tools: int = Field(default=512, ge=1)
    """Most tools one request may declare."""
    max_schema_bytes: int = Field(default=256 * 1024, ge=1024)
    """Largest parameters schema of one tool, in bytes of JSON."""
    max_schema_depth: int = Field(
        default=64, ge=1, description="Nesting of objects and arrays in one tool's parameters."
    )
    # What tool lists may cost (DESIGN §9): compiled on the event loop, and kept compiled.
    max_tools_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        description="Bytes of one request's tool list (its compact JSON); a larger one is refused "
        "with 413 (compiling it would hold every other request meanwhile).",
    )
    tool_cache_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=0,
        description="Bytes of tool-list JSON kept compiled, least recently used dropped first; a "
        "compiled list holds about 18 times its JSON, so 8 MB keeps ~150 lists of Claude Code's "
        "size in ~150 MB.",
    )
    schema_dialect: SchemaDialect = SchemaDialect.LENIENT
    """How tool schemas are read. lenient: also the spellings real tool lists use (`dict`, `float`, `any`, Java and JavaScript type names, `required: true` on a property; docs/schema-dialects.md), and a schema that still does not compile is checked for the tool's name, an object of arguments, the required keys and each property that compiles, counted in toolsentry_schema_fallbacks_total; strict: JSON Schema only, a schema that does not compile is refused with 400."""

    log_level: LogLevel = "info"
    """Log level."""
    log_bodies: bool = False
    """Add each request's body to its log line (bodies may hold personal data)."""
    otlp_endpoint: str | None = Field(
        default=None,
        description="OTLP/HTTP collector for traces (else the OTEL_EXPORTER_OTLP_* variables); "
        "no endpoint, no tracing.",
    )

    shadow: ShadowConfig = Field(default_factory=ShadowConfig)
    """Shadow comparison of tool decisions against a reference upstream (off unless shadow.reference is set)."""

    passthrough: PassthroughConfig = Field(default_factory=PassthroughConfig)
    max_header_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        description="The most bytes a request's header names and values may hold; more is "
        "answered 431.",
    )

    _yaml_file: ClassVar[Path | None] = None

    @field_validator("upstreams", mode="before")
    @classmethod
    def _base_urls(cls, value: Any) -> Any:
        # A plain base URL (the --upstream flag, TOOLSENTRY_UPSTREAMS=http://…) is an entry named
        # after its host.
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not any(isinstance(v, str) for v in value):
            return value
        return [
            _upstream_from_url(v, i, len(value)) if isinstance(v, str) else v
            for i, v in enumerate(value)
        ]

    @field_validator("workers", mode="before")
    @classmethod
    def _workers_auto(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() == "auto":
            return usable_cpus()
        return value

    @field_validator("on_unrepaired")
    @classmethod
    def _channels(cls, value: Any) -> Any:
        UnrepairedPolicy.read(value)  # raises ValueError for a key that names no channel
        return value

    @field_validator("exhaustion_status")
    @classmethod
    def _client_error(cls, value: int | dict[API, int]) -> int | dict[API, int]:
        for status in [value] if isinstance(value, int) else value.values():
            if not 400 <= status <= 499:
                raise ValueError(f"a refusal's status is a 4xx, got {status}")
        return value

    @field_validator("repair", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:
        # YAML 1.1 reads a bare `off` as false; `repair: off` must still mean off.
        return "off" if value is False else value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, _EnvSource(settings_cls)]
        if cls._yaml_file is not None:
            sources.append(_YamlSource(settings_cls, cls._yaml_file))
        return tuple(sources)

    def upstream_api_key(self, upstream: UpstreamConfig, environ: dict[str, str]) -> str | None:
        """The upstream's API key, read from the environment mapping the edge passes in."""
        if upstream.api_key_env is None:
            return None
        return environ.get(upstream.api_key_env)

    def to_json_with_secrets(self) -> str:
        """The settings as JSON, secrets included: only for handing to this proxy's own workers."""
        data = self.model_dump(mode="json")
        data["api_keys"] = [
            {"name": k.name, "key": k.key.get_secret_value()} for k in self.api_keys
        ]
        data["admin_key"] = self.admin_key.get_secret_value() if self.admin_key else None
        return json.dumps(data)

    def redacted(self) -> dict[str, Any]:
        """The resolved settings as JSON-ready data, with every secret masked."""
        data = self.model_dump(mode="json")
        data["api_keys"] = [{"name": k.name, "key": MASK} for k in self.api_keys]
        data["admin_key"] = MASK if self.admin_key is not None else None
        for upstream, shown in zip(self.upstreams, data["upstreams"], strict=True):
            shown["base_url"] = upstream.shown_base_url
        return data


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask where the system has one (Linux),
    else every CPU."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _upstream_from_url(url: str, index: int, count: int) -> dict[str, Any]:
    parts = urlsplit(url)
    # Named after its host (never its credentials), or a Unix socket's file name.
    socket_name = parts.path.partition(":")[0].rpartition("/")[2] if parts.scheme == "unix" else ""
    host = parts.netloc.rpartition("@")[2] or socket_name or f"upstream{index}"
    return {"name": host if count == 1 else f"{host}#{index}", "base_url": url}


class _YamlSource(PydanticBaseSettingsSource):
    """Reads the `--config` file; any error becomes a ConfigError naming the file."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path) -> None:
        super().__init__(settings_cls)
        self._data = read_config_file(path)

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._data)


def read_config_file(path: Path) -> dict[str, Any]:
    """Parse a YAML configuration file into a mapping.

    Raises ConfigError when the file is missing, is not YAML, or is not a mapping.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or one_line(str(exc))
        raise ConfigError(f"config file {path} is not valid YAML: {problem}{where}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {path} must be a mapping of settings, not {type(data).__name__}"
        )
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Build Settings from overrides, the environment and an optional YAML file.

    `overrides` whose value is None are ignored (an option the user did not give).
    Raises ConfigError, one line naming every setting that is wrong.
    """
    given = {k: v for k, v in overrides.items() if v is not None}
    Settings._yaml_file = config_file
    try:
        return Settings(**given)
    except ValidationError as exc:
        problems = "; ".join(_problem(err) for err in exc.errors())
        where = f" in {config_file}" if config_file else ""
        raise ConfigError(f"invalid settings{where}: {problems}") from exc
    except SettingsError as exc:
        # pydantic-settings names the field; what went wrong is its cause.
        cause = f": {one_line(str(exc.__cause__))}" if exc.__cause__ else ""
        raise ConfigError(f"invalid settings: {one_line(str(exc))}{cause}") from exc
    finally:
        Settings._yaml_file = None


def _problem(err: ErrorDetails) -> str:
    """One validation error as `setting (--flag, TOOLSENTRY_VAR): message`."""
    path = tuple(str(p) for p in err["loc"])
    name = ".".join(path) or "settings"
    known = _SETTINGS_BY_PATH.get(path[:2]) or _SETTINGS_BY_PATH.get(path[:1])
    if known is not None:
        spelled = ", ".join(x for x in (known.flag, known.env) if x)
        name = f"{name} ({spelled})"
    elif path[:1] and path[0] in Settings.model_fields:
        # A whole section (`shadow`, its variable's JSON), or a key it does not have
        # (`shadow.nope`, from TOOLSENTRY_SHADOW_NOPE).
        sections = {s.path[0] for s in _SETTINGS_BY_PATH.values() if len(s.path) > 1}
        named = path[:2] if path[0] in sections else path[:1]
        name = f"{name} ({ENV_PREFIX}{'_'.join(named).upper()})"
    return f"{name}: {one_line(err['msg'])}"


class _EnvSource(EnvSettingsSource):
    """`TOOLSENTRY_*` variables, where a list may also be written plainly: one value, or values
    separated by commas (`TOOLSENTRY_API_KEYS=sk-a,sk-b`, `TOOLSENTRY_UPSTREAMS=http://h/v1`),
    and a setting that takes one value or a mapping its one value (`TOOLSENTRY_ON_UNREPAIRED=strip`).
    A value that starts like JSON is JSON, and one that is not valid JSON is a ConfigError
    naming its variable (`TOOLSENTRY_SHADOW_MODELS` for a section's setting)."""

    def decode_complex_value(self, field_name: str, field: FieldInfo, value: Any) -> Any:
        text = value.strip() if isinstance(value, str) else value
        if not isinstance(text, str) or text.startswith(("[", "{", '"')):
            try:
                return super().decode_complex_value(field_name, field, value)
            except ValueError as exc:
                raise _NotJSON(field_name, exc) from exc
        if get_origin(without_none(field.annotation)) is not list:
            return text  # one plain value of a setting that also takes a mapping
        return [item.strip() for item in text.split(",") if item.strip()]

    def prepare_field_value(
        self, field_name: str, field: FieldInfo, value: Any, value_is_complex: bool
    ) -> Any:
        # A section's variable (TOOLSENTRY_SHADOW_MODELS) is decoded under its own key only
        # (`models`): the setting's name is known here.
        try:
            return super().prepare_field_value(field_name, field, value, value_is_complex)
        except _NotJSON as exc:
            path = (field_name,) if exc.key == field_name else (field_name, exc.key)
            variable = f"{self.env_prefix}{'_'.join(path)}".upper()
            raise ConfigError(f"{variable} is not valid JSON: {exc.reason}") from exc


class _NotJSON(ValueError):
    """A variable's value that starts like JSON and is not; `key` is its field's own name."""

    def __init__(self, key: str, reason: ValueError) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


def settings_fields() -> list[SettingInfo]:
    """Every setting of the proxy (`Settings`), as the command line and the reference see it."""
    return fields_of(Settings)


_SETTINGS_BY_PATH = {s.path: s for s in settings_fields()}
