from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rollwire.cli import engine as cli
from rollwire.engine import TinyModel, tokenizer_dir


def test_save_model(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli.engine_app, ["save-model", str(tmp_path / "m"), "--seed", "3"])
    assert r.exit_code == 0, r.output
    m = TinyModel.load(tmp_path / "m")
    assert m.config.seed == 3 and (tmp_path / "m" / "tokenizer" / "tokenizer_config.json").exists()


@pytest.mark.parametrize("argv", [["--port", "9123"], ["serve", "--port", "9123"]])
def test_serve_flags(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(cli, "_serve", lambda **kw: seen.update(kw))
    extra = [
        "--scripted",
        "s.yaml",
        "--fault-error-rate",
        "0.5",
        "--logprobs-mode",
        "processed",
        "--return-routed-experts",
    ]
    r = CliRunner().invoke(cli.engine_app, argv + extra)
    assert r.exit_code == 0, r.output
    assert seen["port"] == 9123 and seen["scripted"] == "s.yaml" and seen["fault_error_rate"] == 0.5
    assert seen["logprobs_mode"] == "processed" and seen["return_routed_experts"] is True


def test_build_tokenizer(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli.engine_app, ["build-tokenizer", str(tmp_path / "tok")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "tok" / "tokenizer.json").read_text() == (
        tokenizer_dir() / "tokenizer.json"
    ).read_text()


def test_served_model_name_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(cli, "_serve", lambda **kw: seen.update(kw))
    argv = ["serve", "--served-model-name", "a", "--served-model-name", "b", "--strict-model-name"]
    r = CliRunner().invoke(cli.engine_app, argv)
    assert r.exit_code == 0, r.output
    assert seen["served_model_name"] == ["a", "b"] and seen["strict_model_name"] is True
    r = CliRunner().invoke(cli.engine_app, ["serve"])
    assert seen["served_model_name"] is None and seen["strict_model_name"] is True
    r = CliRunner().invoke(cli.engine_app, ["serve", "--any-model-name"])
    assert r.exit_code == 0, r.output
    assert seen["strict_model_name"] is False


def test_openai_ids_style_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(cli, "_serve", lambda **kw: seen.update(kw))
    r = CliRunner().invoke(cli.engine_app, ["serve", "--openai-ids-style", "sglang"])
    assert r.exit_code == 0, r.output
    assert seen["openai_ids_style"] == "sglang"
    r = CliRunner().invoke(cli.engine_app, ["serve"])
    assert seen["openai_ids_style"] == "vllm"
