"""An agent's rollouts against a scripted policy: the embedded engine answering each call with
what ``script(messages, tools)`` returns, behind a real gateway, driven by a
:class:`~rollwire.trainer.client.RolloutClient` running the agent in-process — what a task's
tests need to check its agent, rewards and trained rows without training a model."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["scripted_rollouts"]


@contextlib.contextmanager
def scripted_rollouts(
    app: Any,
    script: Callable[[list[dict[str, Any]], Any], str | None],
    *,
    group_size: int = 1,
    deadline: float = 60.0,
) -> Iterator[tuple[Any, Any]]:
    """``(client, tokenizer)``: a RolloutClient over ``app`` whose model calls ``script``
    answers, and the engine's tokenizer; engine, gateway and client stop on exit."""
    from rollwire.engine import EmbeddedEngine, EngineConfig
    from rollwire.gateway import serve_in_thread
    from rollwire.trainer.client import RolloutClient
    from rollwire.trainer.runners import LocalRunner

    with (
        EmbeddedEngine(EngineConfig(scripted=script)) as engine,
        serve_in_thread(backends=[(engine.url, "vllm")]) as gateway,
    ):
        client = RolloutClient(
            gateway, runner=LocalRunner(app), group_size=group_size, deadline=deadline
        )
        try:
            yield client, engine.tokenizer
        finally:
            client.close()
