"""Server-sent-event streams of the OpenAI routes (``stream: true``), and the per-request
rendering of tokens and log-probs shared with the non-streamed responses."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from .faults import FaultDraw
from .http import _CutStream, _sse, _SSEResponse
from .parsing import StreamParser
from .runtime import Engine
from .sampling import SamplingParams
from .scheduler import Completion, TokenEvent
from .validation import _bool

__all__: list[str] = []


class _Renderer:
    """Per-request formatting of tokens and log-probs in vLLM's chat shapes."""

    def __init__(self, engine: Engine, as_ids: bool) -> None:
        self.tok = engine.tokenizer
        self.as_ids = as_ids

    def token(self, tid: int) -> str:
        return f"token_id:{tid}" if self.as_ids else self.tok.token_text(tid)

    def entry(self, tid: int, lp: float, top: list[tuple[int, float]] | None) -> dict[str, Any]:
        return {
            "token": self.token(tid),
            "logprob": max(lp, -9999.0),
            "bytes": list(self.tok.token_bytes(tid)),
            "top_logprobs": [
                {
                    "token": self.token(t),
                    "logprob": max(v, -9999.0),
                    "bytes": list(self.tok.token_bytes(t)),
                }
                for t, v in (top or [])
            ],
        }

    def prompt_logprobs(self, c: Completion) -> list[dict[str, Any] | None] | None:
        if c.prompt_logprobs is None:
            return None
        out: list[dict[str, Any] | None] = []
        for item in c.prompt_logprobs:
            if item is None:
                out.append(None)
                continue
            tid, lp, rank, top = item
            d: dict[str, Any] = {
                str(tid): {"logprob": lp, "rank": rank, "decoded_token": self.tok.decode([tid])}
            }
            for r, (t, v) in enumerate(top, start=1):
                d.setdefault(
                    str(t), {"logprob": v, "rank": r, "decoded_token": self.tok.decode([t])}
                )
            out.append(d)
        return out


class _TextStream:
    """Incremental detokenization that never emits half a UTF-8 character or part of a stop string."""

    def __init__(self, engine: Engine, params: SamplingParams) -> None:
        self.tok = engine.tokenizer
        self.params = params
        self.ids: list[int] = []
        self.hold = max((len(s) for s in params.stop), default=1) - 1

    def visible(self, final_text: str | None = None) -> str:
        if final_text is not None:
            return final_text
        text = self.tok.decode(self.ids, skip_special_tokens=self.params.skip_special_tokens)
        while text.endswith("\ufffd"):
            text = text[:-1]
        return text[: len(text) - self.hold] if self.hold else text


def _error_event(ev: Exception) -> bytes:
    return _sse({"error": {"message": str(ev), "type": "InternalServerError", "code": 500}})


