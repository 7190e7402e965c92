"""The Wordle word list and its train/validation split (in core): see :mod:`rollwire.wordle.words`."""

from rollwire.wordle.words import *  # noqa: F403
from rollwire.wordle.words import __all__ as __all__
