"""Build a LangChain ``ChatOpenAI`` for a rollout session (or for production).

The session model speaks Chat Completions only, so the Responses API is switched off (LangChain
turns it on by itself for "codex" model names or ``reasoning`` settings), and usage is requested
on streams so a streamed call reports its token counts like a non-streamed one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rollwire.agent.context import (
    ROLLOUT_MAX_RETRIES,
    RolloutContext,
    rollout_context,
    session_timeout,
    split_sampling,
)

if TYPE_CHECKING:
    from langchain_openai import ChatOpenAI

__all__ = ["LangGraphAdapter", "adapter", "chat_model"]

#: Sampling keys that are ``ChatOpenAI`` fields; any other session key (``top_k``, ``min_p``,
#: ``repetition_penalty``...) is sent through ``extra_body`` at the top level of the request.
_CHAT_OPENAI_FIELDS = frozenset(
    {
        "temperature",
        "top_p",
        "max_tokens",
        "presence_penalty",
        "frequency_penalty",
        "seed",
        "stop",
        "n",
        "logprobs",
        "top_logprobs",
        "logit_bias",
        "reasoning_effort",
    }
)
#: ``ChatOpenAI`` aliases, folded onto one name so the session's value replaces the production one.
_ALIASES = {
    "model_name": "model",
    "openai_api_base": "base_url",
    "openai_api_key": "api_key",
    "max_completion_tokens": "max_tokens",
    "stop_sequences": "stop",
    "request_timeout": "timeout",
}
# Pre-built clients point at the production endpoint; the session needs its own.
_PRODUCTION_ONLY = ("client", "async_client", "root_client", "root_async_client")


def session_kwargs(ctx: RolloutContext, production_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``ChatOpenAI`` keyword arguments: production's, overridden where the session decides."""
    kwargs: dict[str, Any] = {}
    for key, value in production_kwargs.items():
        if key not in _PRODUCTION_ONLY:
            kwargs[_ALIASES.get(key, key)] = value
    kwargs["base_url"] = ctx.base_url
    kwargs["api_key"] = ctx.api_key
    kwargs["model"] = ctx.model
    kwargs["use_responses_api"] = False
    kwargs["stream_usage"] = True
    kwargs["max_retries"] = ROLLOUT_MAX_RETRIES
    # a production timeout is kept, but never past the rollout's deadline
    kwargs["timeout"] = session_timeout(ctx, kwargs.get("timeout"))
    return split_sampling(ctx.sampling, _CHAT_OPENAI_FIELDS, kwargs)


def chat_model(payload: Mapping[str, Any], **production_kwargs: Any) -> ChatOpenAI:
    """A ``ChatOpenAI`` for the session in ``payload["_rollwire"]``.

    Without a session it is ``ChatOpenAI(**production_kwargs)``. With one, the production
    arguments are kept (``streaming``, ``timeout``...) except ``base_url``, ``api_key``, ``model``
    and the sampling parameters, which come from the session.
    """
    from langchain_openai import ChatOpenAI

    ctx = rollout_context(payload)
    if ctx is None:
        return ChatOpenAI(**production_kwargs)
    return ChatOpenAI(**session_kwargs(ctx, production_kwargs))


class LangGraphAdapter:
    """The ``rollwire.agents`` plugin for LangGraph / LangChain agents."""

    name = "langgraph"
    requires: tuple[str, ...] = ("langchain-openai>=0.3", "langgraph>=0.6")

    def model(self, payload: Mapping[str, Any], **production_kwargs: Any) -> ChatOpenAI:
        """See :func:`rollwire_langgraph.chat_model`."""
        return chat_model(payload, **production_kwargs)


adapter = LangGraphAdapter()
