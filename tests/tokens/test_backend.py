from __future__ import annotations

import base64
import io
from typing import Any

import aiohttp
import numpy as np
import pytest

from rollwire.gateway.tokens.backend import (
    BackendFailure,
    _read_sglang,
    _read_vllm,
    generate,
    sampling_payload,
)


def test_sampling_payload_vllm_and_sglang() -> None:
    ids = np.asarray([1, 2, 3], np.int32)
    sampling = {
        "temperature": 0.7,
        "top_p": 0.9,
        "max_tokens": 50,
        "stop": "END",
        "seed": 3,
        "top_k": 5,
    }
    v = sampling_payload("vllm", ids, sampling, top_logprobs=2, request_id="r1")
    assert v["token_ids"] == [1, 2, 3] and v["request_id"] == "r1"
    assert v["sampling_params"] == {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 5,
        "stop": ["END"],
        "skip_special_tokens": False,
        "max_tokens": 50,
        "seed": 3,
        "logprobs": 2,
        "include_stop_str_in_output": True,
    }
    s = sampling_payload("sglang", ids, sampling, request_id="r1", session_id="s")
    assert s["input_ids"] == [1, 2, 3] and s["rid"] == "r1" and s["return_logprob"] is True
    sp = s["sampling_params"]
    assert sp["max_new_tokens"] == 50 and sp["sampling_seed"] == 3 and sp["no_stop_trim"] is True
    assert "max_tokens" not in sp and "seed" not in sp and sp["skip_special_tokens"] is False
    assert s["return_routed_experts"] is True and s["logprob_start_len"] == -1
    with pytest.raises(ValueError, match="no token-in route"):
        sampling_payload("openai", ids, {})


def test_read_vllm_routed_experts_npy() -> None:
    experts = np.arange(4 * 2 * 2, dtype=np.int16).reshape(4, 2, 2)
    buf = io.BytesIO()
    np.save(buf, experts, allow_pickle=False)
    obj: dict[str, Any] = {
        "choices": [
            {
                "token_ids": [5, 6],
                "finish_reason": "stop",
                "routed_experts": base64.b64encode(buf.getvalue()).decode(),
                "weight_versions": [{"version": "v3", "start": 0, "end": 2}],
                "logprobs": {
                    "content": [{"token_id": 5, "logprob": -0.5}, {"token_id": 6, "logprob": -1.0}]
                },
            }
        ]
    }
    g = _read_vllm(obj, "http://x")
    assert g.completion_ids.tolist() == [5, 6] and g.logprobs.tolist() == [-0.5, -1.0]
    np.testing.assert_array_equal(g.routed_experts, experts)  # type: ignore[arg-type]
    assert g.weight_version == "v3"
    obj["choices"][0]["logprobs"] = None
    with pytest.raises(BackendFailure, match="logprobs"):
        _read_vllm(obj, "http://x")


def test_read_sglang_reshapes_int32_experts() -> None:
    experts = np.arange(4 * 3 * 2, dtype=np.int32).reshape(4, 3, 2)
    obj = {
        "output_ids": [5, 6],
        "meta_info": {
            "finish_reason": {"type": "stop", "matched": 2},
            "output_token_logprobs": [[-0.5, 5, None], [-1.0, 6, None]],
            "routed_experts": base64.b64encode(experts.tobytes()).decode(),
            "weight_version": "7",
        },
    }
    g = _read_sglang(obj, "http://x", prompt_len=3, experts_shape=(3, 2))
    assert g.finish_reason == "stop" and g.stop_reason == 2 and g.weight_version == "7"
    assert g.routed_experts is not None and g.routed_experts.shape == (4, 3, 2)
    np.testing.assert_array_equal(g.routed_experts, experts)


async def test_generate_unreachable_backend() -> None:
    async with aiohttp.ClientSession() as http:
        with pytest.raises(BackendFailure) as info:
            await generate(
                http, "http://127.0.0.1:9", "vllm", {"token_ids": [1]}, prompt_len=1, timeout=5
            )
    assert info.value.connection and info.value.status == 502
