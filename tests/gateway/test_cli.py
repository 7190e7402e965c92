"""The gateway as its own process: the ``rollwire gateway`` CLI, and durability under SIGKILL."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from rollwire.agent.serving import ServerThread
from rollwire.store import SQLiteStore
from rollwire.testing.null_backend import NullBackend
from rollwire.trainer.gateway_client import GatewayClient

ADMIN = "test-admin-key"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _gateway_process(argv: list[str], port: int) -> Iterator[subprocess.Popen[bytes]]:
    """Start a gateway process, wait for ``/health``, and always stop it. Its stderr goes to a
    file (a pipe nobody reads blocks a chatty process once full) and is shown if it fails."""
    env = {**os.environ, "ROLLWIRE_ADMIN_KEY": ADMIN}
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)

        def stderr_tail() -> str:
            err.seek(0)
            return err.read().decode(errors="replace")[-4000:]

        try:
            deadline = time.monotonic() + 180  # bounds a hang: start-up is slow on a busy machine
            while True:
                if proc.poll() is not None:
                    pytest.fail(f"gateway exited with {proc.returncode}: {stderr_tail()}")
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(f"gateway did not answer /health within 180 s: {stderr_tail()}")
                time.sleep(0.1)
            try:
                yield proc
            except BaseException as exc:
                exc.add_note(f"gateway stderr: {stderr_tail()}")
                raise
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


def test_rollwire_gateway_cli_serves_and_stops(tmp_path: Path) -> None:
    exe = shutil.which("rollwire", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("the rollwire console script is not installed next to this interpreter")
    port = _free_port()
    argv = [exe, "gateway", "--port", str(port), "--store", f"sqlite:{tmp_path / 'cli.sqlite'}"]
    with _gateway_process(argv, port) as proc:
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).json()
        assert health["status"] == "ok" and health["backends"] == 0
        r = httpx.get(
            f"http://127.0.0.1:{port}/api/backends",
            headers={"authorization": f"Bearer {ADMIN}"},
            timeout=30,
        )
        assert r.status_code == 200 and r.json() == {"backends": []}
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0


def test_acknowledged_calls_survive_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "kill.sqlite"
    port = _free_port()
    n = 25
    with ServerThread(NullBackend()) as backend:
        argv = [
            sys.executable,
            "-m",
            "rollwire.cli.gateway",
            "--port",
            str(port),
            "--store",
            f"sqlite:{path}",
            "--backend",
            backend.url,
        ]
        with (
            _gateway_process(argv, port) as proc,
            GatewayClient(f"http://127.0.0.1:{port}", ADMIN) as client,
        ):
            h = client.create_session()
            acknowledged: list[str] = []
            with httpx.Client(timeout=30) as http:
                for i in range(n):
                    body = {"model": "p", "messages": [{"role": "user", "content": f"q{i}"}]}
                    r = http.post(h.base_url + "/chat/completions", json=body)
                    assert r.status_code == 200
                    acknowledged.append(f"q{i}")
            proc.kill()  # no shutdown, no final checkpoint: the answer must have meant "stored"
            proc.wait(10)

    async def read() -> list[str]:
        store = SQLiteStore(str(path))
        try:
            rec = await store.get_session(h.session_id)
            assert rec is not None and rec.num_calls == n
            calls = await store.calls(h.session_id)
            return [c.request["messages"][-1]["content"] for c in calls]
        finally:
            await store.close()

    assert asyncio.run(read()) == acknowledged
