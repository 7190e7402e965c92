"""The Wordle word list and its train/validation split (in core): see :mod:`rollwire.envs.wordle.words`."""

from rollwire.envs.wordle.words import *  # noqa: F403
from rollwire.envs.wordle.words import __all__ as __all__
