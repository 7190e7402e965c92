"""The trainer side: :class:`RolloutClient`, :class:`GatewayClient` and the rollout runners."""
