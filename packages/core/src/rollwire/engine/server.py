"""HTTP server of the embedded engine: vLLM's OpenAI-compatible routes plus SGLang's ``/generate``.

Shapes follow ``SERVER_APIS.md`` (vLLM 0.33 / SGLang 0.5). Model work runs on the scheduler's
worker thread; handlers only await its events, so the event loop never blocks on NumPy. This
module is the app factory; the routes live one module per API family: :mod:`.api_openai`
(chat/completions, streams in :mod:`.api_streams`), :mod:`.api_tokens` (token-in generate,
tokenize), :mod:`.api_sglang` (``/generate``), :mod:`.api_admin` (weights, pause, info).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

from starlette.applications import Starlette

from rollwire.agent.serving import ServerThread

from . import api_admin, api_openai, api_sglang, api_tokens
from .config import EngineConfig
from .model import TinyModel
from .runtime import Engine
from .tokenizer import EngineTokenizer

__all__ = ["EmbeddedEngine", "Engine", "create_app", "serve_in_thread"]


def create_app(config: EngineConfig | None = None) -> Starlette:
    """The engine's ASGI app; the model loads now and the worker thread starts with the app."""
    engine = Engine(config or EngineConfig())

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        engine.scheduler.start()
        try:
            yield
        finally:
            engine.scheduler.stop()

    routes = [
        *api_openai.routes(engine),
        *api_tokens.routes(engine),
        *api_sglang.routes(engine),
        *api_admin.routes(engine),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.engine = engine
    return app


class EmbeddedEngine:
    """The embedded engine served on a background thread: ``with EmbeddedEngine() as eng: eng.base_url``.

    ``url`` is ``http://host:port``; ``base_url`` adds ``/v1`` for OpenAI clients.
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        **overrides: Any,
    ) -> None:
        cfg = config or EngineConfig()
        if overrides:
            cfg = replace(cfg, **overrides)
        self.config = cfg
        self.app = create_app(cfg)
        self.engine: Engine = self.app.state.engine
        self._server = ServerThread(self.app, host=host, port=port)
        self.url = self._server.url
        self.base_url = self.url + "/v1"

    @property
    def tokenizer(self) -> EngineTokenizer:
        """The engine's tokenizer."""
        return self.engine.tokenizer

    @property
    def model(self) -> TinyModel:
        """The engine's model."""
        return self.engine.model

    @property
    def port(self) -> int:
        """The TCP port served."""
        return self._server.port

    def start(self) -> EmbeddedEngine:
        """Start serving; returns self once the socket accepts connections."""
        self._server.start()
        return self

    def stop(self) -> None:
        """Stop the server and the worker thread."""
        self._server.stop()
        self.engine.scheduler.stop()

    def __enter__(self) -> EmbeddedEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_in_thread(
    config: EngineConfig | None = None, *, host: str = "127.0.0.1", port: int | None = None
) -> EmbeddedEngine:
    """Start an :class:`EmbeddedEngine` and return it (call ``.stop()`` when done)."""
    return EmbeddedEngine(config, host=host, port=port).start()
