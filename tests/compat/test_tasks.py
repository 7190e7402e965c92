"""``rollwire run --tasks`` reads the datasets the guides ship: JSONL, a JSON array, CSV, Parquet
and a local Hugging Face ``datasets`` folder give the same tasks."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rollwire.cli import app as cli
from rollwire.data.dataset import read_jsonl
from rollwire.data.tasks import read_tasks

ROWS = [{"id": f"q{i}", "prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(1, 9)]


def _write_all(folder: Path) -> dict[str, Path]:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    files = {
        "jsonl": folder / "tasks.jsonl",
        "json": folder / "tasks.json",
        "csv": folder / "tasks.csv",
        "parquet": folder / "tasks.parquet",
    }
    files["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    files["json"].write_text(json.dumps(ROWS, indent=1))
    with files["csv"].open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(ROWS[0]))
        writer.writeheader()
        writer.writerows(ROWS)
    pq.write_table(pa.Table.from_pylist(ROWS), files["parquet"])
    return files


def test_every_format_reads_the_same_rows(tmp_path: Path) -> None:
    files = _write_all(tmp_path)
    for name, path in files.items():
        assert read_tasks(path) == ROWS, name


def test_a_local_datasets_folder_reads_like_the_files(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(ROWS)
    ds.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": ds, "test": ds.select(range(2))}).save_to_disk(
        str(tmp_path / "dict")
    )
    ds.to_json(str(tmp_path / "lines.json"))  # JSON lines in a .json file, as datasets writes
    assert read_tasks(tmp_path / "saved") == ROWS
    assert read_tasks(tmp_path / "dict") == ROWS  # a DatasetDict gives its train split
    assert read_tasks(tmp_path / "lines.json") == ROWS
    snapshot = tmp_path / "snapshot" / "data"
    snapshot.mkdir(parents=True)
    _write_all(snapshot)["jsonl"].unlink()
    (snapshot / "tasks.json").unlink()
    (snapshot / "tasks.csv").unlink()
    assert read_tasks(tmp_path / "snapshot") == ROWS  # a folder of data files (hub layout)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"a": 1}\n[1]\n', "tasks.jsonl:2: a task must be a JSON object"),
        ("{not json\n", "tasks.jsonl:1: not JSON"),
    ],
)
def test_bad_rows_are_named(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        read_tasks(path)
    with pytest.raises(ValueError, match="unknown task file type"):
        read_tasks(tmp_path / "tasks.xlsx")


AGENT = """
def handler(payload):
    return {"reward": float(payload["answer"]) / 100}
"""


def test_rollwire_run_gives_the_same_tasks_from_every_format(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = _write_all(tmp_path)
    (tmp_path / "echo_agent.py").write_text(AGENT)
    monkeypatch.chdir(tmp_path)
    seen: dict[str, list[Any]] = {}
    for name, path in files.items():
        out = tmp_path / f"out-{name}.jsonl"
        args = [
            "run", "--agent", "echo_agent:handler", "--tasks", str(path), "--group-size", "1",
            "--backend", "embedded", "--out", str(out), "--no-progress",
        ]  # fmt: skip
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        rollouts = sorted(read_jsonl(out), key=lambda r: str(r.task_id))
        seen[name] = [(r.task_id, r.task, r.reward) for r in rollouts]
    expected = [(r["id"], r, float(r["answer"]) / 100) for r in ROWS]
    assert all(got == expected for got in seen.values()), seen
