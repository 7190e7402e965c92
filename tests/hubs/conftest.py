"""Environments of other standards (OpenEnv, verifiers, NeMo Gym) as rollwire tasks, on the
embedded engine, and trained with ``rollwire train`` (TRL).

These tests run in ``.venv-hubs`` (``tests/hubs/ci/setup-venv.sh``, then
``tests/hubs/ci/run-tests.sh``: torch + TRL + verifiers + openenv-core, with a NeMo Gym venv on
Python 3.12 beside it, whose python is ``ROLLWIRE_NEMO_GYM_PYTHON``), with only loopback. The
workspace venv has none of the frameworks: there the folder is left out of collection.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

_NEEDS = ("torch", "trl", "verifiers", "openenv")
if not all(importlib.util.find_spec(m) for m in _NEEDS):
    collect_ignore_glob = ["test_*.py"]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "hubs"
#: what every process started here gets: the examples importable, no telemetry, no hub downloads
QUIET = {
    "PYTHONPATH": str(EXAMPLES),
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DO_NOT_TRACK": "1",
    "GRADIO_ANALYTICS_ENABLED": "False",
    "RAY_USAGE_STATS_ENABLED": "0",
    "WANDB_MODE": "disabled",
    "TRL_EXPERIMENTAL_SILENCE": "1",
}


@pytest.fixture(scope="session", autouse=True)
def _quiet_environment() -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in QUIET}
    os.environ.update(QUIET)
    sys.path.insert(0, str(EXAMPLES))
    try:
        yield
    finally:
        sys.path.remove(str(EXAMPLES))
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[Any], timeout: float = 120.0) -> None:
    """Wait until ``url`` answers (any status); fail with the server's output if it exited."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server for {url} exited with {proc.returncode}")
        try:
            httpx.get(url, timeout=2.0)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer within {timeout} s")


