"""The agent side: :class:`RolloutApp`, :func:`rollout_context` and the core agent adapters.

Kept light for agent containers: importing it pulls no gateway, store, engine or NumPy code.
"""
