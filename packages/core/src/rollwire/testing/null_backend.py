"""A null inference backend: answers vLLM-/SGLang-shaped responses instantly, without a model.

For the gateway's tests and benchmarks. ``fixed`` mode returns one precomputed body (~512 prompt
ids, 64 completion ids with log-probs); ``echo`` mode "tokenizes" the messages byte-wise so that
each turn's prompt extends the previous prompt + completion, like a real chat template does.
Run standalone: ``python -m rollwire.testing.null_backend --port 8001 [--fixed] [--kind sglang]``.
"""

from __future__ import annotations

import asyncio
import base64
import io
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

__all__ = ["NullBackend", "render_ids"]

ROLE_IDS = {"system": 300, "user": 301, "assistant": 302, "tool": 303}
END_ID = 310


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content or "")


def render_ids(messages: list[dict[str, Any]]) -> list[int]:
    """Byte-level "chat template": role id, content bytes, end id per message; then the
    assistant generation prompt. The completion of a turn is its bytes + end id, so the next
    prompt extends prompt + completion exactly."""
    ids: list[int] = []
    for m in messages:
        ids.append(ROLE_IDS.get(m.get("role", "user"), 304))
        ids.extend(_text(m.get("content")).encode())
        for tc in m.get("tool_calls") or ():
            ids.extend(orjson.dumps(tc.get("function", {})))
        ids.append(END_ID)
    ids.append(ROLE_IDS["assistant"])
    return ids


def _logprob(tok: int) -> float:
    return -((tok * 7919) % 1000) / 1000.0 - 0.001


Reply = Callable[[dict[str, Any]], dict[str, Any]]


def default_reply(body: dict[str, Any]) -> dict[str, Any]:
    """Answer with a short text that depends on the number of messages."""
    n = len(body.get("messages") or [])
    return {"content": f"reply {n}: " + "lorem ipsum " * 4}


