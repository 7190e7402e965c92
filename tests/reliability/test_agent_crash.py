"""An agent process that dies mid-rollout (``os._exit`` or ``SIGKILL`` after its first model
call) gives the trainer a terminal record no later than the rollout's deadline + grace, and the
model call it made before dying is kept.

RolloutApp acknowledges a rollout before its handler runs, so the trainer cannot see the crash
itself; what it sees is the deadline passing with no completion, and the record is ``timeout``
(a terminal, non-trainable status, as ``failed``), written at deadline + grace."""

from __future__ import annotations

import select
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from rollwire.agent.serving import ServerThread, free_port
from rollwire.testing.null_backend import NullBackend
from rollwire.trainer.client import RolloutClient
from rollwire.trainer.runners import HttpRunner

DEADLINE = 4.0
GRACE = 1.0


AGENT = """
import os, signal, sys
import openai
import uvicorn
from rollwire.agent.app import RolloutApp
from rollwire.agent.context import openai_client

# One call straight to the backend before serving: openai's imports, lazy resources and first
# response parsing take seconds on a busy machine, and must not eat the rollout's deadline.
openai.OpenAI(base_url=sys.argv[3] + "/v1", api_key="warm-up").chat.completions.create(
    model="policy", messages=[{"role": "user", "content": "warm-up"}]
)

app = RolloutApp()

@app.entrypoint
def handler(payload):
    openai_client(payload).chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "first turn"}]
    )
    if sys.argv[2] == "exit":
        os._exit(1)
    os.kill(os.getpid(), signal.SIGKILL)

class Server(uvicorn.Server):
    async def startup(self, sockets=None):
        await super().startup(sockets)
        print("serving", flush=True)  # the test's start signal: listening, warmed up

config = uvicorn.Config(
    app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False
)
Server(config).run()
"""
#: How long the agent may take to start; an event ends the wait, this only bounds a hang.
START_TIMEOUT = 180.0


def _wait_serving(proc: subprocess.Popen[bytes]) -> None:
    """Block until the agent prints ``serving`` (it is listening and warmed up)."""
    assert proc.stdout is not None
    give_up = time.monotonic() + START_TIMEOUT
    while (left := give_up - time.monotonic()) > 0:
        if not select.select([proc.stdout], [], [], left)[0]:
            break
        line = proc.stdout.readline()  # unbuffered pipe: reads up to the newline only
        if not line:
            raise AssertionError(f"agent exited with {proc.wait()} before serving")
        if line.strip() == b"serving":
            return
    raise AssertionError(f"agent did not start serving in {START_TIMEOUT:.0f} s")


@pytest.fixture
def backend() -> Iterator[ServerThread]:
    with ServerThread(NullBackend()) as server:
        yield server


@pytest.fixture(params=["exit", "sigkill"])
def crashing_agent(
    request: pytest.FixtureRequest, backend: ServerThread
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A RolloutApp under uvicorn in its own process (spawned, not forked from a test worker
    with threads) whose handler makes one model call, then dies."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", AGENT, str(port), request.param, backend.url],
        stdout=subprocess.PIPE,
        bufsize=0,
    )
    try:
        _wait_serving(proc)
        yield f"http://127.0.0.1:{port}", proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(60)
        assert proc.stdout is not None
        proc.stdout.close()


def test_agent_crash_gives_a_failed_record_by_deadline_plus_grace(
    crashing_agent: tuple[str, subprocess.Popen[bytes]], backend: ServerThread
) -> None:
    url, proc = crashing_agent
    with RolloutClient(
        "embedded",
        runner=HttpRunner(url, timeout=60.0, grace=GRACE),
        backends=[(backend.url, "vllm")],
        group_size=1,
        deadline=DEADLINE,
        deadline_grace=GRACE,
        infra_retries=0,
    ) as client:
        t = time.monotonic()
        (group,) = client.run([{"prompt": "crash"}])
        took = time.monotonic() - t
    # The agent's one warm call and its death fit in the deadline; this only bounds a hang.
    assert proc.wait(60) != 0  # the agent really died
    (rollout,) = group.rollouts
    assert rollout.terminal and rollout.status == "timeout", (rollout.status, rollout.error)
    assert rollout.completed_at is not None
    # Written when deadline + grace ran out (timer slack allowed), not at the 60 s try timeout.
    written = rollout.completed_at - rollout.created_at
    assert written <= DEADLINE + GRACE + 0.5, written
    assert took < DEADLINE + GRACE + 5.0, took
    assert len(rollout.calls) == 1  # the call answered before the crash is kept
