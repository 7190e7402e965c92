"""What the framework tests share: a framework's recipe for pointing it at rollwire, wrapped as
the agent adapter the shared suite takes, and the suite with its plugin-only checks answered.

A recipe is a few lines of the agent's own code (docs/frameworks.md), not an installed plugin:
``build(payload, base_url=..., api_key=..., model=...)`` returns the framework's model object,
wired to the rollout session when the payload carries ``_rollwire`` and to the production
endpoint otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from rollwire.testing.agent import AgentAdapterConformance

__all__ = ["Recipe", "RecipeConformance"]


@dataclass(frozen=True)
class Recipe:
    """A framework's recipe as an ``AgentAdapter``: ``model`` calls ``build``."""

    name: str
    #: the framework's distributions, as the versions these tests ran on
    requires: tuple[str, ...]
    build: Callable[..., Any]

    def model(self, payload: Mapping[str, Any], **production_kwargs: Any) -> Any:
        """The framework's model object for the session in ``payload`` (or for production)."""
        return self.build(payload, **production_kwargs)


class RecipeConformance(AgentAdapterConformance):
    """The agent-adapter suite for a recipe (production settings: base URL, key, model)."""

    # a recipe lives in the agent's code: nothing is registered under ``rollwire.agents``
    registered = False

    def production_kwargs(self, *, base_url: str, api_key: str, model: str) -> dict[str, Any]:
        return {"base_url": base_url, "api_key": api_key, "model": model}

    def test_entry_module_is_light(self, adapter: Any) -> None:
        pytest.skip(
            "a recipe is the agent's own code, not an entry-point module that `rollwire plugins` "
            "imports, so there is no entry module to keep light"
        )
