"""Build a LangChain ``ChatAnthropic`` for a rollout session (or for production).

The session's gateway speaks Anthropic Messages (``/v1/messages``), so a graph written for Claude
keeps its chat model class: only where the calls go, the model name and the sampling change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rollwire.agent.context import (
    ROLLOUT_MAX_RETRIES,
    rollout_context,
    session_timeout,
)

if TYPE_CHECKING:
    from langchain_anthropic import ChatAnthropic

__all__ = ["anthropic_chat_model"]

#: Sampling keys that are ``ChatAnthropic`` fields; others go in ``model_kwargs``.
_FIELDS = frozenset({"temperature", "top_p", "top_k", "max_tokens", "stop_sequences"})
#: ``ChatAnthropic`` aliases, folded onto one name so the session's value replaces production's.
_ALIASES = {
    "model_name": "model",
    "anthropic_api_url": "base_url",
    "anthropic_api_key": "api_key",
    "max_tokens_to_sample": "max_tokens",
    "stop": "stop_sequences",
    "default_request_timeout": "timeout",
}
_PRODUCTION_ONLY = ("anthropic_proxy", "api_key", "base_url")


def anthropic_chat_model(payload: Mapping[str, Any], **production_kwargs: Any) -> ChatAnthropic:
    """A ``ChatAnthropic`` for the session in ``payload["_rollwire"]``.

    Without a session it is ``ChatAnthropic(**production_kwargs)``. With one, the production
    arguments are kept (``streaming``, ``thinking``, ``timeout``...) except ``base_url``,
    ``api_key``, ``model`` and the sampling parameters, which come from the session.
    """
    try:
        from langchain_anthropic import ChatAnthropic
    except ImportError as exc:
        raise ImportError(
            "rollwire_langgraph.anthropic_chat_model needs langchain-anthropic: "
            "pip install 'rollwire-langgraph[anthropic]'"
        ) from exc

    ctx = rollout_context(payload)
    if ctx is None:
        return ChatAnthropic(**production_kwargs)
    kwargs: dict[str, Any] = {}
    for key, value in production_kwargs.items():
        name = _ALIASES.get(key, key)
        if name not in _PRODUCTION_ONLY:
            kwargs[name] = value
    kwargs["base_url"] = ctx.anthropic_base_url
    kwargs["api_key"] = ctx.api_key
    kwargs["model"] = ctx.model
    kwargs["max_retries"] = ROLLOUT_MAX_RETRIES
    kwargs["timeout"] = session_timeout(ctx, kwargs.get("timeout"))
    extra = dict(kwargs.pop("model_kwargs", None) or {})
    for key, value in ctx.sampling.items():
        if key in _FIELDS:
            kwargs[key] = value
            extra.pop(key, None)
        else:
            extra[key] = value
    if extra:
        kwargs["model_kwargs"] = extra
    return ChatAnthropic(**kwargs)
