"""The control plane (``/api``, see docs/control-api.md), ``/health`` and ``/metrics``.

Route groups live next door (:mod:`~rollwire.gateway.control.sessions`,
:mod:`~rollwire.gateway.control.admin`); this module assembles them, plus any routes a gateway
feature adds (:meth:`Gateway.add_routes`), into one Starlette app with OpenAI-shaped errors.
"""

from __future__ import annotations

import functools
import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from rollwire.gateway.control.admin import AdminRoutes
from rollwire.gateway.control.sessions import SessionRoutes
from rollwire.gateway.control.staleness import StalenessRoutes
from rollwire.gateway.control.weights import WeightRoutes
from rollwire.gateway.dataplane.commit import store_unavailable
from rollwire.gateway.errors import GatewayError, error_response
from rollwire.gateway.ports import GatewayPort
from rollwire.store import StoreUnavailable

__all__ = ["build_control_app"]

log = logging.getLogger("rollwire.gateway")

Endpoint = Callable[[Request], Awaitable[Response]]


def build_control_app(gw: GatewayPort, extra: Sequence[BaseRoute] = ()) -> Starlette:
    """The Starlette app serving everything but the data plane."""

    async def on_gateway_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, GatewayError)
        return exc.response()

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        if isinstance(exc, StoreUnavailable):
            gw.metrics.error("store_unavailable")
            return store_unavailable(exc).response()
        ref = secrets.token_hex(4)
        log.error(
            "unexpected error [%s] serving %s %s",
            ref,
            request.method,
            request.url.path,
            exc_info=exc,
        )
        gw.metrics.error("internal")
        return error_response(
            500,
            f"internal gateway error [{ref}]: the gateway's log has the details",
            "server_error",
            "internal_error",
        )

    def guarded(endpoint: Endpoint) -> Endpoint:
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

    routes: list[BaseRoute] = [
        Route(r.path, guarded(r.endpoint), methods=r.methods)
        for r in [
            *SessionRoutes(gw).routes(),
            *AdminRoutes(gw).routes(),
            *WeightRoutes(gw).routes(),
            *StalenessRoutes(gw).routes(),
        ]
    ]
    routes.extend(extra)
    return Starlette(
        routes=routes,
        exception_handlers={
            GatewayError: on_gateway_error,
            404: on_not_found,
            405: on_not_found,
            Exception: on_unexpected,
        },
    )
