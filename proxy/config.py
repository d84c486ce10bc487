"""The proxy's settings: one typed object, built at the edge (cli.py) and handed to the app factory.

Precedence, highest first: explicit overrides (command-line flags), `TOOLSENTRY_*` environment
variables, the YAML file given with `--config`, defaults. Nested values come from the environment
as JSON (`TOOLSENTRY_UPSTREAMS='[{"name": "vllm", "base_url": "http://127.0.0.1:8001/v1"}]'`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from proxy.errors import ConfigError
from proxy.guard.repair import OnUnrepaired, RepairMode, StructuredOutputs
from proxy.session.budget import DEFAULT_SESSION_HEADERS, ExhaustionPolicy

LogLevel = Literal["debug", "info", "warning", "error"]


class UpstreamConfig(BaseModel):
    """One OpenAI-compatible server the proxy forwards to."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="A short name used in logs and error messages.")
    base_url: str = Field(
        description="The server's OpenAI base URL, e.g. http://127.0.0.1:8001/v1."
    )
    api_key_env: str | None = Field(
        default=None, description="Environment variable holding the upstream's API key."
    )
    models: list[str] = Field(
        default_factory=list,
        description="Models this upstream serves; empty means any model not claimed by another.",
    )
    timeout: float = Field(default=600.0, gt=0, description="Seconds to wait for a response.")
    connect_timeout: float = Field(default=10.0, gt=0)
    max_connections: int = Field(default=256, ge=1, description="Pooled keep-alive connections.")
    keepalive_timeout: float = Field(
        default=4.0,
        gt=0,
        description="Seconds an idle pooled connection is kept: below the server's own keep-alive "
        "(5 s for vLLM and uvicorn), so a connection is never reused just as the server closes it.",
    )
    # Limits on what one answer may cost (DESIGN §9): past one, the answer ends in the protocol's
    # error and one `upstream_error`.
    max_response_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1024,
        description="Bytes of one answer read whole (a plain answer, any error body), counted "
        "decoded: a compressed body stops at this size as it is decoded.",
    )
    max_stream_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=1024,
        description="Bytes of one streamed answer, counted decoded.",
    )
    max_stream_seconds: float = Field(
        default=1800.0,
        gt=0,
        description="Seconds one streamed answer may last from its request, however lively.",
    )
    structured_outputs: StructuredOutputs = Field(
        default=StructuredOutputs.AUTO,
        description="Whether `repair: constrain` and `enforce_strict` may ask this upstream for "
        "constrained calls (named/required tool_choice, strict tools): on, off, or auto (until "
        "it refuses the fields once).",
    )

    @field_validator("structured_outputs", mode="before")
    @classmethod
    def _yaml_on_off(cls, value: Any) -> Any:
        # YAML 1.1 reads bare `on` and `off` as booleans; they must still mean on and off.
        if isinstance(value, bool):
            return "on" if value else "off"
        return value

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {value!r}")
        return value.rstrip("/")


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
        default_factory=list, description="Models whose requests are shadowed; empty means all."
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


class Settings(BaseSettings):
    """Everything the proxy can be told. Field descriptions are what `--help` and docs show."""

    model_config = SettingsConfigDict(
        env_prefix="TOOLSENTRY_",
        extra="forbid",
        validate_default=True,
        # TOOLSENTRY_SHADOW_SAMPLE=0.1 sets shadow.sample: one split after the field's name.
        env_nested_delimiter="_",
        env_nested_max_split=1,
    )

    upstreams: list[UpstreamConfig] = Field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    workers: int = Field(default=1, ge=1)

    store: str = Field(
        default="memory", description="memory | sqlite:///path | redis://host:port/db"
    )
    session_ttl_seconds: int = Field(default=86_400, ge=1)
    session_headers: list[str] = Field(
        default_factory=lambda: list(DEFAULT_SESSION_HEADERS),
        description="Request headers that name the session, tried in order.",
    )

    max_errors: int = Field(default=10, ge=1, description="Errors a session may experience.")
    exhaustion_policy: ExhaustionPolicy = ExhaustionPolicy.REJECT
    tool_error_prefix: str = Field(
        default="Error", description="A role:tool message starting with this reports a tool error."
    )

    repair: RepairMode = RepairMode.REASK
    max_reasks: int = Field(default=2, ge=0, le=10)
    on_unrepaired: OnUnrepaired = OnUnrepaired.PASSTHROUGH
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

    api_keys: list[SecretStr] = Field(default_factory=list)
    admin_key: SecretStr | None = None
    max_body_bytes: int = Field(default=10 * 1024 * 1024, ge=1024)
    max_tools: int = Field(default=512, ge=1)
    max_schema_bytes: int = Field(default=256 * 1024, ge=1024)
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

    log_level: LogLevel = "info"
    log_bodies: bool = False
    otlp_endpoint: str | None = Field(
        default=None,
        description="OTLP/HTTP collector for traces (else the OTEL_EXPORTER_OTLP_* variables); "
        "no endpoint, no tracing.",
    )

    shadow: ShadowConfig = Field(default_factory=ShadowConfig)

    _yaml_file: ClassVar[Path | None] = None

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
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
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
        data["api_keys"] = [k.get_secret_value() for k in self.api_keys]
        data["admin_key"] = self.admin_key.get_secret_value() if self.admin_key else None
        return json.dumps(data)

    def redacted(self) -> dict[str, Any]:
        """The resolved settings as JSON-ready data, with every secret masked."""
        data = self.model_dump(mode="json")
        data["api_keys"] = ["**********" for _ in self.api_keys]
        data["admin_key"] = "**********" if self.admin_key is not None else None
        return data


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
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
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
    Raises ConfigError with every validation problem listed.
    """
    given = {k: v for k, v in overrides.items() if v is not None}
    Settings._yaml_file = config_file
    try:
        return Settings(**given)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'settings'}: {err['msg']}"
            for err in exc.errors()
        )
        where = f" in {config_file}" if config_file else ""
        raise ConfigError(f"invalid settings{where}: {problems}") from exc
    finally:
        Settings._yaml_file = None
