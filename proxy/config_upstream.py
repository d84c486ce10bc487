"""One upstream's settings: where it is, which models it serves, how the proxy talks to it
(timeouts, retries, pool, caps), and what it supports. A list of them is `Settings.upstreams`."""

from __future__ import annotations

from typing import Any
from urllib.parse import SplitResult, urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from proxy.guard.repair import StructuredOutputs


class UpstreamTLS(BaseModel):
    """How an https upstream's certificate is checked, and the certificate the proxy shows it."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    ca_file: str | None = Field(
        default=None,
        description="PEM file of the certificates trusted for this upstream, instead of the "
        "system's (SSL_CERT_FILE and SSL_CERT_DIR name those).",
    )
    client_cert: str | None = Field(
        default=None,
        description="PEM file of the certificate the proxy shows the upstream (mutual TLS), its "
        "key in it or in client_key.",
    )
    client_key: str | None = Field(
        default=None, description="PEM file of client_cert's private key, when not in it."
    )
    verify: bool = Field(
        default=True,
        description="Check the upstream's certificate and name; false trusts any certificate "
        "(a warning at start names the upstream).",
    )


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
    # Replicas (DESIGN §8): the servers of one deployment, balanced by outstanding requests.
    base_urls: list[str] = Field(
        default_factory=list,
        description="Several base URLs, the replicas of one deployment, instead of base_url (which "
        "then names the first): each request goes to the replica with the fewest outstanding "
        "requests. Entries that list the same model are replicas of it too.",
    )
    cooldown_seconds: float = Field(
        default=10.0,
        gt=0,
        description="Seconds a replica is passed over after a try failed before its answer's "
        "first byte (connection refused or reset, a timeout); the request goes on to another "
        "replica within `retries`. With every replica cooling, the one whose cool-down ends "
        "first is tried.",
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

    tls: UpstreamTLS = Field(
        default_factory=UpstreamTLS,
        description="For an https base_url: how its certificate is checked and the certificate "
        "shown to it (the tls.* keys).",
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

    @model_validator(mode="before")
    @classmethod
    def _first_of_base_urls(cls, value: Any) -> Any:
        # `base_urls` alone: `base_url` is its first, so everything that reads one URL (logs, the
        # shadow's reference) reads a replica's.
        if isinstance(value, dict) and value.get("base_urls") and "base_url" not in value:
            urls = value["base_urls"]
            if isinstance(urls, list) and urls:
                return {**value, "base_url": urls[0]}
        return value

    @model_validator(mode="after")
    def _replica_urls_checked(self) -> UpstreamConfig:
        if not self.base_urls:
            return self
        # Each URL is checked as base_url is, by its own validator.
        urls = [_checked_url(self.name, url) for url in self.base_urls]
        if urls[0] != self.base_url:
            raise ValueError("give base_url or base_urls, not both (base_url is base_urls' first)")
        if len(set(urls)) != len(urls):
            raise ValueError(f"base_urls lists a URL twice: {urls}")
        self.base_urls = urls
        return self

    @property
    def replica_urls(self) -> list[str]:
        """The base URL of every replica: `base_urls`, else `base_url` alone."""
        return self.base_urls or [self.base_url]

    def replica(self, url: str) -> UpstreamConfig:
        """This entry's settings for its replica at `url` (one of `replica_urls`): the entry
        itself when it has one base URL."""
        if not self.base_urls:
            return self
        return self.model_copy(update={"base_url": url, "base_urls": []})

    @property
    def shown_base_url(self) -> str:
        """`base_url` as logs, errors and printed settings show it: its password masked."""
        return masked_url(self.base_url)


def _checked_url(name: str, url: str) -> str:
    """`url` as `base_url` would hold it (see its validator). Raises ValueError naming it."""
    try:
        return UpstreamConfig(name=name, base_url=url).base_url
    except ValidationError as exc:
        raise ValueError(f"base_urls: {exc.errors()[0]['msg']}") from None


MASK = "**********"


def masked_url(url: str) -> str:
    """`url` with the password of its userinfo (`user:password@`) masked; as it is without one."""
    parts = urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    if not at:
        return url
    return parts._replace(netloc=f"{userinfo.partition(':')[0]}:{MASK}@{host}").geturl()


_URL_SCHEMES = ("http", "https")


def base_url_parts(url: str) -> SplitResult:
    """`url` split, once it is known to be one of the forms of a base URL (`proxy.upstream_origin`'s module doc).
    Raises ValueError, naming the URL without its userinfo, for any other."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        socket_path, _, path = parts.path.partition(":")
        if parts.netloc or not socket_path.startswith("/") or (path and not path.startswith("/")):
            raise ValueError(f"not a unix:///path/to/socket[:/base/path] URL: {url!r}")
        return parts
    if parts.scheme not in _URL_SCHEMES or not parts.hostname:
        shown = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
        raise ValueError(f"not an http(s) or unix URL: {shown!r}")
    parts.port  # noqa: B018 (raises ValueError for a port that is not one)
    return parts
