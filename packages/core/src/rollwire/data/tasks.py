"""Task datasets as the RL guides ship them: JSONL, a JSON array, CSV, Parquet, or a local Hugging
Face ``datasets`` folder (``save_to_disk`` output, or a folder of data files). Rows may have any
columns (``{prompt, answer, id}`` is the usual shape); each becomes one task dict.

CSV cells stay strings (CSV has no types). Parquet and Arrow need ``pyarrow``
(``pip install "rollwire[parquet]"``).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["TASK_SUFFIXES", "read_tasks"]

#: The file types :func:`read_tasks` reads.
TASK_SUFFIXES = (".jsonl", ".ndjson", ".json", ".csv", ".tsv", ".parquet", ".arrow")


def read_tasks(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a task file or folder, in order; raises ``ValueError`` naming the bad row."""
    path = Path(path)
    if path.is_dir():
        return _read_folder(path)
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        return list(_jsonl(path))
    if suffix == ".json":
        return _json(path)
    if suffix in (".csv", ".tsv"):
        return _csv(path, "\t" if suffix == ".tsv" else ",")
    if suffix == ".parquet":
        return _parquet(path)
    if suffix == ".arrow":
        return _arrow(path)
    raise ValueError(f"{path}: unknown task file type {suffix!r}; expected one of {TASK_SUFFIXES}")


def _row(obj: Any, where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: a task must be a JSON object, got {type(obj).__name__}")
    return obj


def _jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with path.open("rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not JSON: {exc}") from exc
            yield _row(obj, f"{path}:{lineno}")


def _json(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return list(_jsonl(path))  # datasets' to_json() writes JSON lines into .json files
    if isinstance(data, dict) and len(data) == 1 and isinstance(next(iter(data.values())), list):
        data = next(iter(data.values()))  # {"data": [...]} / {"train": [...]}
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON array of tasks, got {type(data).__name__}")
    return [_row(obj, f"{path}[{i}]") for i, obj in enumerate(data)]


def _csv(path: Path, delimiter: str) -> list[dict[str, Any]]:
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f, delimiter=delimiter)
        if not reader.fieldnames:
            raise ValueError(f"{path}: no header row (the column names)")
        rows = []
        for i, row in enumerate(reader, 2):
            if None in row:
                raise ValueError(f"{path}:{i}: more cells than columns")
            rows.append(dict(row))
        return rows


def _pyarrow(path: Path) -> Any:
    try:
        import pyarrow
    except ImportError as exc:
        raise ValueError(
            f"{path}: reading Parquet/Arrow needs pyarrow: pip install 'rollwire[parquet]'"
        ) from exc
    return pyarrow


def _parquet(path: Path) -> list[dict[str, Any]]:
    _pyarrow(path)
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
    return rows


def _arrow(path: Path) -> list[dict[str, Any]]:
    pa = _pyarrow(path)
    with pa.memory_map(str(path)) as source:
        try:
            table = pa.ipc.open_stream(source).read_all()  # what datasets' save_to_disk writes
        except pa.ArrowInvalid:
            source.seek(0)
            table = pa.ipc.open_file(source).read_all()
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows


def _read_folder(path: Path) -> list[dict[str, Any]]:
    """A ``datasets`` folder: ``save_to_disk`` output (a ``DatasetDict`` gives its ``train``
    split), or a folder of data files read in name order."""
    splits = path / "dataset_dict.json"
    if splits.exists():
        names = json.loads(splits.read_text()).get("splits") or []
        if "train" not in names:
            raise ValueError(
                f"{path}: a DatasetDict without a 'train' split ({names}); pass a split folder"
            )
        return _read_folder(path / "train")
    state = path / "state.json"
    if state.exists():
        files = [path / f["filename"] for f in json.loads(state.read_text())["_data_files"]]
    else:
        files = sorted(
            p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TASK_SUFFIXES
            and p.name not in ("dataset_info.json", "state.json")
        )  # fmt: skip
    if not files:
        raise ValueError(f"{path}: no task files in this folder ({', '.join(TASK_SUFFIXES)})")
    return [row for f in files for row in read_tasks(f)]
