"""Run a gateway in a background thread (tests, notebooks, the embedded trainer setup)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rollwire.agent.serving import ServerThread
from rollwire.gateway.app import Gateway
from rollwire.gateway.config import BackendSpec, GatewayConfig

if TYPE_CHECKING:
    from rollwire.trainer.gateway_client import GatewayClient

__all__ = ["RunningGateway", "serve_in_thread"]


class RunningGateway:
    """A gateway served on a thread: ``url``, ``admin_key``, ``client()``, ``stop()``."""

    def __init__(self, gateway: Gateway, server: ServerThread) -> None:
        self.gateway = gateway
        self.server = server
        self.url = server.url
        self.admin_key = gateway.admin_key

    @property
    def store(self) -> Any:
        """The gateway's store."""
        return self.gateway.store

    def client(self) -> GatewayClient:
        """A synchronous control-plane client for this gateway."""
        from rollwire.trainer.gateway_client import GatewayClient

        return GatewayClient(self.url, self.admin_key)

    def stop(self) -> None:
        """Stop serving (closes the store the gateway opened)."""
        self.server.stop()

    def __enter__(self) -> RunningGateway:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_in_thread(
    backends: list[Any] | None = None,
    store: str = "sqlite::memory:",
    admin_key: str | None = None,
    open: bool = False,
    host: str = "127.0.0.1",
    port: int | None = None,
    **config: Any,
) -> RunningGateway:
    """Start a gateway on a background thread and return once it accepts connections.

    ``backends``: ``[(url, kind)]``, ``"URL[=kind]"`` strings or :class:`BackendSpec`; extra
    keyword arguments go to :class:`GatewayConfig`. An admin key is generated when not given.
    """
    cfg = GatewayConfig(
        backends=[BackendSpec.parse(b) for b in backends or []],
        store=store,
        admin_key=admin_key,
        open=open,
        **config,
    )
    if cfg.admin_key is None:
        import secrets

        cfg.admin_key = secrets.token_urlsafe(24)
    gateway = Gateway(cfg)
    server = ServerThread(gateway, host=host, port=port)
    if cfg.public_url is None:
        cfg.public_url = server.url
    try:
        server.start()
    except BaseException:
        gateway_store = gateway.store
        close = getattr(gateway_store, "close_sync", None)
        if close is not None:
            close()
        raise
    return RunningGateway(gateway, server)
