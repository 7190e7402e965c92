"""Staleness routes of the control plane: where the trainer is (``/api/trainer_version``), against
which sessions with ``max_staleness`` are admitted (:mod:`rollwire.gateway.dataplane.staleness`)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollwire.gateway.control.base import ControlRoutes, json_response
from rollwire.gateway.errors import GatewayError

__all__ = ["StalenessRoutes", "check_seq"]


def check_seq(body: dict[str, Any], key: str = "seq") -> int | None:
    """An ordinal of policy versions from a body: a whole number, 0 or more, or absent."""
    value = body.get(key)
    if value is not None and (type(value) is not int or value < 0):
        raise GatewayError(
            400,
            f"{key} must be a whole number of policy versions (0 or more), got {value!r}",
            code="invalid_field",
        )
    return value


class StalenessRoutes(ControlRoutes):
    """``GET/POST /api/trainer_version``."""

    def routes(self) -> list[Route]:
        """The Starlette routes of this group."""
        return [Route("/api/trainer_version", self.trainer_version, methods=["GET", "POST"])]

    async def trainer_version(self, request: Request) -> Response:
        self.require_admin(request)
        if request.method == "POST":
            body = await self.body_of(request)
            if "seq" not in body:
                raise GatewayError(
                    400,
                    "body must be {'seq': int, 'version'?: str}: seq is the trainer's newest "
                    "weights in the policy versions' ordinal (null: stop bounding staleness)",
                    code="invalid_field",
                )
            seq = check_seq(body)
            version = body.get("version")
            if version is not None and (not isinstance(version, str) or len(version) > 256):
                raise GatewayError(
                    400, f"version must be a string of at most 256 characters, got {version!r}"
                )
            await self.gw.set_trainer_seq(seq, version)
        return json_response(self.gw.staleness.info())
