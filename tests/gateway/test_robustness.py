"""Failure paths of the data and control planes: accounting, refusals, retries, eviction."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest

import rollwire.gateway.live_sessions as live_sessions
from rollwire.agent.serving import ServerThread
from rollwire.gateway import RunningGateway, serve_in_thread
from rollwire.testing.null_backend import NullBackend
from rollwire.testing.waiting import until
from rollwire.trainer.gateway_client import GatewayAPIError, GatewayClient

MSGS = [{"role": "user", "content": "hi"}]
_JSON = b"application/json"

Handler = Callable[[dict[str, Any]], Any]


class FakeBackend:
    """A tiny vLLM-shaped ASGI backend whose answer a test writes: ``handler(body)`` returns a
    dict (JSON answer), a list of SSE payloads (bytes, sent as ``data: ...`` events) or a
    ``(status, body, content_type)`` tuple sent as it is."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        raw = b""
        while True:
            msg = await receive()
            raw += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        if scope["path"] == "/health":
            await _send(send, 200, b"{}", b"application/json")
            return
        answer = self.handler(orjson.loads(raw))
        if isinstance(answer, tuple):  # (status, raw body, content type)
            await _send(send, *answer)
        elif isinstance(answer, list):
            body = b"".join(b"data: " + e + b"\n\n" for e in answer)
            await _send(send, 200, body, b"text/event-stream")
        else:
            await _send(send, 200, orjson.dumps(answer), b"application/json")


async def _send(send: Any, status: int, body: bytes, ctype: bytes) -> None:
    await send(
        {"type": "http.response.start", "status": status, "headers": [(b"content-type", ctype)]}
    )
    await send({"type": "http.response.body", "body": body})


def vllm_answer(weight_version: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": "m",
        "prompt_token_ids": [1, 2, 3],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop",
                "token_ids": [7, 8],
                "logprobs": {
                    "content": [{"token": "o", "logprob": -0.1}, {"token": "k", "logprob": -0.2}]
                },
            }
        ],
    }
    if weight_version is not None:
        out["weight_version"] = weight_version
    return out


@pytest.fixture
def slow_gateway() -> Iterator[tuple[RunningGateway, GatewayClient]]:
    slow = NullBackend(delay=0.4)
    with (
        ServerThread(slow) as server,
        serve_in_thread(backends=[(server.url, "vllm")]) as gw,
        gw.client() as c,
    ):
        yield gw, c


def _post(url: str, json: dict[str, Any] | None = None, **kw: Any) -> httpx.Response:
    return httpx.post(url, json=json or {"model": "p", "messages": MSGS}, timeout=30, **kw)


def _wait_in_flight(gw: RunningGateway, n: int) -> None:
    deadline = time.monotonic() + 60  # bounds a hang; the loop ends on the count
    while gw.gateway.in_flight != n and time.monotonic() < deadline:
        time.sleep(0.005)
    assert gw.gateway.in_flight == n


def _health(gw: RunningGateway) -> dict[str, Any]:
    return dict(httpx.get(gw.url + "/health", timeout=30).json())


# ---------------------------------------------------------------- in-flight accounting (1)
def test_bad_parameter_types_are_400_and_leave_nothing_in_flight(
    gateway: RunningGateway, client: GatewayClient
) -> None:
    h = client.create_session(max_tokens=100)
    url = h.base_url + "/chat/completions"
    for bad in ({"max_tokens": "50"}, {"n": "2"}, {"temperature": "hot"}, {"max_tokens": 0}):
        r = _post(url, {"model": "p", "messages": MSGS, **bad})
        assert r.status_code == 400, bad
        err = r.json()["error"]
        key = next(iter(bad))
        assert key in err["message"] and repr(bad[key]) in err["message"]
    assert _health(gateway)["in_flight"] == 0
    assert _post(url).status_code == 200
    assert client.pause(wait=True)["in_flight"] == 0
    client.resume()


