"""``rollwire inspect`` (file and live session) and ``rollwire eval`` from the command line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import orjson
import pytest
from typer.testing import CliRunner

from rollwire.agent.serving import ServerThread
from rollwire.cli import app
from rollwire.data.dataset import write_jsonl
from rollwire.gateway import RunningGateway, serve_in_thread
from rollwire.report.html import read_report_data
from rollwire.testing.chat_samples import chat_batch
from rollwire.testing.null_backend import NullBackend

runner = CliRunner()


def test_inspect_writes_the_report(tmp_path: Path) -> None:
    src = tmp_path / "rollouts.jsonl"
    write_jsonl(src, chat_batch())
    result = runner.invoke(app, ["inspect", str(src)])
    assert result.exit_code == 0, result.output
    page = (tmp_path / "rollouts.html").read_text()
    index, _, payloads = read_report_data(page)
    assert index["summary"]["rollouts"] == 9 and len(payloads) == 9
    said = " ".join(result.output.split())
    assert "no --tokenizer" in said  # says what is missing for roles
    assert "9 rollouts, 2 groups" in said


@pytest.mark.parametrize("which", ["folder", "embedded"])
def test_inspect_with_a_tokenizer(tmp_path: Path, which: str) -> None:
    from rollwire.engine.tokenizer import tokenizer_dir

    src = tmp_path / "r.jsonl"
    write_jsonl(src, chat_batch())
    out = tmp_path / "out" / "report.html"
    spec = str(tokenizer_dir()) if which == "folder" else "embedded"
    result = runner.invoke(app, ["inspect", str(src), "--out", str(out), "--tokenizer", spec])
    assert result.exit_code == 0, result.output
    index, vocab, _ = read_report_data(out.read_text())
    assert index["tokenizer"] is True and vocab


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mode", "rows"], "--mode must be merge or per_call"),
        (["--tokenizer", "/nonexistent"], "no tokenizer at /nonexistent"),
        ([], "give a rollouts JSONL file"),
        (["--session", "abc"], "--session needs --gateway"),
    ],
)
def test_inspect_errors_say_what_is_wrong(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["inspect", *args])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_inspect_a_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"not": "a rollout"}\n')
    result = runner.invoke(app, ["inspect", str(bad)])
    assert result.exit_code == 2 and "bad.jsonl:1" in result.output.replace("\n", "")


@pytest.fixture
def gateway() -> Iterator[RunningGateway]:
    reply = {
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
        ],
    }
    with (
        ServerThread(NullBackend(reply=lambda body: reply)) as backend,
        serve_in_thread(backends=[(backend.url, "vllm")]) as gw,
    ):
        yield gw


def test_inspect_a_live_session_in_the_terminal(gateway: RunningGateway) -> None:
    with gateway.client() as gw:
        handle = gw.create_session()
        oai = openai.OpenAI(base_url=handle.base_url, api_key=handle.token)
        oai.chat.completions.create(model="p", messages=[{"role": "user", "content": "hi"}])
        gw.complete(handle.session_id, reward=1.0)
    result = runner.invoke(
        app,
        [
            "inspect",
            "--session",
            handle.session_id,
            "--gateway",
            gateway.url,
            "--admin-key",
            gateway.admin_key,
        ],
        terminal_width=160,
    )
    assert result.exit_code == 0, result.output
    assert f"rollout {handle.session_id}" in result.output
    assert 'add({"a": 1})' in result.output  # the tool call as parsed
    assert "row 0" in result.output and "call 0" in result.output
    wrong = runner.invoke(
        app, ["inspect", "--session", "nope", "--gateway", gateway.url, "--admin-key", "x"]
    )
    assert wrong.exit_code == 1 and "refused" in " ".join(wrong.output.split())


def test_eval_demo_two_temperatures_side_by_side(tmp_path: Path) -> None:
    out, rollouts = tmp_path / "eval.json", tmp_path / "eval.jsonl"
    result = runner.invoke(
        app,
        ["eval", "--demo", "2", "-t", "0", "-t", "1.0", "--k", "2", "--pass-k", "1",
         "--pass-k", "2", "--out", str(out), "--rollouts", str(rollouts), "--no-progress"],
        terminal_width=160,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if "temperature=0" in line)
    assert "temperature=1" in header  # one table, the two settings as columns
    for metric in ("mean reward", "success rate", "pass@1", "pass@2"):
        assert metric in result.output
    data = orjson.loads(out.read_bytes())
    assert [s["sampling"]["temperature"] for s in data["settings"]] == [0.0, 1.0]
    assert all(s["attempts"] == 4 and s["tasks"] == 2 for s in data["settings"])
    lines = rollouts.read_bytes().splitlines()
    assert len(lines) == 8
    first = orjson.loads(lines[0])
    assert first["metadata"]["eval"]["setting"] == "temperature=0"
    assert all(not c["trainable"] and "eval" in c["flags"] for c in first["calls"])


def test_eval_errors_say_what_is_wrong() -> None:
    result = runner.invoke(app, ["eval"])
    assert result.exit_code == 2 and "--tasks" in result.output
    result = runner.invoke(app, ["eval", "--demo", "1", "--k", "2", "--pass-k", "5"])
    assert result.exit_code == 2 and "1 <= k <= 2" in " ".join(result.output.split())


def test_eval_serves_a_model_folder_in_the_embedded_engine(tmp_path: Path) -> None:
    from rollwire.engine.hf_export import save_hf
    from rollwire.engine.model import ModelConfig, TinyModel
    from rollwire.envs.lockbox import make_tasks

    tasks = tmp_path / "heldout.jsonl"
    tasks.write_bytes(b"".join(orjson.dumps(t) + b"\n" for t in make_tasks(2, "heldout", 1)))
    first_tokens = []
    for seed in (0, 5):  # two different models, as Hugging Face folders (rollwire train's)
        folder = save_hf(TinyModel(ModelConfig(seed=seed)), tmp_path / f"model-{seed}")
        rollouts = tmp_path / f"eval-{seed}.jsonl"
        result = runner.invoke(
            app,
            ["eval", "--agent", "rollwire.envs.lockbox.agent_openai:app", "--tasks", str(tasks),
             "--backend", f"embedded:{folder}", "-t", "0", "--max-tokens", "4", "--k", "1",
             "--out", str(tmp_path / f"eval-{seed}.json"), "--rollouts", str(rollouts),
             "--no-progress"],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        first = orjson.loads(rollouts.read_bytes().splitlines()[0])
        first_tokens.append(first["calls"][0]["completion_ids"])
    assert first_tokens[0] != first_tokens[1]  # each run sampled from its own folder's weights
    missing = runner.invoke(
        app,
        ["eval", "--agent", "rollwire.envs.lockbox.agent_openai:app", "--tasks", str(tasks),
         "--backend", f"embedded:{tmp_path / 'nope'}", "--no-progress",
         "--out", str(tmp_path / "x.json")],
    )  # fmt: skip
    assert missing.exit_code != 0
    assert "no such model folder" in " ".join(missing.output.split())
