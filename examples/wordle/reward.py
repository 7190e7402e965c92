"""The Wordle reward (one implementation, in core): see :mod:`rollwire.envs.wordle.reward`."""

from rollwire.envs.wordle.reward import *  # noqa: F403
from rollwire.envs.wordle.reward import __all__ as __all__
