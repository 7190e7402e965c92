"""Build a Strands ``OpenAIModel`` for a rollout session (or for production).

Strands opens a fresh ``AsyncOpenAI`` per request when given ``client_args``; that is what we
give it. A shared ``client=`` breaks synchronous ``agent(...)`` calls, which run each call on a
new event loop ("Event loop is closed"), so a production ``client`` is dropped in training.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rollwire.agent.context import (
    CREATE_PARAMS,
    ROLLOUT_MAX_RETRIES,
    rollout_context,
    session_timeout,
    split_sampling,
)

if TYPE_CHECKING:
    from strands.models.openai import OpenAIModel

__all__ = ["StrandsAdapter", "adapter", "model"]

# Strands spreads ``params`` into ``create(**request)`` and the SDK rejects unknown names: session
# sampling keys that are not ``create`` arguments (``top_k``, ``min_p``...) go in ``extra_body``.
_OPENAI_PARAMS = CREATE_PARAMS
# Production-only client settings that must not leak into a session's client.
_PRODUCTION_ONLY = ("client", "bedrock_mantle_config")


def session_params(
    sampling: Mapping[str, Any], base: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Strands ``params`` with the session's ``sampling`` laid over ``base`` (session wins)."""
    return split_sampling(sampling, _OPENAI_PARAMS, base)


def model(payload: Mapping[str, Any], **production_kwargs: Any) -> OpenAIModel:
    """A Strands ``OpenAIModel`` for the session in ``payload["_rollwire"]``.

    Without a session it is ``OpenAIModel(**production_kwargs)``. With one, the production
    arguments are kept except where the session decides: ``base_url``/``api_key`` (in
    ``client_args``), ``model_id``, and the sampling parameters in ``params``.
    """
    from strands.models.openai import OpenAIModel

    ctx = rollout_context(payload)
    if ctx is None:
        return OpenAIModel(**production_kwargs)
    kwargs = {k: v for k, v in production_kwargs.items() if k not in _PRODUCTION_ONLY}
    client_args = dict(kwargs.pop("client_args", None) or {})
    client_args["base_url"] = ctx.base_url
    client_args["api_key"] = ctx.api_key
    client_args["max_retries"] = ROLLOUT_MAX_RETRIES
    # a production timeout is kept, but never past the rollout's deadline
    client_args["timeout"] = session_timeout(ctx, client_args.get("timeout"))
    kwargs["model_id"] = ctx.model
    kwargs["params"] = session_params(ctx.sampling, kwargs.get("params"))
    return OpenAIModel(client_args=client_args, **kwargs)


class StrandsAdapter:
    """The ``rollwire.agents`` plugin for Strands Agents."""

    name = "strands"
    requires: tuple[str, ...] = ("strands-agents>=1.0",)

    def model(self, payload: Mapping[str, Any], **production_kwargs: Any) -> OpenAIModel:
        """See :func:`rollwire_strands.model`."""
        return model(payload, **production_kwargs)


adapter = StrandsAdapter()
