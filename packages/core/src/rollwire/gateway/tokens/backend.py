"""Token-in / token-out generation for ``capture="tokens"``: vLLM ``/inference/v1/generate`` and
SGLang ``/generate`` (the embedded engine serves both). Request and response shapes follow
``SERVER_APIS.md``; both map to one :class:`Generation`.
"""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
import orjson

from rollwire.gateway.backends.upstream import (
    UpstreamBrokenError,
    UpstreamConnectError,
    UpstreamError,
    UpstreamPool,
)

__all__ = ["BackendFailure", "Generation", "generate", "sampling_payload"]

TOKEN_KINDS = ("vllm", "sglang", "tinker")
_JSON_HEADER = b"Content-Type: application/json\r\n"

# Parameters whose names are the same on the OpenAI API, vLLM and SGLang sampling params.
_SAME_NAME = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_tokens",
    "stop_token_ids",
)


class BackendFailure(Exception):
    """The backend could not be reached (``connection``) or refused the request."""

    def __init__(self, status: int, message: str, *, connection: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.connection = connection
        self.backend: str | None = None  # name of the backend that failed, set by the caller


@dataclass
class Generation:
    """What a token-in backend returned for one prompt."""

    completion_ids: np.ndarray
    logprobs: np.ndarray
    finish_reason: str
    stop_reason: Any = None
    routed_experts: np.ndarray | None = None
    weight_version: str | None = None
    #: the backend's per-token ``weight_versions`` spans as it sent them (vLLM's shape)
    weight_spans: Any = None
    raw: dict[str, Any] = field(default_factory=dict)
    #: per completion token, the backend's most likely ``(token_id, logprob)`` (when asked)
    top_logprobs: list[list[tuple[int, float]]] | None = None


def _stop_list(stop: Any) -> list[str] | None:
    if stop is None:
        return None
    return [stop] if isinstance(stop, str) else [str(s) for s in stop]


def sampling_payload(
    kind: str,
    prompt_ids: np.ndarray,
    sampling: Mapping[str, Any],
    *,
    top_logprobs: int = 0,
    request_id: str | None = None,
    session_id: str | None = None,
) -> dict[str, Any]:
    """The backend request body: OpenAI-named ``sampling`` mapped to ``kind``'s names."""
    sp: dict[str, Any] = {k: sampling[k] for k in _SAME_NAME if sampling.get(k) is not None}
    stop = _stop_list(sampling.get("stop"))
    if stop:
        sp["stop"] = stop
    sp["skip_special_tokens"] = False
    ids = [int(t) for t in prompt_ids.tolist()]
    if kind == "vllm":
        if sampling.get("max_tokens") is not None:
            sp["max_tokens"] = int(sampling["max_tokens"])
        if sampling.get("seed") is not None:
            sp["seed"] = int(sampling["seed"])
        sp["logprobs"] = int(top_logprobs)
        sp["include_stop_str_in_output"] = True
        body: dict[str, Any] = {"token_ids": ids, "sampling_params": sp}
        if request_id:
            body["request_id"] = request_id
        return body
    if kind == "sglang":
        if sampling.get("max_tokens") is not None:
            sp["max_new_tokens"] = int(sampling["max_tokens"])
        if sampling.get("seed") is not None:
            sp["sampling_seed"] = int(sampling["seed"])
        sp["no_stop_trim"] = True
        body = {
            "input_ids": ids,
            "sampling_params": sp,
            "return_logprob": True,
            "logprob_start_len": -1,
            "return_routed_experts": True,
        }
        if top_logprobs:
            body["top_logprobs_num"] = int(top_logprobs)
        if request_id:
            body["rid"] = request_id
        if session_id:
            body["session_id"] = session_id
        return body
    if kind == "tinker":  # sampled through the SDK (backends/tinker.py), not posted
        return {"token_ids": ids, "sampling": dict(sampling)}
    raise ValueError(f"backend kind {kind!r} has no token-in route; use one of {TOKEN_KINDS}")


def _route(kind: str) -> str:
    return "/inference/v1/generate" if kind == "vllm" else "/generate"


def _error_text(raw: bytes) -> str:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw[:300].decode("utf-8", "replace")
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict):
            return str(err.get("message") or err.get("detail") or err)[:500]
        return str(err)[:500]
    return str(obj)[:300]


async def _post_lean(
    upstream: UpstreamPool, url: str, route: str, data: bytes, timeout: float
) -> tuple[int, bytes]:
    try:
        return await upstream.post(url, route, data, _JSON_HEADER, timeout)
    except UpstreamConnectError as exc:
        raise BackendFailure(502, f"backend {url} unreachable: {exc}", connection=True) from exc
    except UpstreamBrokenError as exc:
        # It died while answering: nothing reached the agent; another backend may serve it.
        raise BackendFailure(
            502, f"backend {url} broke off its answer: {exc}", connection=True
        ) from exc
    except asyncio.TimeoutError as exc:  # a slow backend is not a dead one: no failover
        raise BackendFailure(504, f"backend {url} did not answer within {timeout}s") from exc
    except UpstreamError as exc:
        raise BackendFailure(502, f"backend {url} failed: {exc}") from exc


