"""Environments of other standards as rollwire tasks: one :class:`~rollwire.agent.app.RolloutApp`
per standard, which reaches the environment over its own protocol and the policy through the
rollout session's OpenAI-compatible base URL (``docs/environments.md``).

- :mod:`rollwire.envs.hubs.openenv`: an OpenEnv server (reset/step/state over WebSocket, MCP
  tools); per-step rewards become ``step_reward/<turn>``.
- :mod:`rollwire.envs.hubs.verifiers_env`: a Prime Intellect verifiers taskset, run by a
  verifiers agent whose model endpoint is the session; the trace's reward is the reward.
- :mod:`rollwire.envs.hubs.nemo_gym`: a NeMo Gym agent server's ``/run``; its model server is
  rollwire (:mod:`rollwire.envs.hubs.nemo_gym_model`); ``verify``'s reward is the reward.

Each framework is imported only when a rollout runs, so these modules load without it.
"""
