"""Tokens mode's per-gateway runtime: which tokenizer a session renders with, loaded renderers,
and what each backend says about itself (tokenizer, routing shape)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

from rollwire.gateway.tokens.backend import TOKEN_KINDS
from rollwire.gateway.tokens.parsers import check_template_supported
from rollwire.gateway.tokens.render import ChatRenderer, MissingTokensExtra

if TYPE_CHECKING:
    from rollwire.gateway.backends.pool import Backend
    from rollwire.gateway.context import ChatContext
    from rollwire.gateway.ports import GatewayPort

__all__ = [
    "BackendInfo",
    "TokensRuntime",
    "check_session",
    "ctx_runtime",
    "kind_refusal",
    "rows_tokenizer",
    "runtime_of",
    "tokenizer_source",
]

_RUNTIME_KEY = "tokens_runtime"


@dataclass(frozen=True)
class BackendInfo:
    """What a backend says about itself: its tokenizer and MoE routing shape (when it tells)."""

    tokenizer: str | None
    experts_shape: tuple[int, int] | None
    #: the context the backend serves (``max_model_len`` of ``/v1/models``), when it says
    max_model_len: int | None = None


async def _fetch_json(http: aiohttp.ClientSession, url: str) -> Any:
    with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=10)) as resp:
            if resp.status == 200:
                return await resp.json(content_type=None)
    return None


class TokenRouteUnavailable(ValueError):
    """The backend does not serve its token-in route (vLLM without ``--enable-scale-out``)."""


async def _probe_status(http: aiohttp.ClientSession, url: str) -> int | None:
    with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, OSError):
        async with http.post(url, json={}, timeout=aiohttp.ClientTimeout(total=10)) as resp:
            await resp.read()
            return resp.status
    return None


class TokensRuntime:
    """Tokens-mode state shared by one gateway's sessions: loaded renderers (one per tokenizer)
    and what each backend says about itself. Owned by the gateway (see :func:`runtime_of`)."""

    def __init__(self) -> None:
        self._renderers: dict[str, ChatRenderer] = {}
        self._lock = threading.Lock()
        self._backend_info: dict[str, BackendInfo] = {}
        self._token_route_ok: set[str] = set()

    def load_renderer(self, tokenizer: str) -> ChatRenderer:
        """A :class:`ChatRenderer` for a tokenizer folder, loaded once (blocking; thread-safe)."""
        with self._lock:
            renderer = self._renderers.get(tokenizer)
            if renderer is None:
                renderer = ChatRenderer.from_dir(tokenizer)
                self._renderers[tokenizer] = renderer
            return renderer

    async def renderer(self, tokenizer: str) -> ChatRenderer:
        """:meth:`load_renderer` without blocking the event loop on a first load."""
        cached = self._renderers.get(tokenizer)
        if cached is not None:
            return cached
        return await asyncio.to_thread(self.load_renderer, tokenizer)

    async def describe(self, http: aiohttp.ClientSession, url: str) -> BackendInfo:
        """Ask the backend at ``url`` for its tokenizer and routing shape (cached once answered)."""
        info = self._backend_info.get(url)
        if info is not None:
            return info
        tokenizer = None
        shape = None
        model_info = await _fetch_json(http, url + "/get_model_info")
        if isinstance(model_info, dict):
            tokenizer = model_info.get("tokenizer_path") or model_info.get("model_path")
            layers, top_k = model_info.get("num_layers"), model_info.get("top_k")
            if isinstance(layers, int) and isinstance(top_k, int):
                shape = (layers, top_k)
        models = await _fetch_json(http, url + "/v1/models")
        data = models.get("data") if isinstance(models, dict) else None
        card = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
        if tokenizer is None:
            tokenizer = card.get("root") or card.get("id")
        context = card.get("max_model_len")
        info = BackendInfo(
            tokenizer=str(tokenizer) if tokenizer else None,
            experts_shape=shape,
            max_model_len=context if isinstance(context, int) and context > 0 else None,
        )
        if tokenizer or shape:  # an unreachable backend is asked again next time
            self._backend_info[url] = info
        return info

    async def check_token_route(self, http: aiohttp.ClientSession, backend: Backend) -> None:
        """Raise :class:`TokenRouteUnavailable` when a ``vllm`` backend refuses
        ``/inference/v1/generate`` (403/404: vLLM serves it only with ``--enable-scale-out``).
        An empty body is sent: a server that has the route answers 400/422 and generates
        nothing. Cached once the route answered; an unreachable backend is asked again later."""
        if backend.kind != "vllm" or backend.url in self._token_route_ok:
            return
        status = await _probe_status(http, backend.url + "/inference/v1/generate")
        if status in (403, 404, 405):
            raise TokenRouteUnavailable(
                f"backend {backend.name!r} at {backend.url} answered {status} on "
                "/inference/v1/generate, the token-in route capture='tokens' needs: start vLLM "
                "with --enable-scale-out, or create the session with capture='passthrough'"
            )
        if status is not None:
            self._token_route_ok.add(backend.url)


async def rows_tokenizer(
    gateway: GatewayPort, metadata: Mapping[str, Any] | None, backend: Backend | None
) -> ChatRenderer | None:
    """The tokenizer a session's rows are built with (it classifies forks), or None.

    The session's or the backend's tokenizer, as tokens mode finds it (:func:`tokenizer_source`),
    loaded once per gateway. Only a local folder is loaded (a hub name is never downloaded here);
    without one, rows are built without a tokenizer and forks read ``unknown``.
    """
    if backend is None or not backend.healthy:
        return None  # a backend that is down is not waited for: rows without a tokenizer
    runtime = runtime_of(gateway)
    try:
        info = await runtime.describe(gateway.http, backend.url)
        source = tokenizer_source(metadata, info, backend.url)
    except (LookupError, RuntimeError):
        return None
    if source not in runtime._renderers and not await asyncio.to_thread(os.path.isdir, source):
        return None
    try:
        return await runtime.renderer(source)
    except (ValueError, OSError, MissingTokensExtra):
        return None


def runtime_of(gateway: GatewayPort | None) -> TokensRuntime:
    """The gateway's :class:`TokensRuntime`, created on first use; a fresh one without gateway.

    Kept in the gateway instance's own attributes, so it lives and dies with that gateway (no
    process-wide state: two gateways in one process share nothing).
    """
    if gateway is None:
        return TokensRuntime()
    attrs = vars(gateway)
    runtime = attrs.get(_RUNTIME_KEY)
    if not isinstance(runtime, TokensRuntime):
        runtime = attrs[_RUNTIME_KEY] = TokensRuntime()
    return runtime


def ctx_runtime(ctx: ChatContext) -> TokensRuntime:
    if ctx.gateway is not None:
        return runtime_of(ctx.gateway)
    # Outside a gateway (unit tests): per session, so a session's calls still share one renderer.
    runtime = ctx.state.get(_RUNTIME_KEY)
    if not isinstance(runtime, TokensRuntime):
        runtime = ctx.state[_RUNTIME_KEY] = TokensRuntime()
    return runtime


def kind_refusal(backend: Backend) -> str:
    return (
        f"capture='tokens' needs a token-in backend (vllm, sglang or tinker); backend "
        f"{backend.name!r} at {backend.url} is kind {backend.kind!r}. Register the server with "
        "kind='vllm', 'sglang' or 'tinker', or create the session with capture='passthrough'"
    )


async def check_session(
    metadata: Mapping[str, Any] | None,
    backend: Backend | None,
    *,
    gateway: GatewayPort | None = None,
) -> None:
    """Check, when a ``capture="tokens"`` session is created, that its calls can be served.

    Resolves the tokenizer and chat template exactly as a request would (``metadata["tokenizer"]``,
    ``$ROLLWIRE_TOKENIZER``, what ``backend`` advertises) and raises ``ValueError`` saying what to
    do when none is found, it cannot be loaded, ``backend`` is not token-in, or no tool-call parser
    matches the template. Pass ``gateway`` to reuse its HTTP client and renderer cache.
    """
    if backend is not None and backend.kind not in TOKEN_KINDS:
        raise ValueError(kind_refusal(backend))
    runtime = runtime_of(gateway)
    info = BackendInfo(None, None)
    if backend is not None:
        if gateway is not None:
            await runtime.check_token_route(gateway.http, backend)
            info = await runtime.describe(gateway.http, backend.url)
        else:
            async with aiohttp.ClientSession() as http:
                await runtime.check_token_route(http, backend)
                info = await runtime.describe(http, backend.url)
    try:
        source = tokenizer_source(
            metadata, info, backend.url if backend else None, backend.tokenizer if backend else None
        )
        renderer = await runtime.renderer(source)
    except LookupError as exc:
        raise ValueError(str(exc)) from exc
    except MissingTokensExtra as exc:
        raise ValueError(str(exc)) from exc
    check_template_supported(renderer, tools=True)


def tokenizer_source(
    metadata: Mapping[str, Any] | None,
    info: BackendInfo,
    backend_url: str | None,
    backend_tokenizer: str | None = None,
) -> str:
    """The tokenizer to render with: the session's ``metadata["tokenizer"]``, the backend's own
    setting (``BackendSpec.tokenizer``), ``$ROLLWIRE_TOKENIZER``, then what the backend advertises."""
    meta = metadata or {}
    env = os.environ.get("ROLLWIRE_TOKENIZER")
    for candidate in (meta.get("tokenizer"), backend_tokenizer, env, info.tokenizer):
        if candidate:
            return str(candidate)
    where = f"backend {backend_url} does not name one" if backend_url else "no backend names one"
    raise LookupError(
        f"capture='tokens' needs the model's tokenizer and {where}: create the session with "
        "metadata={'tokenizer': '/path/to/hf/folder'} or set ROLLWIRE_TOKENIZER"
    )
