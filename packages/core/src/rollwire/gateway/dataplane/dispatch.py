"""Upstream dispatch: the request a backend gets, the POST with one fail-over, the answer read
back into the call (non-streamed; streams go through :mod:`rollwire.gateway.dataplane.relay`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import numpy as np
import orjson

from rollwire.data.protocol import ModelCall
from rollwire.gateway.asgi import CHAT_PATH, ASGIResponse, RawResponse
from rollwire.gateway.backends.pool import Backend
from rollwire.gateway.backends.upstream import (
    UpstreamBrokenError,
    UpstreamConnectError,
    UpstreamError,
)
from rollwire.gateway.dataplane.answer import read_session_answer
from rollwire.gateway.dataplane.capture import (
    Asked,
    Captured,
    capture_spans,
    extract,
    resolve_policy_version,
)
from rollwire.gateway.dataplane.capture import strip_response as _strip
from rollwire.gateway.dataplane.commit import assign
from rollwire.gateway.dataplane.sessions import SessionState
from rollwire.gateway.errors import GatewayError, error_response, upstream_error_body
from rollwire.gateway.ports import GatewayPort

__all__ = [
    "LOGPROBS_MODE",
    "ROUTING_MISSING_FLAG",
    "Commit",
    "expect_routing",
    "fail_call",
    "fill_call",
    "forward",
    "open_stream",
    "post",
    "prepare_body",
]

#: What each backend kind's log-probs are: vLLM's before sampling processors, SGLang's after.
LOGPROBS_MODE = {"vllm": "raw", "sglang": "processed"}

Commit = Callable[[ModelCall], Awaitable[None]]

_T = TypeVar("_T")


def prepare_body(backend: Backend, fwd: dict[str, Any], chat: bool) -> bytes:
    """The JSON a backend gets: its served model name (the role's adapter when the request's
    model names a role that has one), and asked for ids and log-probs."""
    body = fwd
    model = backend.model_for(fwd.get("model"))
    if model is not None and fwd.get("model") != model:
        body = dict(fwd)
        body["model"] = model
    if backend.kind != "openai":
        body = dict(body)
        stream = bool(body.get("stream"))
        if backend.kind == "sglang" and stream:
            body["return_output_ids_in_sglext"] = True
        else:
            body["return_token_ids"] = True
        if backend.kind == "vllm":
            body["return_weight_versions"] = True
        if chat:
            body["logprobs"] = True
        elif not body.get("logprobs"):
            body["logprobs"] = 1
    return orjson.dumps(body)


def _unreachable(gw: GatewayPort, last: BaseException | None) -> GatewayError:
    if last is None:
        if gw.pool.backends and all(b.quarantined for b in gw.pool.backends.values()):
            return gw.pool.unavailable()
        return GatewayError(503, "no healthy inference backend", "server_error", "no_backend")
    return GatewayError(
        502, f"inference backend unreachable: {last}", "server_error", "bad_gateway"
    )


async def _with_failover(
    gw: GatewayPort,
    st: SessionState,
    send: Callable[[Backend], Awaitable[_T]],
    connect_failure: Callable[[BaseException], bool],
    *,
    hold: bool,
) -> tuple[Backend, _T]:
    """``send`` to the session's backend; on a connection failure (``connect_failure(exc)``),
    take that backend out and try once more elsewhere. The backend counts the request in flight
    while ``send`` runs, and after it returns when ``hold`` (the caller then releases it)."""
    tried: set[str] = set()
    last: BaseException | None = None
    for _ in range(2):
        backend = gw.pool.pick(st.record.session_id, exclude=frozenset(tried))
        if backend is None:
            break
        if backend.kind == "tinker":
            raise GatewayError(
                400,
                f"backend {backend.name} is a Tinker sampler, which takes token ids only: create "
                "the session with capture='tokens'",
                "invalid_request_error",
                "tinker_needs_tokens_mode",
            )
        tried.add(backend.name)
        backend.in_flight += 1
        try:
            result = await send(backend)
        except BaseException as exc:
            backend.in_flight -= 1
            if not connect_failure(exc):
                raise
            gw.pool.mark_failed(backend)
            gw.metrics.error("backend_connect")
            last = exc
            continue
        if not hold:
            backend.in_flight -= 1
        return backend, result
    raise _unreachable(gw, last)


def _stream_connect_failure(exc: BaseException) -> bool:
    """aiohttp's connection errors, but not a read timeout (that is the caller's to answer)."""
    if not isinstance(
        exc, (aiohttp.ClientConnectionError, aiohttp.ConnectionTimeoutError, OSError)
    ):
        return False
    return not isinstance(exc, asyncio.TimeoutError) or isinstance(
        exc, aiohttp.ConnectionTimeoutError
    )


async def open_stream(
    gw: GatewayPort, st: SessionState, path: str, fwd: dict[str, Any], headers: dict[str, str]
) -> tuple[Backend, aiohttp.ClientResponse]:
    """POST a streamed request; on a connection failure, take the backend out and retry once
    elsewhere. The caller releases the response and the backend's in-flight count."""
    chat = path == CHAT_PATH

    async def send(backend: Backend) -> aiohttp.ClientResponse:
        body = prepare_body(backend, fwd, chat)
        return await gw.http.post(backend.url + path, data=body, headers=headers)

    return await _with_failover(gw, st, send, _stream_connect_failure, hold=True)