def stop(proc: subprocess.Popen[Any]) -> None:
    """Terminate ``proc`` (kill it after 10 s)."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def openenv_url() -> Iterator[str]:
    """The OpenEnv vault environment, served by ``examples/hubs/openenv_vault.py``."""
    port = free_port()
    script = str(EXAMPLES / "openenv_vault.py")
    proc = subprocess.Popen([sys.executable, script, "--port", str(port)], env=dict(os.environ))
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


@pytest.fixture(scope="session")
def nemo_gym() -> Iterator[dict[str, str]]:
    """The NeMo Gym vault servers (resources + agent) on ``ROLLWIRE_NEMO_GYM_PYTHON`` (NeMo Gym
    needs Python >= 3.12), their model server at ``ROLLWIRE_NEMO_GYM_MODEL`` (rollwire's)."""
    python = os.environ.get("ROLLWIRE_NEMO_GYM_PYTHON")
    if not python:
        pytest.fail(
            "set ROLLWIRE_NEMO_GYM_PYTHON to the NeMo Gym venv's python (run-tests.sh does)"
        )
    resources, agent, model = free_port(), free_port(), free_port()
    model_address = f"127.0.0.1:{model}"
    script = str(EXAMPLES / "nemo_gym_vault.py")
    args = [
        "--resources-port",
        str(resources),
        "--agent-port",
        str(agent),
        "--model",
        model_address,
    ]
    proc = subprocess.Popen([python, script, *args], env=dict(os.environ))
    saved = os.environ.get("ROLLWIRE_NEMO_GYM_MODEL")
    os.environ["ROLLWIRE_NEMO_GYM_MODEL"] = model_address
    try:
        wait_http(f"http://127.0.0.1:{agent}/", proc)
        yield {"agent_url": f"http://127.0.0.1:{agent}", "model": model_address}
    finally:
        stop(proc)
        if saved is None:
            os.environ.pop("ROLLWIRE_NEMO_GYM_MODEL", None)
        else:
            os.environ["ROLLWIRE_NEMO_GYM_MODEL"] = saved


def solve(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str | None:
    """The embedded engine's script of a perfect policy: read the box's code, open the box."""
    import json
    import re

    last = messages[-1]
    content = last.get("content") or ""
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    opened = re.search(r"Open box (\w)", content)
    if last["role"] == "user" and opened:
        call = {"name": "read_code", "arguments": {"box": opened.group(1)}}
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
    code = re.search(r"Box (\w)'s code is (\d+)", content)
    if code:
        call = {"name": "open_box", "arguments": {"box": code.group(1), "code": code.group(2)}}
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
    return "Done."


RunGroups = Callable[[str, list[dict[str, Any]]], list[Any]]


@pytest.fixture(scope="session")
def run_groups() -> Iterator[RunGroups]:
    """``run_groups(agent, tasks)``: groups of 2 rollouts per task of ``agent`` (``module:app``)
    on the embedded engine scripted with :func:`solve`, through a gateway."""
    from rollwire.agent.app import load_app
    from rollwire.engine import EmbeddedEngine, EngineConfig
    from rollwire.gateway import serve_in_thread
    from rollwire.trainer.client import RolloutClient
    from rollwire.trainer.runners import LocalRunner

    with (
        EmbeddedEngine(EngineConfig(scripted=solve)) as engine,
        serve_in_thread(backends=[(engine.url, "vllm")]) as gateway,
    ):

        def run(agent: str, tasks: list[dict[str, Any]]) -> list[Any]:
            client = RolloutClient(
                gateway, runner=LocalRunner(load_app(agent)), group_size=2, deadline=300.0
            )
            try:
                return list(client.run(tasks))
            finally:
                client.close()

        yield run


TrainCLI = Callable[..., Path]


def presented(run_groups: RunGroups, agent: str, task: dict[str, Any]) -> dict[str, Any]:
    """The tools and system prompt that the environment presents to the policy, as the first
    call of a scripted rollout of ``task`` captured them."""
    (group,) = run_groups(agent, [{**task, "task_id": "presented"}])
    request = group.rollouts[0].calls[0].request
    system = next((m.get("content") for m in request["messages"] if m["role"] == "system"), None)
    if isinstance(system, list):
        system = "".join(p.get("text", "") for p in system if isinstance(p, dict))
    return {"tools": request.get("tools"), "system": system}


@pytest.fixture(scope="session")
def train(tmp_path_factory: pytest.TempPathFactory, run_groups: RunGroups) -> TrainCLI:
    """``train(standard, url, agent)``: tasks written by ``examples/hubs/make_tasks.py`` with
    the teacher's warm-up in the prompt the environment presents, then ``rollwire train`` of
    ``agent`` for 2 steps of 2 tasks x 8 rollouts after 40 warm-up steps; returns the run
    folder once it exited 0 without a traceback."""
    import make_tasks

    rollwire = str(Path(sys.executable).with_name("rollwire"))

    def run(standard: str, url: str, agent: str, *extra: str) -> Path:
        folder = tmp_path_factory.mktemp(standard)
        (probe,) = make_tasks.MAKERS[standard](1, "train", 0, url)
        shown = presented(run_groups, agent, probe)
        from rollwire.envs.hubs.nemo_gym import model_server

        model_server.stop()  # the NeMo Gym config's model address is rollwire train's now
        make_tasks.write(folder, standard, url, n=8, heldout=2, **shown)
        args = [
            "--agent", agent, "--tasks", "tasks.jsonl", "--eval-tasks", "heldout.jsonl",
            "--sft", "sft.jsonl", "--warmup-steps", "40", "--steps", "2", "--tasks-per-step", "2",
            "--group-size", "8", "--eval-k", "1", "--eval-every", "0", "--seed", "0", "--out", "run",
            "--no-progress", *extra,
        ]  # fmt: skip
        env = {**os.environ, "COLUMNS": "200"}
        proc = subprocess.run(
            [rollwire, "train", *args], cwd=folder, capture_output=True, text=True, env=env,
            timeout=1500,
        )  # fmt: skip
        output = proc.stdout[-4000:] + proc.stderr[-4000:]
        assert proc.returncode == 0, output
        assert "Traceback" not in proc.stdout + proc.stderr, output
        return folder / "run"

    return run
