"""The ``tinker`` backend kind's checks that need no Tinker service (the real sampling, swap and
probe run against SkyRL's server in packages/adapter-tinker/tests/skyrl)."""

from __future__ import annotations

import socket

import openai
import pytest

from rollwire.gateway import serve_in_thread
from rollwire.gateway.config import BackendSpec
from rollwire.gateway.tokens.tinker import sampling_params
from rollwire.trainer.gateway_client import GatewayAPIError


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_a_tinker_backend_needs_the_model_it_samples_first() -> None:
    with pytest.raises(ValueError, match="needs model"):
        BackendSpec("http://127.0.0.1:1", "tinker")
    spec = BackendSpec("http://127.0.0.1:1/v1", "tinker", model="Qwen/Qwen3-8B")
    assert (spec.url, spec.kind) == ("http://127.0.0.1:1", "tinker")


def test_sampling_parameters_map_onto_the_sdk() -> None:
    from tinker import types

    mapped = sampling_params(
        {"max_tokens": 5, "temperature": 0.0, "top_p": 0.9, "seed": 3, "stop": "\n", "n": 2}
    )
    assert mapped == {"max_tokens": 5, "temperature": 0.0, "top_p": 0.9, "seed": 3, "stop": ["\n"]}
    assert types.SamplingParams(**mapped).stop == ["\n"]
    assert sampling_params({"stop_token_ids": [2]}) == {"stop": [2]}
    # a Tinker sampler has no default stop: the template's end of turn, unless the call has one
    assert sampling_params({"max_tokens": 4}, eos_id=7) == {"max_tokens": 4, "stop": [7]}
    assert sampling_params({"stop_token_ids": [2]}, eos_id=7) == {"stop": [2]}


def test_passthrough_is_refused_and_only_sampler_paths_are_pushed() -> None:
    spec = BackendSpec(_dead_url(), "tinker", model="base", name="t")
    with serve_in_thread(backends=[spec]) as gw, gw.client() as c:
        h = c.create_session(capture="passthrough")
        oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="capture='tokens'") as err:
            oai.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
        assert err.value.code == "tinker_needs_tokens_mode"
        with pytest.raises(GatewayAPIError, match=r"takes a sampler checkpoint path tinker://"):
            c.push_weights("t", weights_path="/some/folder", version="v1", timeout=5)
        (backend,) = c.backends()
        assert backend["kind"] == "tinker" and backend["weight_version"] is None
