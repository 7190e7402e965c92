"""The Wordle game (one implementation, in core): see :mod:`rollwire.wordle.game`."""

from rollwire.wordle.game import *  # noqa: F403
from rollwire.wordle.game import __all__ as __all__
