"""Shared by the benchmarks: server subprocesses on 127.0.0.1 and their CPU and memory from /proc."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from rollwire.agent.serving import free_port

__all__ = [
    "Proc",
    "cpu_seconds",
    "free_port",
    "peak_rss_mb",
    "rss_mb",
    "thread_seconds",
    "wait_http",
]


def wait_http(url: str, timeout: float = 60.0) -> None:
    """Block until ``url`` answers below 500, or raise TimeoutError."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status < 500:
                    return
        except Exception:
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not come up within {timeout}s")


def thread_seconds(pid: int) -> dict[str, float]:
    """CPU seconds of each live thread of a process, by thread id: the scheduler's run time in
    nanoseconds (``/proc/<pid>/task/*/schedstat``), not ``/proc/<pid>/stat``'s clock ticks,
    which move in steps of 10 ms (20 us a call over a 500-call round)."""
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[tid] = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            continue  # the thread exited meanwhile
    return out


def cpu_seconds(pid: int) -> float:
    """CPU seconds of a process: :func:`thread_seconds` summed. The servers measured keep their
    threads; one that exits between two readings drops its time from the second."""
    return sum(thread_seconds(pid).values())


def _status_mb(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) / 1024
    return 0.0


def rss_mb(pid: int) -> float:
    """Resident memory now."""
    return _status_mb(pid, "VmRSS:")


def peak_rss_mb(pid: int) -> float:
    """Peak resident memory so far."""
    return _status_mb(pid, "VmHWM:")


class Proc:
    """A server subprocess that is up once constructed and always terminated by ``stop``."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        health: str,
        env: dict[str, str] | None = None,
        timeout: float = 60.0,
    ) -> None:
        self.name = name
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 (lives as long as the process)
            prefix=f"bench-{name}-", suffix=".log", delete=False
        )
        self.p = subprocess.Popen(
            argv, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
        try:
            wait_http(health, timeout)
        except TimeoutError as exc:
            self.stop()
            raise RuntimeError(
                f"{name} failed to start; log: {Path(self.log.name).read_text()[-2000:]}"
            ) from exc

    @property
    def pid(self) -> int:
        return self.p.pid

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
