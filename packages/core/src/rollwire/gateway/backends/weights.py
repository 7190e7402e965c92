"""Weight transports: how a new policy gets into each kind of inference server
(docs/weight-sync.md; the verification probe is in ``control/weights.py``, since it speaks the
token-in route of ``tokens/``).

- ``vllm`` (vLLM with ``VLLM_SERVER_DEV_MODE=1``, and the embedded engine): ``POST
  /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}``, then ``POST
  /reset_prefix_cache`` (the reload does not clear it) and ``POST /update_weight_version``; with
  ``keep``, the server is paused with ``/pause?mode=keep`` around it so requests in flight go on
  with the new weights, their tokens labelled per version.
- ``sglang``: ``POST /update_weights_from_disk {"model_path": DIR}``, ``POST /flush_cache``,
  ``POST /update_weight_version``.
- LoRA adapters (``vllm`` kind: vLLM with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True --enable-lora``,
  and the embedded engine): ``POST /v1/load_lora_adapter {"lora_name", "lora_path": DIR}`` (a
  name already loaded is unloaded first), ``POST /update_weight_version``, then ``POST
  /v1/unload_lora_adapter`` for each adapter the sync no longer keeps; forwarded calls name the
  new adapter from then on. No cache reset: a prefix cache keys its blocks by adapter.
- ``tinker``: no files move; the backend samples from then on with the sampler of the checkpoint
  ``weights_path`` names (``tinker://…/sampler_weights/NAME``, see ``backends/tinker.py``).
- ``openai`` (a hosted API) takes no weights: refused when the sync starts.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import orjson

from rollwire.gateway.backends.pool import Backend
from rollwire.gateway.errors import GatewayError

__all__ = ["ADAPTER_KINDS", "WEIGHT_KINDS", "push_adapter", "push_weights"]

WEIGHT_KINDS = ("vllm", "sglang", "tinker")
#: backend kinds that take a LoRA adapter by name
ADAPTER_KINDS = ("vllm",)


async def _post(
    http: aiohttp.ClientSession,
    backend: Backend,
    path: str,
    body: dict[str, Any] | None,
    timeout: float,
) -> Any:
    url = backend.url + path
    try:
        async with http.post(
            url,
            data=orjson.dumps(body) if body is not None else None,
            headers={"Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as resp:
            raw = await resp.read()
            status = resp.status
    except asyncio.TimeoutError as exc:
        raise GatewayError(
            504,
            f"backend {backend.name} ({url}) did not answer within {timeout:g} s",
            code="weight_push_timeout",
        ) from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise GatewayError(
            502, f"backend {backend.name} ({url}) unreachable: {exc}", code="weight_push_failed"
        ) from exc
    if status >= 400:
        hint = ""
        if status == 404 and backend.kind == "vllm" and path == "/v1/load_lora_adapter":
            hint = (
                " (vLLM serves this route only with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and "
                "--enable-lora --max-lora-rank R)"
            )
        elif status == 404 and backend.kind == "vllm":
            hint = " (vLLM serves this route only with VLLM_SERVER_DEV_MODE=1)"
        text = raw[:500].decode("utf-8", "replace")
        raise GatewayError(
            502 if status >= 500 else 409,
            f"backend {backend.name}: POST {path} answered {status}{hint}: {text}",
            code="weight_push_failed",
        )
    try:
        return orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        return raw.decode("utf-8", "replace")


async def push_weights(
    http: aiohttp.ClientSession,
    backend: Backend,
    *,
    weights_path: str,
    version: str,
    keep: bool = False,
    timeout: float = 600.0,
) -> dict[str, Any]:
    """Load ``weights_path`` into ``backend`` by its kind's transport and label it ``version``;
    returns the steps taken with their seconds. A refusal is a :class:`GatewayError`."""
    if backend.kind not in WEIGHT_KINDS:
        raise GatewayError(
            409,
            f"backend {backend.name} is of kind {backend.kind!r}, which takes no weights "
            f"(only {WEIGHT_KINDS} do)",
            code="backend_takes_no_weights",
        )
    steps: list[dict[str, Any]] = []
    if backend.kind == "tinker":
        from rollwire.gateway.backends.tinker import swap_sampler

        try:
            steps.append(await swap_sampler(backend, model_path=weights_path, version=version))
        except Exception as exc:  # a refused path or the SDK's error, said as it is
            raise GatewayError(
                409, f"backend {backend.name}: {exc}", code="weight_push_failed"
            ) from exc
        return {"backend": backend.name, "version": version, "steps": steps}

    async def step(path: str, body: dict[str, Any] | None) -> Any:
        t0 = time.perf_counter()
        answer = await _post(http, backend, path, body, timeout)
        steps.append({"route": path, "seconds": time.perf_counter() - t0})
        return answer

    if backend.kind == "vllm":
        if keep:
            await step("/pause?mode=keep", None)
        try:
            answer = await step(
                "/collective_rpc",
                {"method": "reload_weights", "kwargs": {"weights_path": weights_path}},
            )
            _check_rpc(backend, answer)
            await step("/reset_prefix_cache", None)
            await step("/update_weight_version", {"new_version": version})
        finally:
            if keep:
                await step("/resume", None)
    else:
        answer = await step("/update_weights_from_disk", {"model_path": weights_path})
        if isinstance(answer, dict) and answer.get("success") is False:
            raise GatewayError(
                409,
                f"backend {backend.name} refused the weights at {weights_path}: "
                f"{answer.get('message')}",
                code="weight_push_failed",
            )
        await step("/flush_cache", None)
        await step("/update_weight_version", {"new_version": version})
    backend.weight_version = version
    return {"backend": backend.name, "version": version, "steps": steps}


async def push_adapter(
    http: aiohttp.ClientSession,
    backend: Backend,
    *,
    adapter_path: str,
    name: str,
    version: str,
    seq: int | None,
    unload: list[str],
    held: dict[str, Any],
    timeout: float = 600.0,
) -> dict[str, Any]:
    """Load the PEFT LoRA folder ``adapter_path`` into ``backend`` as ``name``, label it
    ``version``, unload the adapters named in ``unload``. ``held`` (``{"adapter",
    "adapters"}``: the one calls name, all loaded) is updated step by step, also when a step
    fails. Returns the steps taken with their seconds; a refusal is a :class:`GatewayError`."""
    if backend.kind not in ADAPTER_KINDS:
        raise GatewayError(
            409,
            f"backend {backend.name} is of kind {backend.kind!r}, which takes no LoRA adapter by "
            f"name (only {ADAPTER_KINDS} do); sync the merged model to it instead",
            code="backend_takes_no_adapter",
        )
    steps: list[dict[str, Any]] = []

    async def step(path: str, body: dict[str, Any], missing_ok: bool = False) -> None:
        t0 = time.perf_counter()
        try:
            await _post(http, backend, path, body, timeout)
        except GatewayError as exc:  # an adapter already gone is what an unload wants
            if not (missing_ok and exc.status == 409 and " answered 404" in exc.message):
                raise
        steps.append({"route": path, "seconds": time.perf_counter() - t0})

    loaded = [a for a in held["adapters"] if a.get("name") != name]
    load = {"lora_name": name, "lora_path": adapter_path}
    if len(loaded) < len(held["adapters"]):  # a retried version: load it afresh
        held["adapters"] = loaded
        held["adapter"] = None if held["adapter"] == name else held["adapter"]
        await step("/v1/unload_lora_adapter", {"lora_name": name}, missing_ok=True)
    try:
        await step("/v1/load_lora_adapter", load)
    except GatewayError as exc:  # loaded by a process that left no record: load it afresh
        if "already been loaded" not in exc.message:
            raise
        await step("/v1/unload_lora_adapter", {"lora_name": name}, missing_ok=True)
        await step("/v1/load_lora_adapter", load)
    held["adapters"] = [*loaded, {"name": name, "version": version, "seq": seq}]
    held["adapter"] = name
    await step("/update_weight_version", {"new_version": version})
    backend.weight_version = version
    for old in [a["name"] for a in loaded if a.get("name") in unload]:
        await step("/v1/unload_lora_adapter", {"lora_name": old}, missing_ok=True)
        held["adapters"] = [a for a in held["adapters"] if a.get("name") != old]
    return {"backend": backend.name, "version": version, "adapter": name, "steps": steps}


def _check_rpc(backend: Backend, answer: Any) -> None:
    # vLLM answers {"results": [...]}, one per worker; a worker's exception comes back as text
    if isinstance(answer, dict) and isinstance(answer.get("results"), list):
        for result in answer["results"]:
            if isinstance(result, dict) and result.get("error"):
                raise GatewayError(
                    409,
                    f"backend {backend.name} failed to reload: {result['error']}",
                    code="weight_push_failed",
                )