async def _post_aiohttp(
    http: aiohttp.ClientSession,
    url: str,
    route: str,
    data: bytes,
    timeout: float,
    connect_timeout: float | None,
) -> tuple[int, bytes]:
    try:
        async with http.post(
            url + route,
            data=data,
            headers={"Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=timeout, sock_connect=connect_timeout),
        ) as resp:
            return resp.status, await resp.read()
    except aiohttp.ConnectionTimeoutError as exc:
        raise BackendFailure(502, f"backend {url} unreachable: {exc}", connection=True) from exc
    # Before ClientConnectionError: aiohttp's read timeouts are both. A slow backend is not a
    # dead one (and the request may still be running there): no failover.
    except asyncio.TimeoutError as exc:
        raise BackendFailure(504, f"backend {url} did not answer within {timeout}s") from exc
    except (aiohttp.ClientConnectionError, OSError) as exc:
        raise BackendFailure(502, f"backend {url} unreachable: {exc}", connection=True) from exc


async def generate(
    http: aiohttp.ClientSession,
    url: str,
    kind: str,
    payload: dict[str, Any],
    *,
    prompt_len: int,
    experts_shape: tuple[int, int] | None = None,
    timeout: float,
    connect_timeout: float | None = None,
    upstream: UpstreamPool | None = None,
) -> Generation:
    """POST ``payload`` to the backend's token-in route and read its answer within ``timeout``
    seconds (the gateway's ``upstream_timeout``; ``connect_timeout`` for the connection).
    With ``upstream`` (the gateway's lean keep-alive client, as passthrough calls use) instead
    of ``http``: the same answer for a quarter of aiohttp's CPU per request."""
    route, data = _route(kind), orjson.dumps(payload)
    if upstream is not None:
        status, raw = await _post_lean(upstream, url, route, data, timeout)
    else:
        status, raw = await _post_aiohttp(http, url, route, data, timeout, connect_timeout)
    if status != 200:
        raise BackendFailure(
            status if status < 500 else 502,
            f"backend {url}{_route(kind)} answered {status}: {_error_text(raw)}",
        )
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BackendFailure(502, f"backend {url} answered with invalid JSON: {exc}") from exc
    if kind == "vllm":
        return _read_vllm(obj, url)
    return _read_sglang(obj, url, prompt_len, experts_shape)


def _read_vllm(obj: Any, url: str) -> Generation:
    try:
        choice = obj["choices"][0]
        ids = choice["token_ids"]
    except (KeyError, IndexError, TypeError) as exc:
        raise BackendFailure(502, f"backend {url} returned no choices[0].token_ids") from exc
    if ids is None:
        raise BackendFailure(502, f"backend {url} returned no choices[0].token_ids")
    completion = np.asarray(ids, dtype=np.int32)
    content = ((choice.get("logprobs") or {}).get("content")) or []
    if len(content) != completion.shape[0]:
        raise BackendFailure(
            502,
            f"backend {url} returned {len(content)} logprobs for {completion.shape[0]} tokens "
            "(ask for sampling_params.logprobs)",
        )
    logprobs = np.asarray([float(c["logprob"]) for c in content], dtype=np.float32)
    tops = [
        [
            (int(t["token_id"]), float(t["logprob"]))
            for t in (c.get("top_logprobs") or [])
            if isinstance(t, dict) and isinstance(t.get("token_id"), int)
        ]
        for c in content
    ]
    experts = None
    if choice.get("routed_experts"):
        arr = np.load(io.BytesIO(base64.b64decode(choice["routed_experts"])), allow_pickle=False)
        experts = arr.astype(np.int16)
    versions = choice.get("weight_versions") or []
    version = None
    if versions and isinstance(versions[-1], dict):
        version = versions[-1].get("version")
    version = version if version is not None else obj.get("weight_version")
    return Generation(
        completion_ids=completion,
        logprobs=logprobs,
        finish_reason=str(choice.get("finish_reason") or "stop"),
        stop_reason=choice.get("stop_reason"),
        routed_experts=experts,
        weight_version=None if version is None else str(version),
        weight_spans=versions or None,
        raw=obj,
        top_logprobs=tops if any(tops) else None,
    )


def _read_sglang(
    obj: Any, url: str, prompt_len: int, experts_shape: tuple[int, int] | None
) -> Generation:
    if not isinstance(obj, dict) or obj.get("output_ids") is None:
        raise BackendFailure(502, f"backend {url} returned no output_ids")
    completion = np.asarray(obj["output_ids"], dtype=np.int32)
    meta = obj.get("meta_info") or {}
    lps = meta.get("output_token_logprobs") or []
    if len(lps) != completion.shape[0]:
        raise BackendFailure(
            502, f"backend {url} returned {len(lps)} logprobs for {completion.shape[0]} tokens"
        )
    logprobs = np.asarray([float(item[0]) for item in lps], dtype=np.float32)
    finish = meta.get("finish_reason") or {}
    kind = finish.get("type", "stop") if isinstance(finish, dict) else str(finish)
    matched = finish.get("matched") if isinstance(finish, dict) else None
    experts = None
    if meta.get("routed_experts"):
        flat = np.frombuffer(base64.b64decode(meta["routed_experts"]), dtype="<i4")
        rows = prompt_len + completion.shape[0] - 1
        if experts_shape is not None and flat.size == rows * experts_shape[0] * experts_shape[1]:
            experts = flat.reshape(rows, *experts_shape).astype(np.int16)
        elif rows > 0 and flat.size % rows == 0:
            experts = flat.reshape(rows, 1, -1).astype(np.int16)
    version = meta.get("weight_version")
    # SGLang: per position a list of [logprob, token_id, text]
    tops = [
        [(int(e[1]), float(e[0])) for e in position or [] if len(e) > 1 and e[1] is not None]
        for position in meta.get("output_top_logprobs") or []
    ]
    return Generation(
        completion_ids=completion,
        logprobs=logprobs,
        finish_reason=str(kind),
        stop_reason=matched,
        routed_experts=experts,
        weight_version=None if version is None else str(version),
        raw=obj,
        top_logprobs=tops if any(tops) else None,
    )
