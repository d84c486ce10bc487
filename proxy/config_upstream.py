"""One upstream's settings: where it is, which models it serves, how the proxy talks to it
(timeouts, retries, pool, caps), and what it supports. A list of them is `Settings.upstreams`."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from proxy.guard.repair import StructuredOutputs
from proxy.upstream_origin import base_url_parts


class UpstreamConfig(BaseModel):
    """One OpenAI-compatible server the proxy forwards to."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    name: str = Field(description="A short name used in logs and error messages.")
    base_url: str = Field(
        description="The server's OpenAI base URL, e.g. http://127.0.0.1:8001/v1. A query "
        "(`?api-version=…`) is kept on every request; `user:password@` is sent as basic auth "
        "(api_key_env's key wins when both are set) and masked wherever the URL is shown; "
        "unix:///path/to/socket reaches a server on a Unix socket (base path /v1, or "
        "unix:///path/to/socket:/base/path). Redirects are never followed."
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
    """Seconds to wait for a connection to be established."""
    max_connections: int = Field(default=256, ge=1, description="Pooled keep-alive connections.")
    pool_timeout: float = Field(
        default=10.0,
        gt=0,
        description="Seconds a request waits for a pooled connection while all max_connections "
        "are busy; then it is answered 503 with retry-after (not charged to its session).",
    )
    total_timeout: float = Field(
        default=1800.0,
        gt=0,
        description="Seconds one try may last from its request to its answer's end, plain or "
        "streamed, however lively the upstream (`timeout` bounds only the silence between two "
        "reads, which drips and keep-alive pings reset); past it the answer ends in the "
        "protocol's error and one upstream_error.",
    )
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
        if not value.startswith(("http://", "https://", "unix:///")):
            raise ValueError(
                f"base_url must start with http://, https:// or unix:///, got {masked_url(value)!r}"
            )
        base_url_parts(value)  # a host, a port that is one, a socket's absolute path
        return value.rstrip("/")

    @property
    def shown_base_url(self) -> str:
        """`base_url` as logs, errors and printed settings show it: its password masked."""
        return masked_url(self.base_url)


MASK = "**********"


def masked_url(url: str) -> str:
    """`url` with the password of its userinfo (`user:password@`) masked; as it is without one."""
    parts = urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    if not at:
        return url
    return parts._replace(netloc=f"{userinfo.partition(':')[0]}:{MASK}@{host}").geturl()
