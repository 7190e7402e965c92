"""``rollwire train --sft``: conversations read from a file, checked line by line, and which
conversations a run warms up on."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from rollwire.data.warmup import read_conversations
from rollwire.envs.lockbox import warmup_conversations as teacher
from rollwire.trainer.loop import RunSpec
from rollwire.trainer.training_run import warmup_conversations

TOOL_CHAT = [
    {"role": "user", "content": "What is 12 * 7?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "calc", "arguments": '{"expr": "12*7"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "84"},
    {"role": "assistant", "content": "84"},
]


def _write(path: Path, lines: list[object]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    return path


def test_conversations_come_as_messages_objects_or_bare_lists(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.jsonl", [{"messages": TOOL_CHAT}, TOOL_CHAT[:2]])
    got = read_conversations(path)
    assert got == [TOOL_CHAT, TOOL_CHAT[:2]]


@pytest.mark.parametrize(
    ("line", "error"),
    [
        (b"{not json", "c.jsonl:2: not JSON"),
        (b'{"messages": "hi"}', "c.jsonl:2: expected"),
        (b'[{"role": "user", "content": "hi"}]', "c.jsonl:2: no assistant message"),
    ],
)
def test_a_bad_line_is_an_error_naming_it(tmp_path: Path, line: bytes, error: str) -> None:
    path = tmp_path / "c.jsonl"
    path.write_bytes(orjson.dumps(TOOL_CHAT) + b"\n" + line + b"\n")
    with pytest.raises(ValueError, match=error):
        read_conversations(path)


def test_an_empty_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="holds no conversations"):
        read_conversations(tmp_path / "e.jsonl")


def test_sft_wins_then_the_teacher_warms_only_the_embedded_model(tmp_path: Path) -> None:
    sft = _write(tmp_path / "c.jsonl", [TOOL_CHAT])
    model = tmp_path / "model"
    assert warmup_conversations(RunSpec(out=tmp_path, sft=sft, model=model)) == [TOOL_CHAT]
    assert warmup_conversations(RunSpec(out=tmp_path, model=model)) is None
    assert warmup_conversations(RunSpec(out=tmp_path, warmup_steps=0)) is None
    taught = warmup_conversations(RunSpec(out=tmp_path, warmup_steps=2, seed=3))
    assert taught == teacher(64, teacher_accuracy=0.3, seed=3)
