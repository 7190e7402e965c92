"""The Wordle reward: ``outcome + w * clip(shaping, -1, 1)``.

``outcome`` is 1.55 for a first-guess solve, 0.1 less per extra guess (1.05 on the sixth), -0.5
for a loss and -1.5 when no valid guess was made. ``w`` is 0.04 on a solve and 0.15 on a loss, so
shaping reorders games only within an outcome: any solve beats any loss, a faster solve beats a
slower one, and a loss beats not playing. Shaping penalises guesses that contradict known letters
and rewards testing new letters and shrinking the set of words still possible.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rollwire.envs.wordle.game import MAX_GUESSES, Knowledge, WordleGame, consistent
from rollwire.envs.wordle.words import all_words

__all__ = [
    "LOSS",
    "NO_VALID_GUESS",
    "WordleScore",
    "outcome_reward",
    "score_game",
    "shaping_score",
]

LOSS = -0.5
NO_VALID_GUESS = -1.5
SOLVE_FIRST, SOLVE_STEP = 1.55, 0.1
W_SOLVE, W_LOSS = 0.04, 0.15


@dataclass(frozen=True)
class WordleScore:
    """The reward of one game and the parts it is made of."""

    reward: float
    outcome: float
    shaping: float
    solved: bool
    guesses: int
    invalid: int

    def metrics(self) -> dict[str, float]:
        """Numbers for the rollout's ``metrics``."""
        return {
            "outcome": self.outcome,
            "shaping": self.shaping,
            "solved": float(self.solved),
            "guesses": float(self.guesses),
            "invalid_guesses": float(self.invalid),
        }


def outcome_reward(solved_in: int | None, valid_guesses: int) -> float:
    """1.55 … 1.05 for a solve in 1 … 6, -0.5 for a loss, -1.5 without a valid guess."""
    if valid_guesses <= 0:
        return NO_VALID_GUESS
    if solved_in is None:
        return LOSS
    if not 1 <= solved_in <= MAX_GUESSES:
        raise ValueError(f"solved_in must be 1..{MAX_GUESSES}, got {solved_in}")
    return round(SOLVE_FIRST - SOLVE_STEP * (solved_in - 1), 10)


def shaping_score(
    history: Sequence[tuple[str, str]], secret: str, words: Sequence[str] | None = None
) -> float:
    """Mean over guesses of ``0.5 * shrink + 0.5 * new_letters - contradiction``, in [-1, 1].

    ``shrink`` is how much of the (log) candidate set the guess removed, ``new_letters`` the share
    of its distinct letters never tried before, ``contradiction`` 1 when it ignored known letters.
    """
    if not history:
        return 0.0
    pool = set(words if words is not None else all_words())
    pool.add(secret)
    candidates = sorted(pool)
    known = Knowledge()
    total = 0.0
    for guess, marks in history:
        contradiction = 1.0 if known.contradictions(guess) else 0.0
        letters = set(guess)
        new = len(letters - known.tested) / len(letters)
        after = [w for w in candidates if consistent(w, [(guess, marks)])]
        before_n, after_n = len(candidates), max(1, len(after))
        shrink = 1.0 - math.log(after_n) / math.log(before_n) if before_n > 1 else 1.0
        total += 0.5 * shrink + 0.5 * new - contradiction
        known.add(guess, marks)
        candidates = after
    return max(-1.0, min(1.0, total / len(history)))


def score_game(game: WordleGame, words: Sequence[str] | None = None) -> WordleScore:
    """The reward of a finished (or abandoned) game."""
    n = len(game.history)
    solved_in = n if game.solved else None
    outcome = outcome_reward(solved_in, n)
    if n == 0:
        return WordleScore(outcome, outcome, 0.0, False, 0, game.invalid)
    shaping = shaping_score(game.history, game.secret, words)
    w = W_SOLVE if game.solved else W_LOSS
    reward = outcome + w * max(-1.0, min(1.0, shaping))
    return WordleScore(reward, outcome, shaping, game.solved, n, game.invalid)
