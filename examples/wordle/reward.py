"""The Wordle reward (one implementation, in core): see :mod:`rollwire.wordle.reward`."""

from rollwire.wordle.reward import *  # noqa: F403
from rollwire.wordle.reward import __all__ as __all__
