"""Recording stand-ins for tests: a fake OpenAI endpoint that records what it was sent (for the
agent-adapter conformance suite), and a ``complete_url`` that records every terminal record."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rollwire.agent.serving import ServerThread

__all__ = ["PRODUCTION_MODEL", "CompleteRecorder", "RecordedRequest", "RecordingServer"]

#: the model name the production configuration asks for
PRODUCTION_MODEL = "prod-model"


@dataclass(frozen=True)
class RecordedRequest:
    """One HTTP request as the recording server saw it."""

    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class RecordingServer:
    """A stand-in OpenAI endpoint on 127.0.0.1: records requests, answers every chat call with
    one plain assistant message (so any agent stops after one model call). Streams when asked."""

    reply = "Done."

    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread: threading.Thread | None = None

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                server._record(self, {})
                self._send(
                    200, "application/json", json.dumps({"object": "list", "data": []}).encode()
                )

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                body = json.loads(raw or b"{}")
                server._record(self, body)
                if body.get("stream"):
                    self._send(200, "text/event-stream", server._stream_body(body))
                else:
                    self._send(
                        200, "application/json", json.dumps(server._completion(body)).encode()
                    )

            def _send(self, status: int, ctype: str, data: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler

    def _record(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        headers = {k.lower(): v for k, v in handler.headers.items()}
        self.requests.append(RecordedRequest(handler.command, handler.path, headers, body))

    def message(self, body: dict[str, Any]) -> dict[str, Any]:
        """The assistant message every chat call is answered with: ``reply`` as plain text (a
        subclass answers the way a framework's agents need to finish, e.g. a final-answer tool)."""
        return {"role": "assistant", "content": self.reply}

    def _completion(self, body: dict[str, Any]) -> dict[str, Any]:
        message = self.message(body)
        return {
            "id": "chatcmpl-recorded",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "unknown"),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                    "logprobs": None,
                }
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
        }

    def _stream_body(self, body: dict[str, Any]) -> bytes:
        message = self.message(body)
        delta: dict[str, Any] = {"content": message.get("content") or ""}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        base = {
            "id": "chatcmpl-recorded",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": body.get("model", "unknown"),
        }
        chunks: list[dict[str, Any]] = [
            {
                **base,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "finish_reason": None,
                    }
                ],
            },
            {
                **base,
                "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
            },
            {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
            {
                **base,
                "choices": [],
                "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
            },
        ]
        return (
            b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
            + b"data: [DONE]\n\n"
        )

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        """The chat-completions requests received, in order."""
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    def start(self) -> RecordingServer:
        """Serve on a background thread."""
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and join the thread."""
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> RecordingServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class CompleteRecorder:
    """A stand-in for the gateway's ``POST /api/sessions/{id}/complete``: records every record.

    ``fail_first`` answers 503 to that many posts first (to exercise the app's retries).
    """

    def __init__(self, fail_first: int = 0) -> None:
        self.records: dict[str, list[dict[str, Any]]] = {}
        self.auth: dict[str, str] = {}
        self.fail_first = fail_first
        self._lock = threading.Condition()  # notified on every record: waiters wake at once
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
            self._lock.notify_all()
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

    def wait_for(self, sid: str, timeout: float = 60.0) -> list[dict[str, Any]]:
        """The records of ``sid`` once the first arrives; ``timeout`` only bounds a hang."""
        with self._lock:
            if not self._lock.wait_for(lambda: sid in self.records, timeout):
                raise AssertionError(f"no terminal record for {sid} within {timeout}s")
            return list(self.records[sid])
