"""An agent process that dies mid-rollout (``os._exit`` or ``SIGKILL`` after its first model
call) gives the trainer a terminal record no later than the rollout's deadline + grace, and the
model call it made before dying is kept.

RolloutApp acknowledges a rollout before its handler runs, so the trainer cannot see the crash
itself; what it sees is the deadline passing with no completion, and the record is ``timeout``
(a terminal, non-trainable status, as ``failed``), written at deadline + grace."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from rollwire.agent.serving import ServerThread, free_port
from rollwire.testing.null_backend import NullBackend
from rollwire.trainer.client import RolloutClient
from rollwire.trainer.runners import HttpRunner

DEADLINE = 4.0
GRACE = 1.0


AGENT = """
import os, signal, sys
import openai  # imported before serving: seconds on a busy machine, not in the rollout
import uvicorn
from rollwire.agent.app import RolloutApp
from rollwire.agent.context import openai_client

app = RolloutApp()

@app.entrypoint
def handler(payload):
    openai_client(payload).chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "first turn"}]
    )
    if sys.argv[2] == "exit":
        os._exit(1)
    os.kill(os.getpid(), signal.SIGKILL)

uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
"""


@pytest.fixture(params=["exit", "sigkill"])
def crashing_agent(request: pytest.FixtureRequest) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A RolloutApp under uvicorn in its own process (spawned, not forked from a test worker
    with threads) whose handler makes one model call, then dies."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", AGENT, str(port), request.param])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60.0
        while True:
            assert proc.poll() is None, f"agent exited with {proc.returncode} before serving"
            try:
                if httpx.get(url + "/ping", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "agent did not come up in 60 s"
                time.sleep(0.02)  # no event says a child process started listening
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(5)


def test_agent_crash_gives_a_failed_record_by_deadline_plus_grace(
    crashing_agent: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, proc = crashing_agent
    with ServerThread(NullBackend()) as backend:
        client = RolloutClient(
            "embedded",
            runner=HttpRunner(url, timeout=60.0, grace=GRACE),
            backends=[(backend.url, "vllm")],
            group_size=1,
            deadline=DEADLINE,
            deadline_grace=GRACE,
            infra_retries=0,
        )
        t = time.monotonic()
        (group,) = client.run([{"prompt": "crash"}])
        took = time.monotonic() - t
    assert proc.wait(5) != 0  # the agent really died
    (rollout,) = group.rollouts
    assert rollout.terminal and rollout.status == "timeout", (rollout.status, rollout.error)
    assert rollout.completed_at is not None
    # Written when deadline + grace ran out (timer slack allowed), not at the 60 s try timeout.
    assert rollout.completed_at - rollout.created_at <= DEADLINE + GRACE + 0.5
    assert took < DEADLINE + GRACE + 5.0, took
    assert len(rollout.calls) == 1  # the call answered before the crash is kept
