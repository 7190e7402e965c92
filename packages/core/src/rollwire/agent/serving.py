"""Run an ASGI app with uvicorn on a background thread (engine, gateway, RolloutApp in tests)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import uvicorn


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ServerThread:
    """An ASGI app served by uvicorn on its own thread and event loop; ``stop()`` always joins it.

    Use as a context manager or call ``start()`` / ``stop()``. ``url`` is ``http://host:port``.
    """

    def __init__(
        self,
        app: Any,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        log_level: str = "warning",
        **uvicorn_kwargs: Any,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.url = f"http://{host}:{self.port}"
        loop = "uvloop" if _has_uvloop() else "asyncio"
        self._config = uvicorn.Config(
            app,
            host=host,
            port=self.port,
            log_level=log_level,
            loop=loop,
            http="httptools",
            lifespan="on",
            access_log=False,
            **uvicorn_kwargs,
        )
        self._server = uvicorn.Server(self._config)
        self._thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def _run(self) -> None:
        self._server.run()

    def start(self, timeout: float = 30.0) -> ServerThread:
        """Start serving and block until the socket accepts connections."""
        self._thread = threading.Thread(target=self._run, name=f"uvicorn-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"server on {self.url} exited during start-up")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"server on {self.url} did not start within {timeout}s")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Ask uvicorn to exit and wait for the thread."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True
