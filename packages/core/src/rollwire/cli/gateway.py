"""``rollwire gateway``: serve the gateway (uvicorn with uvloop and httptools)."""

from __future__ import annotations

import logging
import secrets
import sqlite3

import typer

from rollwire.cli.checks import bind_port, check_store, parse_backend, probe_backend, url_problem
from rollwire.cli.errors import fail

__all__ = ["gateway_app"]

gateway_app = typer.Typer(
    rich_markup_mode=None,
    name="gateway",
    help="Run the rollwire gateway: an OpenAI-compatible proxy that captures every model call.",
    invoke_without_command=True,
    no_args_is_help=False,
)


#: 8000 is vLLM's (and the embedded engine's) default; the gateway sits in front of it
DEFAULT_PORT = 9000


@gateway_app.callback()
def serve(
    ctx: typer.Context,
    host: str = typer.Option("127.0.0.1", metavar="HOST", help="Interface to bind."),
    port: int = typer.Option(DEFAULT_PORT, metavar="PORT", help="Port to bind."),
    backend: list[str] = typer.Option(
        [],
        "--backend",
        "-b",
        metavar="URL[=KIND]",
        help="Inference server, KIND vllm (default), sglang or openai. Repeatable.",
    ),
    store: str = typer.Option(
        "sqlite:rollwire-gateway.sqlite",
        metavar="URL",
        help="Where calls are stored: sqlite:PATH, sqlite::memory: or redis://host:port/db "
        "(shared by several gateways; extra rollwire[redis]).",
    ),
    admin_key: str | None = typer.Option(
        None,
        metavar="KEY",
        envvar="ROLLWIRE_ADMIN_KEY",
        help="Key for /api (generated and printed if unset). Prefer the environment variable "
        "or --admin-key-file: a value on the command line is visible in ps.",
    ),
    admin_key_file: str | None = typer.Option(
        None, metavar="PATH", help="Read the admin key from this file (its first line)."
    ),
    private_metrics: bool = typer.Option(
        False, help="/metrics and /health need the admin key too."
    ),
    open_mode: bool = typer.Option(
        False,
        "--open",
        help="LOCAL DEVELOPMENT ONLY: accept any session id as token, create sessions on use.",
    ),
    secret: str | None = typer.Option(
        None,
        metavar="SECRET",
        envvar="ROLLWIRE_GATEWAY_SECRET",
        help="HMAC secret for session tokens (set it to keep tokens valid across restarts).",
    ),
    public_url: str | None = typer.Option(
        None, metavar="URL", help="URL agents use to reach this gateway (base_url of sessions)."
    ),
    max_body_bytes: int = typer.Option(
        8 * 1024 * 1024, metavar="BYTES", help="Largest accepted request body."
    ),
    upstream_timeout: float = typer.Option(
        600.0, metavar="SECONDS", help="Seconds to wait for a backend's answer."
    ),
    health_interval: float = typer.Option(
        5.0, metavar="SECONDS", help="Seconds between backend health checks."
    ),
    log_level: str = typer.Option("warning", metavar="LEVEL", help="uvicorn / rollwire log level."),
) -> None:
    """Serve the gateway until interrupted."""
    if ctx.invoked_subcommand is not None:
        return
    import uvicorn

    from rollwire.gateway.app import Gateway
    from rollwire.gateway.config import GatewayConfig

    specs = [parse_backend(b) for b in backend]
    check_store(store)
    if public_url is not None and url_problem(public_url) is not None:
        raise fail(f"--public-url {public_url} is not a URL ({url_problem(public_url)})")
    logging.basicConfig(level=log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if admin_key_file is not None:
        admin_key = _read_key_file(admin_key_file, admin_key)
    generated = admin_key is None and not open_mode
    cfg = GatewayConfig(
        backends=specs,
        store=store,
        admin_key=secrets.token_urlsafe(24) if generated else admin_key,
        open=open_mode,
        secret=secret,
        public_url=public_url or f"http://{host}:{port}",
        max_body_bytes=max_body_bytes,
        upstream_timeout=upstream_timeout,
        health_interval=health_interval,
        tune_gc=True,
        memory_trim_interval=2.0,
        private_metrics=private_metrics,
    )
    try:
        gateway = Gateway(cfg)
    except (ValueError, OSError, sqlite3.Error) as exc:
        raise fail(f"--store {store}: {exc}") from exc
    sock = bind_port(host, port, "rollwire gateway")
    for spec in specs:
        problem = probe_backend(spec)
        if problem is not None:
            typer.echo(
                f"warning: backend {spec.url} ({spec.kind}) does not answer yet ({problem}); "
                "calls routed to it fail until it does",
                err=True,
            )
    if generated:
        typer.echo(f"admin key (generated): {cfg.admin_key}", err=True)
    if open_mode:
        typer.secho(
            "WARNING: --open accepts ANY session id as a token. Local development only.",
            fg=typer.colors.RED,
            err=True,
            bold=True,
        )
    try:
        import uvloop  # noqa: F401

        loop = "uvloop"
    except ImportError:
        loop = "asyncio"
    typer.echo(
        f"rollwire gateway on http://{host}:{port} -> "
        f"{', '.join(f'{s.url} ({s.kind})' for s in specs) or 'no backends yet'}; store {store}",
        err=True,
    )
    config = uvicorn.Config(
        gateway,
        host=host,
        port=port,
        loop=loop,
        http="httptools",
        lifespan="on",
        access_log=False,
        proxy_headers=False,  # the gateway never reads the client address: skip that middleware
        log_level=log_level,
    )
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:  # Ctrl-C / SIGINT after a clean shutdown, as uvicorn.run treats it
        pass


def _read_key_file(path: str, given: str | None) -> str:
    if given is not None:
        raise fail(
            "give the admin key once: --admin-key (or ROLLWIRE_ADMIN_KEY) or --admin-key-file"
        )
    try:
        with open(path, encoding="utf-8") as f:
            key = f.readline().strip()
    except OSError as exc:
        raise fail(f"--admin-key-file {path}: cannot read it ({exc.strerror})") from exc
    if not key:
        raise fail(f"--admin-key-file {path}: the file is empty")
    return key


def main() -> None:
    """Entry point for ``python -m rollwire.cli.gateway``."""
    gateway_app()


if __name__ == "__main__":
    main()
