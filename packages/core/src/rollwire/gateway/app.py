"""The gateway: an ASGI app with the OpenAI-compatible data plane and the ``/api`` control plane.

The data plane is dispatched by hand (no router on the hot path); ``/api``, ``/health`` and
``/metrics`` go to a small Starlette app (:mod:`rollwire.gateway.control`). Every captured call is
committed to the store before its response (or its final SSE event) leaves the gateway.
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
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import numpy as np
import orjson
from starlette.responses import Response, StreamingResponse

from rollwire.data.protocol import ModelCall
from rollwire.gateway.backends import Backend, BackendPool
from rollwire.gateway.capture import (
    Asked,
    Captured,
    StreamAccumulator,
    extract,
    resolve_policy_version,
    strip_chunk,
)
from rollwire.gateway.capture import strip_response as _strip
from rollwire.gateway.config import BackendSpec, GatewayConfig
from rollwire.gateway.context import ChatContext
from rollwire.gateway.errors import GatewayError, error_body, error_response, upstream_error_body
from rollwire.gateway.metrics import GatewayMetrics
from rollwire.gateway.sampling import apply_sampling, check_sampling, tool_choice_flags
from rollwire.gateway.security import TokenError, TokenSigner, new_secret
from rollwire.gateway.upstream import (
    UpstreamBrokenError,
    UpstreamConnectError,
    UpstreamError,
    UpstreamPool,
)
from rollwire.store import SessionClosed, SessionNotFound, SessionRecord, Store, open_store

__all__ = ["Gateway"]

log = logging.getLogger("rollwire.gateway")

_JSON = "application/json"
_VENDOR_HEADERS = {"content-type": _JSON}
_CHAT = "/v1/chat/completions"
_COMPLETIONS = "/v1/completions"
_MODELS = "/v1/models"
_LOGPROBS_MODE = {"vllm": "raw", "sglang": "processed"}
_MAX_ATTEMPT_HASHES = 8
_UPSTREAM_HEADERS = b"Content-Type: application/json\r\nX-Session-ID: "
_MAX_CACHED_SESSIONS = 65_536  # live sessions kept in memory; idle ones past it are evicted
_SWEEP_INTERVAL = 30.0  # seconds between sweeps of expired sessions out of that cache

ASGIResponse = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


class RawResponse:
    """A complete response body sent as two ASGI messages (no header objects on the hot path)."""

    __slots__ = ("body", "content_type", "status")

    def __init__(self, body: bytes, status: int = 200, content_type: bytes = b"application/json"):
        self.body = body
        self.status = status
        self.content_type = content_type

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": self.status,
                "headers": [
                    (b"content-type", self.content_type),
                    (b"content-length", str(len(self.body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": self.body})


class _Attempt:
    """One request of a session, registered when it starts, so an agent-side retry is matched
    with its original even while the original is still running."""

    __slots__ = ("call_id", "committed", "prior", "retry_count", "superseded_by")

    def __init__(self, retry_count: int, prior: _Attempt | None) -> None:
        self.retry_count = retry_count
        self.prior = prior  # the attempt this one retries (same body, retry header > 0)
        self.call_id: str | None = None
        self.committed = False
        self.superseded_by: str | None = None  # a retry of this one succeeded before it landed


class SessionState:
    """What the gateway keeps in memory about a live session."""

    __slots__ = ("attempts", "header_id", "in_flight", "record", "state", "upstream_headers")

    def __init__(self, record: SessionRecord) -> None:
        self.record = record
        self.state: dict[str, Any] = {}
        self.in_flight = 0
        self.attempts: OrderedDict[int, _Attempt] = OrderedDict()  # hash(raw body) -> attempt
        sid = record.session_id.encode("utf-8")
        if any(c < 0x20 or c == 0x7F for c in sid):
            sid = b""  # never put control characters (CR/LF) into a header line
        self.header_id = sid.decode("utf-8")
        # The header lines every forwarded call of this session carries (prefix-cache affinity).
        self.upstream_headers = _UPSTREAM_HEADERS + sid + b"\r\n"


def _bearer(value: str | None) -> str | None:
    if value and value[:7].lower() == "bearer ":
        return value[7:].strip()
    return None


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
        self._resumed: asyncio.Event | None = None
        self._drained: asyncio.Event | None = None
        self._http: aiohttp.ClientSession | None = None
        self.upstream = UpstreamPool(limit=cfg.pool_size, connect_timeout=cfg.connect_timeout)
        self._health_task: asyncio.Task[None] | None = None
        self._sweep_task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._id_prefix = secrets.token_hex(8)
        self._ids = itertools.count()
        self._timeout = aiohttp.ClientTimeout(
            total=cfg.upstream_timeout, sock_connect=cfg.connect_timeout
        )
        from rollwire.gateway.control import build_control_app

        self._control = build_control_app(self)
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
        if self.config.tune_gc:
            gc.collect()
            gc.freeze()
            gc.set_threshold(50_000, 50, 100)

    async def shutdown(self) -> None:
        """Stop background work, close the pool and (if the gateway opened it) the store."""
        for task in (self._health_task, self._sweep_task):
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

    # ------------------------------------------------------------------ ASGI
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "http":
            path: str = scope["path"]
            if path.startswith("/s/"):
                rest = path[3:]
                slash = rest.find("/")
                if slash > 0:
                    await self._data_plane(scope, receive, send, rest[:slash], rest[slash:])
                    return
            elif path.startswith("/v1/"):
                token = _bearer(_header(scope, b"authorization"))
                await self._data_plane(scope, receive, send, token, path)
                return
            await self._control(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        else:
            await self._control(scope, receive, send)

    @property
    def app(self) -> Gateway:
        """The ASGI application (the gateway itself)."""
        return self

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    # ------------------------------------------------------------------ sessions
    def authenticate(self, token: str | None) -> str:
        """The session id a data-plane token names (401 otherwise)."""
        if not token:
            raise GatewayError(
                401,
                "missing session token: use base_url {gateway}/s/<token>/v1 or "
                "'Authorization: Bearer <token>' on /v1",
                "authentication_error",
                "missing_token",
            )
        try:
            return self.signer.verify(token)
        except TokenError as exc:
            if self.config.open:
                return token
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
        st = self.sessions.get(session_id)
        if st is None:
            st = SessionState(rec)
            if not rec.terminal:  # a closed session needs no state: its calls get 409
                self.sessions[session_id] = st
                if len(self.sessions) > _MAX_CACHED_SESSIONS:
                    self._evict(time.time())
        return st

    def _evict(self, now: float) -> None:
        """Drop expired sessions, then least recently used idle ones past the bound."""
        for sid, st in list(self.sessions.items()):
            exp = st.record.expires_at
            if st.in_flight == 0 and exp is not None and exp < now:
                del self.sessions[sid]
        # Down to 90% of the bound, so a gateway at the bound does not scan on every new session.
        excess = len(self.sessions) - _MAX_CACHED_SESSIONS * 9 // 10
        if excess > 0:
            for sid in [sid for sid, st in self.sessions.items() if st.in_flight == 0][:excess]:
                del self.sessions[sid]

    async def _sweep_sessions(self) -> None:
        while True:
            await asyncio.sleep(_SWEEP_INTERVAL)
            self._evict(time.time())

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
            self.session_finished(new)
        return new

    def issue_token(self, rec: SessionRecord) -> str:
        """A signed data-plane token for the session."""
        return self.signer.issue(rec.session_id, rec.expires_at or (time.time() + 3600))

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

    # ------------------------------------------------------------------ data plane
    async def _data_plane(
        self, scope: dict[str, Any], receive: Any, send: Any, token: str | None, rest: str
    ) -> None:
        st: SessionState | None = None
        counted = False
        response: ASGIResponse
        try:
            try:
                session_id = self.authenticate(token)
                st = await self.session_state(session_id)
                method = scope["method"]
                if rest == _MODELS and method == "GET":
                    response = await self._models()
                elif rest in (_CHAT, _COMPLETIONS) and method == "POST":
                    raw = await _read_body(scope, receive, self.config.max_body_bytes)
                    if self.paused:
                        assert self._resumed is not None
                        await self._resumed.wait()
                    self._check_budget(st)
                    st.in_flight += 1
                    self.in_flight += 1
                    counted = True
                    if self._drained is not None:
                        self._drained.clear()
                    response = await self._handle_call(scope, st, rest, raw)
                else:
                    raise GatewayError(
                        404,
                        f"no route {method} {rest} on the data plane",
                        "invalid_request_error",
                        "not_found",
                    )
            except GatewayError as exc:
                response = exc.response()
            except Exception as exc:
                response = self._internal_error(exc, st)
            await response(scope, receive, send)
        finally:
            # Whatever happened above (even an exception while sending): the call is over.
            if counted and st is not None:
                st.in_flight -= 1
                self.in_flight -= 1
                if self.in_flight == 0 and self._drained is not None:
                    self._drained.set()
                sid = st.record.session_id
                if st.in_flight == 0 and st.record.terminal and self.sessions.get(sid) is st:
                    del self.sessions[sid]

    def _internal_error(self, exc: Exception, st: SessionState | None) -> Response:
        sid = st.record.session_id if st is not None else None
        log.error("unexpected error serving a call of session %r", sid, exc_info=exc)
        self.metrics.error("internal")
        return error_response(
            500,
            f"internal gateway error: {type(exc).__name__}: {exc}",
            "server_error",
            "internal_error",
        )

    def _check_budget(self, st: SessionState) -> None:
        rec = st.record
        if rec.terminal or rec.session_id in self.closing:
            raise GatewayError(
                409,
                f"session {rec.session_id!r} is "
                f"{rec.status if rec.terminal else 'being completed'}; "
                "it accepts no more model calls",
                "invalid_request_error",
                "session_closed",
            )
        if rec.expires_at is not None and rec.expires_at < time.time():
            # Touched after its TTL: it becomes ``timeout`` (in the background; the call is
            # refused either way).
            task = asyncio.ensure_future(self.expire(rec))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            raise GatewayError(401, "session expired", "authentication_error", "session_expired")
        if rec.max_calls is not None and rec.num_calls + st.in_flight >= rec.max_calls:
            self.metrics.error("budget_calls")
            raise GatewayError(
                429,
                f"session {rec.session_id!r} reached its budget of {rec.max_calls} model calls",
                "rate_limit_error",
                "call_budget_exceeded",
            )
        if rec.max_tokens is not None and rec.num_tokens >= rec.max_tokens:
            self.metrics.error("budget_tokens")
            raise GatewayError(
                429,
                f"session {rec.session_id!r} used its budget of {rec.max_tokens} tokens "
                f"({rec.num_tokens} generated)",
                "rate_limit_error",
                "token_budget_exceeded",
            )

    async def _models(self) -> Response:
        backend = self.pool.pick("")
        if backend is None:
            raise GatewayError(503, "no inference backend configured", "server_error", "no_backend")
        try:
            async with self.http.get(backend.url + _MODELS) as resp:
                data = await resp.read()
                return Response(data, status_code=resp.status, media_type=_JSON)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            self.pool.mark_failed(backend)
            raise GatewayError(
                502, f"backend {backend.url} unreachable: {exc}", "server_error", "bad_gateway"
            ) from exc

    def new_call_id(self) -> str:
        """A fresh call id."""
        return f"{self._id_prefix}{next(self._ids):08x}"

    async def _handle_call(
        self, scope: dict[str, Any], st: SessionState, path: str, raw: bytes
    ) -> ASGIResponse:
        t0 = time.perf_counter()
        started_at = time.time()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise GatewayError(400, f"request body is not valid JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise GatewayError(400, "request body must be a JSON object")
        if body.get("tools") == []:
            del body["tools"]  # vLLM rejects an empty tool list; Strands always sends one
        retry_count = 0
        rc = _header(scope, b"x-stainless-retry-count")
        if rc:
            with contextlib.suppress(ValueError):
                retry_count = int(rc)
        raw_hash = hash(raw)
        rec = st.record
        # Registered now, not at commit: a retry that lands before its original is still matched.
        attempts = st.attempts
        attempt = _Attempt(retry_count, attempts.get(raw_hash) if retry_count > 0 else None)
        attempts[raw_hash] = attempt
        attempts.move_to_end(raw_hash)
        if len(attempts) > _MAX_ATTEMPT_HASHES:
            attempts.popitem(last=False)

        async def commit(call: ModelCall) -> None:
            await self._commit(st, call, attempt)

        try:
            return await self._dispatch(scope, st, path, body, attempt, commit, t0, started_at)
        except GatewayError:
            raise
        except Exception as exc:
            if not attempt.committed:
                # Still leave a trace of the attempt: a failed, non-trainable call.
                call = new_call(
                    call_id=attempt.call_id or self.new_call_id(),
                    session_id=rec.session_id,
                    index=0,
                    status="failed",
                    trainable=False,
                    error=f"internal gateway error: {type(exc).__name__}: {exc}",
                    stream=bool(body.get("stream")),
                    started_at=started_at,
                    latency_ms=(time.perf_counter() - t0) * 1000.0,
                    request=body,
                    capture=rec.capture,
                )
                with contextlib.suppress(Exception):
                    await commit(call)
            return self._internal_error(exc, st)

    async def _dispatch(
        self,
        scope: dict[str, Any],
        st: SessionState,
        path: str,
        body: dict[str, Any],
        attempt: _Attempt,
        commit: Callable[[ModelCall], Awaitable[None]],
        t0: float,
        started_at: float,
    ) -> ASGIResponse:
        rec = st.record
        if path == _CHAT and rec.capture == "tokens":
            return await self._tokens_chat(scope, st, body, commit, started_at)

        fwd = dict(body)
        asked = Asked.from_body(body)
        effective, flags = self.apply_sampling(rec, fwd)
        if "tool_choice" in body:
            flags += tool_choice_flags(body)
        backend = self.pool.pick(rec.session_id)
        if backend is None:
            raise GatewayError(503, "no inference backend configured", "server_error", "no_backend")
        stream = bool(body.get("stream"))
        chat = path == _CHAT
        if rec.chat_template_kwargs and chat:
            agent_kwargs = fwd.get("chat_template_kwargs")
            fwd["chat_template_kwargs"] = {
                **(agent_kwargs if isinstance(agent_kwargs, dict) else {}),
                **rec.chat_template_kwargs,
            }
        attempt.call_id = self.new_call_id()
        call = new_call(
            call_id=attempt.call_id,
            session_id=rec.session_id,
            index=0,
            sampling=effective,
            trainable=not (flags and not rec.allow_off_policy),
            off_policy=bool(flags),
            flags=list(flags),
            stream=stream,
            started_at=started_at,
            request=body,
            capture="passthrough",
        )
        if stream:
            headers = {"content-type": _JSON, "x-session-id": st.header_id}
            return await self._forward_stream(st, call, fwd, asked, chat, path, headers, t0, commit)
        return await self._forward(st, call, fwd, asked, path, st.upstream_headers, t0, commit)

    def apply_sampling(
        self, rec: SessionRecord, body: dict[str, Any]
    ) -> tuple[dict[str, Any], list[str]]:
        """The session's sampling policy applied to ``body`` in place, plus the token budget.

        Raises a 400 :class:`GatewayError` when the agent sent a parameter of the wrong type."""
        try:
            check_sampling(body)
        except ValueError as exc:
            raise GatewayError(400, str(exc), code="invalid_sampling_parameter") from exc
        effective, flags = apply_sampling(body, rec.sampling, rec.sampling_policy)
        if rec.max_tokens is not None:
            left = max(1, rec.max_tokens - rec.num_tokens)
            if body.get("max_tokens") is None or body["max_tokens"] > left:
                body["max_tokens"] = left
                effective["max_tokens"] = left
        return effective, flags

    def _prepare(self, backend: Backend, fwd: dict[str, Any], chat: bool) -> bytes:
        body = fwd
        if backend.model is not None and fwd.get("model") != backend.model:
            body = dict(fwd)
            body["model"] = backend.model
        if backend.kind != "openai":
            body = dict(body)
            stream = bool(body.get("stream"))
            if backend.kind == "sglang" and stream:
                body["return_output_ids_in_sglext"] = True
            else:
                body["return_token_ids"] = True
            if backend.kind == "vllm":
                body["return_weight_versions"] = True
            if chat:
                body["logprobs"] = True
            elif not body.get("logprobs"):
                body["logprobs"] = 1
        return orjson.dumps(body)

    async def _send(
        self, st: SessionState, path: str, fwd: dict[str, Any], headers: dict[str, str]
    ) -> tuple[Backend, aiohttp.ClientResponse]:
        """POST to a backend; on a connection failure, take it out and retry once elsewhere."""
        tried: set[str] = set()
        last: Exception | None = None
        chat = path == _CHAT
        for _ in range(2):
            backend = self.pool.pick(st.record.session_id, exclude=frozenset(tried))
            if backend is None:
                break
            tried.add(backend.name)
            backend.in_flight += 1
            try:
                resp = await self.http.post(
                    backend.url + path, data=self._prepare(backend, fwd, chat), headers=headers
                )
            except (aiohttp.ClientConnectionError, aiohttp.ConnectionTimeoutError, OSError) as exc:
                if isinstance(exc, asyncio.TimeoutError) and not isinstance(
                    exc, aiohttp.ConnectionTimeoutError
                ):
                    backend.in_flight -= 1
                    raise
                backend.in_flight -= 1
                self.pool.mark_failed(backend)
                self.metrics.error("backend_connect")
                last = exc
                continue
            except BaseException:
                backend.in_flight -= 1
                raise
            return backend, resp
        if last is None:
            raise GatewayError(503, "no healthy inference backend", "server_error", "no_backend")
        raise GatewayError(
            502, f"inference backend unreachable: {last}", "server_error", "bad_gateway"
        )

    async def _post(
        self, st: SessionState, path: str, fwd: dict[str, Any], headers: bytes
    ) -> tuple[Backend, int, bytes]:
        """POST to a backend with the lean client; on a connection failure, take the backend
        out and retry once elsewhere. Raises :class:`UpstreamBrokenError` when the answer broke
        off, ``asyncio.TimeoutError`` on timeout."""
        tried: set[str] = set()
        last: Exception | None = None
        chat = path == _CHAT
        for _ in range(2):
            backend = self.pool.pick(st.record.session_id, exclude=frozenset(tried))
            if backend is None:
                break
            tried.add(backend.name)
            backend.in_flight += 1
            try:
                status, payload = await self.upstream.post(
                    backend.url,
                    path,
                    self._prepare(backend, fwd, chat),
                    headers,
                    self.config.upstream_timeout,
                )
            except UpstreamConnectError as exc:
                self.pool.mark_failed(backend)
                self.metrics.error("backend_connect")
                last = exc
                continue
            except UpstreamBrokenError:
                # Not the backend's "no": it died while answering. The caller may retry once.
                self.pool.mark_failed(backend)
                raise
            finally:
                backend.in_flight -= 1
            return backend, status, payload
        if last is None:
            raise GatewayError(503, "no healthy inference backend", "server_error", "no_backend")
        raise GatewayError(
            502, f"inference backend unreachable: {last}", "server_error", "bad_gateway"
        )

    async def _failed(
        self, call: ModelCall, commit: Any, status: int, message: str, code: str, t0: float
    ) -> ASGIResponse:
        call.status = "failed"
        call.error = message
        call.trainable = False
        call.latency_ms = (time.perf_counter() - t0) * 1000.0
        await commit(call)
        self.metrics.error(code)
        type_ = "server_error" if status >= 500 else "invalid_request_error"
        return error_response(status, message, type_, code)

    async def _forward(
        self,
        st: SessionState,
        call: ModelCall,
        fwd: dict[str, Any],
        asked: Asked,
        path: str,
        headers: bytes,
        t0: float,
        commit: Any,
    ) -> ASGIResponse:
        backend: Backend | None = None
        try:
            for attempt in range(2):
                try:
                    backend, status, payload = await self._post(st, path, fwd, headers)
                    break
                except UpstreamBrokenError:
                    # The backend died while answering: nothing reached the agent; retry once.
                    if attempt == 1:
                        raise
        except GatewayError as exc:
            return await self._failed(call, commit, exc.status, exc.message, exc.code or "", t0)
        except asyncio.TimeoutError:
            return await self._failed(
                call,
                commit,
                504,
                f"inference backend timed out after {self.config.upstream_timeout}s",
                "upstream_timeout",
                t0,
            )
        except UpstreamError as exc:
            return await self._failed(
                call, commit, 502, f"inference backend failed: {exc}", "bad_gateway", t0
            )
        assert backend is not None
        t_up = time.perf_counter()
        self.metrics.upstream_latency.observe(t_up - t0)
        call.backend = backend.name
        call.logprobs_mode = _LOGPROBS_MODE.get(backend.kind)  # type: ignore[assignment]
        if status != 200:
            call.status = "failed"
            call.trainable = False
            call.error = f"backend answered {status}: {payload[:2000].decode(errors='replace')}"
            call.latency_ms = (time.perf_counter() - t0) * 1000.0
            await commit(call)
            self.metrics.error("upstream_status")
            return RawResponse(upstream_error_body(status, payload), status)
        try:
            data = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return await self._failed(
                call, commit, 502, "inference backend answered with invalid JSON", "bad_gateway", t0
            )
        self._fill(call, extract(data), backend)
        call.latency_ms = (time.perf_counter() - t0) * 1000.0
        if not asked.everything:
            _strip(data, asked)
            payload = orjson.dumps(data)
        call.response = data
        await commit(call)
        self.metrics.latency.observe(time.perf_counter() - t0)
        return RawResponse(payload)

    def _fill(self, call: ModelCall, cap: Captured, backend: Backend) -> None:
        call.prompt_ids = cap.prompt_ids
        call.completion_ids = cap.completion_ids
        call.logprobs = cap.logprobs
        call.routed_experts = cap.routed_experts
        call.finish_reason = cap.finish_reason
        if cap.weight_version is not None:
            call.policy_version, mismatch = resolve_policy_version(
                cap.weight_version, self.policy_version
            )
            if mismatch:
                call.flags.append("policy_version_mismatch")
        if backend.kind == "openai" or not cap.has_ids:
            call.trainable = False
            call.flags.append("no_token_ids")
        elif cap.logprobs.shape[0] != cap.completion_ids.shape[0]:
            call.trainable = False
            call.flags.append("logprobs_mismatch")
            call.logprobs = np.zeros(cap.completion_ids.shape[0], dtype=np.float32)

    async def _forward_stream(
        self,
        st: SessionState,
        call: ModelCall,
        fwd: dict[str, Any],
        asked: Asked,
        chat: bool,
        path: str,
        headers: dict[str, str],
        t0: float,
        commit: Any,
    ) -> ASGIResponse:
        try:
            backend, resp = await self._send(st, path, fwd, headers)
        except GatewayError as exc:
            return await self._failed(call, commit, exc.status, exc.message, exc.code or "", t0)
        except asyncio.TimeoutError:
            return await self._failed(
                call, commit, 504, "inference backend timed out", "upstream_timeout", t0
            )
        call.backend = backend.name
        call.logprobs_mode = _LOGPROBS_MODE.get(backend.kind)  # type: ignore[assignment]
        if resp.status != 200:
            try:
                payload = await resp.read()
            finally:
                resp.release()
                backend.in_flight -= 1
            call.status = "failed"
            call.trainable = False
            call.error = (
                f"backend answered {resp.status}: {payload[:2000].decode(errors='replace')}"
            )
            call.latency_ms = (time.perf_counter() - t0) * 1000.0
            await commit(call)
            self.metrics.error("upstream_status")
            return RawResponse(upstream_error_body(resp.status, payload), resp.status)
        return StreamingResponse(
            self._relay(call, resp, backend, asked, chat, t0, commit),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache"},
        )

    async def _relay(
        self,
        call: ModelCall,
        resp: aiohttp.ClientResponse,
        backend: Backend,
        asked: Asked,
        chat: bool,
        t0: float,
        commit: Any,
    ) -> AsyncIterator[bytes]:
        acc = StreamAccumulator()
        committed = False
        error: str | None = None
        buf = b""

        async def finish(ok: bool) -> bytes | None:
            """Commit the call. None when it landed as it was; else the SSE event(s) to end the
            stream with: an error event (the call was refused, or the backend's stream could not
            be read), then ``[DONE]`` where the stream may still go on."""
            nonlocal committed, error
            tail: bytes | None = None
            try:
                self._fill(call, acc.captured(), backend)
                call.response = acc.response(chat)
            except Exception as exc:  # malformed ids, log-probs, ... from the backend
                log.warning("could not read the stream of call %s: %r", call.call_id, exc)
                reason = f"inference backend sent a malformed stream: {type(exc).__name__}: {exc}"
                error = f"{error}; {reason}" if error else reason
                ok = False
                call.response = {}
                tail = (
                    b"data: "
                    + error_body(reason, "server_error", "bad_gateway")
                    + b"\n\ndata: [DONE]\n\n"
                )
            call.latency_ms = (time.perf_counter() - t0) * 1000.0
            if not ok:
                call.status = "failed"
                call.trainable = False
                call.error = error or "stream ended before [DONE]"
            try:
                await commit(call)
            except GatewayError as exc:  # the session was closed or deleted meanwhile: final
                committed = True
                return b"data: " + error_body(exc.message, exc.type, exc.code) + b"\n\n"
            committed = True
            self.metrics.latency.observe(time.perf_counter() - t0)
            return tail

        async def finish_late() -> None:
            with contextlib.suppress(Exception):
                await finish(False)

        try:
            async for data in resp.content.iter_any():
                buf += data
                while True:
                    end = buf.find(b"\n\n")
                    if end < 0:
                        break
                    event, buf = buf[:end], buf[end + 2 :]
                    for line in event.split(b"\n"):
                        line = line.rstrip(b"\r")
                        if not line.startswith(b"data:"):
                            continue
                        payload = line[5:].strip()
                        if payload == b"[DONE]":
                            if committed:
                                continue
                            # A stream that carried an error event is not a good call.
                            refused = await finish(error is None)
                            if refused is not None:
                                yield refused
                                return
                            yield b"data: [DONE]\n\n"
                            continue
                        try:
                            chunk = orjson.loads(payload)
                        except orjson.JSONDecodeError:
                            continue
                        if isinstance(chunk, dict) and "error" in chunk and "choices" not in chunk:
                            error = f"backend stream error: {chunk['error']}"
                            yield b"data: " + payload + b"\n\n"
                            continue
                        if not isinstance(chunk, dict):
                            continue
                        acc.add(chunk)
                        if asked.everything:
                            yield b"data: " + payload + b"\n\n"
                        elif strip_chunk(chunk, asked):
                            yield b"data: " + orjson.dumps(chunk) + b"\n\n"
            if not committed:
                # A server that ends without [DONE] after a finish reason is still a good call.
                refused = await finish(acc.finish_reason is not None and error is None)
                if refused is not None:
                    yield refused
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            error = f"inference backend stream failed: {exc!r}"
            if not committed:
                await finish(False)
            yield b"data: " + error_body(error, "server_error", "bad_gateway") + b"\n\n"
        except Exception as exc:
            # Anything else (a chunk of the wrong shape): record the call, tell the agent.
            log.warning("relaying the stream of call %s failed: %r", call.call_id, exc)
            reason = f"internal gateway error while relaying: {type(exc).__name__}: {exc}"
            error = f"{error}; {reason}" if error else reason
            if not committed:
                await finish(False)
            yield (
                b"data: "
                + error_body(reason, "server_error", "internal_error")
                + b"\n\ndata: [DONE]\n\n"
            )
        finally:
            resp.release()
            backend.in_flight -= 1
            if not committed:
                # The agent went away mid-stream (or the commit failed): still record the
                # (failed) attempt.
                error = error or "client disconnected during the stream"
                task = asyncio.ensure_future(finish_late())
                self._background.add(task)
                task.add_done_callback(self._background.discard)

    async def _commit(self, st: SessionState, call: ModelCall, attempt: _Attempt) -> None:
        rec = st.record
        if call.policy_version is None:
            call.policy_version = self.policy_version
        if call.backend is None:
            b = self.pool.backends.get(self.pool._sticky.get(rec.session_id, ""))
            call.backend = b.name if b is not None else None
        prior = attempt.prior
        if attempt.retry_count > 0:
            call.retry_count = attempt.retry_count
            if prior is not None:
                call.retry_of = prior.call_id
        if attempt.superseded_by is not None:
            # A retry of this request succeeded while this one was still running.
            call.trainable = False
            call.flags.append("superseded_by_retry")
        # Set before the await: a retry committing meanwhile queues its mark after this append.
        attempt.call_id = call.call_id
        attempt.committed = True
        t = time.perf_counter()
        try:
            await self.store.append_call(call)
        except SessionClosed as exc:
            raise GatewayError(
                409,
                f"session {rec.session_id!r} was completed while this call ran; the call is "
                "not recorded",
                "invalid_request_error",
                "session_closed",
            ) from exc
        except SessionNotFound as exc:
            raise GatewayError(
                404,
                f"session {rec.session_id!r} was deleted while this call ran",
                "invalid_request_error",
                "session_not_found",
            ) from exc
        self.metrics.commit_latency.observe(time.perf_counter() - t)
        n_completion = int(call.completion_ids.shape[0])
        rec.num_calls += 1
        rec.num_tokens += n_completion
        self.metrics.call(
            "chat" if "messages" in call.request else "completions",
            call.status,
            int(call.prompt_ids.shape[0]),
            n_completion,
        )
        if prior is not None and call.status == "ok":
            if prior.committed and prior.call_id is not None:
                await self.store.mark_superseded(rec.session_id, prior.call_id, call.call_id)
            else:
                prior.superseded_by = call.call_id  # it marks itself when it lands

    async def _tokens_chat(
        self,
        scope: dict[str, Any],
        st: SessionState,
        body: dict[str, Any],
        commit: Any,
        started_at: float,
    ) -> ASGIResponse:
        # Imported on first use: passthrough-only gateways never load the renderer stack.
        from rollwire.gateway import tokens

        rec = st.record
        backend = self.pool.pick(rec.session_id)
        if backend is None:
            raise GatewayError(503, "no inference backend configured", "server_error", "no_backend")

        def _apply(params: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
            return self.apply_sampling(rec, params)

        ctx = ChatContext(
            body=body,
            session=rec,
            state=st.state,
            backend=backend,
            http=self.http,
            apply_sampling=_apply,
            commit=commit,
            new_call_id=self.new_call_id,
            policy_version=self.policy_version,
            request_headers={
                k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]
            },
            mark_backend_failed=lambda: self.pool.mark_failed(backend),
            started_at=started_at,
            gateway=self,
        )
        backend.in_flight += 1
        try:
            response: Response = await tokens.handle_chat(ctx)
        finally:
            backend.in_flight -= 1
        return response

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


_CALL_DEFAULTS = ModelCall(call_id="", session_id="", index=0).__dict__


def new_call(**fields: Any) -> ModelCall:
    """A ModelCall without validation or per-field default factories (the hot path)."""
    values = {
        k: (v.copy() if isinstance(v, (list, dict)) else v) for k, v in _CALL_DEFAULTS.items()
    }
    values.update(fields)
    return ModelCall.model_construct(None, **values)


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for k, v in scope["headers"]:
        if k == name:
            return str(v.decode("latin-1"))
    return None


async def _read_body(scope: dict[str, Any], receive: Any, limit: int) -> bytes:
    length = _header(scope, b"content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise GatewayError(
            413,
            f"request body of {length} bytes exceeds the gateway limit of {limit} bytes",
            "invalid_request_error",
            "request_too_large",
        )
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise GatewayError(400, "client disconnected", "invalid_request_error", "disconnected")
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise GatewayError(
                    413,
                    f"request body exceeds the gateway limit of {limit} bytes",
                    "invalid_request_error",
                    "request_too_large",
                )
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
