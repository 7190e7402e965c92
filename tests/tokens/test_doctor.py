from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from rollwire.cli.doctor import diagnose, doctor_command
from rollwire.gateway.tokens.render import ChatRenderer

from .conftest import tokenizer_with_template


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("doctor")(doctor_command)

    @app.command("noop")
    def noop() -> None:  # a second command so typer keeps the "doctor" sub-command name
        """Nothing."""

    return app


def test_diagnose_flags_think_stripping(renderer: ChatRenderer) -> None:
    report = diagnose(renderer)
    by_name = {c.name: c for c in report.cases}
    assert report.parser == "hermes" and report.eos_token == "<|im_end|>"
    assert by_name["plain multi-turn"].passthrough_prefix
    reasoning = by_name["reasoning blocks"]
    assert not reasoning.passthrough_prefix and reasoning.fork_kind == "think_stripped"
    assert reasoning.fork_turn == 1 and reasoning.fork_position is not None
    assert by_name["tool-call JSON spacing"].fork_kind == "retokenized"
    assert by_name["system prompt change"].expected_fork
    assert all(c.tokens_holds for c in report.cases), [c.tokens_detail for c in report.cases]
    assert report.tokens_ok and not report.passthrough_ok
    json.dumps(report.to_dict())


def test_doctor_cli_prints_report(tokenizer_path: Path) -> None:
    result = CliRunner().invoke(
        _app(), ["doctor", "--tokenizer", str(tokenizer_path)], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    assert "think_stripped" in result.output and "retokenized" in result.output
    assert "tokens mode holds for this template" in result.output


def test_doctor_cli_default_tokenizer_json() -> None:
    result = CliRunner().invoke(_app(), ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["tokens_ok"] is True and data["parser"] == "hermes"


def test_doctor_exit_code_when_tokens_mode_cannot_hold(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    folder = tokenizer_with_template(
        tokenizer_path,
        tmp_path / "plain",
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    )
    result = CliRunner().invoke(_app(), ["doctor", "-t", str(folder)], env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output
    assert "no tool-call parser" in result.output
    assert "cannot hold" in result.output


def test_doctor_cli_bad_folder(tmp_path: Path) -> None:
    result = CliRunner().invoke(_app(), ["doctor", "-t", str(tmp_path / "missing")])
    assert result.exit_code == 2 and "cannot load" in result.output