class _Chunker:
    """Frames SSE chunks of one streamed response (``id``, ``object``, ``created``, ``model``)."""

    def __init__(self, kind: str, rid: str, created: int, name: str) -> None:
        self.head = {"id": rid, "object": kind, "created": created, "model": name}

    def __call__(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return _sse({**self.head, "choices": choices, **extra})


class _StreamState:
    """What a streamed response's driver (:func:`_sse_stream`) needs from its route: the chunks
    that open it, the chunks of each token and of each finished choice, and its usage block."""

    def __init__(self, chunk: _Chunker) -> None:
        self.chunk = chunk
        self.sent = 0
        self.completion_tokens = 0
        self.output_ids: list[int] = []

    def opening(self) -> list[bytes]:
        return []

    def on_token(self, i: int, ev: TokenEvent) -> list[bytes]:
        raise NotImplementedError

    def on_done(self, i: int, ev: Completion) -> list[bytes]:
        raise NotImplementedError

    def usage(self, prompt_ids: list[int]) -> dict[str, Any]:
        tokens = self.completion_tokens
        return {
            "prompt_tokens": len(prompt_ids),
            "total_tokens": len(prompt_ids) + tokens,
            "completion_tokens": tokens,
        }

    def finished(self, i: int, ev: Completion) -> list[bytes]:
        self.completion_tokens += len(ev.output_ids)
        if i == 0:
            self.output_ids = list(ev.output_ids)
        return self.on_done(i, ev)


async def _sse_stream(
    engine: Engine,
    body: dict[str, Any],
    prompt_ids: list[int],
    params: list[SamplingParams],
    forced: list[int] | None,
    state: _StreamState,
    draw: FaultDraw,
) -> Response:
    """The SSE response of one streamed chat or completions request: the route's chunks, then
    SGLang's ``sglext`` chunk and the usage chunk when asked, then ``[DONE]``."""
    model = body.get("model")  # checked by the route: a string or None
    reqs, q = await engine.generate_many(
        prompt_ids, params, forced=forced, stream=True, model=model
    )
    sglext = _bool(body, "return_output_ids_in_sglext", False) and not draw.drop_token_ids
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

    async def gen() -> AsyncIterator[bytes]:
        done = 0
        try:
            for c in state.opening():
                yield c
            while done < len(params):
                i, ev = await q.get()
                if isinstance(ev, Exception):
                    yield _error_event(ev)
                    return
                if isinstance(ev, TokenEvent):
                    for c in state.on_token(i, ev):
                        yield c
                    if draw.truncate_stream and state.sent >= 2:
                        raise _CutStream  # injected fault: the connection drops mid-body
                elif isinstance(ev, Completion):
                    done += 1
                    for c in state.finished(i, ev):
                        yield c
            if draw.truncate_stream:
                raise _CutStream
            if sglext:
                ids = {"input_ids": prompt_ids, "output_ids": state.output_ids}
                yield state.chunk([], sglext=ids)
            if include_usage:
                yield state.chunk([], usage=state.usage(prompt_ids))
            yield b"data: [DONE]\n\n"
        finally:
            for r in reqs:
                r.abort()

    return _SSEResponse(gen(), media_type="text/event-stream")


# ---------------------------------------------------------------------- chat stream
class _ChatStream(_StreamState):
    """One streamed chat response (``chat.completion.chunk``)."""

    def __init__(
        self, engine: Engine, body: dict[str, Any], params: list[SamplingParams],
        parse_tools: bool, render: _Renderer, chunk: _Chunker, draw: FaultDraw,
        prompt_ids: list[int],
    ) -> None:  # fmt: skip
        super().__init__(chunk)
        self.n = len(params)
        self.body = body
        self.render = render
        self.prompt_ids = prompt_ids
        self.ret_ids = _bool(body, "return_token_ids", False) and not draw.drop_token_ids
        self.want_lp = params[0].logprobs is not None
        self.texts = [_TextStream(engine, p) for p in params]
        self.parsers = [StreamParser(parse_tools=parse_tools) for _ in params]
        self.tool_seen = [False] * self.n

    def opening(self) -> list[bytes]:
        first_extra = {"prompt_token_ids": self.prompt_ids} if self.ret_ids else {}
        choices = [
            {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
             "finish_reason": None}
            for i in range(self.n)
        ]  # fmt: skip
        return [self.chunk(choices, **first_extra)]

    def _choice(self, i: int, delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
        c: dict[str, Any] = {"index": i, "delta": delta, "logprobs": None, "finish_reason": None}
        c.update(extra)
        if self.ret_ids:
            c.setdefault("token_ids", [])
        return c

    def on_token(self, i: int, ev: TokenEvent) -> list[bytes]:
        self.texts[i].ids.append(ev.token_id)
        frags = self.parsers[i].feed(self.texts[i].visible())
        lp = (
            {"content": [self.render.entry(ev.token_id, ev.logprob, ev.top)]}
            if self.want_lp
            else None
        )
        first = self._choice(i, frags[0] if frags else {}, logprobs=lp)
        if self.ret_ids:
            first["token_ids"] = [ev.token_id]
        out = [self.chunk([first])]
        out += [self.chunk([self._choice(i, frag)]) for frag in frags[1:]]
        self.tool_seen[i] = self.tool_seen[i] or any("tool_calls" in f for f in frags)
        self.sent += 1
        return out

    def on_done(self, i: int, ev: Completion) -> list[bytes]:
        frags = self.parsers[i].feed(self.texts[i].visible(ev.text), final=True)
        self.tool_seen[i] = self.tool_seen[i] or any("tool_calls" in f for f in frags)
        out = [self.chunk([self._choice(i, frag)]) for frag in frags]
        stop = "tool_calls" if self.tool_seen[i] and ev.finish_reason == "stop" else None
        last = self._choice(
            i, {}, finish_reason=stop or ev.finish_reason, stop_reason=ev.stop_reason
        )
        if _bool(self.body, "return_weight_versions", False):
            last["weight_versions"] = ev.weight_versions()
        out.append(self.chunk([last]))
        return out

    def usage(self, prompt_ids: list[int]) -> dict[str, Any]:
        return {**super().usage(prompt_ids), "prompt_tokens_details": None}


async def _chat_stream(
    engine: Engine,
    request: Request,
    body: dict[str, Any],
    prompt_ids: list[int],
    params: list[SamplingParams],
    forced: list[int] | None,
    parse_tools: bool,
    render: _Renderer,
    rid: str,
    created: int,
    name: str,
    draw: FaultDraw,
) -> Response:
    chunk = _Chunker("chat.completion.chunk", rid, created, name)
    state = _ChatStream(engine, body, params, parse_tools, render, chunk, draw, prompt_ids)
    return await _sse_stream(engine, body, prompt_ids, params, forced, state, draw)


# ---------------------------------------------------------------------- completions stream
class _CompletionStream(_StreamState):
    """One streamed completions response (``text_completion``)."""

    def __init__(
        self, engine: Engine, params: list[SamplingParams], prompt_ids: list[int],
        render: _Renderer, chunk: _Chunker, ret_ids: bool,
    ) -> None:  # fmt: skip
        super().__init__(chunk)
        self.params = params
        self.prompt_ids = prompt_ids
        self.render = render
        self.ret_ids = ret_ids
        self.texts = [_TextStream(engine, p) for p in params]
        self.emitted = [""] * len(params)
        self.first = [True] * len(params)

    def on_token(self, i: int, ev: TokenEvent) -> list[bytes]:
        self.texts[i].ids.append(ev.token_id)
        vis = self.texts[i].visible()
        delta, self.emitted[i] = vis[len(self.emitted[i]) :], vis
        c: dict[str, Any] = {"index": i, "text": delta, "logprobs": None, "finish_reason": None}
        if self.params[i].logprobs is not None:
            s = self.render.token(ev.token_id)
            top = {self.render.token(t): v for t, v in ev.top or []}
            top.setdefault(s, ev.logprob)
            c["logprobs"] = {
                "tokens": [s],
                "token_logprobs": [ev.logprob],
                "top_logprobs": [top],
                "text_offset": [0],
            }
        if self.ret_ids:
            c["token_ids"] = [ev.token_id]
            if self.first[i]:
                c["prompt_token_ids"] = self.prompt_ids
        self.first[i] = False
        self.sent += 1
        return [self.chunk([c])]

    def on_done(self, i: int, ev: Completion) -> list[bytes]:
        rest = ev.text[len(self.emitted[i]) :] if ev.text.startswith(self.emitted[i]) else ""
        last: dict[str, Any] = {
            "index": i,
            "text": rest,
            "logprobs": None,
            "finish_reason": ev.finish_reason,
            "stop_reason": ev.stop_reason,
        }
        if self.ret_ids:
            last["token_ids"] = []
        return [self.chunk([last])]


async def _completions_stream(
    engine: Engine,
    body: dict[str, Any],
    prompt_ids: list[int],
    params: list[SamplingParams],
    forced: list[int] | None,
    render: _Renderer,
    rid: str,
    created: int,
    name: str,
    draw: FaultDraw,
) -> Response:
    ret_ids = _bool(body, "return_token_ids", False) and not draw.drop_token_ids
    chunk = _Chunker("text_completion", rid, created, name)
    state = _CompletionStream(engine, params, prompt_ids, render, chunk, ret_ids)
    return await _sse_stream(engine, body, prompt_ids, params, forced, state, draw)
