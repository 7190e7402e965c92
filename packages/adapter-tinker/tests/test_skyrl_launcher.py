"""The SkyRL launcher ends with the process that started it: a parent killed before it could call
``SkyRLServer.stop`` leaves no API or engine behind. Stand-ins for both (sleeping Python processes
in the launcher's session, as ``SkyRLServer.start`` makes them) run the launcher's own watchdog."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

#: the started "server": a session of its own, an "engine" child, the watchdog on its parent
SERVER = """
import os, subprocess, sys, time
from rollwire_tinker.skyrl import PARENT_ENV, stop_with_parent
engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(os.getpid(), engine.pid, flush=True)
stop_with_parent(int(os.environ.pop(PARENT_ENV)), poll=0.05)
time.sleep(600)
"""

#: the "trainer": starts the server as SkyRLServer.start does (or through a shell that forks it,
#: as a wrapper script would), prints its pids, then waits
PARENT = """
import os, shlex, subprocess, sys, time
from rollwire_tinker.skyrl import PARENT_ENV
env = {**os.environ, PARENT_ENV: str(os.getpid())}
argv = [sys.executable, "-c", sys.argv[1]]
if sys.argv[2] == "wrapped":
    argv = ["sh", "-c", shlex.join(argv) + "; exit $?"]
server = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, start_new_session=True)
print(server.stdout.readline().decode().strip(), flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    """Running or sleeping: not gone and not a zombie waiting for init to reap it."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.parametrize("start", ["direct", "wrapped"])
def test_a_killed_parent_takes_the_server_and_its_engine_with_it(start: str) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, SERVER, start],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    groups = [parent.pid]
    try:
        assert parent.stdout is not None
        server, engine = (int(p) for p in parent.stdout.readline().split())
        groups.append(server)
        time.sleep(0.2)  # four polls: a watchdog that misreads its parent has ended it by now
        assert _alive(server) and _alive(engine)
        assert os.getpgid(server) != os.getpgid(parent.pid)  # its own session, as SkyRLServer's
        parent.kill()  # no stop(): SIGKILL, as a CI timeout or the OOM killer does
        parent.wait(10)
        deadline = time.monotonic() + 30
        while (_alive(server) or _alive(engine)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(server) and not _alive(engine)
    finally:
        for group in groups:  # whatever the test left, should it fail
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if parent.stdout is not None:
            parent.stdout.close()
