"""Route shapes against SERVER_APIS.md, over real HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from rollwire.engine import EmbeddedEngine, EngineConfig

from .conftest import TOOLS

MSGS = [{"role": "user", "content": "Say something."}]


def _post(eng: EmbeddedEngine, path: str, body: dict[str, Any], **kw: Any) -> httpx.Response:
    return httpx.post(eng.url + path, json=body, timeout=30, **kw)


def _stream(
    eng: EmbeddedEngine, path: str, body: dict[str, Any], **kw: Any
) -> tuple[list[dict[str, Any]], bool]:
    chunks: list[dict[str, Any]] = []
    done = False
    with httpx.stream("POST", eng.url + path, json={**body, "stream": True}, timeout=30, **kw) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line:
                continue
            assert line.startswith("data: ")
            payload = line[len("data: ") :]
            if payload == "[DONE]":
                done = True
                continue
            assert not done, "data after [DONE]"
            chunks.append(json.loads(payload))
    return chunks, done


def _npy(b64: str) -> np.ndarray:
    return np.load(io.BytesIO(base64.b64decode(b64)), allow_pickle=False)


# ---------------------------------------------------------------- chat, non-streaming
def test_chat_shape(engine: EmbeddedEngine) -> None:
    body = {
        "model": "rollwire-tiny",
        "messages": MSGS,
        "max_tokens": 12,
        "logprobs": True,
        "top_logprobs": 3,
        "return_token_ids": True,
        "return_weight_versions": True,
        "seed": 7,
    }
    d = _post(engine, "/v1/chat/completions", body).json()
    assert d["object"] == "chat.completion" and d["id"].startswith("chatcmpl-")
    assert d["model"] == "rollwire-tiny" and isinstance(d["created"], int)
    tok = engine.tokenizer
    assert d["prompt_token_ids"] == tok.apply_chat_template(MSGS)
    [ch] = d["choices"]
    assert ch["index"] == 0
    msg = ch["message"]
    assert msg["role"] == "assistant" and msg["tool_calls"] == [] and "reasoning" in msg
    ids = ch["token_ids"]
    content = ch["logprobs"]["content"]
    assert len(ids) == len(content) == d["usage"]["completion_tokens"]
    assert d["usage"]["prompt_tokens"] == len(d["prompt_token_ids"])
    assert (
        d["usage"]["total_tokens"] == d["usage"]["prompt_tokens"] + d["usage"]["completion_tokens"]
    )
    assert ch["finish_reason"] in ("stop", "length") and "stop_reason" in ch
    for tid, entry in zip(ids, content):
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["logprob"] <= 0 and len(entry["top_logprobs"]) == 3
        assert bytes(entry["bytes"]) == tok.token_bytes(tid)
        tops = [t["logprob"] for t in entry["top_logprobs"]]
        assert tops == sorted(tops, reverse=True) and entry["logprob"] <= tops[0] + 1e-9
    text = tok.decode(ids, skip_special_tokens=True)
    assert msg["content"] == text
    assert ch["weight_versions"] == [{"version": "0", "start": 0, "end": len(ids)}]
    experts = _npy(ch["routed_experts"])
    assert experts.shape == (len(d["prompt_token_ids"]) + len(ids) - 1, 4, 2)
    assert experts.dtype == np.int32 and experts.min() >= 0 and experts.max() < 8
    # Same seed, same tokens.
    again = _post(engine, "/v1/chat/completions", body).json()
    assert again["choices"][0]["token_ids"] == ids


def test_chat_defaults_and_errors(engine: EmbeddedEngine) -> None:
    d = _post(engine, "/v1/chat/completions", {"messages": MSGS, "max_tokens": 3}).json()
    ch = d["choices"][0]
    assert d["prompt_token_ids"] is None and ch["token_ids"] is None and ch["logprobs"] is None
    r = _post(engine, "/v1/chat/completions", {"messages": MSGS, "tools": []})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == 400 and "tools" in err["message"] and err["type"] == "BadRequestError"
    assert _post(engine, "/v1/chat/completions", {"messages": []}).status_code == 400
    r = httpx.post(engine.url + "/v1/chat/completions", content=b"{nope", timeout=10)
    assert r.status_code == 400


def test_chat_n_stop_and_ignore_eos(engine: EmbeddedEngine) -> None:
    d = _post(
        engine,
        "/v1/chat/completions",
        {
            "messages": MSGS,
            "n": 3,
            "max_tokens": 5,
            "return_token_ids": True,
            "ignore_eos": True,
            "seed": 1,
        },
    ).json()
    assert [c["index"] for c in d["choices"]] == [0, 1, 2]
    assert all(len(c["token_ids"]) == 5 and c["finish_reason"] == "length" for c in d["choices"])
    assert d["usage"]["completion_tokens"] == 15
    first = d["choices"][0]["token_ids"]
    # stop_token_ids: stop on the 3rd greedy token.
    greedy = _post(
        engine,
        "/v1/chat/completions",
        {
            "messages": MSGS,
            "max_tokens": 6,
            "temperature": 0,
            "return_token_ids": True,
            "ignore_eos": True,
        },
    ).json()
    gids = greedy["choices"][0]["token_ids"]
    stop_id = gids[2]
    cut = gids.index(stop_id) + 1
    d2 = _post(
        engine,
        "/v1/chat/completions",
        {
            "messages": MSGS,
            "max_tokens": 6,
            "temperature": 0,
            "return_token_ids": True,
            "stop_token_ids": [stop_id],
            "ignore_eos": True,
        },
    ).json()
    c2 = d2["choices"][0]
    assert (
        c2["token_ids"] == gids[:cut]
        and c2["finish_reason"] == "stop"
        and c2["stop_reason"] == stop_id
    )
    # stop string: text is cut before it.
    full = engine.tokenizer.decode(gids, skip_special_tokens=True)
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    if stop.strip():
        d3 = _post(
            engine,
            "/v1/chat/completions",
            {
                "messages": MSGS,
                "max_tokens": 6,
                "temperature": 0,
                "stop": [stop],
                "ignore_eos": True,
            },
        ).json()
        c3 = d3["choices"][0]
        assert c3["finish_reason"] == "stop" and c3["stop_reason"] == stop
        assert c3["message"]["content"] == full[: full.find(stop)]
    assert first  # sampled something


# ---------------------------------------------------------------- chat, streaming
def test_chat_stream_shape(engine: EmbeddedEngine) -> None:
    body = {
        "messages": MSGS,
        "max_tokens": 10,
        "logprobs": True,
        "return_token_ids": True,
        "stream_options": {"include_usage": True},
        "seed": 3,
    }
    chunks, done = _stream(engine, "/v1/chat/completions", body)
    assert done
    first = chunks[0]
    assert first["object"] == "chat.completion.chunk"
    assert first["prompt_token_ids"] == engine.tokenizer.apply_chat_template(MSGS)
    assert first["choices"][0]["delta"]["role"] == "assistant"
    ids: list[int] = []
    lps: list[dict[str, Any]] = []
    text = ""
    finish = None
    for c in chunks[1:-1]:
        assert "prompt_token_ids" not in c and "routed_experts" not in c["choices"][0]
        ch = c["choices"][0]
        ids += ch["token_ids"]
        lps += (ch["logprobs"] or {}).get("content", [])
        text += ch["delta"].get("content") or ""
        finish = ch["finish_reason"] or finish
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(ids)
    assert len(ids) == len(lps) and finish in ("stop", "length")
    assert text == engine.tokenizer.decode(ids, skip_special_tokens=True)
    nonstream = _post(engine, "/v1/chat/completions", {**body, "stream": False}).json()
    assert nonstream["choices"][0]["token_ids"] == ids
    np.testing.assert_allclose(
        [e["logprob"] for e in lps],
        [e["logprob"] for e in nonstream["choices"][0]["logprobs"]["content"]],
        atol=1e-4,
    )


def test_openai_client_sync_and_async(engine: EmbeddedEngine) -> None:
    client = openai.OpenAI(base_url=engine.base_url, api_key="x", max_retries=0)
    r = client.chat.completions.create(
        model="rollwire-tiny", messages=MSGS, max_tokens=5, logprobs=True
    )  # type: ignore[arg-type]
    assert (
        r.choices[0].logprobs is not None
        and len(r.choices[0].logprobs.content or []) == r.usage.completion_tokens
    )  # type: ignore[union-attr]
    assert [m.id for m in client.models.list()] == ["rollwire-tiny"]
    stream = client.chat.completions.create(
        model="rollwire-tiny",
        messages=MSGS,
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},  # type: ignore[arg-type]
    )
    assert sum(1 for _ in stream) >= 3

    async def go() -> None:
        ac = openai.AsyncOpenAI(base_url=engine.base_url, api_key="x", max_retries=0)
        rs = await asyncio.gather(
            *[
                ac.chat.completions.create(
                    model="rollwire-tiny",
                    messages=MSGS,
                    max_tokens=8,
                    extra_body={"return_token_ids": True},
                )
                for _ in range(4)
            ]  # type: ignore[arg-type]
        )
        for x in rs:
            assert len(x.choices[0].token_ids) == x.usage.completion_tokens  # type: ignore[attr-defined,union-attr]
        await ac.close()

    asyncio.run(go())
    client.close()


# ---------------------------------------------------------------- scripted mode
def test_scripted_tool_call(engine: EmbeddedEngine) -> None:
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    d = _post(
        engine,
        "/v1/chat/completions",
        {
            "messages": msgs,
            "tools": TOOLS,
            "logprobs": True,
            "return_token_ids": True,
            "temperature": 0.7,
        },
    ).json()
    ch = d["choices"][0]
    expected = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    tok = engine.tokenizer
    assert ch["token_ids"] == [*tok.encode(expected), tok.eos_id]
    assert ch["finish_reason"] == "tool_calls"
    [call] = ch["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert ch["message"]["content"] is None
    # Log-probs are the model's real ones: a teacher-forced pass gives the same numbers.
    prompt_ids = d["prompt_token_ids"]
    c = _post(
        engine,
        "/v1/completions",
        {"prompt": prompt_ids + ch["token_ids"], "max_tokens": 1, "prompt_logprobs": 0},
    ).json()
    pl = c["choices"][0]["prompt_logprobs"]
    forced = [pl[len(prompt_ids) + i][str(t)]["logprob"] for i, t in enumerate(ch["token_ids"])]
    np.testing.assert_allclose(forced, [e["logprob"] for e in ch["logprobs"]["content"]], atol=1e-4)
    experts = _npy(ch["routed_experts"])
    assert experts.shape == (len(prompt_ids) + len(ch["token_ids"]) - 1, 4, 2)

    chunks, done = _stream(
        engine, "/v1/chat/completions", {"messages": msgs, "tools": TOOLS, "return_token_ids": True}
    )
    assert done
    calls = [
        tc
        for c in chunks
        for ch2 in c["choices"]
        for tc in (ch2.get("delta") or {}).get("tool_calls") or []
    ]
    assert (
        calls[0]["index"] == 0
        and calls[0]["id"].startswith("call_")
        and calls[0]["function"]["name"] == "get_weather"
    )
    assert "".join(tc["function"]["arguments"] for tc in calls) == '{"city": "Paris"}'
    assert [
        ch2["finish_reason"] for c in chunks for ch2 in c["choices"] if ch2["finish_reason"]
    ] == ["tool_calls"]
    ids = [t for c in chunks for ch2 in c["choices"] for t in ch2.get("token_ids", [])]
    assert ids == [*tok.encode(expected), tok.eos_id]


def test_scripted_sessions_and_tool_choice_none(engine: EmbeddedEngine) -> None:
    r1 = _post(
        engine, "/v1/chat/completions", {"messages": MSGS}, headers={"X-Session-ID": "sess-A"}
    ).json()
    assert r1["choices"][0]["message"]["content"] == "First scripted reply."
    assert r1["choices"][0]["finish_reason"] == "stop"
    r2 = _post(engine, "/v1/chat/completions", {"messages": MSGS, "session_id": "sess-A"}).json()
    msg = r2["choices"][0]["message"]
    assert (
        msg["content"] == "Second reply."
        and msg["reasoning"] == "plan"
        and msg["reasoning_content"] == "plan"
    )
    msgs = [{"role": "user", "content": "weather in Oslo"}]
    r3 = _post(
        engine, "/v1/chat/completions", {"messages": msgs, "tools": TOOLS, "tool_choice": "none"}
    ).json()
    assert r3["choices"][0]["message"]["tool_calls"] == []
    assert "<tool_call>" in r3["choices"][0]["message"]["content"]


def test_scripted_callable() -> None:
    def script(messages: list[dict[str, Any]], tools: Any) -> str | None:
        return "callable says hi" if "hi" in messages[-1]["content"] else None

    with EmbeddedEngine(EngineConfig(scripted=script, logprobs_mode="processed")) as eng:
        d = _post(
            eng,
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "hi"}],
                "temperature": 0.5,
                "logprobs": True,
                "return_token_ids": True,
            },
        ).json()
        assert d["choices"][0]["message"]["content"] == "callable says hi"
        ids = d["prompt_token_ids"] + d["choices"][0]["token_ids"]
        c = _post(
            eng,
            "/v1/completions",
            {"prompt": ids, "max_tokens": 1, "prompt_logprobs": 0, "temperature": 0.5},
        ).json()
        pl = c["choices"][0]["prompt_logprobs"]
        p = len(d["prompt_token_ids"])
        got = [pl[p + i][str(t)]["logprob"] for i, t in enumerate(d["choices"][0]["token_ids"])]
        np.testing.assert_allclose(
            got, [e["logprob"] for e in d["choices"][0]["logprobs"]["content"]], atol=1e-4
        )


# ---------------------------------------------------------------- log-prob semantics
@pytest.fixture(scope="module")
def processed_engine() -> Iterator[EmbeddedEngine]:
    with EmbeddedEngine(EngineConfig(logprobs_mode="processed")) as eng:
        yield eng


@pytest.mark.parametrize("mode", ["raw", "processed"])
def test_prompt_logprobs_reproduce_sampled(
    mode: str, engine: EmbeddedEngine, processed_engine: EmbeddedEngine
) -> None:
    eng = engine if mode == "raw" else processed_engine
    body = {
        "messages": MSGS,
        "max_tokens": 24,
        "temperature": 0.8,
        "logprobs": True,
        "return_token_ids": True,
        "seed": 11,
        "ignore_eos": True,
    }
    d = _post(eng, "/v1/chat/completions", body).json()
    ch = d["choices"][0]
    ids = d["prompt_token_ids"] + ch["token_ids"]
    c = _post(
        eng,
        "/v1/completions",
        {"prompt": ids, "max_tokens": 1, "prompt_logprobs": 1, "temperature": 0.8},
    ).json()
    pl = c["choices"][0]["prompt_logprobs"]
    assert pl[0] is None and len(pl) == len(ids)
    p = len(d["prompt_token_ids"])
    got = [pl[p + i][str(t)]["logprob"] for i, t in enumerate(ch["token_ids"])]
    np.testing.assert_allclose(got, [e["logprob"] for e in ch["logprobs"]["content"]], atol=1e-4)
    assert set(pl[1][str(ids[1])]) == {"logprob", "rank", "decoded_token"}


def test_modes_differ(engine: EmbeddedEngine, processed_engine: EmbeddedEngine) -> None:
    body = {
        "messages": MSGS,
        "max_tokens": 4,
        "temperature": 0.5,
        "logprobs": True,
        "seed": 5,
        "return_token_ids": True,
    }
    raw = _post(engine, "/v1/chat/completions", body).json()["choices"][0]
    proc = _post(processed_engine, "/v1/chat/completions", body).json()["choices"][0]
    assert raw["token_ids"] == proc["token_ids"]
    assert raw["logprobs"]["content"][0]["logprob"] != pytest.approx(
        proc["logprobs"]["content"][0]["logprob"], abs=1e-3
    )


# ---------------------------------------------------------------- completions
def test_completions_shapes(engine: EmbeddedEngine) -> None:
    d = _post(
        engine,
        "/v1/completions",
        {
            "prompt": "The weather",
            "max_tokens": 6,
            "logprobs": 2,
            "return_token_ids": True,
            "ignore_eos": True,
        },
    ).json()
    assert d["object"] == "text_completion" and d["id"].startswith("cmpl-")
    ch = d["choices"][0]
    assert ch["prompt_token_ids"] == engine.tokenizer.encode("The weather")
    assert len(ch["token_ids"]) == 6 and ch["finish_reason"] == "length"
    lp = ch["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert (
        len(lp["tokens"])
        == len(lp["token_logprobs"])
        == len(lp["top_logprobs"])
        == len(lp["text_offset"])
        == 6
    )
    assert all(isinstance(t, dict) and len(t) >= 2 for t in lp["top_logprobs"])
    assert ch["text"] == engine.tokenizer.decode(ch["token_ids"], skip_special_tokens=True)
    d2 = _post(
        engine, "/v1/completions", {"prompt": ch["prompt_token_ids"], "max_tokens": 2}
    ).json()
    assert d2["choices"][0]["token_ids"] is None and d2["usage"]["prompt_tokens"] == len(
        ch["prompt_token_ids"]
    )
    chunks, done = _stream(
        engine,
        "/v1/completions",
        {"prompt": "The weather", "max_tokens": 4, "return_token_ids": True, "ignore_eos": True},
    )
    assert done and chunks[0]["choices"][0]["prompt_token_ids"] == ch["prompt_token_ids"]
    assert sum(len(c["choices"][0]["token_ids"]) for c in chunks) == 4


# ---------------------------------------------------------------- token-in routes
def test_inference_generate(engine: EmbeddedEngine) -> None:
    ids = engine.tokenizer.apply_chat_template(MSGS)
    body = {
        "request_id": "r-1",
        "token_ids": ids,
        "sampling_params": {"max_tokens": 5, "temperature": 0, "logprobs": 1, "ignore_eos": True},
    }
    d = _post(engine, "/inference/v1/generate", body).json()
    [ch] = d["choices"]
    assert set(ch) >= {
        "index",
        "finish_reason",
        "stop_reason",
        "token_ids",
        "routed_experts",
        "weight_versions",
        "logprobs",
    }
    assert len(ch["token_ids"]) == 5 == len(ch["logprobs"]["content"])
    e = ch["logprobs"]["content"][0]
    assert set(e) == {"token_id", "logprob", "rank", "top_logprobs"} and e["rank"] == 1  # greedy
    assert e["top_logprobs"][0]["token_id"] == e["token_id"]
    assert _npy(ch["routed_experts"]).shape == (len(ids) + 4, 4, 2)
    assert (
        _post(engine, "/inference/v1/abort_requests", {"request_ids": ["nope"]}).status_code == 200
    )


def test_sglang_generate(engine: EmbeddedEngine) -> None:
    ids = engine.tokenizer.apply_chat_template(MSGS)
    body = {
        "input_ids": ids,
        "sampling_params": {
            "max_new_tokens": 6,
            "temperature": 0.7,
            "sampling_seed": 3,
            "ignore_eos": True,
        },
        "return_logprob": True,
        "logprob_start_len": -1,
        "return_routed_experts": True,
        "rid": "sg-1",
    }
    d = _post(engine, "/generate", body).json()
    meta = d["meta_info"]
    assert meta["id"] == "sg-1" and meta["finish_reason"] == {"type": "length", "length": 6}
    assert (
        meta["prompt_tokens"] == len(ids) and meta["completion_tokens"] == len(d["output_ids"]) == 6
    )
    assert meta["weight_version"] == "0"
    assert [x[1] for x in meta["output_token_logprobs"]] == d["output_ids"]
    assert all(x[2] is None and x[0] <= 0 for x in meta["output_token_logprobs"])
    experts = np.frombuffer(base64.b64decode(meta["routed_experts"]), dtype=np.int32).reshape(
        -1, 4, 2
    )
    assert experts.shape[0] == len(ids) + 6 - 1 and experts.max() < 8
    assert d["text"] == engine.tokenizer.decode(d["output_ids"], skip_special_tokens=True)
    d2 = _post(
        engine, "/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 2}}
    ).json()
    assert d2["meta_info"]["finish_reason"]["type"] in ("stop", "length")
    # Scripted by regex through the token route (ChatML recovered from ids).
    wids = engine.tokenizer.apply_chat_template([{"role": "user", "content": "FORCE-TEXT please"}])
    d3 = _post(
        engine, "/generate", {"input_ids": wids, "sampling_params": {"max_new_tokens": 50}}
    ).json()
    assert d3["text"] == "Forced answer: 42."
    assert d3["meta_info"]["finish_reason"] == {"type": "stop", "matched": engine.tokenizer.eos_id}


# ---------------------------------------------------------------- utility routes
def test_utility_routes(engine: EmbeddedEngine) -> None:
    assert httpx.get(engine.url + "/health", timeout=30).status_code == 200
    models = httpx.get(engine.url + "/v1/models", timeout=30).json()
    assert models["object"] == "list" and models["data"][0]["id"] == "rollwire-tiny"
    t = _post(engine, "/tokenize", {"prompt": "hello world"}).json()
    assert (
        t["tokens"] == engine.tokenizer.encode("hello world")
        and t["count"] == len(t["tokens"])
        and t["max_model_len"] > 0
    )
    t2 = _post(
        engine,
        "/tokenize",
        {
            "messages": MSGS,
            "tools": TOOLS,
            "add_generation_prompt": True,
            "chat_template_kwargs": {"enable_thinking": False},
        },
    ).json()
    assert t2["tokens"] == engine.tokenizer.apply_chat_template(MSGS, TOOLS, enable_thinking=False)
    assert _post(engine, "/detokenize", {"tokens": t["tokens"]}).json() == {"prompt": "hello world"}
    info = httpx.get(engine.url + "/get_model_info", timeout=30).json()
    assert info["num_experts"] == 8 and info["top_k"] == 2


def test_weight_version(engine: EmbeddedEngine) -> None:
    assert httpx.get(engine.url + "/get_weight_version", timeout=30).json() == {
        "weight_version": "0"
    }
    assert _post(engine, "/update_weight_version", {"new_version": "7"}).json()["success"] is True
    try:
        d = _post(
            engine,
            "/v1/chat/completions",
            {"messages": MSGS, "max_tokens": 2, "return_weight_versions": True},
        ).json()
        assert d["choices"][0]["weight_versions"][0]["version"] == "7"
        g = _post(
            engine, "/generate", {"text": "x", "sampling_params": {"max_new_tokens": 1}}
        ).json()
        assert g["meta_info"]["weight_version"] == "7"
    finally:
        _post(engine, "/update_weight_version", {"new_version": "0"})


def test_pause_and_abort(engine: EmbeddedEngine) -> None:
    assert _post(engine, "/pause?mode=keep", {}).status_code == 200
    assert httpx.get(engine.url + "/is_paused", timeout=30).json() == {"is_paused": True}
    assert _post(engine, "/resume", {}).status_code == 200

    async def go() -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=30) as c:
            body = {
                "request_id": "long-1",
                "token_ids": [5, 6, 7],
                "sampling_params": {"max_tokens": 4000, "ignore_eos": True},
            }
            task = asyncio.create_task(c.post(engine.url + "/inference/v1/generate", json=body))
            await asyncio.sleep(0.2)
            await c.post(
                engine.url + "/inference/v1/abort_requests", json={"request_ids": ["long-1"]}
            )
            return (await task).json()

    d = asyncio.run(go())
    assert d["choices"][0]["finish_reason"] == "abort" and len(d["choices"][0]["token_ids"]) < 4000


def test_concurrent_requests_are_batched(engine: EmbeddedEngine) -> None:
    before = engine.engine.scheduler.steps

    async def go() -> list[Any]:
        async with httpx.AsyncClient(timeout=30) as c:
            body = {
                "messages": MSGS,
                "max_tokens": 40,
                "ignore_eos": True,
                "return_token_ids": True,
            }
            return await asyncio.gather(
                *[c.post(engine.base_url + "/chat/completions", json=body) for _ in range(8)]
            )

    rs = asyncio.run(go())
    assert all(len(r.json()["choices"][0]["token_ids"]) == 40 for r in rs)
    # 8 x 39 decode steps if run one by one; batching needs far fewer.
    assert engine.engine.scheduler.steps - before < 8 * 39 * 0.75


# ---------------------------------------------------------------- validation and errors
@pytest.mark.parametrize(
    ("body", "param", "value"),
    [
        ({"tools": 5}, "tools", "5"),
        ({"logprobs": True, "top_logprobs": "x"}, "top_logprobs", "'x'"),
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs", "21"),
        ({"n": -1}, "n", "-1"),
        ({"n": "two"}, "n", "'two'"),
        ({"max_tokens": -3}, "max_tokens", "-3"),
        ({"temperature": "hot"}, "temperature", "'hot'"),
        ({"top_p": 0}, "top_p", "0"),
        ({"stop": 7}, "stop", "7"),
        ({"stop_token_ids": ["a"]}, "stop_token_ids", "['a']"),
        ({"logprobs": "maybe"}, "logprobs", "'maybe'"),
        ({"prompt_logprobs": -2}, "prompt_logprobs", "-2"),
        ({"messages": [5]}, "messages[0]", "5"),
        ({"tool_choice": 3}, "tool_choice", "3"),
        ({"model": 3}, "model", "3"),
        ({"chat_template_kwargs": []}, "chat_template_kwargs", "[]"),
    ],
)
def test_chat_bad_fields_are_openai_400s(
    engine: EmbeddedEngine, body: dict[str, Any], param: str, value: str
) -> None:
    r = _post(engine, "/v1/chat/completions", {"messages": MSGS, "max_tokens": 2, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "BadRequestError" and err["code"] == 400 and err["param"] == param
    assert f"'{param}'" in err["message"] and value in err["message"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": "x", "logprobs": "x"}, "logprobs"),
        ("/v1/completions", {"prompt": {"a": 1}}, "prompt"),
        ("/inference/v1/generate", {"token_ids": [1], "sampling_params": []}, "sampling_params"),
        (
            "/inference/v1/generate",
            {"token_ids": [1], "sampling_params": {"max_tokens": "x"}},
            "sampling_params.max_tokens",
        ),
        ("/generate", {"text": "x", "sampling_params": {"top_k": "x"}}, "sampling_params.top_k"),
        (
            "/generate",
            {"text": "x", "top_logprobs_num": -1, "return_logprob": 1},
            "top_logprobs_num",
        ),
    ],
)
def test_token_routes_bad_fields_are_400s(
    engine: EmbeddedEngine, path: str, body: dict[str, Any], param: str
) -> None:
    r = _post(engine, path, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_unexpected_errors_are_openai_500s(
    engine: EmbeddedEngine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def boom(*a: Any, **k: Any) -> Any:
        raise ValueError("kaboom")

    # In a handler: a 500 with the exception text, logged.
    monkeypatch.setattr(engine.engine.tokenizer, "token_text", boom)
    r = _post(engine, "/tokenize", {"prompt": "hi", "return_token_strs": True})
    assert r.status_code == 500
    err = r.json()["error"]
    assert err["type"] == "InternalServerError" and "ValueError: kaboom" in err["message"]
    monkeypatch.undo()
    # In the worker: a ValueError there is a bug (500), never a 400; the worker logs it.
    monkeypatch.setattr(engine.engine.model, "forward", boom)
    with caplog.at_level("ERROR", logger="rollwire.engine.scheduler"):
        r = _post(engine, "/v1/chat/completions", {"messages": MSGS, "max_tokens": 2})
    assert r.status_code == 500 and "kaboom" in r.json()["error"]["message"]
    assert any(rec.exc_info and "kaboom" in str(rec.exc_info[1]) for rec in caplog.records)
    monkeypatch.undo()
    assert _post(engine, "/v1/chat/completions", {"messages": MSGS, "max_tokens": 2}).is_success


# ---------------------------------------------------------------- tool_choice
def test_tool_choice_required_and_named(engine: EmbeddedEngine) -> None:
    url = "/v1/chat/completions"
    weather = [{"role": "user", "content": "weather in Rome?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    # A scripted tool call satisfies required and the matching named function.
    for choice in ("required", named):
        d = _post(engine, url, {"messages": weather, "tools": TOOLS, "tool_choice": choice})
        assert d.status_code == 200, d.text
        [call] = d.json()["choices"][0]["message"]["tool_calls"]
        assert call["function"]["name"] == "get_weather"
    # Without a script (or with a text reply) the engine cannot enforce it: a 400 that says so.
    for msgs in (MSGS, [{"role": "user", "content": "FORCE-TEXT"}]):
        r = _post(engine, url, {"messages": msgs, "tools": TOOLS, "tool_choice": "required"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    r = _post(engine, url, {"messages": MSGS, "tools": TOOLS, "tool_choice": "required"})
    assert "scripted mode" in r.json()["error"]["message"]
    # A named function that is not in tools is a 400, like vLLM.
    other = {"type": "function", "function": {"name": "nope"}}
    r = _post(engine, url, {"messages": weather, "tools": TOOLS, "tool_choice": other})
    assert r.status_code == 400 and "'nope'" in r.json()["error"]["message"]
    r = _post(engine, url, {"messages": weather, "tool_choice": "required"})
    assert r.status_code == 400


# ---------------------------------------------------------------- served model names
def test_any_model_name_when_not_strict() -> None:
    with EmbeddedEngine(EngineConfig(strict_model_name=False)) as eng:
        d = _post(
            eng, "/v1/chat/completions", {"model": "gpt-x", "messages": MSGS, "max_tokens": 1}
        )
        assert d.status_code == 200 and d.json()["model"] == "gpt-x"


def test_strict_model_name_is_vllm_404() -> None:
    cfg = EngineConfig(served_model_names=["policy", "policy-v2"], strict_model_name=True)
    with EmbeddedEngine(cfg) as eng:
        cards = httpx.get(eng.url + "/v1/models", timeout=30).json()["data"]
        assert [c["id"] for c in cards] == ["policy", "policy-v2"]
        for path, body in (
            ("/v1/chat/completions", {"messages": MSGS, "max_tokens": 1}),
            ("/v1/completions", {"prompt": "hi", "max_tokens": 1}),
        ):
            r = _post(eng, path, {**body, "model": "gpt-x"})
            assert r.status_code == 404
            assert r.json()["error"] == {
                "message": "The model `gpt-x` does not exist.",
                "type": "NotFoundError",
                "param": "model",
                "code": 404,
            }
            ok = _post(eng, path, {**body, "model": "policy-v2"})
            assert ok.status_code == 200 and ok.json()["model"] == "policy-v2"
            assert _post(eng, path, body).json()["model"] == "policy"


# ---------------------------------------------------------------- route coverage
def test_models_card_fields(engine: EmbeddedEngine) -> None:
    [card] = httpx.get(engine.url + "/v1/models", timeout=30).json()["data"]
    assert card["id"] == card["root"] == "rollwire-tiny" and card["object"] == "model"
    assert card["owned_by"] == "rollwire" and card["parent"] is None
    assert card["max_model_len"] == engine.model.config.max_model_len
    assert isinstance(card["created"], int) and card["permission"] == []


def test_sglang_pause_continue_and_abort(engine: EmbeddedEngine) -> None:
    r = _post(engine, "/pause_generation", {"mode": "in_place"})  # SGLang's shapes and modes
    assert r.json() == {"message": "Generation paused successfully.", "status": "ok"}
    assert httpx.get(engine.url + "/is_paused", timeout=30).json() == {"is_paused": True}
    r = _post(engine, "/continue_generation", {})
    assert r.json() == {"message": "Generation continued successfully.", "status": "ok"}
    assert httpx.get(engine.url + "/is_paused", timeout=30).json() == {"is_paused": False}
    assert _post(engine, "/pause_generation", {"mode": "keep"}).status_code == 400  # vLLM's name

    async def go() -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=30) as c:
            body = {
                "rid": "sg-long",
                "input_ids": [5, 6, 7],
                "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True},
            }
            task = asyncio.create_task(c.post(engine.url + "/generate", json=body))
            for _ in range(100):
                await asyncio.sleep(0.05)
                r = await c.post(engine.url + "/abort_request", json={"rid": "sg-long"})
                if r.json()["aborted"]:
                    break
            return (await task).json()

    d = asyncio.run(go())
    assert d["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(d["output_ids"]) < 4000
    assert _post(engine, "/abort_request", {"rid": "nope"}).json() == {"aborted": 0}


def test_chat_prompt_logprobs(engine: EmbeddedEngine) -> None:
    d = _post(
        engine,
        "/v1/chat/completions",
        {"messages": MSGS, "max_tokens": 1, "prompt_logprobs": 2, "return_token_ids": True},
    ).json()
    pl = d["prompt_logprobs"]
    ids = d["prompt_token_ids"]
    assert pl[0] is None and len(pl) == len(ids)
    for tid, entry in zip(ids[1:], pl[1:]):
        assert str(tid) in entry and entry[str(tid)]["logprob"] <= 0
        assert {v["rank"] for v in entry.values()} >= {1, 2}


def test_stream_final_chunk_has_stop_reason_and_weight_versions(engine: EmbeddedEngine) -> None:
    chunks, done = _stream(
        engine,
        "/v1/chat/completions",
        {"messages": MSGS, "max_tokens": 3, "ignore_eos": True, "return_weight_versions": True},
    )
    assert done
    [last] = [ch for c in chunks for ch in c["choices"] if ch["finish_reason"]]
    assert last["finish_reason"] == "length" and last["stop_reason"] is None
    assert last["weight_versions"] == [{"version": "0", "start": 0, "end": 3}]


def test_scripted_honours_max_tokens_and_stop_over_http(engine: EmbeddedEngine) -> None:
    msgs = [{"role": "user", "content": "FORCE-TEXT"}]
    tok = engine.tokenizer
    d = _post(
        engine,
        "/v1/chat/completions",
        {"messages": msgs, "max_tokens": 2, "return_token_ids": True},
    ).json()
    ch = d["choices"][0]
    assert (
        ch["finish_reason"] == "length" and ch["token_ids"] == tok.encode("Forced answer: 42.")[:2]
    )
    d = _post(engine, "/v1/chat/completions", {"messages": msgs, "stop": [":"]}).json()
    ch = d["choices"][0]
    assert ch["finish_reason"] == "stop" and ch["stop_reason"] == ":"
    assert ch["message"]["content"] == "Forced answer"


def test_scripted_multi_turn_reuses_prefix_with_real_logprobs(engine: EmbeddedEngine) -> None:
    pc = engine.engine.scheduler.prefix_cache
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a weather bot. " * 20},
        {"role": "user", "content": "weather in Paris?"},
    ]
    for turn in range(3):
        hits = pc.hit_tokens
        d = _post(
            engine,
            "/v1/chat/completions",
            {"messages": msgs, "tools": TOOLS, "logprobs": True, "return_token_ids": True},
        ).json()
        ch = d["choices"][0]
        prompt = d["prompt_token_ids"]
        if turn:
            # Everything before this turn's new user message came from the prefix cache.
            assert pc.hit_tokens - hits > len(prompt) // 2
        full = _post(
            engine,
            "/v1/completions",
            {"prompt": prompt + ch["token_ids"], "max_tokens": 1, "prompt_logprobs": 0},
        ).json()
        pl = full["choices"][0]["prompt_logprobs"]
        forced = [pl[len(prompt) + i][str(t)]["logprob"] for i, t in enumerate(ch["token_ids"])]
        np.testing.assert_allclose(
            forced, [e["logprob"] for e in ch["logprobs"]["content"]], atol=1e-4
        )
        calls = ch["message"]["tool_calls"]
        msgs.append({"role": "assistant", "content": None, "tool_calls": calls})
        msgs.append({"role": "tool", "tool_call_id": calls[0]["id"], "content": "sunny"})
        msgs.append({"role": "user", "content": f"and the weather in City{turn}?"})


# ---------------------------------------------------------------- SGLang-style token ids
def test_stream_honours_return_output_ids_in_sglext(engine: EmbeddedEngine) -> None:
    """SGLang's stream ids: one final chunk ``choices: []`` + ``sglext``, before [DONE]."""
    for path, body in (
        ("/v1/chat/completions", {"messages": MSGS}),
        ("/v1/completions", {"prompt": "Say something."}),
    ):
        req = {"model": "rollwire-tiny", **body, "max_tokens": 6, "seed": 3}
        chunks, done = _stream(engine, path, {**req, "return_output_ids_in_sglext": True})
        assert done
        ext = chunks[-1]
        assert ext["choices"] == [] and set(ext["sglext"]) == {"input_ids", "output_ids"}
        assert all("sglext" not in ch for ch in chunks[:-1])
        plain = _post(engine, path, {**req, "return_token_ids": True}).json()
        prompt = plain.get("prompt_token_ids") or plain["choices"][0]["prompt_token_ids"]
        assert ext["sglext"]["input_ids"] == prompt
        assert ext["sglext"]["output_ids"] == plain["choices"][0]["token_ids"]
        chunks, _ = _stream(engine, path, req)
        assert all("sglext" not in ch for ch in chunks)


