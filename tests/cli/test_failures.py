"""Every way a newcomer's command goes wrong, run as they run it: the ``rollwire`` console script
in a subprocess. Each case checks the exit code, one ``error:`` line that says what to do, no
traceback, and that nothing was overwritten."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rollwire.engine import EmbeddedEngine, EngineConfig
from rollwire.engine.config import FaultConfig
from rollwire.gateway import serve_in_thread

AGENT = "rollwire.envs.wordle.agent_openai:app"
CLI = Callable[..., Any]
#: Bounds a command that should exit at once but serves instead; its start-up (imports) alone
#: takes tens of seconds on a busy machine.
EXIT_BOUND = 240


@pytest.fixture
def tasks(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"secret": "crane"}\n{"secret": "slate"}\n')
    return path


@pytest.fixture(scope="module")
def engine() -> Iterator[EmbeddedEngine]:
    with EmbeddedEngine(EngineConfig()) as e:
        yield e


# -- rollwire run --------------------------------------------------------------------------------


def test_a_dead_backend_is_refused_before_the_run(
    cli: CLI, error_line: CLI, free_port: CLI, tasks: Path, tmp_path: Path
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    proc = cli("run", "--agent", AGENT, "--tasks", str(tasks), "--backend", dead, cwd=tmp_path)
    assert proc.returncode == 2
    assert f"--backend {dead}: the inference server does not answer" in error_line(proc)
    assert not (tmp_path / "rollouts.jsonl").exists()


def test_a_backend_that_fails_every_call_fails_the_run(
    cli: CLI, error_line: CLI, tasks: Path, tmp_path: Path
) -> None:
    config = EngineConfig(faults=FaultConfig(error_rate=1.0))
    with EmbeddedEngine(config) as failing:
        proc = cli(
            "run", "--agent", AGENT, "--tasks", str(tasks), "--backend", failing.url,
            "-n", "2", "--no-progress", cwd=tmp_path,
        )  # fmt: skip
    assert proc.returncode == 1
    assert "4 of 4 rollouts failed for an infrastructure reason" in error_line(proc)
    # the cause, grouped once (not one line per rollout), with the backend's own words
    assert "4  a model call failed at the gateway (infrastructure)" in proc.stdout
    assert "injected fault" in proc.stdout and proc.stdout.count("injected fault") == 1
    assert "reward mean" in proc.stdout and "calls with routed experts" in proc.stdout
    assert (tmp_path / "rollouts.jsonl").read_text().count("\n") == 4  # written either way


def test_an_unreachable_agent_fails_the_run_and_says_why(
    cli: CLI, error_line: CLI, free_port: CLI, tasks: Path, tmp_path: Path, engine: EmbeddedEngine
) -> None:
    agent = f"http:http://127.0.0.1:{free_port()}"
    proc = cli(
        "run", "--tasks", str(tasks), "--backend", engine.url, "--runner", agent,
        "-n", "1", "--no-progress", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "2 of 2 rollouts failed for an infrastructure reason" in error_line(proc)
    assert "the agent could not be reached (infrastructure)" in proc.stdout
    assert "could not connect to the agent" in proc.stdout


def test_agent_errors_fail_the_run_above_max_failed(
    cli: CLI, error_line: CLI, tasks: Path, tmp_path: Path, engine: EmbeddedEngine
) -> None:
    (tmp_path / "crashing_agent.py").write_text(
        "from rollwire import RolloutApp\n"
        "app = RolloutApp()\n"
        "@app.rollout_entrypoint\n"
        "def play(payload):\n"
        "    raise KeyError('no board in the task')\n"
    )
    args = ["run", "--agent", "crashing_agent:app", "--tasks", str(tasks), "--no-progress"]
    args += ["--backend", engine.url, "-n", "1"]
    proc = cli(*args, cwd=tmp_path)
    assert proc.returncode == 1
    assert "2 of 2 rollouts failed (100%, more than --max-failed 0.2)" in error_line(proc)
    assert "the agent raised an error (agent): KeyError: 'no board in the task'" in proc.stdout
    # the same run is acceptable when the user says so
    proc = cli(*args, "--max-failed", "1", "--out", "again.jsonl", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "again.jsonl").exists()


def test_tokens_mode_without_transformers_is_refused(
    cli: CLI, error_line: CLI, tasks: Path, tmp_path: Path
) -> None:
    shadow = tmp_path / "no-transformers"
    (shadow / "transformers").mkdir(parents=True)
    (shadow / "transformers" / "__init__.py").write_text("raise ImportError('not installed')\n")
    proc = cli(
        "run", "--agent", AGENT, "--tasks", str(tasks), "--backend", "embedded",
        "--capture", "tokens", cwd=tmp_path, env={"PYTHONPATH": str(shadow)},
    )  # fmt: skip
    assert proc.returncode == 2
    assert 'pip install "rollwire[tokens]"' in error_line(proc)


def test_an_existing_output_is_kept_without_force(
    cli: CLI, error_line: CLI, tasks: Path, tmp_path: Path
) -> None:
    out = tmp_path / "rollouts.jsonl"
    out.write_text("earlier run\n")
    proc = cli(
        "run", "--agent", AGENT, "--tasks", str(tasks), "--backend", "embedded", cwd=tmp_path
    )
    assert proc.returncode == 2
    assert "--out rollouts.jsonl exists; pass --force" in error_line(proc)
    assert out.read_text() == "earlier run\n"


def test_bad_tasks_files_say_which_line(cli: CLI, error_line: CLI, tmp_path: Path) -> None:
    bad = tmp_path / "tasks.jsonl"
    bad.write_text('{"secret": "crane"}\n[1, 2]\n')
    proc = cli("run", "--agent", AGENT, "--tasks", str(bad), "--backend", "embedded", cwd=tmp_path)
    assert proc.returncode == 2
    assert "tasks.jsonl:2: a task must be a JSON object, got list" in error_line(proc)


def test_a_remote_gateway_is_checked_before_the_run(
    cli: CLI, error_line: CLI, free_port: CLI, tasks: Path, tmp_path: Path, engine: EmbeddedEngine
) -> None:
    base = ["run", "--agent", AGENT, "--tasks", str(tasks)]
    with serve_in_thread(backends=[(engine.url, "vllm")], admin_key="right") as gw:
        wrong = cli(*base, "--gateway", gw.url, "--admin-key", "wrong", cwd=tmp_path)
        missing = cli(*base, "--gateway", gw.url, cwd=tmp_path)
    with serve_in_thread(admin_key="right") as empty:
        no_backend = cli(*base, "--gateway", empty.url, "--admin-key", "right", cwd=tmp_path)
    started = time.monotonic()
    down = cli(
        *base, "--gateway", f"http://127.0.0.1:{free_port()}", "--admin-key", "k", cwd=tmp_path
    )
    assert time.monotonic() - started < 30  # no minute of retries before saying so
    assert wrong.returncode == missing.returncode == no_backend.returncode == down.returncode == 2
    assert "refused the admin key (HTTP 401)" in error_line(wrong)
    assert "pass --admin-key KEY or set ROLLWIRE_ADMIN_KEY" in error_line(missing)
    assert "has no inference backend" in error_line(no_backend)
    assert "cannot reach the gateway" in error_line(down)
    assert not (tmp_path / "rollouts.jsonl").exists()


# -- rollwire gateway / engine -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--backend", "foo"], "--backend foo is not a backend URL"),
        (["--backend", "http://127.0.0.1:5=bogus"], "unknown backend kind 'bogus'"),
        (["--store", "postgres://db/x"], "--store postgres://db/x: unknown store"),
        (["--store", "sqlite:/no/such/folder/x.db"], "the folder /no/such/folder does not exist"),
    ],
)
def test_gateway_flags_are_checked_at_start(
    cli: CLI, error_line: CLI, free_port: CLI, args: list[str], message: str, tmp_path: Path
) -> None:
    proc = cli("gateway", "--port", str(free_port()), *args, cwd=tmp_path, timeout=EXIT_BOUND)
    assert proc.returncode == 2
    assert message in error_line(proc)
    assert "admin key" not in proc.stderr and "rollwire gateway on" not in proc.stderr


@pytest.mark.parametrize("command", ["gateway", "engine"])
def test_a_busy_port_is_one_line_before_any_announcement(
    cli: CLI, error_line: CLI, command: str, tmp_path: Path
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = cli(command, "--port", str(port), cwd=tmp_path, timeout=EXIT_BOUND)
    assert proc.returncode == 2
    assert f"port {port} on 127.0.0.1 is already in use" in error_line(proc)
    assert "serving" not in proc.stdout + proc.stderr and " on http://" not in proc.stderr


# -- rollwire export -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rollouts(cli: CLI, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    proc = cli("demo", "--tasks", "1", "--group-size", "2", "--out", str(out), cwd=out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out / "rollouts.jsonl"


def test_export_to_an_adapter_that_is_not_installed(
    cli: CLI, error_line: CLI, rollouts: Path, tmp_path: Path
) -> None:
    proc = cli("export", "--in", str(rollouts), "--to", "megatron", "--out", "x", cwd=tmp_path)
    assert proc.returncode == 2
    line = error_line(proc)
    assert "--to megatron: no such trainer adapter is usable; choose one of jsonl" in line
    assert "slime" in line and "rllm" in line
    assert not (tmp_path / "x").exists()


def test_export_options_the_adapter_does_not_take(
    cli: CLI, error_line: CLI, rollouts: Path, tmp_path: Path
) -> None:
    args = ["export", "--in", str(rollouts), "--to", "slime", "--out", "s.jsonl"]
    proc = cli(*args, "--max-prompt-length", "512", cwd=tmp_path)  # verl's option
    assert proc.returncode == 2
    assert "the slime adapter takes no --max-prompt-length" in error_line(proc)
    assert not (tmp_path / "s.jsonl").exists()


def test_export_with_a_tokenizer_fills_slime_response_text(
    cli: CLI, error_line: CLI, rollouts: Path, tmp_path: Path
) -> None:
    from rollwire.engine import tokenizer_dir

    args = ["export", "--in", str(rollouts), "--to", "slime", "--out", "s.jsonl"]
    plain = cli(*args, cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    with_tok = cli(*args, "--tokenizer", str(tokenizer_dir()), "--force", cwd=tmp_path)
    assert with_tok.returncode == 0, with_tok.stderr
    samples = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    responses = [s["response"] for group in samples for s in _leaves(group)]
    assert responses and all("guess_word" in r for r in responses)
    # and an existing export is kept without --force
    again = cli(*args, cwd=tmp_path)
    assert again.returncode == 2 and "--out s.jsonl exists" in error_line(again)


def _leaves(node: object) -> Iterator[dict[str, object]]:
    if isinstance(node, dict) and "response" in node:
        yield node
    elif isinstance(node, (list, dict)):
        for child in node.values() if isinstance(node, dict) else node:
            yield from _leaves(child)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scripted", "/no/such/script.yaml"], "script '/no/such/script.yaml' is neither"),
        (["--model-dir", "/no/such/model"], "model folder '/no/such/model' does not exist"),
    ],
)
def test_engine_flags_are_checked_at_start(
    cli: CLI, error_line: CLI, free_port: CLI, args: list[str], message: str, tmp_path: Path
) -> None:
    proc = cli("engine", "--port", str(free_port()), *args, cwd=tmp_path, timeout=EXIT_BOUND)
    assert proc.returncode == 2
    assert message in error_line(proc)
    assert "serving" not in proc.stdout


def test_a_gateway_backend_that_does_not_answer_yet_is_a_warning(
    free_port: CLI, tmp_path: Path
) -> None:
    import subprocess
    import sys

    dead, port = f"http://127.0.0.1:{free_port()}", free_port()
    rollwire = str(Path(sys.executable).with_name("rollwire"))
    argv = [
        rollwire,
        "gateway",
        "--port",
        str(port),
        "--backend",
        dead,
        "--store",
        "sqlite::memory:",
    ]
    proc = subprocess.Popen(argv, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        lines = []
        for line in proc.stderr:  # the announcement comes after the checks
            lines.append(line)
            if line.startswith("rollwire gateway on"):
                break
        text = "".join(lines)
        assert f"warning: backend {dead} (vllm) does not answer yet" in text, text
        assert proc.poll() is None  # it serves: vLLM may still be loading
    finally:
        proc.terminate()
        proc.wait(30)
        if proc.stderr is not None:
            proc.stderr.close()


def test_eval_fails_when_its_rollouts_failed_for_infrastructure(
    cli: CLI, error_line: CLI, tasks: Path, tmp_path: Path
) -> None:
    with EmbeddedEngine(EngineConfig(faults=FaultConfig(error_rate=1.0))) as failing:
        args = ["eval", "--agent", AGENT, "--tasks", str(tasks), "--backend", failing.url]
        proc = cli(*args, "--k", "1", "--no-progress", cwd=tmp_path)
        assert proc.returncode == 1
        assert "2 evaluation rollouts failed for an infrastructure reason" in error_line(proc)
        assert "injected fault" in proc.stdout
        again = cli(*args, "--k", "1", "--no-progress", cwd=tmp_path)  # eval.json exists now
    assert again.returncode == 2 and "--out eval.json exists" in error_line(again)
