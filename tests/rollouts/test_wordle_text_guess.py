"""Wordle, lesson 3 of the RL guides: a guess written as text (``guess_word("slate")``, a JSON
tool object, a lone word) is played with a small penalty instead of scoring -1.5."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from rollwire.envs.wordle import WordleGame, score_game
from rollwire.envs.wordle.agent_openai import app
from rollwire.envs.wordle.text_guess import TEXT_GUESS_PENALTY, parse_text_guess
from rollwire.trainer.client import RolloutClient
from rollwire.trainer.runners import LocalRunner

TEXT_GUESSES = [
    'I will try guess_word("slate") first.',
    'Next: {"name": "guess_word", "arguments": {"word": "brine"}}',
    "crane",
]


@pytest.mark.parametrize(
    ("text", "word"),
    [
        ('guess_word("crane")', "crane"),
        ("guess_word(word='CRANE')", "crane"),
        ('<tool_call>{"name": "guess_word", "arguments": {"word": "crane"}}</tool_call>', "crane"),
        ('```json\n{"name": "guess_word", "arguments": "{\\"word\\": \\"crane\\"}"}\n```', "crane"),
        ('{"word": "Crane"}', "crane"),
        ("  **crane**.\n", "crane"),
        ("I think the answer is crane", None),  # prose is not a guess
        ('{"name": "other_tool", "arguments": {"word": "crane"}}', None),
        ("guess_word('cranes')", None),
        ("", None),
    ],
)
def test_parse_text_guess(text: str, word: str | None) -> None:
    assert parse_text_guess(text) == word


def _script(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    return TEXT_GUESSES[turn] if turn < len(TEXT_GUESSES) else "Game over."


@pytest.fixture(scope="module")
def text_stack() -> Iterator[Any]:
    from rollwire.engine import EmbeddedEngine, EngineConfig
    from rollwire.gateway import serve_in_thread

    with (
        EmbeddedEngine(EngineConfig(scripted=_script)) as engine,
        serve_in_thread(backends=[(engine.url, "vllm")]) as gateway,
    ):
        yield gateway


def test_text_guesses_in_all_three_styles_still_solve_with_the_penalty(text_stack: Any) -> None:
    with RolloutClient(text_stack, runner=LocalRunner(app), group_size=1, deadline=60) as client:
        [group] = client.run([{"task_id": "w", "secret": "crane"}])
    [rollout] = group.rollouts
    assert rollout.status == "completed", rollout.error
    assert len(rollout.calls) == 3
    assert not any(c.response["choices"][0]["message"].get("tool_calls") for c in rollout.calls)
    game = WordleGame("crane")
    for word in ("slate", "brine", "crane"):
        game.guess(word)
    expected = score_game(game).reward - 3 * TEXT_GUESS_PENALTY
    assert rollout.metrics["solved"] == 1.0 and rollout.metrics["guesses"] == 3.0
    assert rollout.metrics["text_guesses"] == 3.0
    assert rollout.reward == pytest.approx(expected)
    assert 1.0 < rollout.reward < score_game(game).reward  # a solve, a little below the tool one
