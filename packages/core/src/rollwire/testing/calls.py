"""One call through a running gateway, as tests of weight syncs make it: a greedy chat call in a
fresh session, read back as the gateway captured it (ids, log-probs, the policy version that
served it), and the models a server lists."""

from __future__ import annotations

from typing import Any

__all__ = ["greedy_call", "served_models"]


def greedy_call(
    gw: Any, text: str = "hi", max_tokens: int = 6
) -> tuple[list[int], list[int], list[float], str | None]:
    """``(prompt ids, completion ids, log-probs, policy version)`` of one greedy chat call to
    ``model="policy"`` through ``gw`` (a :class:`~rollwire.gateway.RunningGateway`)."""
    import openai

    with gw.client() as c:
        h = c.create_session(sampling={"temperature": 0.0, "max_tokens": max_tokens})
        oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
        oai.chat.completions.create(model="policy", messages=[{"role": "user", "content": text}])
        (call,) = c.calls(h.session_id)
        return (
            [int(t) for t in call.prompt_ids],
            [int(t) for t in call.completion_ids],
            [float(x) for x in call.logprobs],
            call.policy_version,
        )


def served_models(url: str) -> list[str]:
    """The model ids ``url``'s ``/v1/models`` lists (the base first, then loaded adapters)."""
    import httpx

    return [m["id"] for m in httpx.get(url + "/v1/models", timeout=60).json()["data"]]
