"""Wordle: six guesses at a five-letter word, green/yellow/gray feedback, a known-letter summary.

Pure Python, no I/O. The feedback text is what the agent's ``guess_word`` tool returns; its
``Guess n/6: WORD`` / ``Result: G-Y--`` lines are also what the scripted solver reads back.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "GUESS_TOOL",
    "MAX_GUESSES",
    "SYSTEM_PROMPT",
    "GuessResult",
    "Knowledge",
    "WordleGame",
    "consistent",
    "feedback",
    "parse_feedback_text",
    "task_prompt",
]

MAX_GUESSES = 6
WORD_LEN = 5
GREEN, YELLOW, GRAY = "G", "Y", "-"
Mark = Literal["G", "Y", "-"]

SYSTEM_PROMPT = (
    "You are playing Wordle. Find the secret five-letter English word in at most six guesses. "
    "Make each guess by calling the guess_word tool with one five-letter word. After each guess "
    "you get a result per letter: G = right letter in the right spot, Y = in the word but in "
    "another spot, - = not in the word (or not that many times)."
)

#: The OpenAI tool schema of the one tool the agent has.
GUESS_TOOL: dict[str, object] = {
    "type": "function",
    "function": {
        "name": "guess_word",
        "description": "Guess the secret five-letter word; returns per-letter feedback.",
        "parameters": {
            "type": "object",
            "properties": {"word": {"type": "string", "description": "a five-letter English word"}},
            "required": ["word"],
        },
    },
}


def task_prompt(max_guesses: int = MAX_GUESSES) -> str:
    """The opening user message of a game."""
    return f"A new game has started. Guess the secret five-letter word in at most {max_guesses} guesses."


def feedback(guess: str, secret: str) -> str:
    """Per-letter marks for ``guess`` against ``secret`` (``G``/``Y``/``-``), Wordle's rules.

    Greens are taken first; a yellow is given only while the secret still has unmatched copies of
    the letter, left to right — so repeated letters are marked the way the game marks them.
    """
    guess, secret = guess.lower(), secret.lower()
    marks = [GRAY] * len(guess)
    left: Counter[str] = Counter()
    for i, (g, s) in enumerate(zip(guess, secret)):
        if g == s:
            marks[i] = GREEN
        else:
            left[s] += 1
    for i, g in enumerate(guess):
        if marks[i] != GREEN and left[g] > 0:
            marks[i] = YELLOW
            left[g] -= 1
    return "".join(marks)


def consistent(word: str, history: Iterable[tuple[str, str]]) -> bool:
    """Whether ``word`` could be the secret given ``(guess, marks)`` pairs seen so far."""
    return all(feedback(guess, word) == marks for guess, marks in history)


@dataclass
class Knowledge:
    """What the feedback so far says about the secret (the known-letter summary)."""

    greens: dict[int, str] = field(default_factory=dict)
    not_at: dict[int, set[str]] = field(default_factory=dict)
    min_count: dict[str, int] = field(default_factory=dict)
    max_count: dict[str, int] = field(default_factory=dict)
    tested: set[str] = field(default_factory=set)

    def add(self, guess: str, marks: str) -> None:
        """Fold one guess's feedback in."""
        hits: Counter[str] = Counter()
        for i, (ch, m) in enumerate(zip(guess, marks)):
            self.tested.add(ch)
            if m == GREEN:
                self.greens[i] = ch
                hits[ch] += 1
            else:
                self.not_at.setdefault(i, set()).add(ch)
                if m == YELLOW:
                    hits[ch] += 1
        for ch in set(guess):
            self.min_count[ch] = max(self.min_count.get(ch, 0), hits[ch])
            if any(c == ch and m == GRAY for c, m in zip(guess, marks)):
                self.max_count[ch] = hits[ch]

    def contradictions(self, guess: str) -> list[str]:
        """Ways ``guess`` ignores what is known (empty when it is a possible answer's shape)."""
        out: list[str] = []
        counts = Counter(guess)
        for i, ch in self.greens.items():
            if guess[i] != ch:
                out.append(f"position {i + 1} is known to be {ch.upper()}")
        for i, chars in self.not_at.items():
            if guess[i] in chars and self.greens.get(i) != guess[i]:
                out.append(f"{guess[i].upper()} is known not to be at position {i + 1}")
        for ch, n in self.min_count.items():
            if counts[ch] < n:
                out.append(f"the word has at least {n} {ch.upper()}")
        for ch, n in self.max_count.items():
            if counts[ch] > n:
                out.append(f"the word has {'no' if n == 0 else f'only {n}'} {ch.upper()}")
        return out

    def summary(self) -> str:
        """One human-readable line per kind of knowledge."""
        pattern = "".join(self.greens.get(i, "_").upper() for i in range(WORD_LEN))
        present = sorted(ch for ch, n in self.min_count.items() if n > 0)
        absent = sorted(ch for ch, n in self.max_count.items() if n == 0)
        return (
            f"Known: {pattern}\n"
            f"In the word: {' '.join(c.upper() for c in present) or '(none yet)'}\n"
            f"Not in the word: {' '.join(c.upper() for c in absent) or '(none yet)'}"
        )


