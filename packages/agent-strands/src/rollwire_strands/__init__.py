"""rollwire adapter for Strands Agents: a Strands ``OpenAIModel`` wired to the rollout session.

    from strands import Agent
    import rollwire_strands

    agent = Agent(model=rollwire_strands.model(payload, model_id="gpt-4o"), tools=[...])

An agent written for Claude keeps its class: ``rollwire_strands.anthropic_model(payload,
model_id="claude-...", max_tokens=1024)`` is a Strands ``AnthropicModel`` on the session (the
gateway speaks Anthropic Messages; needs the ``anthropic`` package). With no ``_rollwire`` key in ``payload``
the model is built from the production keyword arguments
alone, so the same agent code serves production and training. Strands is imported lazily.
"""

from rollwire_strands.anthropic_model import anthropic_model
from rollwire_strands.openai_model import StrandsAdapter, adapter, model

__all__ = ["StrandsAdapter", "adapter", "anthropic_model", "model"]
