"""The control plane (``/api``, see docs/control-api.md), ``/health`` and ``/metrics``."""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollwire.data.protocol import TERMINAL_STATUSES, Rollout
from rollwire.data.trajectory import TrajectoryBuilder
from rollwire.gateway.config import BACKEND_KINDS, BackendSpec
from rollwire.gateway.errors import GatewayError, error_response
from rollwire.gateway.sampling import POLICIES, check_sampling
from rollwire.gateway.security import TokenError
from rollwire.store import CompletionConflict, SessionExists, SessionNotFound, SessionRecord

if TYPE_CHECKING:
    from rollwire.gateway.app import Gateway

__all__ = ["build_control_app"]

log = logging.getLogger("rollwire.gateway")

_MAX_LIST_LIMIT = 100_000  # the most sessions one ``GET /api/sessions`` lists

_CREATE_FIELDS = {
    "session_id",
    "group_id",
    "task_id",
    "metadata",
    "sampling",
    "sampling_policy",
    "ttl",
    "max_calls",
    "max_tokens",
    "capture",
    "allow_off_policy",
    "chat_template_kwargs",
}


def _json(data: Any, status: int = 200) -> Response:
    return Response(
        orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status,
        media_type="application/json",
    )


def _too_large(limit: int) -> GatewayError:
    return GatewayError(
        413,
        f"request body exceeds the gateway limit of {limit} bytes",
        "invalid_request_error",
        "request_too_large",
    )