async def post(
    gw: GatewayPort, st: SessionState, path: str, fwd: dict[str, Any], headers: bytes
) -> tuple[Backend, int, bytes]:
    """POST to a backend with the lean client; on a connection failure, take the backend out
    and retry once elsewhere. Raises :class:`UpstreamBrokenError` when the answer broke off,
    ``asyncio.TimeoutError`` on timeout."""
    chat = path == CHAT_PATH

    async def send(backend: Backend) -> tuple[int, bytes]:
        try:
            return await gw.upstream.post(
                backend.url,
                path,
                prepare_body(backend, fwd, chat),
                headers,
                gw.config.upstream_timeout,
            )
        except UpstreamBrokenError:
            # Not the backend's "no": it died while answering. The caller may retry once.
            gw.pool.mark_failed(backend)
            raise

    backend, (status, payload) = await _with_failover(
        gw, st, send, lambda exc: isinstance(exc, UpstreamConnectError), hold=False
    )
    return backend, status, payload


async def fail_call(
    gw: GatewayPort,
    call: ModelCall,
    commit: Commit,
    status: int,
    message: str,
    code: str,
    t0: float,
) -> ASGIResponse:
    """Record ``call`` as failed (non-trainable) and answer the agent with an OpenAI error."""
    call.status = "failed"
    call.error = message
    call.trainable = False
    call.latency_ms = (time.perf_counter() - t0) * 1000.0
    await commit(call)
    gw.metrics.error(code)
    type_ = "server_error" if status >= 500 else "invalid_request_error"
    return error_response(status, message, type_, code)


async def upstream_refused(
    gw: GatewayPort, call: ModelCall, commit: Commit, status: int, payload: bytes, t0: float
) -> ASGIResponse:
    """Record a backend's non-200 answer as a failed call and relay its error to the agent."""
    call.status = "failed"
    call.trainable = False
    call.error = f"backend answered {status}: {payload[:2000].decode(errors='replace')}"
    call.latency_ms = (time.perf_counter() - t0) * 1000.0
    await commit(call)
    gw.metrics.error("upstream_status")
    return RawResponse(upstream_error_body(status, payload), status)


async def _post_once_more(
    gw: GatewayPort, st: SessionState, path: str, fwd: dict[str, Any], headers: bytes
) -> tuple[Backend, int, bytes]:
    for attempt in range(2):
        try:
            return await post(gw, st, path, fwd, headers)
        except UpstreamBrokenError:
            # The backend died while answering: nothing reached the agent; retry once.
            if attempt == 1:
                raise
    raise AssertionError("unreachable")


