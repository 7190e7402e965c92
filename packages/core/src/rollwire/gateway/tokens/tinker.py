"""Token-in generation on a ``tinker`` backend: one sample of its current Tinker sampler
(``backends/tinker.py`` holds the sampler and swaps it on a weight push)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import numpy as np

from rollwire.gateway.backends.pool import Backend
from rollwire.gateway.backends.tinker import TinkerUnavailable, new_sampler, sdk
from rollwire.gateway.tokens.backend import BackendFailure, Generation

__all__ = ["sampling_params", "tinker_generate"]


def sampling_params(sampling: Mapping[str, Any], eos_id: int | None = None) -> dict[str, Any]:
    """OpenAI-named sampling parameters as the SDK's ``SamplingParams`` fields; without a stop
    of the request's own, the sample stops at ``eos_id`` (a Tinker sampler has no default)."""
    out: dict[str, Any] = {}
    for key in ("max_tokens", "temperature", "top_p", "top_k", "seed"):
        if sampling.get(key) is not None:
            out[key] = sampling[key]
    stop = sampling.get("stop")
    if isinstance(stop, str):
        out["stop"] = [stop]
    elif stop:
        out["stop"] = [str(s) for s in stop]
    elif sampling.get("stop_token_ids"):
        out["stop"] = [int(t) for t in sampling["stop_token_ids"]]
    elif eos_id is not None:
        out["stop"] = [int(eos_id)]
    return out


async def tinker_generate(
    backend: Backend,
    prompt_ids: np.ndarray,
    sampling: Mapping[str, Any],
    *,
    timeout: float,
    eos_id: int | None = None,
) -> Generation:
    """One sample of the backend's current sampler after ``prompt_ids`` (stopping at ``eos_id``
    unless ``sampling`` names a stop); its checkpoint name is the generation's weight version."""
    try:
        tinker = sdk()
        if backend.sampler is None:
            model = backend.model or ""
            backend.sampler = await asyncio.to_thread(new_sampler, backend, model)
        sampler, version = backend.sampler, backend.weight_version
        prompt = tinker.types.ModelInput.from_ints([int(t) for t in prompt_ids.tolist()])
        params = tinker.types.SamplingParams(**sampling_params(sampling, eos_id))
        result = await asyncio.wait_for(sampler.sample_async(prompt, 1, params), timeout)
    except asyncio.TimeoutError as exc:
        raise BackendFailure(
            504, f"tinker sampler {backend.url} did not answer within {timeout}s"
        ) from exc
    except TinkerUnavailable as exc:
        raise BackendFailure(502, str(exc)) from exc
    except Exception as exc:  # the SDK's own errors: connection, 4xx/5xx, validation
        raise BackendFailure(
            502, f"tinker sampler {backend.url} failed: {type(exc).__name__}: {exc}"
        ) from exc
    seq = result.sequences[0]
    logprobs = seq.logprobs or []
    if len(logprobs) != len(seq.tokens):
        raise BackendFailure(
            502,
            f"tinker sampler {backend.url} returned {len(logprobs)} logprobs for {len(seq.tokens)} tokens",
        )
    stop = str(getattr(seq, "stop_reason", "") or "stop")
    return Generation(
        completion_ids=np.asarray(seq.tokens, dtype=np.int32),
        logprobs=np.asarray(logprobs, dtype=np.float32),
        finish_reason="length" if stop == "length" else "stop",
        weight_version=version,
    )
