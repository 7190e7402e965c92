"""``rollwire gateway``: serve the gateway (uvicorn with uvloop and httptools)."""

from __future__ import annotations

import logging
import secrets

import typer

__all__ = ["gateway_app"]

gateway_app = typer.Typer(
    name="gateway",
    help="Run the rollwire gateway: an OpenAI-compatible proxy that captures every model call.",
    invoke_without_command=True,
    no_args_is_help=False,
)


@gateway_app.callback()
def serve(
    ctx: typer.Context,
    host: str = typer.Option("127.0.0.1", help="Interface to bind."),
    port: int = typer.Option(8000, help="Port to bind."),
    backend: list[str] = typer.Option(
        [],
        "--backend",
        "-b",
        help="Inference server as URL[=vllm|sglang|openai] (repeatable; default kind vllm).",
    ),
    store: str = typer.Option(
        "sqlite:rollwire-gateway.sqlite",
        help="Where calls are stored: sqlite:PATH or sqlite::memory:.",
    ),
    admin_key: str | None = typer.Option(
        None, envvar="ROLLWIRE_ADMIN_KEY", help="Key for /api (generated and printed if unset)."
    ),
    open_mode: bool = typer.Option(
        False,
        "--open",
        help="LOCAL DEVELOPMENT ONLY: accept any session id as token, create sessions on use.",
    ),
    secret: str | None = typer.Option(
        None,
        envvar="ROLLWIRE_GATEWAY_SECRET",
        help="HMAC secret for session tokens (set it to keep tokens valid across restarts).",
    ),
    public_url: str | None = typer.Option(
        None, help="URL agents use to reach this gateway (for base_url in new sessions)."
    ),
    max_body_bytes: int = typer.Option(8 * 1024 * 1024, help="Largest accepted request body."),
    upstream_timeout: float = typer.Option(600.0, help="Seconds to wait for a backend's answer."),
    health_interval: float = typer.Option(5.0, help="Seconds between backend health checks."),
    log_level: str = typer.Option("warning", help="uvicorn / rollwire log level."),
) -> None:
    """Serve the gateway until interrupted."""
    if ctx.invoked_subcommand is not None:
        return
    import uvicorn

    from rollwire.gateway.app import Gateway
    from rollwire.gateway.config import BackendSpec, GatewayConfig

    logging.basicConfig(level=log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if admin_key is None and not open_mode:
        admin_key = secrets.token_urlsafe(24)
        typer.echo(f"admin key (generated): {admin_key}", err=True)
    if open_mode:
        typer.secho(
            "WARNING: --open accepts ANY session id as a token. Local development only.",
            fg=typer.colors.RED,
            err=True,
            bold=True,
        )
    try:
        specs = [BackendSpec.parse(b) for b in backend]
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--backend") from exc
    cfg = GatewayConfig(
        backends=specs,
        store=store,
        admin_key=admin_key,
        open=open_mode,
        secret=secret,
        public_url=public_url or f"http://{host}:{port}",
        max_body_bytes=max_body_bytes,
        upstream_timeout=upstream_timeout,
        health_interval=health_interval,
        tune_gc=True,
    )
    gateway = Gateway(cfg)
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
    uvicorn.run(
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


def main() -> None:
    """Entry point for ``python -m rollwire.cli.gateway``."""
    gateway_app()


if __name__ == "__main__":
    main()
