"""The Wordle game (one implementation, in core): see :mod:`rollwire.envs.wordle.game`."""

from rollwire.envs.wordle.game import *  # noqa: F403
from rollwire.envs.wordle.game import __all__ as __all__
