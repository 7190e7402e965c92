"""Build a Strands ``AnthropicModel`` for a rollout session (or for production).

The session's gateway speaks Anthropic Messages (``/v1/messages``), so an agent written for
Claude keeps its model class: only where the calls go, the model id and the sampling change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rollwire.agent.context import (
    ROLLOUT_MAX_RETRIES,
    rollout_context,
    session_timeout,
    split_sampling,
)

if TYPE_CHECKING:
    from strands.models.anthropic import AnthropicModel

__all__ = ["anthropic_model"]

#: Sampling keys ``messages.create`` takes by name; others (``min_p``...) go in ``extra_body``.
_MESSAGES_PARAMS = frozenset({"temperature", "top_p", "top_k", "stop_sequences"})
_DEFAULT_MAX_TOKENS = 4096  # AnthropicModel requires one; the session's sampling may set it


def anthropic_model(payload: Mapping[str, Any], **production_kwargs: Any) -> AnthropicModel:
    """A Strands ``AnthropicModel`` for the session in ``payload["_rollwire"]``.

    Without a session it is ``AnthropicModel(**production_kwargs)``. With one, the production
    arguments are kept except where the session decides: ``base_url``/``api_key`` (in
    ``client_args``), ``model_id``, ``max_tokens`` (the session's, else production's, else
    4096) and the sampling parameters in ``params``.
    """
    try:
        from strands.models.anthropic import AnthropicModel
    except ImportError as exc:
        raise ImportError(
            "rollwire_strands.anthropic_model needs Strands' Anthropic provider: "
            "pip install 'strands-agents[anthropic]'"
        ) from exc

    ctx = rollout_context(payload)
    if ctx is None:
        return AnthropicModel(**production_kwargs)
    kwargs = dict(production_kwargs)
    client_args = dict(kwargs.pop("client_args", None) or {})
    client_args["base_url"] = ctx.anthropic_base_url
    client_args["api_key"] = ctx.api_key
    client_args["max_retries"] = ROLLOUT_MAX_RETRIES
    client_args["timeout"] = session_timeout(ctx, client_args.get("timeout"))
    sampling = dict(ctx.sampling)
    kwargs["model_id"] = ctx.model
    kwargs["max_tokens"] = int(
        sampling.pop("max_tokens", None) or kwargs.get("max_tokens") or _DEFAULT_MAX_TOKENS
    )
    kwargs["params"] = split_sampling(sampling, _MESSAGES_PARAMS, kwargs.get("params"))
    return AnthropicModel(client_args=client_args, **kwargs)
