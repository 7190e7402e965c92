"""The gateway: an ASGI app with the OpenAI-compatible data plane and the ``/api`` control plane.

This module is the entry point and the routing: :class:`Gateway` holds the state (store, backend
pool, live sessions in :mod:`.live_sessions`, pause, drain and policy version in
:mod:`.shared_state`) and dispatches data-plane requests by hand (no router on the hot path) to
the handlers in :attr:`Gateway.call_routes`; ``/api``, ``/health`` and ``/metrics`` go to a small
Starlette app (:mod:`.control.routes`). The handlers live in :mod:`.dataplane`: ``calls`` (per
route), ``dispatch`` (upstream), ``relay`` (streams) and ``commit`` (the store): every captured
call is committed before its response (or its final SSE event) leaves the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import logging
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import aiohttp
from starlette.routing import BaseRoute

from rollwire.gateway import dialects, process
from rollwire.gateway.asgi import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    MODELS_PATH,
    ASGIResponse,
    bearer,
    header,
    lifespan,
    read_body,
)
from rollwire.gateway.backends.pool import BackendPool
from rollwire.gateway.backends.upstream import UpstreamPool
from rollwire.gateway.config import BackendSpec, GatewayConfig
from rollwire.gateway.control.foreign_results import SESSION_CONTROL_PATHS, foreign_result_routes
from rollwire.gateway.control.routes import build_control_app
from rollwire.gateway.dataplane import calls, hangups
from rollwire.gateway.dataplane.sessions import SessionState
from rollwire.gateway.dataplane.staleness import StalenessGate
from rollwire.gateway.errors import GatewayError
from rollwire.gateway.live_sessions import LiveSessions
from rollwire.gateway.metrics import GatewayMetrics
from rollwire.gateway.security import TokenSigner, new_secret
from rollwire.gateway.shared_state import SharedState
from rollwire.gateway.sync_barrier import SyncBarrier
from rollwire.gateway.ui import ui_routes
from rollwire.store import SessionRecord, Store, open_store

__all__ = ["CallHandler", "Gateway"]

log = logging.getLogger("rollwire.gateway")


#: A data-plane handler for a POST that makes a model call: (gateway, scope, session, path, raw
#: body) -> the ASGI response. Register one per path in :attr:`Gateway.call_routes`.
CallHandler = Callable[
    ["Gateway", dict[str, Any], SessionState, str, bytes], Awaitable[ASGIResponse]
]


class Gateway(LiveSessions, SharedState):
    """The gateway's state and its ASGI entry point (``gateway.app`` or the instance itself)."""

    def __init__(self, config: GatewayConfig | None = None, *, store: Store | None = None) -> None:
        self.config = config or GatewayConfig()
        cfg = self.config
        self.store: Store = store if store is not None else open_store(cfg.store)
        self._owns_store = store is None
        self.admin_key = cfg.admin_key
        secret = cfg.secret
        if secret is None and self.admin_key is not None:
            # Same admin key, same token secret: session tokens survive a gateway restart.
            secret = hmac.new(
                self.admin_key.encode(), b"rollwire-session-tokens", "sha256"
            ).hexdigest()
        if self.admin_key is None and not cfg.open:
            self.admin_key = secrets.token_urlsafe(24)
        self.signer = TokenSigner(secret or new_secret())
        self.pool = BackendPool([BackendSpec.parse(b) for b in cfg.backends])
        self.metrics = GatewayMetrics()
        # Live sessions (LRU): terminal ones are not kept, expired and idle-over-bound evicted.
        self.sessions: OrderedDict[str, SessionState] = OrderedDict()
        self.closing: set[str] = set()  # sessions whose completion is under way: no new calls
        # ``/wait`` requests per session: the event completion sets, and how many wait on it
        # (the entry goes when the last of them leaves, or the session is deleted).
        self.waiters: dict[str, asyncio.Event] = {}
        self.waiter_counts: dict[str, int] = {}
        self.policy_version: str | None = None
        self.paused = False
        self.in_flight = 0
        #: POST routes of the data plane that make a model call (counted in flight, held while
        #: paused), by path under ``/v1``; a new wire dialect adds its handler here.
        self.call_routes: dict[str, CallHandler] = {
            CHAT_PATH: calls.handle_call,
            COMPLETIONS_PATH: calls.handle_call,
            **dialects.CALL_ROUTES,
        }
        self._resumed: asyncio.Event | None = None
        self._drained: asyncio.Event | None = None
        self._http: aiohttp.ClientSession | None = None
        self.upstream = UpstreamPool(limit=cfg.pool_size, connect_timeout=cfg.connect_timeout)
        self._health_task: asyncio.Task[None] | None = None
        self._sweep_task: asyncio.Task[None] | None = None
        self._trim_task: asyncio.Task[None] | None = None
        self._share_task: asyncio.Task[None] | None = None
        self._shared_seen: tuple[bool, str | None] = (False, None)  # last read from the store
        self.barrier = SyncBarrier(self)  # this gateway's part in a weight sync's pause
        self.staleness = StalenessGate(self)  # max_staleness: the ordinals, the held calls
        self._background: set[asyncio.Task[Any]] = set()
        self._id_prefix = secrets.token_hex(8)
        self._ids = itertools.count()
        self._timeout = aiohttp.ClientTimeout(
            total=cfg.upstream_timeout, sock_connect=cfg.connect_timeout
        )
        self._extra_routes: list[BaseRoute] = list(ui_routes(self))  # the /ui dashboard
        self._extra_routes.extend(foreign_result_routes(self))  # S3 / SageMaker result channels
        self._control = build_control_app(self, self._extra_routes)
        if cfg.open:
            log.warning(
                "rollwire gateway in OPEN mode: any session id is accepted as a token and "
                "sessions are created on first use. Local development only."
            )

    # ------------------------------------------------------------------ lifecycle
    @property
    def http(self) -> aiohttp.ClientSession:
        """The pooled upstream HTTP client (exists between start-up and shutdown)."""
        if self._http is None:
            raise RuntimeError("gateway not started: its HTTP client exists only while serving")
        return self._http

    @property
    def started(self) -> bool:
        """True between start-up and shutdown (while :attr:`http` exists)."""
        return self._http is not None

    async def startup(self) -> None:
        """Open the upstream connection pool and start health checks."""
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._drained = asyncio.Event()
        self._drained.set()
        self.upstream = UpstreamPool(
            limit=self.config.pool_size, connect_timeout=self.config.connect_timeout
        )
        connector = aiohttp.TCPConnector(
            limit=self.config.pool_size, limit_per_host=0, ttl_dns_cache=300
        )
        self._http = aiohttp.ClientSession(
            connector=connector, timeout=self._timeout, auto_decompress=False
        )
        # Always: backends added at run time (POST /api/backends) need checks too.
        self._health_task = asyncio.create_task(
            self.pool.run_health_checks(self._http, self.config.health_interval)
        )
        self._sweep_task = asyncio.create_task(self._sweep_sessions())
        with contextlib.suppress(Exception):  # a store down at start-up: the loop retries
            await self.load_shared_state()
        self._share_task = asyncio.create_task(self._follow_shared_state())
        if self.config.memory_trim_interval > 0:
            self._trim_task = asyncio.create_task(
                process.trim_memory(self.config.memory_trim_interval)
            )
        if self.config.tune_gc:
            process.freeze_gc()

    async def shutdown(self) -> None:
        """Stop background work, close the pool and (if the gateway opened it) the store."""
        for task in (self._health_task, self._sweep_task, self._share_task, self._trim_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        await self.barrier.close()
        await self.upstream.close()
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self._owns_store:
            await self.store.close()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` in the background; shutdown waits for it."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def add_routes(self, routes: Sequence[BaseRoute]) -> None:
        """Serve more Starlette routes beside the control plane (a gateway feature's own
        routes, e.g. a dashboard or a foreign result channel). Call before serving."""
        self._extra_routes.extend(routes)
        self._control = build_control_app(self, self._extra_routes)

    # ------------------------------------------------------------------ ASGI
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "http":
            path: str = scope["path"]
            if path.startswith("/s/"):
                rest = path[3:]
                slash = rest.find("/")
                if slash > 0 and rest[slash:] not in SESSION_CONTROL_PATHS:
                    await self._data_plane(scope, receive, send, rest[:slash], rest[slash:])
                    return
            elif path.startswith("/v1/"):
                # Bearer for OpenAI-style clients, x-api-key for Anthropic ones.
                token = bearer(header(scope, b"authorization")) or header(scope, b"x-api-key")
                await self._data_plane(scope, receive, send, token, path)
                return
            await self._control(scope, receive, send)
        elif kind == "lifespan":
            await lifespan(receive, send, self.startup, self.shutdown)
        else:
            await self._control(scope, receive, send)

    @property
    def app(self) -> Gateway:
        """The ASGI application (the gateway itself)."""
        return self

    # ------------------------------------------------------------------ calls
    def new_call_id(self) -> str:
        """A fresh call id."""
        return f"{self._id_prefix}{next(self._ids):08x}"

    def apply_sampling(
        self, rec: SessionRecord, body: dict[str, Any]
    ) -> tuple[dict[str, Any], list[str]]:
        """The session's sampling policy applied to ``body`` in place, plus the token budget
        (:func:`rollwire.gateway.dataplane.calls.session_sampling`)."""
        return calls.session_sampling(rec, body)

    # ------------------------------------------------------------------ data plane
    async def _route(
        self, scope: dict[str, Any], receive: Any, st: SessionState, rest: str
    ) -> tuple[ASGIResponse, bool]:
        """The response for one data-plane request, and whether it was counted in flight."""
        method = scope["method"]
        if rest == MODELS_PATH and method == "GET":
            return await calls.models(self), False
        handler = self.call_routes.get(rest) if method == "POST" else None
        if handler is None:
            raise GatewayError(
                404,
                f"no route {method} {rest} on the data plane",
                "invalid_request_error",
                "not_found",
            )
        raw = await read_body(scope, receive, self.config.max_body_bytes)
        if st.record.max_staleness is not None:
            await self.staleness.admit(st)  # a stale rollout's first call waits, not in flight
        if self.paused:
            assert self._resumed is not None
            await self._resumed.wait()
        calls.check_budget(self, st)
        st.in_flight += 1
        self.in_flight += 1
        if self._drained is not None:
            self._drained.clear()
        # The agent may hang up while the backend works: the call is then recorded as such.
        hangup = hangups.watch(receive)
        scope["rollwire.hangup"] = hangup
        try:
            return await handler(self, scope, st, rest, raw), True
        except BaseException:
            self._call_over(st)
            raise
        finally:
            hangup.stop()  # before the response runs: a stream listens for itself
            # The flag holds uvicorn's request cycle, which holds the scope: left in the scope,
            # that loop would keep the whole request for the cyclic GC to find.
            scope.pop("rollwire.hangup", None)

    def _call_over(self, st: SessionState) -> None:
        st.in_flight -= 1
        self.in_flight -= 1
        if self.in_flight == 0 and self._drained is not None:
            self._drained.set()
        sid = st.record.session_id
        if st.in_flight == 0 and st.record.terminal and self.sessions.get(sid) is st:
            del self.sessions[sid]

    async def _data_plane(
        self, scope: dict[str, Any], receive: Any, send: Any, token: str | None, rest: str
    ) -> None:
        st: SessionState | None = None
        counted = False
        response: ASGIResponse
        try:
            try:
                session_id, incarnation = self.authenticate_full(token)
                st = await self.session_state(session_id)
                self.check_incarnation(st.record, incarnation)
                response, counted = await self._route(scope, receive, st, rest)
            except GatewayError as exc:
                response = dialects.refusal(rest, exc)
            except Exception as exc:
                response = calls.internal_error(self, exc, st)
            await response(scope, receive, send)
        finally:
            # Whatever happened above (even an exception while sending): the call is over.
            if counted and st is not None:
                self._call_over(st)
