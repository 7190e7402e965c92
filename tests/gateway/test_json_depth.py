"""Deeply nested JSON in a request: a 400 naming the gateway's depth limit, never a 500."""

from __future__ import annotations

import httpx
import pytest

from rollwire.gateway import RunningGateway
from rollwire.gateway.dataplane.calls import MAX_JSON_DEPTH, json_too_deep
from rollwire.trainer.gateway_client import GatewayClient


def _chat(content_depth: int) -> bytes:
    """A chat body whose one message's content is ``content_depth`` nested lists (the body
    itself is 3 levels deeper: the object, ``messages``, the message)."""
    content = b"[" * content_depth + b'"hi"' + b"]" * content_depth
    return b'{"model": "policy", "messages": [{"role": "user", "content": ' + content + b"}]}"


def _post(url: str, raw: bytes) -> httpx.Response:
    return httpx.post(url, content=raw, headers={"content-type": "application/json"}, timeout=30)


@pytest.mark.parametrize("depth", [1000, 5000])
def test_deep_chat_message_is_a_400_naming_the_limit(
    gateway: RunningGateway, client: GatewayClient, depth: int
) -> None:
    h = client.create_session()
    r = _post(h.base_url + "/chat/completions", _chat(depth))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "json_too_deep"
    assert "depth limit" in err["message"] and str(MAX_JSON_DEPTH) in err["message"]
    # Refused before the call began: nothing recorded, nothing left in flight.
    assert client.calls(h.session_id) == []
    assert httpx.get(gateway.url + "/health", timeout=30).json()["in_flight"] == 0
    # The session still serves a normal request.
    ok = _post(h.base_url + "/chat/completions", _chat(1))
    assert ok.status_code == 200, ok.text
    assert ok.json()["choices"][0]["message"]["content"].startswith("reply 1")


def test_depth_limit_is_exact(client: GatewayClient) -> None:
    h = client.create_session()
    at_limit = _post(h.base_url + "/chat/completions", _chat(MAX_JSON_DEPTH - 3))
    assert at_limit.status_code == 200, at_limit.text
    over = _post(h.base_url + "/chat/completions", _chat(MAX_JSON_DEPTH - 2))
    assert over.status_code == 400 and over.json()["error"]["code"] == "json_too_deep"
    (call,) = client.calls(h.session_id)
    assert call.status == "ok"


def test_deep_responses_request_is_a_400_in_its_dialect(client: GatewayClient) -> None:
    h = client.create_session()
    deep = b"[" * 1000 + b'"hi"' + b"]" * 1000
    r = _post(h.base_url + "/responses", b'{"model": "policy", "input": ' + deep + b"}")
    assert r.status_code == 400, r.text
    assert "depth limit" in r.json()["error"]["message"]


def test_json_too_deep_counts_lists_and_objects() -> None:
    value: object = "leaf"
    for i in range(MAX_JSON_DEPTH):
        value = [value] if i % 2 else {"k": value}
    assert not json_too_deep(value)
    assert json_too_deep([value]) and json_too_deep({"k": value})
    assert not json_too_deep({"prompt": list(range(10_000)), "n": 1})
