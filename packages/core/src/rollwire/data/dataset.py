"""JSONL datasets of rollouts: one :class:`~rollwire.data.protocol.Rollout` per line, round-tripping exactly."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from rollwire.data.protocol import Group, Rollout

__all__ = ["iter_jsonl", "read_jsonl", "write_jsonl"]


def write_jsonl(path: str | Path, batch: Iterable[Rollout | Group]) -> int:
    """Write rollouts (or the rollouts of groups) to ``path``; returns the number written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    tmp = path.with_name(path.name + ".partial")
    with tmp.open("wb") as f:
        for item in batch:
            rollouts = item.rollouts if isinstance(item, Group) else [item]
            for rollout in rollouts:
                f.write(rollout.to_json())
                f.write(b"\n")
                n += 1
    tmp.replace(path)
    return n


def iter_jsonl(path: str | Path) -> Iterator[Rollout]:
    """Yield rollouts from a JSONL file; a bad line raises with its line number."""
    with Path(path).open("rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield Rollout.from_json(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{lineno}: not a rollwire rollout: {exc}") from exc


def read_jsonl(path: str | Path) -> list[Rollout]:
    """All rollouts of a JSONL file, in file order."""
    return list(iter_jsonl(path))
