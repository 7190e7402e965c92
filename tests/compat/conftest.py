"""A stand-in for ``complete_url`` (as in tests/rollouts): it records every terminal record. It
runs on 127.0.0.1 on a free port and is stopped at the end."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rollwire.agent.serving import ServerThread


class CompleteRecorder:
    """A stand-in for the gateway's ``POST /api/sessions/{id}/complete``: records every record.

    ``fail_first`` answers 503 to that many posts first (to exercise the app's retries).
    """

    def __init__(self, fail_first: int = 0) -> None:
        self.records: dict[str, list[dict[str, Any]]] = {}
        self.auth: dict[str, str] = {}
        self.fail_first = fail_first
        self._lock = threading.Lock()
        self.app = Starlette(
            routes=[Route("/api/sessions/{sid}/complete", self._complete, methods=["POST"])]
        )
        self.server = ServerThread(self.app)

    async def _complete(self, request: Request) -> JSONResponse:
        with self._lock:
            if self.fail_first > 0:
                self.fail_first -= 1
                return JSONResponse({"error": "try again"}, status_code=503)
        sid = request.path_params["sid"]
        body = await request.json()
        with self._lock:
            self.records.setdefault(sid, []).append(body)
            self.auth[sid] = request.headers.get("authorization", "")
        return JSONResponse({"session_id": sid, **body})

    def url(self, sid: str) -> str:
        return f"{self.server.url}/api/sessions/{sid}/complete"

    def payload(self, sid: str, deadline_in: float | None = 30.0, **task: Any) -> dict[str, Any]:
        """A rollout payload whose ``complete_url`` points here."""
        return {
            **task,
            "_rollwire": {
                "version": 1,
                "session_id": sid,
                "base_url": "http://127.0.0.1:9/v1",
                "api_key": f"tok-{sid}",
                "model": "policy",
                "sampling": {"temperature": 1.0},
                "complete_url": self.url(sid),
                "deadline": None if deadline_in is None else time.time() + deadline_in,
                "group_id": "g",
                "task_id": "t",
            },
        }

    def wait_for(self, sid: str, timeout: float = 10.0) -> list[dict[str, Any]]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self._lock:
                if sid in self.records:
                    return list(self.records[sid])
            time.sleep(0.01)
        raise AssertionError(f"no terminal record for {sid} within {timeout}s")


@pytest.fixture
def recorder() -> Iterator[CompleteRecorder]:
    rec = CompleteRecorder()
    with rec.server:
        yield rec
