"""``tokens.handle_chat`` driven directly with a :class:`ChatContext` and fake token-in backends.

Covers what the golden tests cannot reach easily: refused sampling constraints, work kept off the
event loop, the gateway's upstream timeout, failover on a dead backend, per-gateway caches and
:func:`check_session`.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from rollwire.data.protocol import ModelCall
from rollwire.gateway.app import Gateway
from rollwire.gateway.backends.pool import Backend
from rollwire.gateway.config import GatewayConfig
from rollwire.gateway.context import ChatContext
from rollwire.gateway.dataplane.sampling import apply_sampling
from rollwire.gateway.tokens import handler as tokens
from rollwire.gateway.tokens.heal import FullRender
from rollwire.gateway.tokens.render import ChatRenderer
from rollwire.gateway.tokens.runtime import check_session, runtime_of
from rollwire.store.base import SessionRecord

from .conftest import TOOLS, tokenizer_with_template

REPLY = "Hello there."


def _dead_url() -> str:
    """A 127.0.0.1 URL nothing listens on (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _vllm_app(
    renderer: ChatRenderer, delay: float = 0.0, version: str | None = None
) -> web.Application:
    """A fake vLLM ``/inference/v1/generate`` that always samples ``REPLY`` + ``<|im_end|>``."""
    ids = [*renderer.encode(REPLY).tolist(), int(renderer.encode("<|im_end|>")[0])]
    app = web.Application()
    app["requests"] = []

    async def generate(request: web.Request) -> web.Response:
        app["requests"].append(await request.json())
        await asyncio.sleep(delay)
        choice = {
            "index": 0,
            "finish_reason": "stop",
            "token_ids": ids,
            "logprobs": {"content": [{"token_id": t, "logprob": -0.5} for t in ids]},
        }
        out: dict[str, Any] = {"choices": [choice]}
        if version is not None:
            out["weight_version"] = version
        return web.Response(body=orjson.dumps(out))

    app.router.add_post("/inference/v1/generate", generate)
    return app


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def fake_vllm(renderer: ChatRenderer) -> AsyncIterator[TestServer]:
    server = TestServer(_vllm_app(renderer), host="127.0.0.1")
    await server.start_server()
    yield server
    await server.close()


def _url(server: TestServer) -> str:
    return str(server.make_url("")).rstrip("/")


class Harness:
    """One session on a (not started) :class:`Gateway`: its config and backend pool are real."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        backends: list[tuple[str, str]],
        tokenizer: Path,
        **config: Any,
    ) -> None:
        self.gateway = Gateway(
            GatewayConfig(backends=[(u, k) for u, k in backends], admin_key="k", **config)  # type: ignore[misc]
        )
        self.http = http
        self.session = SessionRecord(
            session_id="s1", capture="tokens", metadata={"tokenizer": str(tokenizer)}
        )
        self.state: dict[str, Any] = {}
        self.calls: list[ModelCall] = []
        self.policy_version: str | None = None

    async def chat(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        backend = self.gateway.pool.pick(self.session.session_id)
        assert backend is not None

        async def commit(call: ModelCall) -> None:
            self.calls.append(call)

        def apply(params: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
            return apply_sampling(params, self.session.sampling, self.session.sampling_policy)

        ctx = ChatContext(
            body=body,
            session=self.session,
            state=self.state,
            backend=backend,
            http=self.http,
            apply_sampling=apply,
            commit=commit,
            new_call_id=lambda: uuid.uuid4().hex,
            policy_version=self.policy_version,
            request_headers={},
            mark_backend_failed=lambda: self.gateway.pool.mark_failed(backend),
            gateway=self.gateway,
        )
        resp = await tokens.handle_chat(ctx)
        return resp.status_code, orjson.loads(bytes(resp.body))

    def backend(self, url: str) -> Backend:
        return next(b for b in self.gateway.pool.backends.values() if b.url == url)


USER = [{"role": "user", "content": "Say hello."}]


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"response_format": {"type": "json_object"}}, "response_format"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {}},
                }
            },
            "response_format",
        ),
        ({"logit_bias": {"42": 5}}, "logit_bias"),
        ({"guided_json": {"type": "object"}}, "guided_json"),
        ({"guided_regex": "a+"}, "guided_regex"),
        ({"structured_outputs": {"regex": "a+"}}, "structured_outputs"),
    ],
)
async def test_sampling_constraints_are_refused(
    http: aiohttp.ClientSession,
    fake_vllm: TestServer,
    tokenizer_path: Path,
    extra: dict[str, Any],
    named: str,
) -> None:
    """The token-in route would drop them: refuse with a 400 naming the key, call nothing."""
    h = Harness(http, [(_url(fake_vllm), "vllm")], tokenizer_path)
    status, body = await h.chat({"model": "p", "messages": USER, **extra})
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    assert named in body["error"]["message"] and "passthrough" in body["error"]["message"]
    assert h.calls == [] and fake_vllm.app["requests"] == []


async def test_session_logit_bias_is_refused_and_plain_text_format_served(
    http: aiohttp.ClientSession, fake_vllm: TestServer, tokenizer_path: Path
) -> None:
    h = Harness(http, [(_url(fake_vllm), "vllm")], tokenizer_path)
    h.session.sampling = {"logit_bias": {"7": -100}}
    status, body = await h.chat({"model": "p", "messages": USER})
    assert status == 400 and "logit_bias" in body["error"]["message"]
    h.session.sampling = {}
    status, body = await h.chat(
        {"model": "p", "messages": USER, "response_format": {"type": "text"}}
    )
    assert status == 200 and body["choices"][0]["message"]["content"] == REPLY
    (call,) = h.calls
    assert call.trainable and not call.off_policy and call.flags == []


async def test_backend_weight_version_wins_and_mismatch_is_flagged(
    http: aiohttp.ClientSession, renderer: ChatRenderer, tokenizer_path: Path
) -> None:
    """As in passthrough: the version the backend sampled with is recorded, and one that differs
    from the trainer's is flagged; without a backend version the trainer's is recorded."""
    server = TestServer(_vllm_app(renderer, version="w6"), host="127.0.0.1")
    await server.start_server()
    try:
        h = Harness(http, [(_url(server), "vllm")], tokenizer_path)
        h.policy_version = "w7"
        assert (await h.chat({"model": "p", "messages": USER}))[0] == 200
        h.policy_version = "w6"
        assert (await h.chat({"model": "p", "messages": USER}))[0] == 200
    finally:
        await server.close()
    stale, current = h.calls
    assert stale.policy_version == "w6" and "policy_version_mismatch" in stale.flags
    assert current.policy_version == "w6" and "policy_version_mismatch" not in current.flags


async def test_trainer_version_recorded_when_backend_reports_none(
    http: aiohttp.ClientSession, fake_vllm: TestServer, tokenizer_path: Path
) -> None:
    h = Harness(http, [(_url(fake_vllm), "vllm")], tokenizer_path)
    h.policy_version = "w7"
    assert (await h.chat({"model": "p", "messages": USER}))[0] == 200
    (call,) = h.calls
    assert call.policy_version == "w7" and "policy_version_mismatch" not in call.flags


def _record_threads(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[int]:
    threads: list[int] = []
    original: Callable[..., Any] = getattr(owner, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.get_ident())
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapped)
    return threads


async def test_full_render_runs_off_the_event_loop(
    http: aiohttp.ClientSession,
    fake_vllm: TestServer,
    tokenizer_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fork's full render grows with the history: a worker thread does it; healing stays inline."""
    renders = _record_threads(monkeypatch, FullRender, "run")
    h = Harness(http, [(_url(fake_vllm), "vllm")], tokenizer_path)
    loop_thread = threading.get_ident()
    status, body = await h.chat({"model": "p", "messages": USER})
    assert status == 200 and len(renders) == 1 and renders[0] != loop_thread
    reply = body["choices"][0]["message"]
    status, _ = await h.chat(
        {"model": "p", "messages": [*USER, reply, {"role": "user", "content": "Again."}]}
    )
    assert status == 200 and len(renders) == 1  # healed: no full render
    assert [c.branch for c in h.calls] == [0, 0]
    status, _ = await h.chat({"model": "p", "messages": [{"role": "user", "content": "New."}]})
    assert status == 200 and len(renders) == 2 and renders[1] != loop_thread
    assert h.calls[-1].branch == 1


async def test_long_completion_is_decoded_off_the_event_loop(
    http: aiohttp.ClientSession,
    fake_vllm: TestServer,
    tokenizer_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answers = _record_threads(monkeypatch, tokens, "build_answer")
    h = Harness(http, [(_url(fake_vllm), "vllm")], tokenizer_path)
    loop_thread = threading.get_ident()
    await h.chat({"model": "p", "messages": USER})
    assert answers == [loop_thread]  # short: inline
    monkeypatch.setattr(tokens, "_INLINE_TOKENS_WITH_LOGPROBS", 2)
    status, body = await h.chat({"model": "p", "messages": USER, "logprobs": True})
    assert status == 200 and body["choices"][0]["message"]["content"] == REPLY
    assert len(answers) == 2 and answers[1] != loop_thread
    assert len(body["choices"][0]["logprobs"]["content"]) == h.calls[-1].completion_ids.shape[0]
    await h.chat({"model": "p", "messages": USER})  # no logprobs: the larger threshold applies
    assert len(answers) == 3 and answers[2] == loop_thread
    monkeypatch.setattr(tokens, "_INLINE_TOKENS", 2)
    await h.chat({"model": "p", "messages": USER})
    assert len(answers) == 4 and answers[3] != loop_thread


async def test_upstream_timeout_comes_from_the_gateway_config(
    http: aiohttp.ClientSession,
    renderer: ChatRenderer,
    fake_vllm: TestServer,
    tokenizer_path: Path,
) -> None:
    """A slow backend times out after ``upstream_timeout``; it is not dead, so no failover."""
    slow = TestServer(_vllm_app(renderer, delay=3.0), host="127.0.0.1")
    await slow.start_server()
    slow_url = _url(slow)
    try:
        h = Harness(
            http,
            [(slow_url, "vllm"), (_url(fake_vllm), "vllm")],
            tokenizer_path,
            upstream_timeout=0.3,
        )
        status, body = await h.chat({"model": "p", "messages": USER})
    finally:
        await slow.close()
    assert status == 504 and "within 0.3s" in body["error"]["message"]
    (call,) = h.calls
    assert call.status == "failed" and call.capture == "tokens"
    assert call.backend == h.backend(slow_url).name and h.backend(slow_url).healthy
    assert fake_vllm.app["requests"] == []


async def test_connection_failure_fails_over_to_another_backend(
    http: aiohttp.ClientSession, fake_vllm: TestServer, tokenizer_path: Path
) -> None:
    dead, good = _dead_url(), _url(fake_vllm)
    h = Harness(http, [(dead, "vllm"), (good, "vllm")], tokenizer_path)
    assert h.gateway.pool.pick("s1") is h.backend(dead)  # the call goes to the dead one first
    status, body = await h.chat({"model": "p", "messages": USER})
    assert status == 200 and body["choices"][0]["message"]["content"] == REPLY
    (call,) = h.calls
    assert call.status == "ok" and call.backend == h.backend(good).name
    assert not h.backend(dead).healthy and h.backend(good).in_flight == 0
    assert len(fake_vllm.app["requests"]) == 1


async def test_connection_failure_without_another_backend_is_a_502(
    http: aiohttp.ClientSession, tokenizer_path: Path
) -> None:
    dead = _dead_url()
    h = Harness(http, [(dead, "vllm")], tokenizer_path)
    status, body = await h.chat({"model": "p", "messages": USER})
    assert status == 502 and "unreachable" in body["error"]["message"]
    (call,) = h.calls
    assert call.status == "failed" and call.backend == h.backend(dead).name
    assert not h.backend(dead).healthy


async def test_caches_belong_to_the_gateway(
    http: aiohttp.ClientSession, fake_vllm: TestServer, tokenizer_path: Path
) -> None:
    a = Harness(http, [(_url(fake_vllm), "vllm")], tokenizer_path)
    b = Harness(http, [(_url(fake_vllm), "vllm")], tokenizer_path)
    await a.chat({"model": "p", "messages": USER})
    await b.chat({"model": "p", "messages": USER})
    ra, rb = runtime_of(a.gateway), runtime_of(b.gateway)
    assert ra is runtime_of(a.gateway) and ra is not rb
    source = str(tokenizer_path)
    assert ra.load_renderer(source) is ra.load_renderer(source)
    assert ra.load_renderer(source) is not rb.load_renderer(source)
    assert not any(isinstance(v, dict) for k, v in vars(tokens).items() if not k.startswith("__"))


async def test_tools_refused_at_request_time_when_no_parser_matches(
    http: aiohttp.ClientSession, fake_vllm: TestServer, tokenizer_path: Path, tmp_path: Path
) -> None:
    """For a session not checked at creation: tools are refused, plain chats still served."""
    h = Harness(http, [(_url(fake_vllm), "vllm")], _plain_template(tokenizer_path, tmp_path))
    status, body = await h.chat({"model": "p", "messages": USER, "tools": TOOLS})
    assert status == 400 and "no tool-call parser" in body["error"]["message"]
    status, body = await h.chat({"model": "p", "messages": USER})
    assert status == 200 and body["choices"][0]["message"]["content"] == REPLY


def _plain_template(tokenizer_path: Path, tmp_path: Path) -> Path:
    """The tokenizer with a chat template that shows no tool-call markup."""
    return tokenizer_with_template(
        tokenizer_path,
        tmp_path / "plain",
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    )


async def test_check_session_accepts_a_supported_template(tokenizer_path: Path) -> None:
    backend = Backend(name="b0", url=_dead_url(), kind="vllm")
    await check_session({"tokenizer": str(tokenizer_path)}, backend)


async def test_check_session_refuses_what_a_request_would(
    tokenizer_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ROLLWIRE_TOKENIZER", raising=False)
    plain = _plain_template(tokenizer_path, tmp_path)
    vllm = Backend(name="b0", url=_dead_url(), kind="vllm")
    with pytest.raises(ValueError, match="no tool-call parser"):
        await check_session({"tokenizer": str(plain)}, vllm)
    with pytest.raises(ValueError, match="token-in backend"):
        await check_session(
            {"tokenizer": str(tokenizer_path)}, Backend(name="o", url=vllm.url, kind="openai")
        )
    with pytest.raises(ValueError, match="needs the model's tokenizer"):
        await check_session({}, vllm)
    with pytest.raises(ValueError, match="cannot load"):
        await check_session({"tokenizer": str(tmp_path / "missing")}, vllm)


async def test_check_session_uses_the_gateway_runtime(
    http: aiohttp.ClientSession, fake_vllm: TestServer, tokenizer_path: Path
) -> None:
    h = Harness(http, [(_url(fake_vllm), "vllm")], tokenizer_path)
    await h.gateway.startup()
    try:
        backend = h.backend(_url(fake_vllm))
        await check_session(h.session.metadata, backend, gateway=h.gateway)
        runtime = runtime_of(h.gateway)
        loaded = runtime.load_renderer(str(tokenizer_path))
        await h.chat({"model": "p", "messages": USER, "tools": TOOLS})
        assert h.state["tokens.healer"].renderer is loaded
    finally:
        await h.gateway.shutdown()