def test_session_deleted_during_a_call(slow_gateway: tuple[RunningGateway, GatewayClient]) -> None:
    gw, c = slow_gateway
    h = c.create_session()
    results: list[httpx.Response] = []
    t = threading.Thread(target=lambda: results.append(_post(h.base_url + "/chat/completions")))
    t.start()
    _wait_in_flight(gw, 1)
    c.delete_session(h.session_id)
    t.join(60)
    assert results[0].status_code == 404
    assert results[0].json()["error"]["code"] == "session_not_found"
    assert _health(gw)["in_flight"] == 0
    t0 = time.monotonic()
    assert c.pause(wait=True)["in_flight"] == 0
    c.resume()
    assert time.monotonic() - t0 < 5


def test_unexpected_error_is_500_and_a_failed_call(
    gateway: RunningGateway, client: GatewayClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = client.create_session()

    def broken(*args: Any) -> None:
        raise RuntimeError("capture exploded")

    import rollwire.gateway.dataplane.dispatch as dispatch

    monkeypatch.setattr(dispatch, "fill_call", broken)
    r = _post(h.base_url + "/chat/completions")
    assert r.status_code == 500
    err = r.json()["error"]
    # The agent is not shown internals; the recorded call has them.
    assert err["code"] == "internal_error" and "capture exploded" not in err["message"]
    assert _health(gateway)["in_flight"] == 0
    (call,) = client.calls(h.session_id)
    assert call.status == "failed" and not call.trainable and "capture exploded" in call.error


# ---------------------------------------------------------------- stream errors (2)
def test_stream_with_error_event_then_done_is_failed() -> None:
    def handler(body: dict[str, Any]) -> list[bytes]:
        chunk = {
            "id": "c",
            "object": "chat.completion.chunk",
            "prompt_token_ids": [1, 2],
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": "par"},
                    "token_ids": [5],
                    "logprobs": {"content": [{"token": "par", "logprob": -0.5}]},
                    "finish_reason": None,
                }
            ],
        }
        return [orjson.dumps(chunk), b'{"error": {"message": "engine fell over"}}', b"[DONE]"]

    with (
        ServerThread(FakeBackend(handler)) as server,
        serve_in_thread(backends=[(server.url, "vllm")]) as gw,
        gw.client() as c,
    ):
        h = c.create_session()
        body = {"model": "p", "messages": MSGS, "stream": True}
        r = _post(h.base_url + "/chat/completions", body)
        assert b"engine fell over" in r.content
        (call,) = c.calls(h.session_id)
        assert call.status == "failed" and not call.trainable
        assert "engine fell over" in (call.error or "")


# ---------------------------------------------------------------- completion races (9)
def test_no_call_lands_after_completion(
    gateway: RunningGateway, client: GatewayClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = client.create_session()
    url = h.base_url + "/chat/completions"
    assert _post(url).status_code == 200
    store = gateway.gateway.store
    real_complete = store.complete
    entered = threading.Event()

    async def slow_complete(*args: Any, **kw: Any) -> Any:
        entered.set()
        await asyncio.sleep(0.4)
        return await real_complete(*args, **kw)

    monkeypatch.setattr(store, "complete", slow_complete)
    done: list[Any] = []
    t = threading.Thread(target=lambda: done.append(client.complete(h.session_id, reward=1.0)))
    t.start()
    assert entered.wait(60)
    r = _post(url)  # lands while the completion is being written
    t.join(60)
    assert r.status_code == 409 and r.json()["error"]["code"] == "session_closed"
    assert done[0].num_calls == 1
    assert len(client.calls(h.session_id)) == 1
    assert _post(url).status_code == 409


# ---------------------------------------------------------------- retries (10)
def test_retry_that_lands_before_its_original_supersedes_it() -> None:
    nb = NullBackend()
    order = itertools.count()

    async def first_is_slow(scope: dict[str, Any], receive: Any, send: Any) -> None:
        chat = scope["type"] == "http" and scope["path"].endswith("/chat/completions")
        if chat and next(order) == 0:
            await asyncio.sleep(0.6)
        await nb(scope, receive, send)

    with (
        ServerThread(first_is_slow) as server,
        serve_in_thread(backends=[(server.url, "vllm")]) as gw,
        gw.client() as c,
    ):
        h = c.create_session()
        url = h.base_url + "/chat/completions"
        results: list[int] = []
        t = threading.Thread(target=lambda: results.append(_post(url).status_code))
        t.start()
        _wait_in_flight(gw, 1)
        # The SDK timed out and retried the same body; the retry answers first.
        retry = _post(url, headers={"x-stainless-retry-count": "1"})
        assert retry.status_code == 200
        t.join(60)
        assert results == [200]
        calls = {x.retry_count: x for x in c.calls(h.session_id)}
        original, second = calls[0], calls[1]
        assert second.index < original.index  # the retry was committed first
        assert second.retry_of == original.call_id and second.trainable
        assert not original.trainable and "superseded_by_retry" in original.flags
        assert sum(x.trainable for x in calls.values()) == 1


# ---------------------------------------------------------------- validation (11)
@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"ttl": "abc"}, "ttl"),
        ({"ttl": -5}, "ttl"),
        ({"max_calls": "x"}, "max_calls"),
        ({"max_calls": 0}, "max_calls"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"chat_template_kwargs": 5}, "chat_template_kwargs"),
        ({"metadata": [1]}, "metadata"),
        ({"sampling": {"temperature": "hot"}}, "temperature"),
        ({"sampling": {"max_tokens": "64"}}, "max_tokens"),
        ({"allow_off_policy": "yes"}, "allow_off_policy"),
        ({"group_id": {"name": "g"}}, "group_id"),
    ],
)
def test_create_session_refuses_bad_fields(
    client: GatewayClient, fields: dict[str, Any], named: str
) -> None:
    with pytest.raises(GatewayAPIError) as exc:
        client.create_session(**fields)
    assert exc.value.status_code == 400
    assert named in exc.value.message


