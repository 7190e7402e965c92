"""The gateway: an ASGI app with the OpenAI-compatible data plane and the ``/api`` control plane.

This module is the entry point and the routing: :class:`Gateway` holds the state (store, backend
pool, live sessions, pause and drain) and dispatches data-plane requests by hand (no router on
the hot path) to the handlers in :attr:`Gateway.call_routes`; ``/api``, ``/health`` and
``/metrics`` go to a small Starlette app (:mod:`rollwire.gateway.control`). The handlers live in
:mod:`~rollwire.gateway.calls` (per route), :mod:`~rollwire.gateway.dispatch` (upstream),
:mod:`~rollwire.gateway.relay` (streams) and :mod:`~rollwire.gateway.commit` (the store): every
captured call is committed before its response (or its final SSE event) leaves the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import itertools
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import aiohttp
from starlette.routing import BaseRoute

from rollwire.gateway import calls, dialects
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
from rollwire.gateway.backends import BackendPool
from rollwire.gateway.config import BackendSpec, GatewayConfig
from rollwire.gateway.control import build_control_app
from rollwire.gateway.errors import GatewayError
from rollwire.gateway.foreign_results import SESSION_CONTROL_PATHS, foreign_result_routes
from rollwire.gateway.metrics import GatewayMetrics
from rollwire.gateway.security import TokenError, TokenSigner, new_secret
from rollwire.gateway.sessions import SessionState
from rollwire.gateway.ui import ui_routes
from rollwire.gateway.upstream import UpstreamPool
from rollwire.store import SessionNotFound, SessionRecord, Store, open_store

__all__ = ["CallHandler", "Gateway"]

log = logging.getLogger("rollwire.gateway")

_NO_TOKEN = (
    "missing session token: use base_url {gateway}/s/<token>/v1 or "
    "'Authorization: Bearer <token>' on /v1"
)
_MAX_CACHED_SESSIONS = 65_536  # live sessions kept in memory; idle ones past it are evicted
# Settings in the store that every gateway on it shares.
_PAUSED = "gateway:paused"
_POLICY_VERSION = "gateway:policy_version"

#: A data-plane handler for a POST that makes a model call: (gateway, scope, session, path, raw
#: body) -> the ASGI response. Register one per path in :attr:`Gateway.call_routes`.
CallHandler = Callable[
    ["Gateway", dict[str, Any], SessionState, str, bytes], Awaitable[ASGIResponse]
]


async def _watch_hangup(receive: Any, hangup: asyncio.Event) -> None:
    """Set ``hangup`` when the client disconnects (the request body was read already)."""
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            hangup.set()
            return


class Gateway:
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
        self._share_task: asyncio.Task[None] | None = None
        self._shared_seen: tuple[bool, str | None] = (False, None)  # last read from the store
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
        if self.config.tune_gc:
            gc.collect()
            gc.freeze()
            gc.set_threshold(50_000, 50, 100)

    async def shutdown(self) -> None:
        """Stop background work, close the pool and (if the gateway opened it) the store."""
        for task in (self._health_task, self._sweep_task, self._share_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
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

    # ------------------------------------------------------------------ sessions
    def authenticate(self, token: str | None) -> str:
        """The session id a data-plane token names (401 otherwise)."""
        return self.authenticate_full(token)[0]

    def authenticate_full(self, token: str | None) -> tuple[str, str | None]:
        """``(session id, incarnation or None)`` a data-plane token names (401 otherwise)."""
        if not token:
            raise GatewayError(401, _NO_TOKEN, "authentication_error", "missing_token")
        try:
            return self.signer.verify_full(token)
        except TokenError as exc:
            if self.config.open:
                return token, None
            self.metrics.error("unauthorized")
            raise GatewayError(401, str(exc), "authentication_error", "invalid_token") from exc

    async def session_state(self, session_id: str) -> SessionState:
        """The live state of a session (loaded from the store on first use)."""
        st = self.sessions.get(session_id)
        if st is not None:
            self.sessions.move_to_end(session_id)
            return st
        rec = await self.store.get_session(session_id)
        if rec is None:
            if not self.config.open:
                raise GatewayError(
                    404,
                    f"session {session_id!r} not found",
                    "invalid_request_error",
                    "session_not_found",
                )
            rec = SessionRecord(session_id=session_id)
            with contextlib.suppress(ValueError):
                await self.store.create_session(rec)
            rec = await self.store.get_session(session_id) or rec
        shared: Any = None
        if not rec.terminal:
            # Another gateway (or this one before a restart) may have routed it already.
            shared = await self.store.get_setting(f"sticky:{session_id}")
        st = self.sessions.get(session_id)
        if st is None:
            st = SessionState(rec)
            if isinstance(shared, str) and self.pool.stick(session_id, shared):
                st.shared_backend = shared
            if not rec.terminal:  # a closed session needs no state: its calls get 409
                self.sessions[session_id] = st
                if len(self.sessions) > _MAX_CACHED_SESSIONS:
                    for old in self._evict(time.time()):
                        self.spawn(self.expire(old))
        return st

    def _evict(self, now: float) -> list[SessionRecord]:
        """Drop expired sessions (returned, to be timed out), then least recently used idle ones
        past the bound."""
        expired = []
        for sid, st in list(self.sessions.items()):
            exp = st.record.expires_at
            if st.in_flight == 0 and exp is not None and exp < now:
                del self.sessions[sid]
                expired.append(st.record)
        # Down to 90% of the bound, so a gateway at the bound does not scan on every new session.
        excess = len(self.sessions) - _MAX_CACHED_SESSIONS * 9 // 10
        if excess > 0:
            for sid in [sid for sid, st in self.sessions.items() if st.in_flight == 0][:excess]:
                del self.sessions[sid]
                self.metrics.sessions_evicted += 1
        return expired

    async def _sweep_sessions(self) -> None:
        while True:
            await asyncio.sleep(self.config.sweep_interval)
            for rec in self._evict(time.time()):
                # Abandoned: nobody completed it before its TTL. It becomes ``timeout`` now,
                # not whenever someone happens to read it.
                with contextlib.suppress(Exception):
                    await self.expire(rec)

    async def expire(self, rec: SessionRecord) -> SessionRecord:
        """Give a running session past its TTL the status ``timeout`` (returns the record)."""
        if rec.terminal or rec.expires_at is None or rec.expires_at >= time.time():
            return rec
        from rollwire.store import CompletionConflict

        try:
            new, changed = await self.store.complete(
                rec.session_id, status="timeout", error="session expired (ttl passed)"
            )
        except CompletionConflict as exc:
            return exc.record  # completed meanwhile
        except SessionNotFound:
            return rec
        if changed:
            self.metrics.sessions_expired += 1
            self.session_finished(new)
        return new

    def issue_token(self, rec: SessionRecord) -> str:
        """A signed data-plane token for the session."""
        return self.signer.issue(
            rec.session_id, rec.expires_at or (time.time() + 3600), rec.incarnation
        )

    def check_incarnation(self, rec: SessionRecord, incarnation: str | None) -> None:
        """Refuse (401) a token issued for an earlier session that had this id."""
        if incarnation is not None and incarnation != rec.incarnation:
            self.metrics.error("unauthorized")
            raise GatewayError(
                401,
                f"this token was issued for an earlier session {rec.session_id!r} that was "
                "deleted; the session now under that id has its own token",
                "authentication_error",
                "invalid_token",
            )

    def session_finished(self, rec: SessionRecord) -> None:
        """Called when a session became terminal: wake waiters, drop routing affinity."""
        st = self.sessions.get(rec.session_id)
        if st is not None:
            st.record = rec
            if st.in_flight == 0:
                del self.sessions[rec.session_id]
        ev = self.waiters.get(rec.session_id)
        if ev is not None:
            ev.set()
        self.pool.forget(rec.session_id)

    def new_call_id(self) -> str:
        """A fresh call id."""
        return f"{self._id_prefix}{next(self._ids):08x}"

    def apply_sampling(
        self, rec: SessionRecord, body: dict[str, Any]
    ) -> tuple[dict[str, Any], list[str]]:
        """The session's sampling policy applied to ``body`` in place, plus the token budget
        (:func:`rollwire.gateway.calls.session_sampling`)."""
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
        if self.paused:
            assert self._resumed is not None
            await self._resumed.wait()
        calls.check_budget(self, st)
        st.in_flight += 1
        self.in_flight += 1
        if self._drained is not None:
            self._drained.clear()
        # The agent may hang up while the backend works: the call is then recorded as such.
        hangup = asyncio.Event()
        scope["rollwire.hangup"] = hangup
        watcher = asyncio.ensure_future(_watch_hangup(receive, hangup))
        try:
            return await handler(self, scope, st, rest, raw), True
        except BaseException:
            self._call_over(st)
            raise
        finally:
            watcher.cancel()  # before the response runs: a stream listens for itself

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

    # ------------------------------------------------------------------ shared state
    async def load_shared_state(self) -> None:
        """Take the pause state and policy version from the store (set by any gateway on it,
        and kept across restarts)."""
        paused = bool(await self.store.get_setting(_PAUSED))
        raw = await self.store.get_setting(_POLICY_VERSION)
        version = None if raw is None else str(raw)
        # Follow changes only (what this process set itself stays until someone changes it).
        last_paused, last_version = self._shared_seen
        if paused != last_paused and paused != self.paused:
            self.pause() if paused else self.resume()
        if version != last_version:
            self.policy_version = version
        self._shared_seen = (paused, version)

    async def _follow_shared_state(self) -> None:
        while True:
            await asyncio.sleep(self.config.shared_state_interval)
            try:
                await self.load_shared_state()
            except Exception as exc:
                log.debug("could not read the shared gateway state: %r", exc)

    async def set_paused(self, paused: bool) -> None:
        """Pause or resume every gateway on this store (this one at once, the others within
        ``shared_state_interval``); kept across restarts."""
        await self.store.set_setting(_PAUSED, True if paused else None)
        self._shared_seen = (paused, self._shared_seen[1])
        self.pause() if paused else self.resume()

    async def set_policy_version(self, version: str | None) -> None:
        """Set the policy version stamped on captured calls, for every gateway on this store."""
        await self.store.set_setting(_POLICY_VERSION, version)
        self._shared_seen = (self._shared_seen[0], version)
        self.policy_version = version

    # ------------------------------------------------------------------ pause / drain
    def pause(self) -> None:
        """Hold new data-plane calls until :meth:`resume`."""
        self.paused = True
        if self._resumed is not None:
            self._resumed.clear()

    def resume(self) -> None:
        """Let held and new calls through again."""
        self.paused = False
        if self._resumed is not None:
            self._resumed.set()

    async def drained(self, timeout: float | None = None) -> bool:
        """Wait until no call is in flight; False on timeout."""
        if self._drained is None or self.in_flight == 0:
            return True
        try:
            await asyncio.wait_for(self._drained.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True