def test_sglang_ids_style_chat() -> None:
    with EmbeddedEngine(openai_ids_style="sglang") as eng:
        req = {"model": "rollwire-tiny", "messages": MSGS, "max_tokens": 6, "seed": 3}
        out = _post(eng, "/v1/chat/completions", {**req, "return_token_ids": True}).json()
        choice = out["choices"][0]
        assert out.get("prompt_token_ids") is None and "token_ids" not in choice
        prompt = eng.tokenizer.encode(eng.tokenizer.render_chat(MSGS, None))
        assert choice["prompt_token_ids"] == prompt
        assert len(choice["response_token_ids"]) == out["usage"]["completion_tokens"]
        plain = _post(eng, "/v1/chat/completions", req).json()["choices"][0]
        assert "response_token_ids" not in plain and "prompt_token_ids" not in plain
        r = _post(eng, "/v1/chat/completions", {**req, "stream": True, "return_token_ids": True})
        assert r.status_code == 400 and r.json()["error"]["param"] == "return_token_ids"
        assert "return_output_ids_in_sglext" in r.json()["error"]["message"]
        chunks, done = _stream(
            eng, "/v1/chat/completions", {**req, "return_output_ids_in_sglext": True}
        )
        assert done and chunks[-1]["sglext"] == {
            "input_ids": choice["prompt_token_ids"],
            "output_ids": choice["response_token_ids"],
        }
    with pytest.raises(ValueError, match="openai_ids_style"):
        EngineConfig(openai_ids_style="tgi")  # type: ignore[arg-type]
