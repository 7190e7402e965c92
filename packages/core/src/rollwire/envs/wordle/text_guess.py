"""Guesses a model wrote as text instead of a tool call (the RL guides' Wordle lesson 3): small
models often answer ``guess_word("crane")``, a JSON tool object in the text, or just ``crane``.
The agent plays such a guess, with a small shaping penalty per text guess, instead of scoring the
game as never played (-1.5): the signal to prefer real tool calls stays, the game is not lost.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["TEXT_GUESS_PENALTY", "parse_text_guess"]

#: Reward taken off per guess parsed from text; six of them (0.12) keep every solve above every
#: loss and a faster solve above a slower one (a guess is worth 0.1).
TEXT_GUESS_PENALTY = 0.02

_CALL = re.compile(r"""guess_word\s*\(\s*(?:word\s*=\s*)?["']([A-Za-z]{5})["']\s*\)""")
_OBJECT = re.compile(r"\{.*\}", re.S)
_LONE = re.compile(r"""[\s"'`*.!]*([A-Za-z]{5})[\s"'`*.!]*""")


def _word_of(obj: Any) -> str | None:
    if not isinstance(obj, dict):
        return None
    if obj.get("name") not in (None, "guess_word"):
        return None
    args = obj.get("arguments", obj.get("parameters", obj))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    word = args.get("word") if isinstance(args, dict) else None
    return word.lower() if isinstance(word, str) and re.fullmatch(r"[A-Za-z]{5}", word) else None


def parse_text_guess(text: str | None) -> str | None:
    """The five-letter guess written in ``text`` as ``guess_word("crane")``, as a JSON tool
    object (``{"name": "guess_word", "arguments": {"word": "crane"}}`` or ``{"word": ...}``), or
    as a lone word; None when the text holds none of those."""
    if not text:
        return None
    call = _CALL.search(text)
    if call:
        return call.group(1).lower()
    for found in _OBJECT.finditer(text):
        try:
            word = _word_of(json.loads(found.group(0)))
        except ValueError:
            continue
        if word:
            return word
    lone = _LONE.fullmatch(text)
    return lone.group(1).lower() if lone else None
