"""`toolsentry` command line: `serve` runs the proxy, `check-config` validates a configuration.

This is the edge where the environment is read: flags and `TOOLSENTRY_*` variables become one
`Settings`, handed to the app factory.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer
import uvicorn
from rich.console import Console
from rich.markup import escape

from proxy import __version__, listening
from proxy.config import Settings, is_loopback, load_settings, settings_fields
from proxy.config_fields import SettingInfo
from proxy.config_upstream import masked_url
from proxy.errors import ConfigError
from proxy.http.clients import ClientLimits
from proxy.listening import listen, url_of, write_port_file
from proxy.logs import configure_logging, get_logger
from proxy.propagation import Propagation

app = typer.Typer(
    name="toolsentry",
    help=(
        "An OpenAI-compatible proxy that checks every tool call against the request's tools, "
        "repairs failures by re-asking the model, and counts what is left against a per-session "
        "error budget. Point any agent framework's base_url at it."
    ),
    no_args_is_help=True,
    add_completion=False,
    # Help text is plain text: with rich markup, `[default: …]` in a help string was read as a
    # tag and vanished.
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)
_err = Console(stderr=True)

# The environment variable uvicorn's worker processes read their resolved settings from.
RESOLVED_SETTINGS_ENV = "TOOLSENTRY_RESOLVED_SETTINGS"
# Where prometheus_client's multiprocess mode keeps every worker's values; the library reads it.
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


def _fail(message: str) -> typer.Exit:
    # One line, whatever the message (a container's log reads it), and never read as markup.
    text = escape(" ".join(message.split()))
    _err.print(f"[bold red]error:[/] {text}", soft_wrap=True, highlight=False)
    return typer.Exit(code=2)


def shown_help(description: str, env: str | None = None, default: str = "none") -> str:
    """An option's help as `serve --help` shows it: what it does, then its variable and default
    (typer's own `[default: …]` would print a default of None as `(none)`)."""
    shown = f"env var: {env}; default: {default}" if env else f"default: {default}"
    return f"{description}  [{shown}]"


def described(help_text: str) -> str:
    """What an option does, without the variable and default `shown_help` adds."""
    return help_text.rpartition("  [")[0] or help_text


_SERVE_EPILOG = (
    "Every setting is also a TOOLSENTRY_* environment variable (listed with each flag) and a key "
    "of the --config file; flags beat the environment, which beats the file. A list is a repeated "
    "flag, or JSON or comma-separated values in the environment. Structured settings have no flag "
    "(their entries have several keys each): they are in the --config file, or JSON in their "
    "variable (plain keys or URLs may be comma-separated): {file_only}. Every setting is "
    "described in docs/configuration.md."
)


def serve(
    upstream: Annotated[
        list[str] | None,
        typer.Option(
            "--upstream",
            "-u",
            metavar="URL",
            help=shown_help(
                "Base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8001/v1. Repeat "
                "for several: replicas serving every model, balanced (use --config to route by "
                "model). In the variable, several are separated by spaces.",
                "TOOLSENTRY_UPSTREAM",
            ),
            envvar="TOOLSENTRY_UPSTREAM",
            show_envvar=False,
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            metavar="FILE",
            help=shown_help(
                "YAML file with any setting (upstreams with names, models, keys, timeouts).",
                "TOOLSENTRY_CONFIG",
            ),
            envvar="TOOLSENTRY_CONFIG",
            show_envvar=False,
        ),
    ] = None,
    port_file: Annotated[
        Path | None,
        typer.Option(
            metavar="PATH",
            help=shown_help(
                "Write the port listened on to this file (one line) once the socket listens, "
                "for whoever started the proxy with --port 0.",
                "TOOLSENTRY_PORT_FILE",
            ),
            envvar="TOOLSENTRY_PORT_FILE",
            show_envvar=False,
        ),
    ] = None,
    print_settings: Annotated[
        bool,
        typer.Option(
            "--print-settings",
            help=shown_help(
                "Print the resolved settings (secrets masked) as JSON and exit without listening.",
                default="false",
            ),
        ),
    ] = False,
    **flags: Any,
) -> None:
    """Run the proxy. Every option can also be set in the environment or in the --config file."""
    try:
        settings = load_settings(config, upstreams=upstream or None, **_nested(flags))
        if print_settings:
            sys.stdout.write(json.dumps(settings.redacted(), indent=2, ensure_ascii=False) + "\n")
            return
        check_runnable(settings)
        check_bind(settings)
        # Before anything imports opentelemetry.propagate, which raises on a name it lacks.
        Propagation.from_environ(os.environ)
        sock = listen(settings.host, settings.port)
    except ConfigError as exc:
        raise _fail(exc.message) from None
    configure_logging(settings.log_level)
    _warn_if_insecure(settings)
    options = _uvicorn_options(settings)
    with sock:
        if settings.workers > 1:
            status = _serve_workers(sock, settings, port_file, options)
        else:
            status = _serve_in_process(sock, settings, port_file, options)
    if status:
        raise typer.Exit(code=status)


def _warn_if_insecure(settings: Settings) -> None:
    """Warn when the proxy serves beyond this machine without an admin key (`insecure_admin`),
    and for each upstream whose certificate is not checked (`tls.verify: false`)."""
    if settings.admin_key is None and not is_loopback(settings.host):
        get_logger().warning(
            "insecure_admin",
            host=settings.host,
            message="serving on a non-loopback address without an admin key",
        )
    for upstream in settings.upstreams or []:
        if not upstream.tls.verify:
            get_logger().warning(
                "upstream_tls_unverified",
                upstream=upstream.name,
                message="tls.verify is false: any certificate is trusted for this upstream",
            )


def _uvicorn_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's options for the proxy, whether one process serves or several workers do."""
    return {
        "log_level": "warning" if settings.log_level == "info" else settings.log_level,
        "access_log": False,
        # The proxy reads no client address, so X-Forwarded-* need no middleware of their own
        # (one ASGI layer less on every request).
        "proxy_headers": False,
        "loop": "uvloop",
        # uvicorn's httptools protocol with the time and number bounds it lacks; its own
        # keep-alive timer is the idle timeout (`limit_concurrency` is not used: it refuses
        # requests, not connections, so idle sockets would make real requests fail).
        "http": ClientLimits(
            header_timeout=settings.client_header_timeout,
            body_timeout=settings.client_body_timeout,
            max_connections=settings.max_client_connections,
        ).protocol(),
        "timeout_keep_alive": settings.client_idle_timeout,
        "timeout_graceful_shutdown": 10,
    }


def _serve_workers(
    sock: socket.socket, settings: Settings, port_file: Path | None, options: dict[str, Any]
) -> int:
    """Serve on `sock` with `settings.workers` worker processes, which read the resolved settings
    and the metrics directory from the environment; uvicorn's exit status."""
    os.environ[RESOLVED_SETTINGS_ENV] = settings.to_json_with_secrets()
    # A fresh directory per run: values left by an earlier run would be added to this one's.
    metrics_dir = tempfile.mkdtemp(prefix="toolsentry-metrics-")
    os.environ[METRICS_DIR_ENV] = metrics_dir
    supervised = uvicorn.Config(
        "proxy.cli:app_from_environment", factory=True, workers=settings.workers, **options
    )
    try:
        _report(sock, settings, port_file, f"with {settings.workers} workers → ")
        return listening.serve(supervised, sock)
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


def _serve_in_process(
    sock: socket.socket, settings: Settings, port_file: Path | None, options: dict[str, Any]
) -> int:
    """Serve on `sock` from this process; uvicorn's exit status. Raises typer.Exit (code 2)
    when the app cannot be made from `settings`."""
    from proxy.app import create_app

    try:
        application = create_app(settings, environ=os.environ)
    except ConfigError as exc:
        raise _fail(exc.message) from None
    _report(sock, settings, port_file, "→ ")
    return listening.serve(uvicorn.Config(application, **options), sock)


def _nested(flags: dict[str, Any]) -> dict[str, Any]:
    """The flags given, as overrides: `shadow__sample=0.1` becomes `{"shadow": {"sample": "0.1"}}`."""
    out: dict[str, Any] = {}
    for name, value in flags.items():
        if value is None or value == []:
            continue
        *sections, last = name.split("__")
        into = out
        for section in sections:
            into = into.setdefault(section, {})
        into[last] = value
    return out


def _setting_option(setting: SettingInfo) -> inspect.Parameter:
    """The `serve` parameter of one setting: a flag read as text (bool for a switch), for the
    settings model to validate; the model's own variable and default in its help."""
    assert setting.flag is not None
    description = setting.description
    if setting.metavar == "SECRET":
        description = (
            f"Prefer the variable: a flag's value shows in the process list. {description}"
        )
    help_text = shown_help(description, setting.env, setting.default)
    annotation: Any = str | None
    names = [setting.flag]
    if setting.kind == "switch":
        annotation = bool | None
        names = [f"{setting.flag}/--no-{setting.flag[2:]}"]
    elif setting.kind == "repeat":
        annotation = list[str] | None
    option = typer.Option(
        *names, help=help_text, metavar=setting.metavar or None, show_default=False
    )
    return inspect.Parameter(
        "__".join(setting.path),
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[annotation, option],
    )


def _derive_serve_options() -> None:
    """Give `serve` one flag per setting of the model (those that are not structured)."""
    settings = settings_fields()
    own = [
        p
        for p in inspect.signature(serve, eval_str=True).parameters.values()
        if p.kind != p.VAR_KEYWORD
    ]
    derived = [_setting_option(s) for s in settings if s.flag is not None]
    serve.__signature__ = inspect.Signature([*own, *derived], return_annotation=None)  # type: ignore[attr-defined]
    serve.__annotations__ = {p.name: p.annotation for p in (*own, *derived)} | {"return": None}
    file_only = ", ".join(f"{s.key} ({s.env})" for s in settings if s.flag is None)
    app.command(epilog=_SERVE_EPILOG.format(file_only=file_only))(serve)


_derive_serve_options()


def _report(sock: socket.socket, settings: Settings, port_file: Path | None, how: str) -> None:
    """Say where the proxy listens: the startup line, and `port_file` when given."""
    if port_file is not None:
        write_port_file(port_file, sock)
    upstreams = ", ".join(masked_url(url) for u in settings.upstreams for url in u.replica_urls)
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
    from proxy.upstream_origin import environment_proxies, origin_for

    check_shadow(settings)
    proxies = environment_proxies(os.environ)
    for upstream in settings.upstreams:
        for url in upstream.replica_urls:  # TLS files that cannot be used, a proxy not http
            origin_for(upstream.replica(url), proxies)
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