async def forward(
    gw: GatewayPort,
    st: SessionState,
    call: ModelCall,
    fwd: dict[str, Any],
    asked: Asked,
    path: str,
    headers: bytes,
    t0: float,
    commit: Commit,
) -> ASGIResponse:
    """Forward a non-streamed call, capture the answer into ``call``, commit, answer."""
    try:
        backend, status, payload = await _post_once_more(gw, st, path, fwd, headers)
    except GatewayError as exc:
        return await fail_call(gw, call, commit, exc.status, exc.message, exc.code or "", t0)
    except asyncio.TimeoutError:
        message = f"inference backend timed out after {gw.config.upstream_timeout}s"
        return await fail_call(gw, call, commit, 504, message, "upstream_timeout", t0)
    except UpstreamError as exc:
        message = f"inference backend failed: {exc}"
        return await fail_call(gw, call, commit, 502, message, "bad_gateway", t0)
    gw.metrics.upstream_latency.observe(time.perf_counter() - t0)
    assign(call, backend=backend.name, logprobs_mode=LOGPROBS_MODE.get(backend.kind))
    if status != 200:
        return await upstream_refused(gw, call, commit, status, payload, t0)
    try:
        if asked.token_ids:  # the agent gets the ids back: parse them as they are
            data, prompt_ids = orjson.loads(payload), None
        else:
            data, prompt_ids = read_session_answer(payload, st.record.session_id)
    except orjson.JSONDecodeError:
        message = "inference backend answered with invalid JSON"
        return await fail_call(gw, call, commit, 502, message, "bad_gateway", t0)
    fill_call(gw, call, extract(data, prompt_ids), backend)
    if not asked.everything:
        _strip(data, asked)
        payload = orjson.dumps(data)
    assign(call, latency_ms=(time.perf_counter() - t0) * 1000.0, response=data)
    await commit(call)
    gw.metrics.latency.observe(time.perf_counter() - t0)
    return RawResponse(payload)


#: flag of a call whose session wants routed experts but which came back without them
ROUTING_MISSING_FLAG = "routed_experts_missing"


def expect_routing(gw: GatewayPort, commit: Commit) -> Commit:
    """``commit`` that first flags (and counts in ``/metrics``) a successful call without routing."""

    async def checked(call: ModelCall) -> None:
        if call.status == "ok" and call.routed_experts is None and call.completion_ids.shape[0]:
            call.flags.append(ROUTING_MISSING_FLAG)
            gw.metrics.routing_missing += 1
        await commit(call)

    return checked


def fill_call(gw: GatewayPort, call: ModelCall, cap: Captured, backend: Backend) -> None:
    """Copy what was captured into ``call`` and flag what makes it untrainable. A call a LoRA
    adapter served carries that adapter's version (the server's own label is the base's)."""
    served = backend.adapter_version(cap.model) if backend.adapters else None
    reported = served if served is not None else cap.weight_version
    version, version_flag = resolve_policy_version(reported, gw.policy_version)
    assign(
        call,
        prompt_ids=cap.prompt_ids,
        completion_ids=cap.completion_ids,
        logprobs=cap.logprobs,
        routed_experts=cap.routed_experts,
        finish_reason=cap.finish_reason,
        policy_version=version,
    )
    raw_spans = cap.weight_spans if cap.has_ids else None
    call.weight_versions, spans_flag = capture_spans(raw_spans, cap.completion_ids.shape[0])
    for flag in (version_flag, spans_flag):
        if flag:
            call.flags.append(flag)
    if backend.kind == "openai" or not cap.has_ids:
        call.trainable = False
        call.flags.append("no_token_ids")
    elif cap.logprobs.shape[0] != cap.completion_ids.shape[0]:
        call.trainable = False
        call.flags.append("logprobs_mismatch")
        call.logprobs = np.zeros(cap.completion_ids.shape[0], dtype=np.float32)