@dataclass(frozen=True)
class GuessResult:
    """What one call of the tool did."""

    valid: bool
    text: str
    marks: str = ""
    solved: bool = False


_FEEDBACK_RE = re.compile(r"Guess (\d+)/\d+: ([A-Z]{5})\nResult: ([GY-]{5})")


def parse_feedback_text(text: str) -> list[tuple[str, str]]:
    """``(guess, marks)`` pairs found in feedback text (the solver reads the game this way)."""
    return [(m.group(2).lower(), m.group(3)) for m in _FEEDBACK_RE.finditer(text)]


class WordleGame:
    """One game. ``guess(word)`` plays a turn and returns the text the tool reports back."""

    def __init__(self, secret: str, max_guesses: int = MAX_GUESSES) -> None:
        secret = secret.strip().lower()
        if len(secret) != WORD_LEN or not secret.isalpha() or not secret.isascii():
            raise ValueError(f"the secret must be a five-letter word, got {secret!r}")
        self.secret = secret
        self.max_guesses = max_guesses
        self.history: list[tuple[str, str]] = []
        self.invalid: int = 0
        self.knowledge = Knowledge()

    @property
    def solved(self) -> bool:
        """The last guess was the secret."""
        return bool(self.history) and self.history[-1][0] == self.secret

    @property
    def over(self) -> bool:
        """Solved, or out of guesses."""
        return self.solved or len(self.history) >= self.max_guesses

    @property
    def guesses(self) -> Sequence[str]:
        """Valid guesses so far."""
        return [g for g, _ in self.history]

    def guess(self, word: object) -> GuessResult:
        """Play ``word``; an invalid word costs no guess but is counted."""
        if self.over:
            return GuessResult(False, "The game is over; no more guesses are accepted.")
        w = word.strip().lower() if isinstance(word, str) else ""
        if len(w) != WORD_LEN or not w.isalpha() or not w.isascii():
            self.invalid += 1
            return GuessResult(
                False, f"Invalid guess {word!r}: guess one word of exactly five letters A-Z."
            )
        marks = feedback(w, self.secret)
        self.history.append((w, marks))
        self.knowledge.add(w, marks)
        n = len(self.history)
        head = f"Guess {n}/{self.max_guesses}: {w.upper()}\nResult: {marks}"
        if w == self.secret:
            return GuessResult(
                True, f"{head}\nSolved in {n} guess{'es' if n > 1 else ''}!", marks, True
            )
        if n >= self.max_guesses:
            return GuessResult(
                True, f"{head}\nOut of guesses. The word was {self.secret.upper()}.", marks
            )
        left = self.max_guesses - n
        return GuessResult(
            True,
            f"{head}\n{self.knowledge.summary()}\n{left} guess{'es' if left > 1 else ''} left.",
            marks,
        )