def test_control_plane_refuses_bad_queries_and_rewards(
    gateway: RunningGateway, client: GatewayClient
) -> None:
    h = client.create_session()
    headers = {"authorization": f"Bearer {gateway.admin_key}"}
    api = gateway.url + "/api"
    for method, path in (
        ("GET", "/sessions?limit=abc"),
        ("GET", "/sessions?limit=-1"),
        ("GET", f"/sessions/{h.session_id}/wait?timeout=abc"),
        ("GET", f"/sessions/{h.session_id}/wait?timeout=nan"),
    ):
        r = httpx.request(method, api + path, headers=headers, timeout=30)
        assert r.status_code == 400, path
        assert r.json()["error"]["message"], path
    for reward in ("nan", "inf", "1e999", True):
        r = httpx.post(
            api + f"/sessions/{h.session_id}/complete",
            json={"reward": reward},
            headers=headers,
            timeout=30,
        )
        assert r.status_code == 400, reward
        assert "reward" in r.json()["error"]["message"]
    r = httpx.post(
        api + f"/sessions/{h.session_id}/complete",
        json={"reward": 1.0, "metrics": {"acc": "nan"}},
        headers=headers,
        timeout=30,
    )
    assert r.status_code == 400 and "acc" in r.json()["error"]["message"]
    assert client.get_session(h.session_id).status == "running"


def test_control_plane_body_size_limit(backend: tuple[NullBackend, ServerThread]) -> None:
    with serve_in_thread(backends=[(backend[1].url, "vllm")], max_body_bytes=2000) as gw:
        headers = {"authorization": f"Bearer {gw.admin_key}"}
        big = {"metadata": {"blob": "x" * 5000}}
        r = httpx.post(gw.url + "/api/sessions", json=big, headers=headers, timeout=30)
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

        def chunks() -> Iterator[bytes]:  # no content-length: the limit holds while reading
            yield b'{"metadata": {"blob": "'
            for _ in range(10):
                yield b"x" * 500
            yield b'"}}'

        r = httpx.post(gw.url + "/api/sessions", content=chunks(), headers=headers, timeout=30)
        assert r.status_code == 413


