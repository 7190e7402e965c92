"""Admin routes of the control plane: backends, policy version, pause/resume, health, metrics."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollwire.gateway.config import BACKEND_KINDS, BackendSpec
from rollwire.gateway.control.base import ControlRoutes, json_response, query_number
from rollwire.gateway.control.staleness import check_seq
from rollwire.gateway.errors import GatewayError

__all__ = ["AdminRoutes", "check_backend_url"]


def check_backend_url(url: str) -> None:
    """An ``http(s)://host[:port][/path]`` URL (400 otherwise: ``file://``, no host, ...)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise GatewayError(400, f"backend url {url[:200]!r} is not a URL: {exc}") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise GatewayError(
            400,
            f"backend url must be http:// or https:// with a host, got {url[:200]!r}",
        )
    if any(c.isspace() or not c.isprintable() for c in url) or (port is not None and port == 0):
        raise GatewayError(
            400, f"backend url {url[:200]!r} has spaces, control characters or port 0"
        )


_MAX_VERSION = 256


class AdminRoutes(ControlRoutes):
    """``/api/backends``, ``/api/policy_version``, ``/api/pause``, ``/api/resume``, ``/health``,
    ``/metrics``."""

    def routes(self) -> list[Route]:
        """The Starlette routes of this group."""
        return [
            Route("/api/backends", self.list_backends, methods=["GET"]),
            Route("/api/backends", self.add_backend, methods=["POST"]),
            Route("/api/backends/{name}", self.remove_backend, methods=["DELETE"]),
            Route("/api/policy_version", self.policy_version, methods=["GET", "POST"]),
            Route("/api/pause", self.pause, methods=["GET", "POST"]),
            Route("/api/resume", self.resume, methods=["POST"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
        ]

    def backends_json(self) -> Response:
        return json_response({"backends": [b.info() for b in self.gw.pool.backends.values()]})

    async def list_backends(self, request: Request) -> Response:
        self.require_admin(request)
        return self.backends_json()

    async def add_backend(self, request: Request) -> Response:
        self.require_admin(request)
        body = await self.body_of(request)
        kind = body.get("kind") or "vllm"
        if not body.get("url") or not isinstance(body["url"], str):
            raise GatewayError(400, f"a backend needs a 'url' string, got {body.get('url')!r}")
        if body.get("name") is not None and not isinstance(body["name"], str):
            raise GatewayError(400, f"a backend's name must be a string, got {body['name']!r}")
        if kind not in BACKEND_KINDS:
            raise GatewayError(400, f"kind must be one of {BACKEND_KINDS}, got {kind!r}")
        check_backend_url(body["url"])
        replace = body.get("replace", False)
        if not isinstance(replace, bool):
            raise GatewayError(400, f"replace must be true or false, got {replace!r}")
        name = body.get("name")
        if name is not None and name in self.gw.pool.backends and not replace:
            raise GatewayError(
                409,
                f"a backend named {name!r} exists ({self.gw.pool.backends[name].url}); send "
                "'replace': true to replace it, or DELETE it first",
                code="backend_exists",
            )
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise GatewayError(400, f"model must be a string, got {model!r}")
        tokenizer = body.get("tokenizer")
        if tokenizer is not None and not isinstance(tokenizer, str):
            raise GatewayError(400, f"tokenizer must be a string, got {tokenizer!r}")
        backend = self.gw.pool.add(
            BackendSpec(
                url=str(body["url"]),
                kind=kind,
                name=body.get("name"),
                model=None if model is None else str(model),
                tokenizer=tokenizer,
            )
        )
        if self.gw.started:
            await self.gw.pool.check(self.gw.http, backend)
        return self.backends_json()

    async def remove_backend(self, request: Request) -> Response:
        self.require_admin(request)
        name = request.path_params["name"]
        if not self.gw.pool.remove(name):
            raise GatewayError(404, f"no backend named {name!r}", code="backend_not_found")
        return Response(status_code=204)

    async def policy_version(self, request: Request) -> Response:
        self.require_admin(request)
        if request.method == "POST":
            body = await self.body_of(request)
            version = body.get("version")
            if not isinstance(version, (str, int)) or isinstance(version, bool):
                raise GatewayError(400, f"body must be {{'version': str}}, got version={version!r}")
            version = str(version)
            if not version or len(version) > _MAX_VERSION:
                raise GatewayError(
                    400, f"version must be 1 to {_MAX_VERSION} characters, got {len(version)}"
                )
            await self.gw.set_policy_version(version, check_seq(body))
        return json_response(
            {"version": self.gw.policy_version, "seq": self.gw.staleness.policy_seq}
        )

    def pause_json(self) -> Response:
        return json_response({"paused": self.gw.paused, "in_flight": self.gw.in_flight})

    async def pause(self, request: Request) -> Response:
        self.require_admin(request)
        if request.method == "POST":
            # Everything is validated before anything changes: a refused request pauses nothing.
            wait = request.query_params.get("wait", "").lower()
            if wait not in ("", "0", "1", "true", "false", "yes", "no"):
                raise GatewayError(
                    400, f"wait must be true or false, got {wait!r}", code="invalid_query"
                )
            timeout = query_number(request, "timeout", 600.0)
            await self.gw.set_paused(True)
            if wait in ("1", "true", "yes"):
                await self.gw.drained(timeout)
        return self.pause_json()

    async def resume(self, request: Request) -> Response:
        self.require_admin(request)
        # also ends a weight sync's pause (one left behind by a trainer that died mid-sync)
        await self.gw.barrier.end(None)
        return self.pause_json()

    async def health(self, request: Request) -> Response:
        if self.gw.config.private_metrics:
            self.require_admin(request)
        healthy = sum(1 for b in self.gw.pool.backends.values() if b.healthy)
        return json_response(
            {
                "status": "ok",
                "backends": len(self.gw.pool.backends),
                "healthy_backends": healthy,
                "paused": self.gw.paused,
                "in_flight": self.gw.in_flight,
                "policy_version": self.gw.policy_version,
            }
        )

    async def metrics(self, request: Request) -> Response:
        if self.gw.config.private_metrics:
            self.require_admin(request)
        text = self.gw.metrics.render(len(self.gw.sessions), self.gw.in_flight)
        return Response(text, media_type="text/plain; version=0.0.4")
