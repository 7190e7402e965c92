"""The control plane (``/api``, see docs/control-api.md), ``/health`` and ``/metrics``."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import TYPE_CHECKING, Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollwire.gateway.config import BACKEND_KINDS, BackendSpec
from rollwire.gateway.errors import GatewayError, error_response
from rollwire.gateway.sampling import POLICIES
from rollwire.gateway.security import TokenError
from rollwire.protocol import TERMINAL_STATUSES, Rollout
from rollwire.store import CompletionConflict, SessionExists, SessionNotFound, SessionRecord
from rollwire.trajectory import TrajectoryBuilder

if TYPE_CHECKING:
    from rollwire.gateway.app import Gateway

__all__ = ["build_control_app"]

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


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw:
        return {}
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise GatewayError(400, f"request body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise GatewayError(400, "request body must be a JSON object")
    return data


def build_control_app(gw: Gateway) -> Starlette:
    """The Starlette app serving everything but the data plane."""

    def require_admin(request: Request) -> None:
        if gw.admin_key is None:
            return  # open mode without an admin key: local development
        auth = request.headers.get("authorization", "")
        if auth[:7].lower() == "bearer " and auth[7:].strip() == gw.admin_key:
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
        return rec

    def public_url(request: Request) -> str:
        if gw.config.public_url:
            return gw.config.public_url.rstrip("/")
        return str(request.base_url).rstrip("/")

    async def create_session(request: Request) -> Response:
        require_admin(request)
        body = await _body(request)
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
        for key in ("metadata", "sampling"):
            if body.get(key) is not None and not isinstance(body[key], dict):
                raise GatewayError(400, f"{key} must be an object, got {body[key]!r}")
        ttl = float(body.get("ttl") or gw.config.default_ttl)
        now = time.time()
        sampling = dict(body.get("sampling") or {})
        if "max_completion_tokens" in sampling:
            sampling.setdefault("max_tokens", sampling.pop("max_completion_tokens"))
        rec = SessionRecord(
            session_id=str(body.get("session_id") or uuid.uuid4().hex),
            group_id=body.get("group_id"),
            task_id=body.get("task_id"),
            metadata=dict(body.get("metadata") or {}),
            sampling=sampling,
            sampling_policy=dict(policy),
            capture=capture,
            allow_off_policy=bool(body.get("allow_off_policy", False)),
            chat_template_kwargs=body.get("chat_template_kwargs"),
            max_calls=body.get("max_calls"),
            max_tokens=body.get("max_tokens"),
            expires_at=now + ttl,
            created_at=now,
        )
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
        if not (gw.admin_key is None or token == gw.admin_key):
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
        body = await _body(request)
        status = body.get("status") or "completed"
        if status not in TERMINAL_STATUSES:
            raise GatewayError(
                400, f"status must be one of {sorted(TERMINAL_STATUSES)}, got {status!r}"
            )
        reward = body.get("reward")
        if reward is not None:
            try:
                reward = float(reward)
            except (TypeError, ValueError) as exc:
                raise GatewayError(400, f"reward must be a number, got {reward!r}") from exc
        metrics = body.get("metrics") or {}
        if not isinstance(metrics, dict):
            raise GatewayError(400, f"metrics must be an object of numbers, got {metrics!r}")
        try:
            metrics = {str(k): float(v) for k, v in metrics.items()}
        except (TypeError, ValueError) as exc:
            raise GatewayError(400, f"metrics must map names to numbers: {exc}") from exc
        st = gw.sessions.get(sid)
        if st is not None and st.in_flight:
            # Let calls already in flight land first: a completed session has all its calls.
            deadline = time.monotonic() + 30.0
            while st.in_flight and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        try:
            rec, changed = await gw.store.complete(
                sid, status=status, reward=reward, metrics=metrics, error=body.get("error")
            )
        except SessionNotFound as exc:
            raise GatewayError(
                404, f"session {sid!r} not found", "invalid_request_error", "session_not_found"
            ) from exc
        except CompletionConflict as exc:
            raise GatewayError(
                409, str(exc), "invalid_request_error", "completion_conflict"
            ) from exc
        if changed:
            gw.session_finished(rec)
        return _json(rec.info())

    async def wait(request: Request) -> Response:
        require_admin(request)
        sid = request.path_params["session_id"]
        try:
            timeout = min(float(request.query_params.get("timeout", 30.0)), 300.0)
        except ValueError as exc:
            raise GatewayError(400, "timeout must be a number of seconds") from exc
        deadline = time.monotonic() + max(0.0, timeout)
        ev = gw.waiters.get(sid)
        if ev is None:
            ev = gw.waiters[sid] = asyncio.Event()
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
            if ev.is_set():
                gw.waiters.pop(sid, None)

    async def delete_session(request: Request) -> Response:
        require_admin(request)
        sid = request.path_params["session_id"]
        await gw.store.delete_session(sid)
        gw.sessions.pop(sid, None)
        gw.pool.forget(sid)
        return Response(status_code=204)

    def backends_json() -> Response:
        return _json({"backends": [b.info() for b in gw.pool.backends.values()]})

    async def list_backends(request: Request) -> Response:
        require_admin(request)
        return backends_json()

    async def add_backend(request: Request) -> Response:
        require_admin(request)
        body = await _body(request)
        kind = body.get("kind") or "vllm"
        if not body.get("url"):
            raise GatewayError(400, "a backend needs a 'url'")
        if kind not in BACKEND_KINDS:
            raise GatewayError(400, f"kind must be one of {BACKEND_KINDS}, got {kind!r}")
        backend = gw.pool.add(BackendSpec(url=str(body["url"]), kind=kind, name=body.get("name")))
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
            body = await _body(request)
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
                timeout = float(request.query_params.get("timeout", 600))
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
    return Starlette(
        routes=routes,
        exception_handlers={GatewayError: on_gateway_error, 404: on_not_found, 405: on_not_found},
    )
