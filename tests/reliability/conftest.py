"""Shared by the reliability tests: a gateway in its own process (to ``kill -9``), a scripted
backend, and a throwaway redis-server."""

from __future__ import annotations

import multiprocessing
import multiprocessing.process
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from rollwire.agent.serving import ServerThread, free_port
from rollwire.testing.null_backend import NullBackend
from rollwire.testing.store import redis_server

__all__ = ["ADMIN_KEY", "GatewayProcess", "redis_server"]

ADMIN_KEY = "reliability-admin-key"


def _serve(port: int, store: str, backends: list[str], config: dict[str, Any]) -> None:
    """The child: a gateway as ``rollwire gateway`` runs it (uvicorn, httptools, lifespan)."""
    import uvicorn

    from rollwire.gateway.app import Gateway
    from rollwire.gateway.config import BackendSpec, GatewayConfig

    cfg = GatewayConfig(
        backends=[BackendSpec.parse(b) for b in backends],
        store=store,
        admin_key=ADMIN_KEY,
        public_url=f"http://127.0.0.1:{port}",
        health_interval=0.5,
        **config,
    )
    uvicorn.run(
        Gateway(cfg),
        host="127.0.0.1",
        port=port,
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level="warning",
    )


class GatewayProcess:
    """A gateway in a forked child process on a free port (forked: no seconds of imports on a
    busy machine); :meth:`kill` is ``kill -9``."""

    def __init__(self, store: str, backends: list[str], **config: Any) -> None:
        self.store = store
        self.backends = backends
        self.config = config
        self.port = free_port()
        self.proc: multiprocessing.process.BaseProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> GatewayProcess:
        ctx = multiprocessing.get_context("fork")
        self.proc = ctx.Process(
            target=_serve, args=(self.port, self.store, self.backends, self.config), daemon=True
        )
        self.proc.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.proc.is_alive():
                raise RuntimeError(f"gateway exited with {self.proc.exitcode}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.02)  # no event says a child process started listening
        self.stop()
        raise TimeoutError(f"gateway on {self.url} did not come up in {timeout}s")

    @property
    def pid(self) -> int:
        assert self.proc is not None and self.proc.pid is not None
        return self.proc.pid

    def kill(self) -> None:
        """``kill -9``: no shutdown, no flush."""
        if self.proc is not None and self.proc.is_alive():
            os.kill(self.pid, signal.SIGKILL)
            self.proc.join()

    def stop(self) -> None:
        if self.proc is None or not self.proc.is_alive():
            return
        self.proc.terminate()
        self.proc.join(15)
        if self.proc.is_alive():
            self.kill()

    def api(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """A control-plane request with the admin key."""
        headers = {"authorization": f"Bearer {ADMIN_KEY}", **kw.pop("headers", {})}
        return httpx.request(method, self.url + path, headers=headers, timeout=30.0, **kw)


@pytest.fixture
def null_backend() -> Iterator[str]:
    """A null inference backend (vLLM-shaped answers with token ids) in a thread."""
    with ServerThread(NullBackend()) as server:
        yield server.url


@pytest.fixture
def gateway_procs() -> Iterator[list[GatewayProcess]]:
    """Gateways a test starts; all stopped after it."""
    procs: list[GatewayProcess] = []
    yield procs
    for p in procs:
        p.stop()
