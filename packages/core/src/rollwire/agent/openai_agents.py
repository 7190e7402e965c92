"""OpenAI Agents SDK support: the agent's model wired to the rollout session.

    from agents import Agent, Runner
    from rollwire.agent.openai_agents import agents_model, model_provider

    agent = Agent(name="solver", model=agents_model(payload, model="gpt-4o"), tools=[...])
    # or keep the SDK's default Responses model (also for agents that name a model by string):
    agent = Agent(name="solver", model=OpenAIResponsesModel("gpt-4o", AsyncOpenAI()))
    agent = Agent(name="solver", model=agents_model(payload, model=agent.model))
    Runner.run(agent, task, run_config=RunConfig(model_provider=model_provider(payload)))

The session speaks the API the model speaks: Chat Completions for ``OpenAIChatCompletionsModel``
(the default of :func:`agents_model` with a model name), the Responses API for
``OpenAIResponsesModel`` (``api="responses"``, or a model object of that class, or
:func:`model_provider`) — the gateway captures both the same way. The session's sampling
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
    from agents import ModelSettings

__all__ = [
    "OpenAIAgentsAdapter",
    "adapter",
    "agents_model",
    "model_provider",
    "session_model_settings",
]

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
def _session_model_class(api: str = "chat_completions") -> Any:
    agents = _import_agents()
    base = agents.OpenAIResponsesModel if api == "responses" else agents.OpenAIChatCompletionsModel

    class SessionModel(base):  # type: ignore[misc,valid-type]
        """The SDK's model that applies the rollout's sampling to every call."""

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

    SessionModel.__name__ = SessionModel.__qualname__ = (
        "SessionResponsesModel" if api == "responses" else "SessionChatCompletionsModel"
    )
    return SessionModel


_APIS = ("chat_completions", "responses")


def agents_model(
    payload: Mapping[str, Any], *, api: str | None = None, **production_kwargs: Any
) -> Any:
    """An Agents SDK model for the session in ``payload["_rollwire"]``.

    ``model`` is a model name or a model object the agent already has (an
    ``OpenAIResponsesModel`` or ``OpenAIChatCompletionsModel``, whose API is then kept); ``api``
    (``"chat_completions"``, the default for a name, or ``"responses"``) picks the SDK class.
    Without a session: that model (``openai_client`` defaults to ``AsyncOpenAI()``). With one:
    the same class with the session's model name and an ``AsyncOpenAI`` for the session
    (production ``openai_client`` is dropped), and tracing off.

    Tracing is switched off with ``agents.set_tracing_disabled(True)``, which is process-wide:
    production requests served later by the same process are not traced either. Run training
    and traced production traffic in separate processes (or re-enable tracing yourself).
    """
    agents = _import_agents()
    ctx = rollout_context(payload)
    kwargs = dict(production_kwargs)
    given = kwargs.get("model")
    if isinstance(given, agents.Model):
        if api is None:
            api = "responses" if isinstance(given, agents.OpenAIResponsesModel) else None
        if ctx is None:
            return given
        if not isinstance(given, (agents.OpenAIResponsesModel, agents.OpenAIChatCompletionsModel)):
            raise TypeError(
                f"agents_model cannot wire a {type(given).__name__} to a rollout session: pass "
                "an OpenAIResponsesModel, an OpenAIChatCompletionsModel or a model name"
            )
        kwargs["model"] = ctx.model
    api = api or "chat_completions"
    if api not in _APIS:
        raise ValueError(f"api must be one of {_APIS}, got {api!r}")
    cls = agents.OpenAIResponsesModel if api == "responses" else agents.OpenAIChatCompletionsModel
    if ctx is None:
        if "openai_client" not in kwargs:
            kwargs["openai_client"] = async_openai_client(payload)
        return cls(**kwargs)
    agents.set_tracing_disabled(True)
    kwargs.pop("openai_client", None)
    kwargs["model"] = ctx.model
    kwargs["openai_client"] = async_openai_client(payload)
    return _session_model_class(api)(sampling=ctx.sampling, **kwargs)


def model_provider(payload: Mapping[str, Any]) -> Any:
    """An Agents SDK ``ModelProvider`` for ``RunConfig(model_provider=...)``: every agent that
    names its model by string gets the SDK's default ``OpenAIResponsesModel``, wired to the
    session in a rollout; outside one, the SDK's own ``OpenAIProvider()``."""
    agents = _import_agents()
    if rollout_context(payload) is None:
        return agents.OpenAIProvider()

    class SessionProvider(agents.ModelProvider):  # type: ignore[misc,name-defined]
        """Responses models on the rollout session, whatever name the agent asks for."""

        def get_model(self, model_name: str | None) -> Any:
            return agents_model(payload, model=model_name or "policy", api="responses")

    return SessionProvider()


class OpenAIAgentsAdapter:
    """Agent adapter for the OpenAI Agents SDK (in core; not a separate distribution)."""

    name = "openai-agents"
    requires: tuple[str, ...] = ("openai-agents>=0.2",)

    def model(self, payload: Mapping[str, Any], **production_kwargs: Any) -> Any:
        """See :func:`agents_model`."""
        return agents_model(payload, **production_kwargs)


adapter = OpenAIAgentsAdapter()