class NullBackend:
    """The ASGI app. ``requests`` keeps the last parsed request bodies and headers."""

    def __init__(
        self,
        *,
        fixed: bool = False,
        kind: str = "vllm",
        reply: Reply | None = None,
        routed_experts: tuple[int, int] | None = None,
        prompt_tokens: int = 512,
        completion_tokens: int = 64,
        delay: float = 0.0,
        keep_requests: int = 64,
    ) -> None:
        self.fixed = fixed
        self.kind = kind
        self.reply = reply or default_reply
        self.routed_experts = routed_experts
        self.delay = delay
        self.requests: list[tuple[dict[str, Any], dict[str, str]]] = []
        self._keep = keep_requests
        self.calls = 0
        self._fixed_body = b""
        if fixed:
            prompt = [(i * 31) % 50000 for i in range(prompt_tokens)]
            completion = [(i * 17 + 5) % 50000 for i in range(completion_tokens)]
            self._fixed_body = orjson.dumps(
                self._chat_body(prompt, completion, "x " * completion_tokens, None, {})
            )

    # ------------------------------------------------------------------ shapes
    def _experts(self, n_tokens: int) -> str | None:
        if self.routed_experts is None or n_tokens < 2:
            return None
        layers, k = self.routed_experts
        arr = (np.arange((n_tokens - 1) * layers * k, dtype=np.int16) % 64).reshape(
            n_tokens - 1, layers, k
        )
        buf = io.BytesIO()
        np.save(buf, arr, allow_pickle=False)
        return base64.b64encode(buf.getvalue()).decode()

    def _chat_body(
        self,
        prompt: list[int],
        completion: list[int],
        text: str,
        tool_calls: list[dict[str, Any]] | None,
        req: dict[str, Any],
    ) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": text, "tool_calls": []}
        finish = "stop"
        if tool_calls:
            message["tool_calls"] = tool_calls
            message["content"] = text or None
            finish = "tool_calls"
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": {
                "content": [
                    {
                        "token": f"token_id:{t}",
                        "logprob": _logprob(t),
                        "bytes": None,
                        "top_logprobs": [],
                    }
                    for t in completion
                ]
            },
            "finish_reason": finish,
            "stop_reason": None,
        }
        body: dict[str, Any] = {
            "id": "chatcmpl-null",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.get("model") or "null",
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(completion),
                "total_tokens": len(prompt) + len(completion),
            },
        }
        if self.kind == "sglang":
            choice["prompt_token_ids"] = prompt
            choice["response_token_ids"] = completion
        else:
            body["prompt_token_ids"] = prompt
            choice["token_ids"] = completion
            experts = self._experts(len(prompt) + len(completion))
            if experts is not None:
                choice["routed_experts"] = experts
        return body

    def _answer(self, req: dict[str, Any]) -> tuple[list[int], list[int], str, Any]:
        if "messages" in req:
            prompt = render_ids(req["messages"])
        else:
            p = req.get("prompt")
            prompt = list(p) if isinstance(p, list) else list(str(p or "").encode())
        out = self.reply(req)
        text = out.get("content") or ""
        tool_calls = out.get("tool_calls")
        completion = list(text.encode())
        for tc in tool_calls or ():
            completion.extend(orjson.dumps(tc.get("function", {})))
        completion.append(END_ID)
        max_tokens = req.get("max_tokens")
        if isinstance(max_tokens, int) and max_tokens < len(completion):
            completion = completion[:max_tokens]
        return prompt, completion, text, tool_calls

    # ------------------------------------------------------------------ ASGI
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        path = scope["path"]
        if scope["method"] == "GET":
            if path == "/health":
                await _send(send, 200, b"{}")
            elif path == "/v1/models":
                await _send(send, 200, b'{"object":"list","data":[{"id":"null","object":"model"}]}')
            else:
                await _send(send, 404, b'{"error":{"message":"not found"}}')
            return
        raw = b""
        while True:
            msg = await receive()
            raw += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        self.calls += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fixed:
            await _send(send, 200, self._fixed_body)
            return
        req = orjson.loads(raw)
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.requests.append((req, headers))
        del self.requests[: -self._keep]
        if req.get("tools") == [] and self.kind == "vllm":
            await _send(send, 400, b'{"error":{"message":"empty tools","type":"BadRequest"}}')
            return
        prompt, completion, text, tool_calls = self._answer(req)
        if path == "/v1/completions":
            body = {
                "id": "cmpl-null",
                "object": "text_completion",
                "model": "null",
                "choices": [
                    {
                        "index": 0,
                        "text": text,
                        "token_ids": completion,
                        "prompt_token_ids": prompt,
                        "logprobs": {"token_logprobs": [_logprob(t) for t in completion]},
                        "finish_reason": "stop",
                    }
                ],
            }
            if req.get("stream"):
                await self._stream_completions(send, body)
            else:
                await _send(send, 200, orjson.dumps(body))
            return
        if req.get("stream"):
            await self._stream_chat(send, req, prompt, completion, text, tool_calls)
            return
        await _send(
            send, 200, orjson.dumps(self._chat_body(prompt, completion, text, tool_calls, req))
        )

    async def _stream_chat(
        self,
        send: Any,
        req: dict[str, Any],
        prompt: list[int],
        completion: list[int],
        text: str,
        tool_calls: list[dict[str, Any]] | None,
    ) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )

        async def event(obj: Any) -> None:
            await send(
                {
                    "type": "http.response.body",
                    "body": b"data: " + orjson.dumps(obj) + b"\n\n",
                    "more_body": True,
                }
            )

        head = {
            "id": "chatcmpl-null",
            "object": "chat.completion.chunk",
            "model": "null",
            "created": int(time.time()),
        }
        sglang = self.kind == "sglang"
        first = dict(
            head,
            choices=[
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        )
        if not sglang:
            first["prompt_token_ids"] = prompt
        await event(first)
        pieces, pos = _stream_pieces(text, completion, tool_calls)
        rest = completion[pos:]
        for delta, toks in pieces:
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "finish_reason": None,
                "logprobs": {
                    "content": [{"token": f"token_id:{t}", "logprob": _logprob(t)} for t in toks]
                },
            }
            if not sglang:
                choice["token_ids"] = toks
            await event(dict(head, choices=[choice]))
        last: dict[str, Any] = {
            "index": 0,
            "delta": {},
            "finish_reason": "tool_calls" if tool_calls else "stop",
            "logprobs": {
                "content": [{"token": f"token_id:{t}", "logprob": _logprob(t)} for t in rest]
            },
        }
        if not sglang:
            last["token_ids"] = rest
        await event(dict(head, choices=[last]))
        if sglang and req.get("return_output_ids_in_sglext"):
            await event(
                dict(head, choices=[], sglext={"input_ids": prompt, "output_ids": completion})
            )
        if (req.get("stream_options") or {}).get("include_usage"):
            await event(
                dict(
                    head,
                    choices=[],
                    usage={"prompt_tokens": len(prompt), "completion_tokens": len(completion)},
                )
            )
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    async def _stream_completions(self, send: Any, body: dict[str, Any]) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        choice = body["choices"][0]
        chunk = {
            "id": "cmpl-null",
            "object": "text_completion",
            "model": "null",
            "choices": [
                dict(
                    choice,
                    finish_reason=None,
                    token_ids=choice["token_ids"][:2],
                    logprobs={"token_logprobs": choice["logprobs"]["token_logprobs"][:2]},
                    text=choice["text"][:2],
                )
            ],
        }
        chunk2 = {
            "id": "cmpl-null",
            "object": "text_completion",
            "model": "null",
            "choices": [
                {
                    "index": 0,
                    "text": choice["text"][2:],
                    "token_ids": choice["token_ids"][2:],
                    "logprobs": {"token_logprobs": choice["logprobs"]["token_logprobs"][2:]},
                    "finish_reason": "stop",
                }
            ],
        }
        for c in (chunk, chunk2):
            await send(
                {
                    "type": "http.response.body",
                    "body": b"data: " + orjson.dumps(c) + b"\n\n",
                    "more_body": True,
                }
            )
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


