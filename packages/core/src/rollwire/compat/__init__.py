"""Drop-ins for agents written for other RL toolkits: change one import, keep the agent.

- :mod:`rollwire.compat.agentcore_rl_toolkit`: ``AgentCoreRLApp`` (gen-1, ``_rollout`` and
  ``{"rewards": ...}``) and ``AgentCoreRuntimeApp`` (gen-2, ``_config`` and ``{"reward": ...}``);
- :mod:`rollwire.compat.bedrock_agentcore`: ``BedrockAgentCoreApp``, also under SageMaker's
  ``@sagemaker_rft_handler`` (the handler then sees SageMaker's ``{instance, metadata,
  inferenceParams}`` request);
- :mod:`rollwire.compat.sagemaker`: ``sagemaker_rft_handler`` and the header helpers, for agents
  that do not install ``sagemaker-train``.

Each is a :class:`~rollwire.agent.app.RolloutApp`: the handler sees the payload shape it was
written for (a view of ``_rollwire``), its reward in that framework's shape becomes the rollout's
reward, and the invocation answers what that framework answers. Light imports, as the agent side.
"""
