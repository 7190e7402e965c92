"""Session routes of the control plane: create, read, list, complete, wait, delete."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollwire.data.protocol import TERMINAL_STATUSES, Rollout
from rollwire.data.rewards import attach_step_rewards
from rollwire.data.trajectory import TrajectoryBuilder
from rollwire.gateway.control.base import (
    MAX_METRIC_KEY,
    MAX_METRICS,
    ControlRoutes,
    cut_text,
    json_number,
    json_response,
    query_number,
    same_key,
)
from rollwire.gateway.control.session_body import session_record
from rollwire.gateway.errors import GatewayError
from rollwire.gateway.security import TokenError
from rollwire.gateway.tokens.runtime import rows_tokenizer
from rollwire.store import CompletionConflict, SessionExists, SessionNotFound, SessionRecord

__all__ = ["SessionRoutes"]

log = logging.getLogger("rollwire.gateway")

_MAX_LIST_LIMIT = 100_000  # the most sessions one ``GET /api/sessions`` lists


class SessionRoutes(ControlRoutes):
    """``/api/sessions/...``"""

    def routes(self) -> list[Route]:
        """The Starlette routes of this group."""
        return [
            Route("/api/sessions", self.create_session, methods=["POST"]),
            Route("/api/sessions", self.list_sessions, methods=["GET"]),
            Route("/api/sessions/{session_id}", self.get_session, methods=["GET"]),
            Route("/api/sessions/{session_id}", self.delete_session, methods=["DELETE"]),
            Route("/api/sessions/{session_id}/calls", self.session_calls, methods=["GET"]),
            Route("/api/sessions/{session_id}/rollout", self.session_rollout, methods=["GET"]),
            Route(
                "/api/sessions/{session_id}/trajectory", self.session_trajectory, methods=["GET"]
            ),
            Route("/api/sessions/{session_id}/complete", self.complete, methods=["POST"]),
            Route("/api/sessions/{session_id}/wait", self.wait, methods=["GET"]),
        ]

    async def check_tokens_session(self, rec: SessionRecord) -> None:
        """Refuse a tokens session whose chat template no tool-call parser understands, or whose
        backend refuses its token-in route (the calls would fail one by one later). Other problems, such as a backend that is down or
        names no tokenizer, are left to the request-time checks, which say the same."""
        from rollwire.gateway.tokens.parsers import TemplateNotSupported
        from rollwire.gateway.tokens.runtime import TokenRouteUnavailable, check_session

        backend = self.gw.pool.pick(rec.session_id)
        try:
            await check_session(rec.metadata, backend, gateway=self.gw)
        except TemplateNotSupported as exc:
            raise GatewayError(
                400, f"capture='tokens': {exc}", code="unsupported_chat_template"
            ) from exc
        except TokenRouteUnavailable as exc:
            raise GatewayError(400, str(exc), code="token_route_unavailable") from exc
        except Exception as exc:  # not decidable now: the first call will say what is wrong
            log.info("tokens session %r not checked at creation: %s", rec.session_id, exc)

    async def create_session(self, request: Request) -> Response:
        self.require_admin(request)
        rec = session_record(await self.body_of(request), self.gw.config.default_ttl)
        if rec.capture == "tokens":
            await self.check_tokens_session(rec)
        try:
            await self.gw.store.create_session(rec)
        except SessionExists as exc:
            raise GatewayError(409, str(exc), "invalid_request_error", "session_exists") from exc
        token = self.gw.issue_token(rec)
        url = self.public_url(request)
        return json_response(
            {
                "session_id": rec.session_id,
                "token": token,
                "base_url": f"{url}/s/{token}/v1",
                "complete_url": f"{url}/api/sessions/{rec.session_id}/complete",
                "expires_at": rec.expires_at,
            },
            201,
        )

    async def get_session(self, request: Request) -> Response:
        self.require_admin(request)
        rec = await self.load(request.path_params["session_id"])
        return json_response(rec.info())

    async def list_sessions(self, request: Request) -> Response:
        self.require_admin(request)
        q = request.query_params
        limit = q.get("limit")
        offset = q.get("offset") or "0"
        if not (offset.isascii() and offset.isdigit() and len(offset) <= 12):
            raise GatewayError(
                400,
                f"offset must be a non-negative integer, got {offset[:40]!r}",
                code="invalid_query",
            )
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
        recs = await self.gw.store.list_sessions(
            group_id=q.get("group_id") or None,
            status=q.get("status") or None,
            limit=int(limit) if limit else None,
            offset=int(offset),
        )
        now = time.time()
        if q.get("status") == "running":
            # Past their TTL they are timed out when next touched; they are not running.
            recs = [r for r in recs if r.expires_at is None or r.expires_at >= now]
        page: dict[str, Any] = {"sessions": [r.info() for r in recs]}
        if limit and len(recs) >= int(limit):
            page["next_offset"] = int(offset) + int(limit)
        return json_response(page)

    async def session_calls(self, request: Request) -> Response:
        self.require_admin(request)
        sid = request.path_params["session_id"]
        await self.load(sid)
        calls = await self.gw.store.calls(sid)
        return Response(
            b'{"calls":[' + b",".join(c.model_dump_json().encode() for c in calls) + b"]}",
            media_type="application/json",
        )

    async def rollout_of(self, sid: str) -> Rollout:
        rec = await self.load(sid)
        calls = await self.gw.store.calls(sid)
        status = (
            rec.status if rec.status in TERMINAL_STATUSES or rec.status == "running" else "running"
        )
        rollout = Rollout.model_validate(
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
        return attach_step_rewards(rollout)  # step_reward/<i> metrics onto their calls

    async def session_rollout(self, request: Request) -> Response:
        self.require_admin(request)
        rollout = await self.rollout_of(request.path_params["session_id"])
        return Response(rollout.to_json(), media_type="application/json")

    async def session_trajectory(self, request: Request) -> Response:
        self.require_admin(request)
        mode = request.query_params.get("mode", "merge")
        if mode not in ("merge", "per_call"):
            raise GatewayError(400, f"mode must be 'merge' or 'per_call', got {mode!r}")
        sid = request.path_params["session_id"]
        rollout = await self.rollout_of(sid)
        rec = await self.load(sid)
        # the backend's tokenizer classifies forks; without one they read "unknown"
        pool = self.gw.pool.backends
        served = [pool[c.backend] for c in reversed(rollout.calls) if c.backend in pool]
        backend = served[0] if served else next(iter(pool.values()), None)
        tokenizer = await rows_tokenizer(self.gw, rec.metadata, backend)
        builder = TrajectoryBuilder(mode, tokenizer)  # type: ignore[arg-type]
        rows = await asyncio.to_thread(builder.build, rollout)
        return Response(
            b'{"rows":[' + b",".join(r.model_dump_json().encode() for r in rows) + b"]}",
            media_type="application/json",
        )

    async def complete(self, request: Request) -> Response:
        sid = request.path_params["session_id"]
        auth = request.headers.get("authorization", "")
        token = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        if not (self.gw.admin_key is None or same_key(token, self.gw.admin_key)):
            try:
                owner, incarnation = self.gw.signer.verify_full(token) if token else (None, None)
            except TokenError:
                owner, incarnation = None, None
            if owner == sid and incarnation is not None:
                self.gw.check_incarnation(await self.load(sid), incarnation)
            if owner != sid:
                self.gw.metrics.error("unauthorized_admin")
                raise GatewayError(
                    401,
                    "completing a session needs the admin key or that session's own token",
                    "authentication_error",
                    "invalid_token",
                )
        body = await self.body_of(request)
        status = body.get("status")
        if status is None:
            status = "completed"
        if not isinstance(status, str) or status not in TERMINAL_STATUSES:
            raise GatewayError(
                400, f"status must be one of {sorted(TERMINAL_STATUSES)}, got {status!r}"
            )
        reward = body.get("reward")
        if reward is not None:
            reward = json_number(reward, "reward")
        metrics = body.get("metrics") or {}
        if not isinstance(metrics, dict):
            raise GatewayError(400, f"metrics must be an object of numbers, got {metrics!r}")
        if len(metrics) > MAX_METRICS:
            raise GatewayError(400, f"at most {MAX_METRICS} metrics, got {len(metrics)}")
        for k in metrics:
            if len(k) > MAX_METRIC_KEY:
                raise GatewayError(
                    400, f"metric name {k[:40]!r}... is over {MAX_METRIC_KEY} characters"
                )
        metrics = {str(k): json_number(v, f"metrics[{k!r}]") for k, v in metrics.items()}
        error = body.get("error")
        if error is not None and not isinstance(error, str):
            raise GatewayError(400, f"error must be a string, got {error!r}")
        rec = await self.finish(sid, status, reward, metrics, error)
        return json_response(rec.info())

    async def finish(
        self,
        sid: str,
        status: str,
        reward: float | None,
        metrics: dict[str, float],
        error: str | None,
    ) -> SessionRecord:
        """Record a session's terminal record (the one path every result channel ends in):
        404 for an unknown session, 409 when it already holds a different record."""
        if error is not None:
            error = cut_text(error)
        # From here on new calls of the session are refused (409), so none lands after the
        # completion; calls already in flight are let in first.
        closing = sid not in self.gw.closing
        self.gw.closing.add(sid)
        try:
            st = self.gw.sessions.get(sid)
            if st is not None and st.in_flight:
                deadline = time.monotonic() + 30.0
                while st.in_flight and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
            try:
                rec, changed = await self.gw.store.complete(
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
                self.gw.closing.discard(sid)
        if changed or rec.terminal:
            self.gw.session_finished(rec)
        return rec

    async def wait(self, request: Request) -> Response:
        self.require_admin(request)
        sid = request.path_params["session_id"]
        timeout = min(query_number(request, "timeout", 30.0), 300.0)
        deadline = time.monotonic() + max(0.0, timeout)
        ev = self.gw.waiters.get(sid)
        if ev is None:
            ev = self.gw.waiters[sid] = asyncio.Event()
        self.gw.waiter_counts[sid] = self.gw.waiter_counts.get(sid, 0) + 1
        try:
            while True:
                rec = await self.load(sid)
                left = deadline - time.monotonic()
                if rec.terminal or left <= 0:
                    return json_response(rec.info())
                try:
                    # In-process completion sets the event; another gateway sharing the store
                    # is noticed by polling.
                    await asyncio.wait_for(ev.wait(), min(left, self.gw.config.wait_poll_interval))
                except asyncio.TimeoutError:
                    pass
        finally:
            # The last waiter out removes the entry (unless a delete already replaced it).
            if self.gw.waiters.get(sid) is ev:
                left_waiting = self.gw.waiter_counts.get(sid, 1) - 1
                if left_waiting <= 0:
                    del self.gw.waiters[sid]
                    self.gw.waiter_counts.pop(sid, None)
                else:
                    self.gw.waiter_counts[sid] = left_waiting

    async def delete_session(self, request: Request) -> Response:
        self.require_admin(request)
        sid = request.path_params["session_id"]
        await self.gw.store.delete_session(sid)
        self.gw.sessions.pop(sid, None)
        self.gw.pool.forget(sid)
        ev = self.gw.waiters.pop(sid, None)
        self.gw.waiter_counts.pop(sid, None)
        if ev is not None:
            ev.set()  # waiters wake up and answer 404
        return Response(status_code=204)
