"""What real vLLM 0.32 needs from the gateway: weight versions, forced ``tool_choice``, the
token-in route (the fast contract versions are in tests/gateway/test_vllm_findings.py)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from rollwire.gateway import RunningGateway, serve_in_thread
from rollwire.trainer.gateway_client import GatewayClient

from ._server import VLLMServer
from .conftest import NAME, TOOLS

MSGS = [{"role": "user", "content": "Tell me about the weather."}]


@pytest.fixture(scope="module")
def gateway(vllm: VLLMServer) -> Iterator[RunningGateway]:
    with serve_in_thread(backends=[(vllm.url, "vllm")]) as gw:
        yield gw


def test_weight_versions_follow_sync(gateway: RunningGateway, vllm: VLLMServer) -> None:
    # a first tokens session loads the tokenizer (transformers, torch) in the gateway: slow here
    c = GatewayClient(gateway.url, gateway.admin_key, timeout=300)
    sampling = {"temperature": 0.0, "max_tokens": 4}
    tok = c.create_session(capture="tokens", sampling=sampling)
    pas = c.create_session(sampling=sampling)
    for h in (tok, pas):
        openai.OpenAI(base_url=h.base_url, api_key="x").chat.completions.create(
            model="policy", messages=MSGS
        )
    c.sync_weight_version("step-3")
    assert httpx.get(vllm.url + "/weight_info").json()["weight_version"] == "step-3"
    for h in (tok, pas):
        openai.OpenAI(base_url=h.base_url, api_key="x").chat.completions.create(
            model="policy", messages=MSGS
        )
    t0, t1 = c.calls(tok.session_id)
    p0, p1 = c.calls(pas.session_id)
    # before any sync vLLM says "default": no version, nothing flagged
    assert t0.policy_version is None and t0.flags == []
    assert p0.policy_version is None and p0.flags == []
    # tokens mode: vLLM reports the synced version on /inference/v1/generate
    assert t1.policy_version == "step-3" and t1.flags == []
    # passthrough: vLLM 0.32 reports none on its OpenAI routes; the trainer's is recorded, flagged
    assert p1.policy_version == "step-3" and p1.flags == ["weight_version_unreported"]
    # leave vLLM as it started for the other modules
    httpx.post(vllm.url + "/update_weight_version", json={"new_version": "default"})


def test_forced_tool_choice_is_never_trained(gateway: RunningGateway) -> None:
    c = gateway.client()
    h = c.create_session(allow_off_policy=True, sampling={"temperature": 1.0, "max_tokens": 40})
    oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
    r = oai.chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": "Add 2 and 3."}],
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice={"type": "function", "function": {"name": "add"}},
    )
    # the grammar forced the call's opening (the random model fills the arguments)
    text = r.choices[0].message.content or ""
    assert r.choices[0].message.tool_calls or text.startswith('<tool_call>{"name": "add"')
    (call,) = c.calls(h.session_id)
    assert call.off_policy and "guided_tool_choice" in call.flags
    assert (
        not call.trainable
    )  # allow_off_policy or not: the grammar's log-probs are not the policy's
    assert call.logprobs.shape == call.completion_ids.shape


def test_served_name_and_context_reported(vllm: VLLMServer) -> None:
    (card,) = httpx.get(vllm.url + "/v1/models").json()["data"]
    assert card["id"] == NAME and card["max_model_len"] == 2048
    # the token-in route exists (--enable-scale-out): a bad body is a 4xx, not 403/404
    status = httpx.post(vllm.url + "/inference/v1/generate", json={}).status_code
    assert 400 <= status < 500 and status not in (403, 404)