# ---------------------------------------------------------------- health loop (4)
def test_backend_added_at_run_time_is_health_checked() -> None:
    with (
        serve_in_thread(backends=[], health_interval=0.1) as gw,
        gw.client() as c,
    ):
        server = ServerThread(NullBackend()).start()
        try:
            (b,) = c.add_backend(server.url, name="late")
            assert b["healthy"]
        finally:
            server.stop()
        deadline = time.monotonic() + 60
        while c.backends()[0]["healthy"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not c.backends()[0]["healthy"]


# ---------------------------------------------------------------- policy version (14)
def test_backend_weight_version_is_kept_and_mismatch_flagged() -> None:
    with (
        ServerThread(FakeBackend(lambda body: vllm_answer("w7"))) as server,
        serve_in_thread(backends=[(server.url, "vllm")]) as gw,
        gw.client() as c,
    ):
        h = c.create_session()
        url = h.base_url + "/chat/completions"
        c.set_policy_version("w6")
        assert _post(url).status_code == 200
        c.set_policy_version("w7")
        assert _post(url).status_code == 200
        stale, current = c.calls(h.session_id)
        assert stale.policy_version == "w7" and "policy_version_mismatch" in stale.flags
        assert stale.trainable  # recorded, not dropped: the trainer decides
        assert current.policy_version == "w7" and "policy_version_mismatch" not in current.flags


# ---------------------------------------------------------------- tool_choice (15)
def test_forcing_tool_choice_is_off_policy(client: GatewayClient) -> None:
    tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    named = {"type": "function", "function": {"name": "add"}}
    for allow in (False, True):
        h = client.create_session(allow_off_policy=allow)
        oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
        for choice in ("auto", "required", named):
            oai.chat.completions.create(
                model="p",
                messages=MSGS,
                tools=tools,  # type: ignore[arg-type]
                tool_choice=choice,  # type: ignore[arg-type]
            )
        auto, required, forced = client.calls(h.session_id)
        assert auto.trainable and not auto.off_policy
        for call in (required, forced):
            assert call.off_policy and "guided_tool_choice" in call.flags
            # served under a grammar: its log-probs are not the policy's, even when allowed
            assert not call.trainable


# ---------------------------------------------------------------- session cache (16) and TTL
def _call_over(gw: Any, session_id: str) -> None:
    """Wait until the gateway has counted the session's call over: that happens just after the
    answer went out, so the agent can hold the answer before it (seen at load 8)."""

    def over() -> bool:
        st = gw.sessions.get(session_id)
        return st is None or st.in_flight == 0

    until("the call is over", over, 60)


def test_session_cache_keeps_no_terminal_or_expired_sessions(
    gateway: RunningGateway, client: GatewayClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    gw = gateway.gateway
    h = client.create_session()
    url = h.base_url + "/chat/completions"
    assert _post(url).status_code == 200
    assert h.session_id in gw.sessions
    _call_over(gw, h.session_id)
    client.complete(h.session_id, reward=0.0)
    assert h.session_id not in gw.sessions
    assert _post(url).status_code == 409
    assert httpx.get(h.base_url + "/models", timeout=30).status_code == 200
    assert h.session_id not in gw.sessions  # a closed session is not cached again

    monkeypatch.setattr(live_sessions, "_MAX_CACHED_SESSIONS", 3)
    handles = [client.create_session() for _ in range(5)]
    for hh in handles:
        assert _post(hh.base_url + "/chat/completions").status_code == 200
        _call_over(gw, hh.session_id)  # a call in flight keeps its session from eviction
    assert len(gw.sessions) <= 3
    assert handles[-1].session_id in gw.sessions  # least recently used go first
    gw.sessions[handles[-1].session_id].record.expires_at = time.time() - 1
    gw._evict(time.time())
    assert handles[-1].session_id not in gw.sessions


def test_session_past_its_ttl_times_out_when_looked_at(client: GatewayClient) -> None:
    h = client.create_session(ttl=0.3)
    t0 = time.monotonic()
    info = client.wait(h.session_id, timeout=30)
    assert info.status == "timeout" and info.terminal
    assert time.monotonic() - t0 < 15  # woken at the TTL, not at the wait's own timeout
    assert client.get_session(h.session_id).status == "timeout"
    h2 = client.create_session(ttl=0.2)
    time.sleep(0.3)
    assert client.get_session(h2.session_id).status == "timeout"


# ---------------------------------------------------------------- header hygiene (18)
def test_session_id_with_line_breaks_is_refused(client: GatewayClient) -> None:
    # Control characters could never be read back or completed through a URL (and must not
    # reach a header line): refused at creation, nothing created.
    before = len(client.list_sessions())
    with pytest.raises(GatewayAPIError) as exc:
        client.create_session(session_id="evil\r\nX-Injected: 1")
    assert exc.value.status_code == 400 and exc.value.code == "invalid_session_id"
    assert len(client.list_sessions()) == before


# ---------------------------------------------------------------- backend error bodies
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("status", "body", "ctype", "said"),
    [
        (500, b"Internal Server Error", b"text/plain", "Internal Server Error"),
        (502, b"<html>bad gateway</html>", b"text/html", "<html>bad gateway</html>"),
        (400, b'{"object": "error", "message": "too long", "code": 400}', _JSON, "too long"),
        (503, b"", b"text/plain", "(empty body)"),
    ],
)
def test_backend_error_that_is_not_openai_shaped_is_wrapped(
    stream: bool, status: int, body: bytes, ctype: bytes, said: str
) -> None:
    with (
        ServerThread(FakeBackend(lambda b: (status, body, ctype))) as server,
        serve_in_thread(backends=[(server.url, "vllm")]) as gw,
        gw.client() as c,
    ):
        h = c.create_session()
        r = _post(
            h.base_url + "/chat/completions", {"model": "p", "messages": MSGS, "stream": stream}
        )
        assert r.status_code == status
        assert r.headers["content-type"] == "application/json"
        err = r.json()["error"]
        assert err["message"] == f"inference backend answered {status}: {said}"
        assert err["type"] == ("server_error" if status >= 500 else "invalid_request_error")
        (call,) = c.calls(h.session_id)
        assert call.status == "failed" and not call.trainable


@pytest.mark.parametrize("stream", [False, True])
def test_openai_shaped_backend_error_is_passed_through(stream: bool) -> None:
    body = orjson.dumps({"error": {"message": "bad model", "type": "NotFoundError", "code": 404}})
    with (
        ServerThread(FakeBackend(lambda b: (404, body, _JSON))) as server,
        serve_in_thread(backends=[(server.url, "vllm")]) as gw,
        gw.client() as c,
    ):
        h = c.create_session()
        r = _post(
            h.base_url + "/chat/completions", {"model": "p", "messages": MSGS, "stream": stream}
        )
        assert r.status_code == 404 and r.content == body


# ---------------------------------------------------------------- malformed streams
@pytest.mark.parametrize(
    "bad",
    [
        {"prompt_token_ids": ["a", None]},  # read when the call is committed
        {"choices": [{"index": 0, "token_ids": 7}]},  # read while relaying
    ],
)
def test_malformed_stream_is_recorded_and_reported(bad: dict[str, Any]) -> None:
    def handler(body: dict[str, Any]) -> Any:
        if not body.get("stream"):
            return vllm_answer()
        chunk: dict[str, Any] = {
            "id": "x",
            "object": "chat.completion.chunk",
            "model": "m",
            "prompt_token_ids": [1, 2, 3],
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": "h"},
                    "token_ids": [5],
                    "logprobs": {"content": [{"token": "h", "logprob": -0.5}]},
                    "finish_reason": "stop",
                }
            ],
        }
        chunk.update(bad)
        return [orjson.dumps(chunk), b"[DONE]"]

    with (
        ServerThread(FakeBackend(handler)) as server,
        serve_in_thread(backends=[(server.url, "vllm")]) as gw,
        gw.client() as c,
    ):
        h = c.create_session()
        r = _post(
            h.base_url + "/chat/completions", {"model": "p", "messages": MSGS, "stream": True}
        )
        assert r.status_code == 200
        events = [e[6:] for e in r.text.split("\n\n") if e.startswith("data: ")]
        assert events[-1] == "[DONE]"
        err = orjson.loads(events[-2])["error"]
        assert err["type"] == "server_error"
        (call,) = c.calls(h.session_id)
        assert call.status == "failed" and not call.trainable
        assert call.error and err["message"] in call.error
        assert gw.gateway.in_flight == 0
        assert all(b.in_flight == 0 for b in gw.gateway.pool.backends.values())
        # The session goes on: a good call after it is recorded as usual.
        assert _post(h.base_url + "/chat/completions").status_code == 200
        assert [x.status for x in c.calls(h.session_id)] == ["failed", "ok"]
