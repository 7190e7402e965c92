"""Fixtures: null backends and gateways served on 127.0.0.1, always stopped."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rollwire.agent.serving import ServerThread
from rollwire.gateway import RunningGateway, serve_in_thread
from rollwire.testing.null_backend import NullBackend
from rollwire.trainer.gateway_client import GatewayClient


def tool_reply(body: dict) -> dict:
    """Answer with two tool calls when tools are offered, text otherwise."""
    if body.get("tools"):
        return {
            "content": "",
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
                },
                {
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "mul", "arguments": '{"x": [3, 4], "y": "z"}'},
                },
            ],
        }
    n = len(body.get("messages") or [])
    return {"content": f"reply {n}: the answer is 42."}


@pytest.fixture(scope="module")
def backend() -> Iterator[tuple[NullBackend, ServerThread]]:
    nb = NullBackend(reply=tool_reply, routed_experts=(2, 2))
    with ServerThread(nb) as server:
        yield nb, server


@pytest.fixture(scope="module")
def gateway(backend: tuple[NullBackend, ServerThread]) -> Iterator[RunningGateway]:
    with serve_in_thread(backends=[(backend[1].url, "vllm")]) as gw:
        yield gw


@pytest.fixture(scope="module")
def client(gateway: RunningGateway) -> Iterator[GatewayClient]:
    with gateway.client() as c:
        yield c
