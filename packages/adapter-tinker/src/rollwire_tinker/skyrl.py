"""SkyRL's self-hosted Tinker server (``skyrl[tinker,jax]==0.3.0``) started from a pip install.

``python -m skyrl.tinker.api`` starts its engine by rebuilding the ``uv run`` command line that
started it (``_build_uv_run_cmd_engine``), so from a plain venv it raises ValueError. This launcher
runs the same API app and has it start the engine as ``python -m rollwire_tinker.skyrl engine``
(SkyRL's own ``skyrl.tinker.engine.main``) in the same interpreter. On Python < 3.12 it also
makes ``typing.TypedDict`` typing_extensions' before SkyRL is imported: pydantic refuses
``typing.TypedDict`` there, and ``skyrl/tinker/types.py`` uses it. SkyRL's files are not touched.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["SkyRLServer", "main", "stop_with_parent"]

SKYRL_VERSION = "0.3.0"

#: set by :class:`SkyRLServer` to the starting process's pid: the launcher ends with it
PARENT_ENV = "ROLLWIRE_SKYRL_PARENT_PID"


def _typeddict_for_pydantic() -> None:
    if sys.version_info < (3, 12):
        import typing

        import typing_extensions

        typing.TypedDict = typing_extensions.TypedDict  # type: ignore[assignment]


def _engine(argv: Sequence[str]) -> None:
    _typeddict_for_pydantic()
    from skyrl.tinker import engine

    sys.argv = ["skyrl.tinker.engine", *argv]
    engine.main()


def _api(argv: Sequence[str]) -> None:
    _typeddict_for_pydantic()
    import argparse

    import uvicorn
    from skyrl.tinker import api
    from skyrl.tinker.config import EngineConfig, add_model, config_to_argv
    from skyrl.utils.log import get_uvicorn_log_config

    if not hasattr(api, "_build_uv_run_cmd_engine"):
        raise RuntimeError(
            f"this launcher is written for skyrl=={SKYRL_VERSION}, whose API server builds the "
            "engine command in skyrl.tinker.api._build_uv_run_cmd_engine; install that version"
        )

    def engine_command(parent_cmd: list[str], config: Any) -> list[str]:
        return [sys.executable, "-m", "rollwire_tinker.skyrl", "engine", *config_to_argv(config)]

    api._build_uv_run_cmd_engine = engine_command
    parser = argparse.ArgumentParser(description="SkyRL's Tinker API server, launched by rollwire")
    add_model(parser, EngineConfig)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(list(argv))
    fields = {k: v for k, v in vars(args).items() if k in EngineConfig.model_fields}
    api.app.state.engine_config = EngineConfig.model_validate(fields)
    uvicorn.run(api.app, host=args.host, port=args.port, log_config=get_uvicorn_log_config())


def _gone(pid: int) -> bool:
    """No such process, or a zombie waiting to be reaped (Linux's ``/proc`` says which)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]


def stop_with_parent(parent: int, poll: float = 1.0) -> threading.Thread:
    """End this process group once ``parent`` is gone (a daemon thread polling every ``poll``
    seconds; ``parent`` may be further up than this process's parent, as when a wrapper starts
    it). The server runs in its own session, so a parent killed before its ``stop`` (SIGKILL, an
    OOM kill, a timed-out CI job) would leave the API and its engine, GBs of memory, running for
    good: this ends them with it."""

    def watch() -> None:
        while not _gone(parent):
            time.sleep(poll)
        os.killpg(os.getpgrp(), signal.SIGKILL)  # the engine (same group) and this process

    thread = threading.Thread(target=watch, name="stop-with-parent", daemon=True)
    thread.start()
    return thread


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m rollwire_tinker.skyrl api|engine [SkyRL's flags]``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ("api", "engine"):
        raise SystemExit(
            "usage: python -m rollwire_tinker.skyrl api|engine --base-model DIR [SkyRL flags]"
        )
    parent = os.environ.pop(PARENT_ENV, None)  # the API's engine, its child, does not watch
    if parent and args[0] == "api":
        stop_with_parent(int(parent))
    (_api if args[0] == "api" else _engine)(args[1:])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SkyRLServer:
    """SkyRL's Tinker server on 127.0.0.1, started and stopped by the caller (a context manager).

    ``workdir`` holds its SQLite database, checkpoints and log; ``max_lora_adapters`` must exceed
    the training clients created while it runs (an ended session's adapter stays 300 s).
    """

    def __init__(
        self,
        base_model: str | Path,
        workdir: str | Path,
        *,
        port: int | None = None,
        max_lora_adapters: int = 4,
        max_lora_rank: int = 8,
        backend_config: dict[str, Any] | None = None,
        python: str = sys.executable,
        startup_timeout: float = 900.0,
    ) -> None:
        self.base_model = str(base_model)
        self.workdir = Path(workdir)
        self.port = port or _free_port()
        self.python = python
        self.startup_timeout = startup_timeout
        self.backend_config = {
            "max_lora_adapters": max_lora_adapters,
            "max_lora_rank": max_lora_rank,
            **(backend_config or {}),
        }
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = self.workdir / "skyrl-server.log"

    @property
    def base_url(self) -> str:
        """Where the SDK's ``ServiceClient(base_url=...)`` reaches it."""
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The launcher's command line."""
        return [
            self.python, "-m", "rollwire_tinker.skyrl", "api",
            "--base-model", self.base_model,
            "--backend", "jax",
            "--backend-config", json.dumps(self.backend_config),
            "--database-url", f"sqlite:///{self.workdir / 'tinker.db'}",
            "--checkpoints-base", str(self.workdir / "checkpoints"),
            "--host", "127.0.0.1", "--port", str(self.port),
        ]  # fmt: skip

    def start(self) -> SkyRLServer:
        """Start it and wait until its health route answers (the engine loads in the background)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
        env.setdefault("HF_HUB_OFFLINE", "1")
        env[PARENT_ENV] = str(os.getpid())  # it ends with this process, however this one ends
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        log.close()
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"SkyRL's server exited with {self.process.returncode} while starting; its log "
                    f"({self.log_path}) ends with:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.base_url}/api/v1/healthz", timeout=2):
                    return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise TimeoutError(
            f"SkyRL's server did not answer on {self.base_url} within {self.startup_timeout:.0f} s; "
            f"its log ends with:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the server's log (API and engine)."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (the API stops its engine), then SIGKILL of the whole process group if needed."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # an engine left behind holds GBs of memory
        except ProcessLookupError:
            pass
        proc.wait()

    def __enter__(self) -> SkyRLServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    main()