async def _send(send: Any, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    """Serve a null backend (for benchmarks)."""
    import argparse

    import uvicorn

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--fixed", action="store_true")
    p.add_argument("--kind", default="vllm", choices=["vllm", "sglang"])
    a = p.parse_args()
    uvicorn.run(
        NullBackend(fixed=a.fixed, kind=a.kind),
        host=a.host,
        port=a.port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()


def _stream_pieces(
    text: str, completion: list[int], tool_calls: list[dict[str, Any]] | None
) -> tuple[list[tuple[dict[str, Any], list[int]]], int]:
    """The stream's deltas with the token ids each carries (text 4 tokens a chunk, then each
    tool call in three pieces, by index), and how many completion ids they used."""
    pieces: list[tuple[dict[str, Any], list[int]]] = []
    tb = text.encode()
    n_text = len(tb)
    for i in range(0, n_text, 4):
        pieces.append(
            ({"content": tb[i : i + 4].decode(errors="ignore")}, completion[i : min(i + 4, n_text)])
        )
    pos = n_text
    for idx, tc in enumerate(tool_calls or ()):
        fn = tc.get("function", {})
        args = fn.get("arguments", "")
        n = len(orjson.dumps(fn))
        toks = completion[pos : pos + n]
        pos += n
        half = len(args) // 2
        opening = {"name": fn.get("name"), "arguments": ""}
        head = {"index": idx, "id": tc.get("id"), "type": "function", "function": opening}
        pieces.append(({"tool_calls": [head]}, toks[: n // 3]))
        first = {"index": idx, "function": {"arguments": args[:half]}}
        pieces.append(({"tool_calls": [first]}, toks[n // 3 : 2 * n // 3]))
        second = {"index": idx, "function": {"arguments": args[half:]}}
        pieces.append(({"tool_calls": [second]}, toks[2 * n // 3 :]))
    return pieces, pos
