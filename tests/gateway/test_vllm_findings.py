"""What real vLLM 0.32 showed the gateway (tests/vllm runs the real thing), as fast contract tests
against a server that answers the way vLLM was seen to answer."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rollwire.agent.serving import ServerThread
from rollwire.engine import tokenizer_dir
from rollwire.gateway import serve_in_thread
from rollwire.trainer.gateway_client import GatewayAPIError

MSGS = [{"role": "user", "content": "hi"}]


class VLLMLike:
    """vLLM 0.32 as observed: ``/inference/v1/generate`` 403 without ``--enable-scale-out``,
    ``"default"`` as the weight version until ``/update_weight_version`` (404 without
    ``VLLM_SERVER_DEV_MODE=1``) sets one."""

    def __init__(self, *, scale_out: bool = False, dev_mode: bool = True, root: str = "") -> None:
        self.root = root or str(tokenizer_dir())
        self.scale_out = scale_out
        self.dev_mode = dev_mode
        self.version = "default"
        self.updates: list[str] = []

    def app(self) -> Starlette:
        async def models(request: Request) -> Response:
            card = {
                "id": "m",
                "object": "model",
                "root": self.root,
                "max_model_len": 2048,
            }
            return JSONResponse({"object": "list", "data": [card]})

        async def generate(request: Request) -> Response:
            if not self.scale_out:
                return JSONResponse({"detail": "Forbidden"}, status_code=403)
            return JSONResponse({"error": {"message": "token_ids: field required"}}, 400)

        async def chat(request: Request) -> Response:
            return JSONResponse(
                {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "model": "m",
                    "prompt_token_ids": [1, 2, 3],
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "ok"},
                            "finish_reason": "stop",
                            "token_ids": [7, 2],
                            "logprobs": {"content": [{"token": "o", "logprob": -0.1},
                                                     {"token": "k", "logprob": -0.2}]},
                            "weight_versions": [{"version": self.version, "start": 0, "end": 2}],
                        }
                    ],
                }
            )  # fmt: skip

        async def update(request: Request) -> Response:
            if not self.dev_mode:
                return JSONResponse({"detail": "Not Found"}, status_code=404)
            self.version = (await request.json())["new_version"]
            self.updates.append(self.version)
            return JSONResponse({"success": True, "new_version": self.version})

        async def health(request: Request) -> Response:
            return Response(status_code=200)

        return Starlette(
            routes=[
                Route("/health", health),
                Route("/v1/models", models),
                Route("/inference/v1/generate", generate, methods=["POST"]),
                Route("/v1/chat/completions", chat, methods=["POST"]),
                Route("/update_weight_version", update, methods=["POST"]),
            ]
        )


@pytest.fixture
def vllm_like() -> Iterator[tuple[VLLMLike, str]]:
    fake = VLLMLike()
    with ServerThread(fake.app()) as server:
        yield fake, server.url


def test_tokens_session_refused_without_scale_out(vllm_like: tuple[VLLMLike, str]) -> None:
    fake, url = vllm_like
    with serve_in_thread(backends=[(url, "vllm")]) as gw, gw.client() as c:
        with pytest.raises(GatewayAPIError) as err:
            c.create_session(capture="tokens")
        assert err.value.status_code == 400 and err.value.code == "token_route_unavailable"
        assert "--enable-scale-out" in err.value.message and "403" in err.value.message
        c.create_session(capture="passthrough")  # passthrough needs no token-in route
        fake.scale_out = True  # restarted with the flag: accepted
        c.create_session(capture="tokens")


def test_default_weight_version_counts_as_unreported(vllm_like: tuple[VLLMLike, str]) -> None:
    _, url = vllm_like
    with serve_in_thread(backends=[(url, "vllm")]) as gw, gw.client() as c:
        h = c.create_session()
        assert (
            httpx.post(
                h.base_url + "/chat/completions", json={"model": "p", "messages": MSGS}, timeout=30
            ).status_code
            == 200
        )
        c.set_policy_version("w1")
        assert (
            httpx.post(
                h.base_url + "/chat/completions", json={"model": "p", "messages": MSGS}, timeout=30
            ).status_code
            == 200
        )
        before, after = c.calls(h.session_id)
    assert before.policy_version is None and before.flags == []
    # the trainer's version is recorded; "default" is no evidence of stale weights
    assert after.policy_version == "w1" and after.flags == ["weight_version_unreported"]


def test_sync_weight_version_sets_servers_then_gateway(vllm_like: tuple[VLLMLike, str]) -> None:
    fake, url = vllm_like
    with serve_in_thread(backends=[(url, "vllm")]) as gw, gw.client() as c:
        assert c.sync_weight_version("w2") == "w2"
        assert fake.updates == ["w2"]
        h = c.create_session()
        r = httpx.post(
            h.base_url + "/chat/completions", json={"model": "p", "messages": MSGS}, timeout=30
        )
        assert r.status_code == 200
        (call,) = c.calls(h.session_id)
        assert call.policy_version == "w2" and call.flags == []
        fake.dev_mode = False
        with pytest.raises(GatewayAPIError, match="VLLM_SERVER_DEV_MODE=1") as err:
            c.sync_weight_version("w3")
        assert url in err.value.message
        assert c.sync_weight_version("w3", servers=[]) == "w3"  # gateway only


def test_policy_version_flags() -> None:
    from rollwire.gateway.dataplane.capture import resolve_policy_version

    assert resolve_policy_version(None, None) == (None, None)
    assert resolve_policy_version("default", None) == (None, None)
    assert resolve_policy_version("default", "w1") == ("w1", "weight_version_unreported")
    assert resolve_policy_version("w1", "w1") == ("w1", None)
    assert resolve_policy_version("w0", "w1") == ("w0", "policy_version_mismatch")


def test_tokens_mode_caps_max_tokens_to_the_context() -> None:
    from rollwire.engine import EmbeddedEngine, EngineConfig

    with (
        EmbeddedEngine(EngineConfig(max_model_len=96)) as eng,
        serve_in_thread(backends=[(eng.url, "vllm")]) as gw,
        gw.client() as c,
    ):
        h = c.create_session(capture="tokens", sampling={"max_tokens": 1000, "temperature": 0.0})
        r = httpx.post(
            h.base_url + "/chat/completions", json={"model": "p", "messages": MSGS}, timeout=30
        )
        assert r.status_code == 200, r.text
        (call,) = c.calls(h.session_id)
        room = 96 - len(call.prompt_ids)
        assert call.sampling["max_tokens"] == room and len(call.completion_ids) <= room
        long = [{"role": "user", "content": "word " * 200}]
        r = httpx.post(
            h.base_url + "/chat/completions", json={"model": "p", "messages": long}, timeout=30
        )
        assert r.status_code == 400 and "max_model_len 96" in r.text


def test_backend_tokenizer_for_a_remote_server() -> None:
    # /v1/models names a folder on the vLLM host, which this gateway cannot read
    fake = VLLMLike(scale_out=True, root="/models/on/another/host")
    with (
        ServerThread(fake.app()) as server,
        serve_in_thread(backends=[]) as gw,
        gw.client() as c,
    ):
        c.add_backend(server.url, name="remote")
        h = c.create_session(capture="tokens")
        r = httpx.post(
            h.base_url + "/chat/completions", json={"model": "p", "messages": MSGS}, timeout=30
        )
        assert r.status_code == 400 and "/models/on/another/host" in r.text
        c.remove_backend("remote")
        (info,) = c.add_backend(server.url, name="remote", tokenizer=str(tokenizer_dir()))
        assert info["tokenizer"] == str(tokenizer_dir())
        h = c.create_session(capture="tokens")
        r = httpx.post(
            h.base_url + "/chat/completions", json={"model": "p", "messages": MSGS}, timeout=30
        )
        # rendered with the backend's tokenizer and sent: the fake's token-in route refuses it
        assert "/models/on/another/host" not in r.text
        (call,) = c.calls(h.session_id)
        assert call.status == "failed" and len(call.prompt_ids) > 0
