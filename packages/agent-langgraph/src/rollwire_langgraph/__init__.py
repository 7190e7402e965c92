"""rollwire adapter for LangGraph / LangChain: a ``ChatOpenAI`` wired to the rollout session.

    from langchain.agents import create_agent
    import rollwire_langgraph

    agent = create_agent(rollwire_langgraph.chat_model(payload, model="gpt-4o"), tools=[...])

A graph written for Claude keeps its class: ``rollwire_langgraph.anthropic_chat_model(payload,
model="claude-...")`` is a ``ChatAnthropic`` on the session (the gateway speaks Anthropic
Messages; extra ``anthropic``). With no ``_rollwire`` key in ``payload`` the model is ``ChatOpenAI(**production_kwargs)``, so the
same agent code serves production and training. LangChain is imported lazily.
"""

from rollwire_langgraph.chat_anthropic import anthropic_chat_model
from rollwire_langgraph.chat_openai import LangGraphAdapter, adapter, chat_model

__all__ = ["LangGraphAdapter", "adapter", "anthropic_chat_model", "chat_model"]
