"""Wordle rules: feedback (repeated letters included), the game, the reward's ordering properties,
the word split, and the scripted solver."""

from __future__ import annotations

import json
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollwire.envs.wordle import (
    GUESS_TOOL,
    WordleGame,
    WordleSolver,
    all_words,
    consistent,
    feedback,
    make_tasks,
    outcome_reward,
    parse_feedback_text,
    score_game,
    split_words,
)
from rollwire.envs.wordle.reward import NO_VALID_GUESS

words5 = st.text(alphabet=string.ascii_lowercase[:8], min_size=5, max_size=5)


@pytest.mark.parametrize(
    ("guess", "secret", "marks"),
    [
        ("crane", "crane", "GGGGG"),
        ("slate", "crane", "--G-G"),
        ("speed", "abide", "--Y-Y"),  # second E gray: the secret has one E
        ("eerie", "elder", "GYY--"),
        ("allee", "eagle", "YY-YG"),  # second L gray: the secret has one L
        ("lolly", "hello", "-YGG-"),  # first L gray: both Ls of the secret are matched green
        ("mamma", "maxim", "GGY--"),
        ("geese", "sheep", "-YGY-"),
    ],
)
def test_feedback_marks_repeated_letters_like_the_game(guess: str, secret: str, marks: str) -> None:
    assert feedback(guess, secret) == marks


@given(guess=words5, secret=words5)
def test_feedback_invariants(guess: str, secret: str) -> None:
    marks = feedback(guess, secret)
    assert len(marks) == 5
    assert all((m == "G") == (g == s) for m, g, s in zip(marks, guess, secret))
    for ch in set(guess):  # marked copies never exceed copies in the secret
        marked = sum(1 for m, g in zip(marks, guess) if g == ch and m != "-")
        assert marked == min(guess.count(ch), secret.count(ch))
    assert consistent(secret, [(guess, marks)])


def test_game_flow_and_feedback_text() -> None:
    game = WordleGame("crane")
    bad = game.guess("toolong")
    assert not bad.valid and game.invalid == 1 and not game.history
    r = game.guess("slate")
    assert (
        r.valid
        and r.marks == "--G-G"
        and "Known: __A_E" in r.text
        and "Not in the word: L S T" in r.text
    )
    assert parse_feedback_text(r.text) == [("slate", "--G-G")]
    assert game.guess("CRANE").solved and game.over and game.solved
    assert not game.guess("crane").valid
    lost = WordleGame("crane")
    texts = [lost.guess(w).text for w in ["aaaaa", "bbbbb", "ccccc", "ddddd", "eeeee", "fffff"]]
    assert lost.over and not lost.solved and "The word was CRANE" in texts[-1]


def _play(secret: str, guesses: list[str]) -> float:
    game = WordleGame(secret)
    for g in guesses:
        game.guess(g)
    return score_game(game).reward


sample = list(all_words()[:120])
guess_lists = st.lists(st.sampled_from(sample), min_size=0, max_size=5)


@settings(max_examples=60, deadline=None)
@given(
    secret=st.sampled_from(sample),
    a=guess_lists,
    b=st.lists(st.sampled_from(sample), min_size=6, max_size=6),
)
def test_any_solve_beats_any_loss(secret: str, a: list[str], b: list[str]) -> None:
    solve = [*[g for g in a if g != secret][:5], secret]
    loss = [g if g != secret else "zzzzz" for g in b]
    assert _play(secret, solve) > _play(secret, loss)


@settings(max_examples=60, deadline=None)
@given(secret=st.sampled_from(sample), a=guess_lists, b=guess_lists)
def test_a_faster_solve_beats_a_slower_one(secret: str, a: list[str], b: list[str]) -> None:
    fast = [g for g in a if g != secret]
    slow = [g for g in b if g != secret]
    if len(fast) == len(slow):
        slow = [*slow, "zzzzz"] if len(slow) < 5 else slow
        fast = fast[:-1] if len(fast) == len(slow) else fast
    if len(fast) > len(slow):
        fast, slow = slow, fast
    assert _play(secret, [*fast, secret]) > _play(secret, [*slow, secret])


@settings(max_examples=40, deadline=None)
@given(
    secret=st.sampled_from(sample),
    guesses=st.lists(st.sampled_from(sample), min_size=1, max_size=6),
)
def test_a_loss_beats_no_valid_guess_and_rewards_stay_in_their_band(
    secret: str, guesses: list[str]
) -> None:
    guesses = [g if g != secret else "zzzzz" for g in guesses]
    loss = _play(secret, guesses)
    assert NO_VALID_GUESS < -0.65 <= loss <= -0.35
    assert _play(secret, ["bad", "12345"]) == NO_VALID_GUESS == outcome_reward(None, 0)


def test_outcome_table() -> None:
    assert [outcome_reward(n, n) for n in range(1, 7)] == [1.55, 1.45, 1.35, 1.25, 1.15, 1.05]
    assert outcome_reward(None, 3) == -0.5


def test_shaping_punishes_contradicting_known_letters() -> None:
    smart = _play("crane", ["slate", "grade", "crane"])  # keeps A, E; drops S, L, T
    dumb = _play("crane", ["slate", "slate", "crane"])  # repeats known-absent letters
    assert smart > dumb


def test_train_and_validation_words_are_disjoint_and_cover_the_list() -> None:
    train, val = set(split_words("train")), set(split_words("validation"))
    assert train and val and not (train & val)
    assert train | val == set(all_words())
    assert len(all_words()) >= 300 and all(len(w) == 5 and w.isalpha() for w in all_words())
    tasks = make_tasks(20, "validation")
    assert {t["secret"] for t in tasks} <= val and len({t["task_id"] for t in tasks}) == 20


def test_solver_plays_consistent_guesses_and_stops_when_solved() -> None:
    solver = WordleSolver(seed=3, explore=0.0)
    # no tool offered: the model samples
    assert solver([{"role": "user", "content": "hi"}], None) is None
    messages = [{"role": "tool", "content": "Guess 1/6: SLATE\nResult: --G-G\n"}]
    text = solver(messages, [GUESS_TOOL])
    assert text is not None and text.startswith("<tool_call>\n") and text.endswith("\n</tool_call>")
    word = json.loads(text.split("\n")[1])["arguments"]["word"]
    assert consistent(word, [("slate", "--G-G")])
    assert (
        solver(
            [{"role": "tool", "content": "Guess 2/6: CRANE\nResult: GGGGG\nSolved in 2 guesses!"}],
            [GUESS_TOOL],
        )
        == "Game over."
    )
