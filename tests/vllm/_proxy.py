"""A loopback HTTP proxy in front of a real server that can mishandle one route: what a LoRA
push that "succeeds" without the new adapter reaching the server looks like from the trainer."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

#: ``rewrite(path, body) -> (body to forward, or None to answer 200 without forwarding)``
Rewrite = Callable[[str, dict[str, Any]], dict[str, Any] | None]

_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding"}


class Proxy:
    """Forwards every request to ``upstream``; a JSON POST to a path in ``rewrites`` goes through
    its function first. ``seen`` lists ``(path, body as received)`` of those requests."""

    def __init__(self, upstream: str, rewrites: dict[str, Rewrite]) -> None:
        self.upstream, self.rewrites = upstream.rstrip("/"), rewrites
        self.seen: list[tuple[str, dict[str, Any]]] = []
        http = httpx.Client(timeout=600)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                path = self.path.split("?")[0]
                if self.command == "POST" and path in proxy.rewrites:
                    sent = json.loads(body or b"{}")
                    proxy.seen.append((path, dict(sent)))
                    out = proxy.rewrites[path](path, sent)
                    if out is None:  # "done", and nothing reached the server
                        self._answer(200, b"Success", {"content-type": "text/plain"})
                        return
                    body = json.dumps(out).encode()
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                r = http.request(
                    self.command, proxy.upstream + self.path, content=body, headers=headers
                )
                self._answer(r.status_code, r.content, dict(r.headers))

            def _answer(self, status: int, content: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                for k, v in headers.items():
                    if k.lower() not in _HOP:
                        self.send_header(k, v)
                self.send_header("content-length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            do_GET = do_POST = do_PUT = do_DELETE = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http = http
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> Proxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._http.close()
