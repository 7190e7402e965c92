"""OpenAI Agents SDK support: an ``OpenAIChatCompletionsModel`` wired to the rollout session.

    from agents import Agent, Runner
    from rollwire.agent.openai_agents import agents_model

    agent = Agent(name="solver", model=agents_model(payload, model="gpt-4o"), tools=[...])

The session speaks Chat Completions (never the Responses API), the session's sampling
parameters are laid over the agent's ``ModelSettings`` on every call, and tracing to OpenAI is
switched off in a rollout (the session token is no OpenAI key, and traces must not leave the
cluster). ``agents`` (``pip install openai-agents``) is imported only when a model is built.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rollwire.agent.context import async_openai_client, rollout_context

if TYPE_CHECKING:
    from agents import ModelSettings, OpenAIChatCompletionsModel

__all__ = ["OpenAIAgentsAdapter", "adapter", "agents_model", "session_model_settings"]

#: ``ModelSettings`` fields that map one to one onto session sampling keys; any other key
#: (``top_k``, ``min_p``, ``seed``...) is sent through ``extra_body``.
_SETTINGS_FIELDS = frozenset(
    {"temperature", "top_p", "max_tokens", "frequency_penalty", "presence_penalty", "top_logprobs"}
)


def _import_agents() -> Any:
    try:
        import agents
    except ImportError as exc:  # pragma: no cover - exercised only without the SDK
        raise ImportError(
            "rollwire.agent.openai_agents needs the OpenAI Agents SDK: pip install openai-agents"
        ) from exc
    return agents


def session_model_settings(
    sampling: Mapping[str, Any], base: ModelSettings | None = None
) -> ModelSettings:
    """``base`` (the agent's settings) with the session's ``sampling`` laid over it (session wins)."""
    agents = _import_agents()
    base = base if base is not None else agents.ModelSettings()
    changes: dict[str, Any] = {"include_usage": True}
    extra = dict(base.extra_body or {}) if isinstance(base.extra_body, Mapping) else {}
    for key, value in sampling.items():
        if key in _SETTINGS_FIELDS:
            changes[key] = value
            extra.pop(key, None)
        else:
            extra[key] = value
    if extra:
        changes["extra_body"] = extra
    return base.resolve(changes)


@functools.cache
def _session_model_class() -> Any:
    agents = _import_agents()

    class SessionChatCompletionsModel(agents.OpenAIChatCompletionsModel):  # type: ignore[misc,name-defined]
        """Chat Completions model that applies the rollout's sampling to every call."""

        def __init__(self, *args: Any, sampling: Mapping[str, Any], **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.sampling = dict(sampling)

        async def get_response(
            self,
            system_instructions: Any,
            input: Any,
            model_settings: Any,
            *args: Any,
            **kwargs: Any,
        ) -> Any:
            settings = session_model_settings(self.sampling, model_settings)
            return await super().get_response(system_instructions, input, settings, *args, **kwargs)

        def stream_response(
            self,
            system_instructions: Any,
            input: Any,
            model_settings: Any,
            *args: Any,
            **kwargs: Any,
        ) -> Any:
            settings = session_model_settings(self.sampling, model_settings)
            return super().stream_response(system_instructions, input, settings, *args, **kwargs)

    return SessionChatCompletionsModel


def agents_model(
    payload: Mapping[str, Any], **production_kwargs: Any
) -> OpenAIChatCompletionsModel:
    """An Agents SDK model for the session in ``payload["_rollwire"]``.

    Without a session: ``OpenAIChatCompletionsModel(**production_kwargs)`` (``model`` required;
    ``openai_client`` defaults to ``AsyncOpenAI()``). With one: the session's model name and an
    ``AsyncOpenAI`` for the session (production ``openai_client`` is dropped), and tracing off.

    Tracing is switched off with ``agents.set_tracing_disabled(True)``, which is process-wide:
    production requests served later by the same process are not traced either. Run training
    and traced production traffic in separate processes (or re-enable tracing yourself).
    """
    agents = _import_agents()
    ctx = rollout_context(payload)
    kwargs = dict(production_kwargs)
    if ctx is None:
        if "openai_client" not in kwargs:
            kwargs["openai_client"] = async_openai_client(payload)
        return agents.OpenAIChatCompletionsModel(**kwargs)  # type: ignore[no-any-return]
    agents.set_tracing_disabled(True)
    kwargs.pop("openai_client", None)
    kwargs["model"] = ctx.model
    kwargs["openai_client"] = async_openai_client(payload)
    model: OpenAIChatCompletionsModel = _session_model_class()(sampling=ctx.sampling, **kwargs)
    return model


class OpenAIAgentsAdapter:
    """Agent adapter for the OpenAI Agents SDK (in core; not a separate distribution)."""

    name = "openai-agents"
    requires: tuple[str, ...] = ("openai-agents>=0.2",)

    def model(
        self, payload: Mapping[str, Any], **production_kwargs: Any
    ) -> OpenAIChatCompletionsModel:
        """See :func:`agents_model`."""
        return agents_model(payload, **production_kwargs)


adapter = OpenAIAgentsAdapter()
