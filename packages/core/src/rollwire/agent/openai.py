"""The ``openai`` agent adapter: an ``openai.OpenAI`` client wired to the rollout session.

Registered as entry point ``rollwire.agents: openai``. Light: ``openai`` is imported when a client
is built, not when the adapter is discovered.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rollwire.agent.context import async_openai_client, openai_client

if TYPE_CHECKING:
    import openai

__all__ = ["OpenAIAgentAdapter", "adapter"]


class OpenAIAgentAdapter:
    """Builds OpenAI clients for rollouts (or production, without ``_rollwire``)."""

    name = "openai"
    requires = ("openai>=1.60",)

    def model(self, payload: Mapping[str, Any], **production_kwargs: Any) -> openai.OpenAI:
        """``openai.OpenAI`` for the session in ``payload`` (see :func:`rollwire.agent.context.openai_client`)."""
        return openai_client(payload, **production_kwargs)

    def async_model(
        self, payload: Mapping[str, Any], **production_kwargs: Any
    ) -> openai.AsyncOpenAI:
        """The ``openai.AsyncOpenAI`` twin of :meth:`model`."""
        return async_openai_client(payload, **production_kwargs)


adapter = OpenAIAgentAdapter()
