"""rollwire as a NeMo Gym model server: ``/v1/responses`` and ``/v1/chat/completions`` at a fixed
address that a NeMo Gym config names (a server entry with ``host`` and ``port`` and no
``entrypoint``, so NeMo Gym starts nothing there), forwarding each request to the rollout session
that the request's ``metadata["rollwire_session_id"]`` names.

NeMo Gym agents reach their model server by name, at one address for every rollout; the rollout
app (:mod:`rollwire.envs.hubs.nemo_gym`) puts the session id in the row's
``responses_create_params.metadata``, which agents pass on with every model call. Only sessions
this process registered are served; the session's token never enters NeMo Gym's data.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rollwire.agent.context import RolloutContext
from rollwire.agent.serving import ServerThread

__all__ = ["SESSION_METADATA_KEY", "SessionModelServer"]

#: the ``metadata`` key naming the rollout session a model request belongs to
SESSION_METADATA_KEY = "rollwire_session_id"


class SessionModelServer:
    """The model server of this process's NeMo Gym rollouts (one per process, started once)."""

    def __init__(self) -> None:
        self._sessions: dict[str, RolloutContext] = {}
        self._lock = threading.Lock()
        self._thread: ServerThread | None = None
        self.address: tuple[str, int] | None = None
        self.asgi = Starlette(
            routes=[
                Route("/", self._health, methods=["GET"]),
                Route("/v1/responses", self._responses, methods=["POST"]),
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
            ]
        )

    def start(self, host: str, port: int) -> None:
        """Serve on ``host:port`` (a no-op when already serving there)."""
        with self._lock:
            if self.address == (host, port):
                return
            if self.address is not None:
                raise RuntimeError(
                    f"the NeMo Gym model server already serves {self.address}, not {(host, port)}"
                )
            self._thread = ServerThread(self.asgi, host=host, port=port).start()
            self.address = (host, port)

    def stop(self) -> None:
        """Stop serving (tests; a process's server otherwise lives as long as it)."""
        with self._lock:
            if self._thread is not None:
                self._thread.stop()
            self._thread, self.address = None, None

    @contextlib.contextmanager
    def session(self, ctx: RolloutContext) -> Iterator[dict[str, str]]:
        """Serve ``ctx``'s session while the block runs; yields the metadata to send."""
        self._sessions[ctx.session_id] = ctx
        try:
            yield {SESSION_METADATA_KEY: ctx.session_id}
        finally:
            self._sessions.pop(ctx.session_id, None)

    async def _health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "sessions": len(self._sessions)})

    async def _responses(self, request: Request) -> Response:
        return await self._forward(request, "responses")

    async def _chat(self, request: Request) -> Response:
        return await self._forward(request, "chat/completions")

    async def _forward(self, request: Request, path: str) -> Response:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            return _error(400, f"the request body is not JSON ({exc})")
        if not isinstance(body, dict):
            return _error(400, "the request body must be a JSON object")
        metadata = dict(body.get("metadata") or {})
        session_id = metadata.pop(SESSION_METADATA_KEY, None)
        ctx = self._sessions.get(str(session_id))
        if ctx is None:
            return _error(
                400,
                f"no live rollout session {session_id!r}: a request must carry "
                f"metadata[{SESSION_METADATA_KEY!r}] of a rollout this process runs",
            )
        body["model"] = ctx.model
        if metadata:
            body["metadata"] = metadata
        else:
            body.pop("metadata", None)
        return await _post(ctx, path, body)


async def _post(ctx: RolloutContext, path: str, body: dict[str, Any]) -> Response:
    url = f"{ctx.base_url.rstrip('/')}/{path}"
    headers = {"Authorization": f"Bearer {ctx.api_key}"}
    async with httpx.AsyncClient(timeout=ctx.call_timeout()) as client:
        try:
            answer = await client.post(url, content=orjson.dumps(body), headers=headers)
        except httpx.HTTPError as exc:
            return _error(502, f"the rollout session's gateway did not answer ({exc})")
    return Response(
        answer.content,
        status_code=answer.status_code,
        media_type=answer.headers.get("content-type", "application/json"),
    )


def _error(status: int, message: str) -> Response:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}}, status)