async def _body(request: Request, limit: int) -> dict[str, Any]:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw:
        return {}
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise GatewayError(400, f"request body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise GatewayError(400, "request body must be a JSON object")
    return data


def _positive_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if type(value) is not int or value < 1:
        raise GatewayError(
            400, f"{key} must be a positive integer, got {value!r}", code="invalid_field"
        )
    return value


def _positive_seconds(value: Any, key: str) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
        raise GatewayError(
            400, f"{key} must be a positive number of seconds, got {value!r}", code="invalid_field"
        )
    return float(value)


def _query_number(request: Request, key: str, default: float) -> float:
    raw = request.query_params.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise GatewayError(
            400, f"{key} must be a non-negative number, got {raw!r}", code="invalid_query"
        )
    return value


def _same(given: str, key: str) -> bool:
    """Constant-time comparison of a presented key with the admin key."""
    return hmac.compare_digest(given.encode("utf-8"), key.encode("utf-8"))


def _finite(value: Any, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError) as exc:
        raise GatewayError(400, f"{what} must be a number, got {value!r}") from exc
    if type(value) is bool or not math.isfinite(number):
        raise GatewayError(400, f"{what} must be a finite number, got {value!r}")
    return number


def build_control_app(gw: Gateway) -> Starlette:
    """The Starlette app serving everything but the data plane."""

    def require_admin(request: Request) -> None:
        if gw.admin_key is None:
            return  # open mode without an admin key: local development
        auth = request.headers.get("authorization", "")
        if auth[:7].lower() == "bearer " and _same(auth[7:].strip(), gw.admin_key):
            return
        gw.metrics.error("unauthorized_admin")
        raise GatewayError(
            401,
            "the control plane needs 'Authorization: Bearer <admin key>'",
            "authentication_error",
            "invalid_admin_key",
        )

    async def load(session_id: str) -> SessionRecord:
        rec = await gw.store.get_session(session_id)
        if rec is None:
            raise GatewayError(
                404,
                f"session {session_id!r} not found",
                "invalid_request_error",
                "session_not_found",
            )
        if not rec.terminal and rec.expires_at is not None and rec.expires_at < time.time():
            rec = await gw.expire(rec)  # past its TTL: it becomes ``timeout`` when looked at
        return rec

    async def body_of(request: Request) -> dict[str, Any]:
        return await _body(request, gw.config.max_body_bytes)

    async def check_tokens_session(rec: SessionRecord) -> None:
        """Refuse a tokens session whose chat template no tool-call parser understands (the
        calls would fail one by one later). Other problems, such as a backend that is down or
        names no tokenizer, are left to the request-time checks, which say the same."""
        from rollwire.gateway import tokens
        from rollwire.gateway.parsers import TemplateNotSupported

        backend = gw.pool.pick(rec.session_id)
        try:
            await tokens.check_session(rec.metadata, backend, gateway=gw)
        except TemplateNotSupported as exc:
            raise GatewayError(
                400, f"capture='tokens': {exc}", code="unsupported_chat_template"
            ) from exc
        except Exception as exc:  # not decidable now: the first call will say what is wrong
            log.info("tokens session %r not checked at creation: %s", rec.session_id, exc)

    def public_url(request: Request) -> str:
        if gw.config.public_url:
            return gw.config.public_url.rstrip("/")
        return str(request.base_url).rstrip("/")

    async def create_session(request: Request) -> Response:
        require_admin(request)
        body = await body_of(request)
        unknown = set(body) - _CREATE_FIELDS
        if unknown:
            raise GatewayError(
                400, f"unknown session fields {sorted(unknown)}; allowed: {sorted(_CREATE_FIELDS)}"
            )
        capture = body.get("capture") or "passthrough"
        if capture not in ("passthrough", "tokens"):
            raise GatewayError(400, f"capture must be 'passthrough' or 'tokens', got {capture!r}")
        policy = body.get("sampling_policy") or {}
        if not isinstance(policy, dict) or any(v not in POLICIES for v in policy.values()):
            raise GatewayError(
                400, f"sampling_policy values must be one of {POLICIES}, got {policy!r}"
            )
        for key in ("metadata", "sampling", "chat_template_kwargs"):
            if body.get(key) is not None and not isinstance(body[key], dict):
                raise GatewayError(
                    400, f"{key} must be an object, got {body[key]!r}", code="invalid_field"
                )
        for key in ("session_id", "group_id", "task_id"):
            value = body.get(key)
            if type(value) is int:
                body[key] = str(value)  # a numeric task index names the task as well
            elif value is not None and not isinstance(value, str):
                raise GatewayError(
                    400, f"{key} must be a string, got {value!r}", code="invalid_field"
                )
        aop = body.get("allow_off_policy")
        if aop is None:
            aop = False
        elif not isinstance(aop, bool):
            raise GatewayError(
                400, f"allow_off_policy must be true or false, got {aop!r}", code="invalid_field"
            )
        ttl = gw.config.default_ttl
        if body.get("ttl") is not None:
            ttl = _positive_seconds(body["ttl"], "ttl")
        max_calls = _positive_int(body, "max_calls")
        max_tokens = _positive_int(body, "max_tokens")
        now = time.time()
        sampling = dict(body.get("sampling") or {})
        try:
            check_sampling(sampling, where="sampling")
        except ValueError as exc:
            raise GatewayError(400, str(exc), code="invalid_field") from exc
        if "max_completion_tokens" in sampling:
            sampling.setdefault("max_tokens", sampling.pop("max_completion_tokens"))
        rec = SessionRecord(
            session_id=body.get("session_id") or uuid.uuid4().hex,
            group_id=body.get("group_id"),
            task_id=body.get("task_id"),
            metadata=dict(body.get("metadata") or {}),
            sampling=sampling,
            sampling_policy=dict(policy),
            capture=capture,
            allow_off_policy=aop,
            chat_template_kwargs=body.get("chat_template_kwargs"),
            max_calls=max_calls,
            max_tokens=max_tokens,
            expires_at=now + ttl,
            created_at=now,
        )
        if capture == "tokens":
            await check_tokens_session(rec)
        try:
            await gw.store.create_session(rec)
        except SessionExists as exc:
            raise GatewayError(409, str(exc), "invalid_request_error", "session_exists") from exc
        token = gw.issue_token(rec)
        url = public_url(request)
        return _json(
            {
                "session_id": rec.session_id,
                "token": token,
                "base_url": f"{url}/s/{token}/v1",
                "complete_url": f"{url}/api/sessions/{rec.session_id}/complete",
                "expires_at": rec.expires_at,
            },
            201,
        )

    async def get_session(request: Request) -> Response:
        require_admin(request)
        rec = await load(request.path_params["session_id"])
        return _json(rec.info())

    async def list_sessions(request: Request) -> Response:
        require_admin(request)
        q = request.query_params
        limit = q.get("limit")
        if limit and not (
            limit.isascii()
            and limit.isdigit()
            and len(limit) <= len(str(_MAX_LIST_LIMIT))
            and 0 < int(limit) <= _MAX_LIST_LIMIT
        ):
            raise GatewayError(
                400,
                f"limit must be an integer from 1 to {_MAX_LIST_LIMIT}, got {limit[:40]!r}",
                code="invalid_query",
            )
        recs = await gw.store.list_sessions(
            group_id=q.get("group_id") or None,
            status=q.get("status") or None,
            limit=int(limit) if limit else None,
        )
        return _json({"sessions": [r.info() for r in recs]})

    async def session_calls(request: Request) -> Response:
        require_admin(request)
        sid = request.path_params["session_id"]
        await load(sid)
        calls = await gw.store.calls(sid)
        return Response(
            b'{"calls":[' + b",".join(c.model_dump_json().encode() for c in calls) + b"]}",
            media_type="application/json",
        )

    async def rollout_of(sid: str) -> Rollout:
        rec = await load(sid)
        calls = await gw.store.calls(sid)
        status = (
            rec.status if rec.status in TERMINAL_STATUSES or rec.status == "running" else "running"
        )
        return Rollout.model_validate(
            {
                "rollout_id": sid,
                "group_id": rec.group_id,
                "task_id": rec.task_id,
                "status": status,
                "reward": rec.reward,
                "metrics": rec.metrics,
                "error": rec.error,
                "metadata": rec.metadata,
                "capture": rec.capture,
                "created_at": rec.created_at,
                "completed_at": rec.completed_at,
            }
        ).model_copy(update={"calls": calls})

    async def session_rollout(request: Request) -> Response:
        require_admin(request)
        rollout = await rollout_of(request.path_params["session_id"])
        return Response(rollout.to_json(), media_type="application/json")

    async def session_trajectory(request: Request) -> Response:
        require_admin(request)
        mode = request.query_params.get("mode", "merge")
        if mode not in ("merge", "per_call"):
            raise GatewayError(400, f"mode must be 'merge' or 'per_call', got {mode!r}")
        rollout = await rollout_of(request.path_params["session_id"])
        rows = TrajectoryBuilder(mode).build(rollout)  # type: ignore[arg-type]
        return Response(
            b'{"rows":[' + b",".join(r.model_dump_json().encode() for r in rows) + b"]}",
            media_type="application/json",
        )

    async def complete(request: Request) -> Response:
        sid = request.path_params["session_id"]
        auth = request.headers.get("authorization", "")
        token = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        if not (gw.admin_key is None or _same(token, gw.admin_key)):
            try:
                owner = gw.signer.verify(token) if token else None
            except TokenError:
                owner = None
            if owner != sid:
                gw.metrics.error("unauthorized_admin")
                raise GatewayError(
                    401,
                    "completing a session needs the admin key or that session's own token",
                    "authentication_error",
                    "invalid_token",
                )
        body = await body_of(request)
        status = body.get("status")
        if status is None:
            status = "completed"
        if not isinstance(status, str) or status not in TERMINAL_STATUSES:
            raise GatewayError(
                400, f"status must be one of {sorted(TERMINAL_STATUSES)}, got {status!r}"
            )
        reward = body.get("reward")
        if reward is not None:
            reward = _finite(reward, "reward")
        metrics = body.get("metrics") or {}
        if not isinstance(metrics, dict):
            raise GatewayError(400, f"metrics must be an object of numbers, got {metrics!r}")
        metrics = {str(k): _finite(v, f"metrics[{k!r}]") for k, v in metrics.items()}
        error = body.get("error")
        if error is not None and not isinstance(error, str):
            raise GatewayError(400, f"error must be a string, got {error!r}")
        # From here on new calls of the session are refused (409), so none lands after the
        # completion; calls already in flight are let in first.
        closing = sid not in gw.closing
        gw.closing.add(sid)
        try:
            st = gw.sessions.get(sid)
            if st is not None and st.in_flight:
                deadline = time.monotonic() + 30.0
                while st.in_flight and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
            try:
                rec, changed = await gw.store.complete(
                    sid, status=status, reward=reward, metrics=metrics, error=error
                )
            except SessionNotFound as exc:
                raise GatewayError(
                    404, f"session {sid!r} not found", "invalid_request_error", "session_not_found"
                ) from exc
            except CompletionConflict as exc:
                raise GatewayError(
                    409, str(exc), "invalid_request_error", "completion_conflict"
                ) from exc
        finally:
            if closing:
                gw.closing.discard(sid)
        if changed or rec.terminal:
            gw.session_finished(rec)
        return _json(rec.info())

    async def wait(request: Request) -> Response:
        require_admin(request)
        sid = request.path_params["session_id"]
        timeout = min(_query_number(request, "timeout", 30.0), 300.0)
        deadline = time.monotonic() + max(0.0, timeout)
        ev = gw.waiters.get(sid)
        if ev is None:
            ev = gw.waiters[sid] = asyncio.Event()
        gw.waiter_counts[sid] = gw.waiter_counts.get(sid, 0) + 1
        try:
            while True:
                rec = await load(sid)
                left = deadline - time.monotonic()
                if rec.terminal or left <= 0:
                    return _json(rec.info())
                try:
                    # In-process completion sets the event; another gateway sharing the store
                    # is noticed by polling.
                    await asyncio.wait_for(ev.wait(), min(left, gw.config.wait_poll_interval))
                except asyncio.TimeoutError:
                    pass
        finally:
            # The last waiter out removes the entry (unless a delete already replaced it).
            if gw.waiters.get(sid) is ev:
                left_waiting = gw.waiter_counts.get(sid, 1) - 1
                if left_waiting <= 0:
                    del gw.waiters[sid]
                    gw.waiter_counts.pop(sid, None)
                else:
                    gw.waiter_counts[sid] = left_waiting

    async def delete_session(request: Request) -> Response:
        require_admin(request)
        sid = request.path_params["session_id"]
        await gw.store.delete_session(sid)
        gw.sessions.pop(sid, None)
        gw.pool.forget(sid)
        ev = gw.waiters.pop(sid, None)
        gw.waiter_counts.pop(sid, None)
        if ev is not None:
            ev.set()  # waiters wake up and answer 404
        return Response(status_code=204)

    def backends_json() -> Response:
        return _json({"backends": [b.info() for b in gw.pool.backends.values()]})

    async def list_backends(request: Request) -> Response:
        require_admin(request)
        return backends_json()

    async def add_backend(request: Request) -> Response:
        require_admin(request)
        body = await body_of(request)
        kind = body.get("kind") or "vllm"
        if not body.get("url") or not isinstance(body["url"], str):
            raise GatewayError(400, f"a backend needs a 'url' string, got {body.get('url')!r}")
        if body.get("name") is not None and not isinstance(body["name"], str):
            raise GatewayError(400, f"a backend's name must be a string, got {body['name']!r}")
        if kind not in BACKEND_KINDS:
            raise GatewayError(400, f"kind must be one of {BACKEND_KINDS}, got {kind!r}")
        model = body.get("model")
        backend = gw.pool.add(
            BackendSpec(
                url=str(body["url"]),
                kind=kind,
                name=body.get("name"),
                model=None if model is None else str(model),
            )
        )
        if gw._http is not None:
            await gw.pool.check(gw._http, backend)
        return backends_json()

    async def remove_backend(request: Request) -> Response:
        require_admin(request)
        name = request.path_params["name"]
        if not gw.pool.remove(name):
            raise GatewayError(404, f"no backend named {name!r}", code="backend_not_found")
        return Response(status_code=204)

    async def policy_version(request: Request) -> Response:
        require_admin(request)
        if request.method == "POST":
            body = await body_of(request)
            if body.get("version") is None:
                raise GatewayError(400, "body must be {'version': str}")
            gw.policy_version = str(body["version"])
        return _json({"version": gw.policy_version})

    def pause_json() -> Response:
        return _json({"paused": gw.paused, "in_flight": gw.in_flight})

    async def pause(request: Request) -> Response:
        require_admin(request)
        if request.method == "POST":
            gw.pause()
            if request.query_params.get("wait", "").lower() in ("1", "true", "yes"):
                timeout = _query_number(request, "timeout", 600.0)
                await gw.drained(timeout)
        return pause_json()

    async def resume(request: Request) -> Response:
        require_admin(request)
        gw.resume()
        return pause_json()

    async def health(request: Request) -> Response:
        healthy = sum(1 for b in gw.pool.backends.values() if b.healthy)
        return _json(
            {
                "status": "ok",
                "backends": len(gw.pool.backends),
                "healthy_backends": healthy,
                "paused": gw.paused,
                "in_flight": gw.in_flight,
                "policy_version": gw.policy_version,
            }
        )

    async def metrics(request: Request) -> Response:
        text = gw.metrics.render(len(gw.sessions), gw.in_flight)
        return Response(text, media_type="text/plain; version=0.0.4")

    async def on_gateway_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, GatewayError)
        return exc.response()

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        log.error("unexpected error serving %s %s", request.method, request.url.path, exc_info=exc)
        gw.metrics.error("internal")
        return error_response(
            500,
            f"internal gateway error: {type(exc).__name__}: {exc}",
            "server_error",
            "internal_error",
        )

    def guarded(
        endpoint: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        """The endpoint, answering an unexpected exception with an OpenAI-shaped 500 (Starlette's
        own ``Exception`` handler would answer too, but then re-raise to the server)."""

        @functools.wraps(endpoint)
        async def run(request: Request) -> Response:
            try:
                return await endpoint(request)
            except (GatewayError, HTTPException):
                raise
            except Exception as exc:
                return await on_unexpected(request, exc)

        return run

    async def on_not_found(request: Request, exc: Exception) -> Response:
        code = getattr(exc, "status_code", 404)
        return error_response(
            code, f"no route {request.method} {request.url.path}", code="not_found"
        )

    routes = [
        Route("/api/sessions", create_session, methods=["POST"]),
        Route("/api/sessions", list_sessions, methods=["GET"]),
        Route("/api/sessions/{session_id}", get_session, methods=["GET"]),
        Route("/api/sessions/{session_id}", delete_session, methods=["DELETE"]),
        Route("/api/sessions/{session_id}/calls", session_calls, methods=["GET"]),
        Route("/api/sessions/{session_id}/rollout", session_rollout, methods=["GET"]),
        Route("/api/sessions/{session_id}/trajectory", session_trajectory, methods=["GET"]),
        Route("/api/sessions/{session_id}/complete", complete, methods=["POST"]),
        Route("/api/sessions/{session_id}/wait", wait, methods=["GET"]),
        Route("/api/backends", list_backends, methods=["GET"]),
        Route("/api/backends", add_backend, methods=["POST"]),
        Route("/api/backends/{name}", remove_backend, methods=["DELETE"]),
        Route("/api/policy_version", policy_version, methods=["GET", "POST"]),
        Route("/api/pause", pause, methods=["GET", "POST"]),
        Route("/api/resume", resume, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    routes = [Route(r.path, guarded(r.endpoint), methods=r.methods) for r in routes]
    return Starlette(
        routes=routes,
        exception_handlers={
            GatewayError: on_gateway_error,
            404: on_not_found,
            405: on_not_found,
            Exception: on_unexpected,
        },
    )
