"""The Wordle agent written with Strands Agents.

The code lives in core, :mod:`rollwire.envs.wordle.agent_strands`, so that ``rollwire demo --agent
strands`` runs from an installed wheel (with ``rollwire[strands]``) from any directory; read it there.
Serve it on AgentCore's contract (port 8080) with ``python examples/wordle/agent_strands.py``.
"""

from rollwire.envs.wordle.agent_strands import MAX_TURNS, app, play

__all__ = ["MAX_TURNS", "app", "play"]

if __name__ == "__main__":
    app.run()
