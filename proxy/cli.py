"""`toolsentry` command line: `serve` runs the proxy, `check-config` validates a configuration.

This is the edge where the environment is read: flags and `TOOLSENTRY_*` variables become one
`Settings`, handed to the app factory.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import typer
import uvicorn
from rich.console import Console

from proxy import __version__, listening
from proxy.config import Settings, is_loopback, load_settings
from proxy.errors import ConfigError
from proxy.guard.repair import RepairMode
from proxy.listening import listen, url_of, write_port_file
from proxy.logs import configure_logging, get_logger

app = typer.Typer(
    name="toolsentry",
    help=(
        "An OpenAI-compatible proxy that checks every tool call against the request's tools, "
        "repairs failures by re-asking the model, and counts what is left against a per-session "
        "error budget. Point any agent framework's base_url at it."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
_err = Console(stderr=True)

# The environment variable uvicorn's worker processes read their resolved settings from.
RESOLVED_SETTINGS_ENV = "TOOLSENTRY_RESOLVED_SETTINGS"
# Where prometheus_client's multiprocess mode keeps every worker's values; the library reads it.
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


def _upstreams_from_urls(urls: list[str]) -> list[dict[str, Any]]:
    out = []
    for i, url in enumerate(urls):
        host = urlsplit(url).netloc or f"upstream{i}"
        out.append({"name": host if len(urls) == 1 else f"{host}#{i}", "base_url": url})
    return out


def _fail(message: str) -> typer.Exit:
    _err.print(f"[bold red]error:[/] {message}", soft_wrap=True, highlight=False)
    return typer.Exit(code=2)


@app.command()
def serve(
    upstream: Annotated[
        list[str] | None,
        typer.Option(
            "--upstream",
            "-u",
            help="Base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8001/v1. "
            "Repeat for several; it serves every model (use --config to route by model).",
            envvar="TOOLSENTRY_UPSTREAM",
            show_envvar=True,
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="YAML file with any setting (upstreams with names, models, keys, timeouts).",
            envvar="TOOLSENTRY_CONFIG",
            show_envvar=True,
        ),
    ] = None,
    host: Annotated[
        str | None,
        typer.Option(
            help="Address to listen on [default: 127.0.0.1].",
            envvar="TOOLSENTRY_HOST",
            show_envvar=True,
        ),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            help="Port to listen on; 0 takes a free one, named in the startup line and the "
            "--port-file [default: 8000].",
            envvar="TOOLSENTRY_PORT",
            show_envvar=True,
        ),
    ] = None,
    port_file: Annotated[
        Path | None,
        typer.Option(
            help="Write the port listened on to this file (one line) once the socket listens, "
            "for whoever started the proxy with --port 0.",
            envvar="TOOLSENTRY_PORT_FILE",
            show_envvar=True,
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            help="Worker processes [default: 1]. More than one needs a shared store (sqlite or redis).",
            envvar="TOOLSENTRY_WORKERS",
            show_envvar=True,
        ),
    ] = None,
    store: Annotated[
        str | None,
        typer.Option(
            help="Where session counts live: memory, sqlite:///path/to.db (survives restarts), "
            "redis://host:port/db (several replicas) [default: memory].",
            envvar="TOOLSENTRY_STORE",
            show_envvar=True,
        ),
    ] = None,
    max_errors: Annotated[
        int | None,
        typer.Option(
            help="Error budget per session: tool failures an agent may experience before the "
            "exhaustion policy applies [default: 10, as τ²-bench].",
            envvar="TOOLSENTRY_MAX_ERRORS",
            show_envvar=True,
        ),
    ] = None,
    repair: Annotated[
        RepairMode | None,
        typer.Option(
            help="reask: re-ask the model when a tool call fails validation; constrain: re-ask "
            "under the upstream's structured outputs (a named or required call, strict schemas), "
            "plainly where the upstream refuses them; off: pass failures through and count them "
            "[default: reask].",
            envvar="TOOLSENTRY_REPAIR",
            show_envvar=True,
            case_sensitive=False,
        ),
    ] = None,
    log_level: Annotated[
        str | None,
        typer.Option(
            help="debug, info, warning or error [default: info].",
            envvar="TOOLSENTRY_LOG_LEVEL",
            show_envvar=True,
        ),
    ] = None,
    shadow_reference: Annotated[
        str | None,
        typer.Option(
            help="Shadow comparison: the upstream (by name) that also answers a sample of "
            "sessions, in the background, to compare tool decisions with [default: off].",
            envvar="TOOLSENTRY_SHADOW_REFERENCE",
            show_envvar=True,
        ),
    ] = None,
    shadow_sample: Annotated[
        float | None,
        typer.Option(
            help="Share of sessions shadowed, 0 to 1 [default: 0.05].",
            envvar="TOOLSENTRY_SHADOW_SAMPLE",
            show_envvar=True,
        ),
    ] = None,
    shadow_log: Annotated[
        Path | None,
        typer.Option(
            help="JSONL file with one line per shadow pair, for `evalkit shadow`.",
            envvar="TOOLSENTRY_SHADOW_LOG",
            show_envvar=True,
        ),
    ] = None,
    otlp_endpoint: Annotated[
        str | None,
        typer.Option(
            help="OTLP/HTTP collector for traces, e.g. http://127.0.0.1:4318 (Jaeger, Tempo, an "
            "OpenTelemetry Collector). The standard OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME "
            "and OTEL_TRACES_SAMPLER variables work too; without an endpoint nothing is traced.",
            envvar="TOOLSENTRY_OTLP_ENDPOINT",
            show_envvar=True,
        ),
    ] = None,
    insecure_admin: Annotated[
        bool,
        typer.Option(
            "--insecure-admin",
            help="Serve on a non-loopback address without an admin key (logged at every start).",
        ),
    ] = False,
) -> None:
    """Run the proxy. Every option can also be set in the environment or in the --config file."""
    try:
        settings = load_settings(
            config,
            upstreams=_upstreams_from_urls(upstream) if upstream else None,
            host=host,
            port=port,
            workers=workers,
            store=store,
            max_errors=max_errors,
            repair=repair,
            log_level=log_level,
            shadow={
                k: v
                for k, v in (
                    ("reference", shadow_reference),
                    ("sample", shadow_sample),
                    ("log", shadow_log),
                )
                if v is not None
            }
            or None,
            otlp_endpoint=otlp_endpoint,
            insecure_admin=insecure_admin or None,
        )
        check_runnable(settings)
        check_bind(settings)
    except ConfigError as exc:
        raise _fail(exc.message) from None
    try:
        sock = listen(settings.host, settings.port)
    except ConfigError as exc:
        raise _fail(exc.message) from None
    configure_logging(settings.log_level)
    if settings.admin_key is None and not is_loopback(settings.host):
        get_logger().warning(
            "insecure_admin",
            host=settings.host,
            message="serving on a non-loopback address without an admin key",
        )
    options: dict[str, Any] = {
        "log_level": "warning" if settings.log_level == "info" else settings.log_level,
        "access_log": False,
        # The proxy reads no client address, so X-Forwarded-* need no middleware of their own
        # (one ASGI layer less on every request).
        "proxy_headers": False,
        "loop": "uvloop",
        "http": "httptools",
        "timeout_graceful_shutdown": 10,
    }
    with sock:
        if settings.workers > 1:
            os.environ[RESOLVED_SETTINGS_ENV] = settings.to_json_with_secrets()
            # A fresh directory per run: values left by an earlier run would be added to this
            # one's.
            metrics_dir = tempfile.mkdtemp(prefix="toolsentry-metrics-")
            os.environ[METRICS_DIR_ENV] = metrics_dir
            supervised = uvicorn.Config(
                "proxy.cli:app_from_environment", factory=True, workers=settings.workers, **options
            )
            try:
                _report(sock, settings, port_file, f"with {settings.workers} workers → ")
                status = listening.serve(supervised, sock)
            finally:
                shutil.rmtree(metrics_dir, ignore_errors=True)
        else:
            from proxy.app import create_app

            try:
                application = create_app(settings, environ=os.environ)
            except ConfigError as exc:
                raise _fail(exc.message) from None
            _report(sock, settings, port_file, "→ ")
            status = listening.serve(uvicorn.Config(application, **options), sock)
    if status:
        raise typer.Exit(code=status)


def _report(sock: socket.socket, settings: Settings, port_file: Path | None, how: str) -> None:
    """Say where the proxy listens: the startup line, and `port_file` when given."""
    if port_file is not None:
        write_port_file(port_file, sock)
    upstreams = ", ".join(u.base_url for u in settings.upstreams)
    _err.print(
        f"toolsentry {__version__} on {url_of(settings.host, sock)}/v1 {how}{upstreams}",
        highlight=False,
        soft_wrap=True,
    )


@app.command("check-config")
def check_config(
    file: Annotated[Path, typer.Argument(help="The YAML configuration file to validate.")],
) -> None:
    """Validate a configuration file and print the resolved settings (secrets masked) as JSON."""
    try:
        settings = load_settings(file)
        check_runnable(settings)
    except ConfigError as exc:
        raise _fail(exc.message) from None
    sys.stdout.write(json.dumps(settings.redacted(), indent=2, ensure_ascii=False) + "\n")


@app.command()
def version() -> None:
    """Print the version."""
    sys.stdout.write(f"toolsentry {__version__}\n")


def check_runnable(settings: Settings) -> None:
    """Refuse settings that cannot work, saying why. Raises ConfigError."""
    if not settings.upstreams:
        raise ConfigError(
            "no upstream configured: give --upstream URL, set TOOLSENTRY_UPSTREAM, or list "
            "upstreams in a --config file"
        )
    from proxy.shadow import check_shadow

    check_shadow(settings)
    if settings.workers > 1 and settings.store == "memory":
        raise ConfigError(
            "--workers > 1 needs a shared session store: each worker would keep its own memory "
            "store and budgets would not add up. Use --store sqlite:///path.db or redis://…"
        )


def check_bind(settings: Settings) -> None:
    """Refuse to serve beyond this machine without an admin key, unless `insecure_admin`.
    Raises ConfigError."""
    if (
        settings.admin_key is None
        and not settings.insecure_admin
        and not is_loopback(settings.host)
    ):
        raise ConfigError(
            f"refusing to serve on {settings.host} without an admin key: set TOOLSENTRY_ADMIN_KEY "
            "(or admin_key in --config), or pass --insecure-admin to accept the risk"
        )


def app_from_environment() -> Any:
    """uvicorn's factory for worker processes: the settings the parent resolved."""
    from proxy.app import create_app

    raw = os.environ.get(RESOLVED_SETTINGS_ENV)
    if raw is None:
        raise ConfigError(f"{RESOLVED_SETTINGS_ENV} is not set")
    settings = Settings.model_validate_json(raw)
    configure_logging(settings.log_level)
    return create_app(settings, environ=os.environ, metrics_dir=os.environ.get(METRICS_DIR_ENV))


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
