"""The vault task: its tasks and splits, its SFT data, and its LangGraph agent end to end with real
OpenAI tools (embedded engine scripted to emit Hermes ``<tool_call>`` blocks, parsed by the
engine into ``tool_calls``, run by LangGraph, gateway, RolloutClient)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

pytest.importorskip("langgraph", reason="the vault agent is written with LangGraph")

from rollwire.data.tool_health import tool_health
from rollwire.data.trajectory import build_rows
from rollwire.data.warmup import read_conversations
from rollwire.envs.vault import (
    SPLITS,
    TOOLS,
    Vault,
    make_tasks,
    warmup_conversations,
)
from rollwire.envs.vault.agent_langgraph import app
from rollwire.testing.scripted import scripted_rollouts
from rollwire.trainer.client import RolloutClient


def test_splits_name_disjoint_boxes_and_tasks_are_seeded() -> None:
    train, held = make_tasks(50, "train", seed=1), make_tasks(50, "heldout", seed=1)
    assert {t["box"] for t in train} <= set(SPLITS["train"])
    assert {t["box"] for t in held} <= set(SPLITS["heldout"])
    assert make_tasks(50, "train", seed=1) == train != make_tasks(50, "train", seed=2)
    assert all(100 <= t["code"] < 1000 for t in train + held)
    with pytest.raises(ValueError, match="unknown vault split"):
        make_tasks(1, "test")


def test_only_the_right_code_on_the_right_box_opens_it() -> None:
    vault = Vault("N", 482)
    assert vault.read_code("n") == "Box N's code is 482."
    assert "no box" in vault.read_code("Q")
    assert "Wrong code" in vault.open_box("N", "481") and vault.reward() == 0.0
    assert "Wrong code" in vault.open_box("Q", "482") and vault.reward() == 0.0
    assert vault.open_box("N", " 482 ") == "Box N is open." and vault.reward() == 1.0
    assert vault.metrics() == {"solved": 1.0, "reads": 2.0, "open_attempts": 3.0}


def test_sft_data_is_tool_calls_with_the_tools_and_a_teacher_as_right_as_asked(
    tmp_path: Any,
) -> None:
    convs = warmup_conversations(1000, teacher_accuracy=0.3, seed=0)
    assert all(c["tools"] == TOOLS for c in convs)
    roles = [[m["role"] for m in c["messages"]] for c in convs]
    assert all(r == ["system", "user", "assistant", "tool", "assistant"] for r in roles)
    right = []
    for c in convs:
        read, opened = c["messages"][2]["tool_calls"][0], c["messages"][4]["tool_calls"][0]
        assert read["function"]["name"] == "read_code"
        code = c["messages"][3]["content"].split()[-1].rstrip(".")
        right.append(json.loads(opened["function"]["arguments"])["code"] == code)
    assert 0.3 - 0.05 < np.mean(right) < 0.3 + 0.05
    # the file format of `rollwire train --sft`, read back with its tools
    path = tmp_path / "sft.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in convs[:3]))
    assert read_conversations(path) == convs[:3]


TASK = {"task_id": "t0", "box": "N", "code": 482, "prompt": "Open box N."}
#: the code the scripted policy types into ``open_box``
SAID: dict[str, str] = {}


def _call(name: str, arguments: dict[str, str]) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


def _script(messages: list[dict[str, Any]], tools: Any) -> str | None:
    if messages[-1]["role"] == "user":
        return _call("read_code", {"box": "N"})
    if SAID["code"] == "runaway":  # an argument repeated past max_tokens (seen on vLLM)
        return '<tool_call>\n{"name": "open_box", "arguments": {"box": "N"' + ', "code": "48"' * 40
    return _call("open_box", {"box": "N", "code": SAID["code"]})


@pytest.fixture(scope="module")
def client() -> Iterator[tuple[RolloutClient, Any]]:
    with scripted_rollouts(app, _script) as c:
        yield c


def _play(client: tuple[RolloutClient, Any], code: str) -> Any:
    SAID["code"] = code
    (group,) = client[0].run([TASK])
    return group.rollouts[0]


def test_the_agent_sends_tools_gets_parsed_tool_calls_and_trains_both(
    client: tuple[RolloutClient, Any],
) -> None:
    rollout, tok = _play(client, "482"), client[1]
    assert rollout.status == "completed" and rollout.reward == 1.0
    assert rollout.metrics == {"solved": 1.0, "reads": 1.0, "open_attempts": 1.0, "turns": 2.0}
    assert len(rollout.calls) == 2  # open_box returns directly: no third call
    assert all(c.request["tools"] == TOOLS for c in rollout.calls)  # what LangChain wrote
    health = tool_health(rollout.calls)
    assert (health.offered, health.parsed, health.unparsed) == (2, 2, 0)
    (row,) = build_rows([rollout], tokenizer=tok)  # the second call extends the first
    sampled = np.concatenate([c.completion_ids for c in rollout.calls])
    np.testing.assert_array_equal(row.response_ids[row.loss_mask == 1], sampled)
    context = tok.decode(row.response_ids[row.loss_mask == 0].tolist())
    assert "Box N's code is 482." in context  # the tool's result is context, mask 0


def test_a_wrong_code_scores_zero(client: tuple[RolloutClient, Any]) -> None:
    rollout = _play(client, "481")
    assert rollout.reward == 0.0 and rollout.metrics["open_attempts"] == 1.0


@pytest.fixture(scope="module")
def strands_client() -> Iterator[tuple[RolloutClient, Any]]:
    pytest.importorskip("strands", reason="the second vault agent is written with Strands")
    from rollwire.envs.vault.agent_strands import app as strands_app

    with scripted_rollouts(strands_app, _script) as c:
        yield c


def test_the_strands_agent_streams_the_same_tools_and_stops_when_the_box_opens(
    strands_client: tuple[RolloutClient, Any],
) -> None:
    rollout, tok = _play(strands_client, "482"), strands_client[1]
    assert rollout.status == "completed" and rollout.reward == 1.0
    assert rollout.metrics == {
        "solved": 1.0, "reads": 1.0, "open_attempts": 1.0, "turns": 2.0, "truncated": 0.0
    }  # fmt: skip
    assert len(rollout.calls) == 2  # open_box cancels the loop: no third call
    assert all(c.request["tools"] == TOOLS for c in rollout.calls)  # what Strands wrote
    assert all(c.request.get("stream") for c in rollout.calls)  # parsed out of a stream
    health = tool_health(rollout.calls)
    assert (health.offered, health.parsed, health.unparsed) == (2, 2, 0)
    (row,) = build_rows([rollout], tokenizer=tok)  # one row: Strands resends the history whole
    sampled = np.concatenate([c.completion_ids for c in rollout.calls])
    np.testing.assert_array_equal(row.response_ids[row.loss_mask == 1], sampled)
    assert _play(strands_client, "481").reward == 0.0


def test_a_strands_answer_cut_at_max_tokens_ends_the_episode_as_an_outcome(
    strands_client: tuple[RolloutClient, Any],
) -> None:
    """Strands raises ``MaxTokensReachedException`` on an answer cut at ``max_tokens``; the agent
    ends the episode there, so the rollout completes with reward 0 and trains, not fails."""
    rollout, tok = _play(strands_client, "runaway"), strands_client[1]
    assert rollout.status == "completed" and rollout.reward == 0.0, rollout.error
    assert rollout.metrics["truncated"] == 1.0 and rollout.metrics["open_attempts"] == 0.0
    assert rollout.calls[-1].finish_reason == "length"
    assert len(rollout.calls[-1].completion_ids) == 64  # the agent's own max_tokens
    (row,) = build_rows([rollout], tokenizer=tok)
    sampled = np.concatenate([c.completion_ids for c in rollout.calls])
    np.testing.assert_array_equal(row.response_ids[row.loss_mask == 1], sampled)
