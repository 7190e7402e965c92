"""Result channels for agents that report the way other toolkits do, each ending in the session's
terminal record (:meth:`SessionRoutes.finish`, the path ``/complete`` takes):

- agentcore-rl-toolkit gen-1 saves ``s3://{bucket}/{exp_id}/{input_id}/{session}.json``; with
  ``AWS_ENDPOINT_URL_S3`` at the gateway that is ``PUT /{bucket}/{exp_id}/{input_id}/{name}``
  (path-style). rollwire gives such agents the session token as ``exp_id``, so the key itself
  names the session; S3's own auth header is accepted and not needed.
- SageMaker's ``RolloutFeedbackClient`` posts ``{endpoint}/complete-rollout`` ``{JobArn,
  TrajectoryId, Status}`` then ``{endpoint}/update-reward`` ``{JobArn, TrajectoryId, Rewards}``;
  rollwire gives such agents ``endpoint = {gateway}/s/{token}``. The reward completes the
  session: ``completed``, or ``failed`` when ``/complete-rollout`` said ``Status: failed``.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from rollwire.data.foreign import read_s3_result, reduce_rewards, step_metrics
from rollwire.gateway.control.base import json_response
from rollwire.gateway.control.sessions import SessionRoutes
from rollwire.gateway.errors import GatewayError
from rollwire.gateway.ports import GatewayPort
from rollwire.gateway.security import TokenError

__all__ = ["SESSION_CONTROL_PATHS", "foreign_result_routes"]

log = logging.getLogger("rollwire.gateway")

#: Paths under ``/s/{token}`` that are control routes, not the data plane.
SESSION_CONTROL_PATHS = frozenset({"/complete-rollout", "/update-reward"})
#: How many SageMaker ``/complete-rollout`` statuses wait for their ``/update-reward``.
_PENDING_LIMIT = 100_000


class _ForeignResults(SessionRoutes):
    def __init__(self, gw: GatewayPort) -> None:
        super().__init__(gw)
        self._status: dict[str, str] = {}  # session -> SageMaker's Status, until its reward

    def routes(self) -> list[Route]:
        return [
            Route("/s/{token}/complete-rollout", self.complete_rollout, methods=["POST"]),
            Route("/s/{token}/update-reward", self.update_reward, methods=["POST"]),
            Route("/{bucket}/{exp_id}/{input_id}/{name}", self.s3_put, methods=["PUT"]),
        ]

    def _session_of(self, token: str, what: str) -> str:
        try:
            return self.gw.signer.verify(token)
        except TokenError as exc:
            self.gw.metrics.error("unauthorized")
            raise GatewayError(
                401,
                f"{what}: {exc}; the path must carry the session token rollwire issued",
                "authentication_error",
                "invalid_token",
            ) from exc

    async def _sagemaker_body(self, request: Request, what: str) -> tuple[str, dict[str, Any]]:
        sid = self._session_of(request.path_params["token"], what)
        body = await self.body_of(request)
        trajectory = body.get("TrajectoryId")
        if trajectory is not None and str(trajectory) != sid:
            raise GatewayError(
                400, f"{what}: TrajectoryId {trajectory!r} is not this session ({sid!r})"
            )
        return sid, body

    async def complete_rollout(self, request: Request) -> Response:
        sid, body = await self._sagemaker_body(request, "complete-rollout")
        status = str(body.get("Status") or "ready")
        if status not in ("ready", "failed"):
            raise GatewayError(400, f"Status must be 'ready' or 'failed', got {status!r}")
        if len(self._status) >= _PENDING_LIMIT:
            self._status.pop(next(iter(self._status)))
        self._status[sid] = status
        return json_response({"TrajectoryId": sid, "Status": status})

    async def update_reward(self, request: Request) -> Response:
        sid, body = await self._sagemaker_body(request, "update-reward")
        try:
            reward, steps = reduce_rewards(body.get("Rewards"))
        except ValueError as exc:
            raise GatewayError(400, f"update-reward: Rewards: {exc}") from exc
        failed = self._status.pop(sid, "ready") == "failed"
        metrics = step_metrics(steps)
        error = "the agent reported the trajectory failed (SageMaker Status 'failed')"
        rec = await self.finish(
            sid,
            "failed" if failed else "completed",
            reward,
            metrics,
            error if failed else None,
        )
        return json_response({"TrajectoryId": sid, "status": rec.status})

    async def s3_put(self, request: Request) -> Response:
        params = request.path_params
        what = f"PUT /{params['bucket']}/{params['exp_id']}/{params['input_id']}/{params['name']}"
        sid = self._session_of(params["exp_id"], what)
        raw = await request.body()
        if len(raw) > self.gw.config.max_body_bytes:
            raise GatewayError(413, f"{what}: the result exceeds the gateway's body limit")
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise GatewayError(400, f"{what}: the result is not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise GatewayError(400, f"{what}: the result must be a JSON object")
        try:
            result = read_s3_result(body)
        except ValueError as exc:  # no usable reward: the rollout failed, and says why
            await self.finish(sid, "failed", 0.0, {}, f"invalid reward: {exc}")
        else:
            reward = 0.0 if result.reward is None else result.reward  # a failure trains as 0.0
            await self.finish(sid, result.status, reward, result.metrics, result.error)
        etag = f'"{hashlib.md5(raw, usedforsecurity=False).hexdigest()}"'
        return Response(b"", headers={"ETag": etag})


def foreign_result_routes(gw: GatewayPort) -> list[BaseRoute]:
    """The S3 and SageMaker result routes, for :meth:`Gateway.add_routes`."""
    return list(_ForeignResults(gw).routes())
