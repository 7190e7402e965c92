"""The Wordle agent written with LangChain/LangGraph.

The code lives in core, :mod:`rollwire.envs.wordle.agent_langgraph`, so that ``rollwire demo --agent
langgraph`` runs from an installed wheel (with ``rollwire[langgraph]``) from any directory; read it there.
Serve it on AgentCore's contract (port 8080) with ``python examples/wordle/agent_langgraph.py``.
"""

from rollwire.envs.wordle.agent_langgraph import MAX_TURNS, app, play

__all__ = ["MAX_TURNS", "app", "play"]

if __name__ == "__main__":
    app.run()
