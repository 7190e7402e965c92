"""rollwire: online RL for production LLM agents."""

__version__ = "0.1.0"
