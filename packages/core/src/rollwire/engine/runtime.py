"""The engine behind the routes: model, tokenizer, scheduler, script and faults, and the calls
every route makes (submit, run to completion, scripted replies, injected faults)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from starlette.requests import Request

from .config import EngineConfig
from .faults import FaultDraw, FaultInjector
from .http import _HTTPError, _session_id
from .lora import LoraDelta, ServedAdapter, adapted, adapter_version, read_adapter
from .model import ModelConfig, TinyModel, WeightsError
from .sampling import SamplingParams
from .scheduler import Completion, GenerationRequest, PauseMode, Scheduler
from .scripted import Script, load_script, messages_from_prompt
from .tokenizer import EngineTokenizer

__all__ = ["Engine"]

logger = logging.getLogger("rollwire.engine.server")

#: What a reload may not change, with the Hugging Face config key each comes from.
_SHAPE_FIELDS = {
    "model_type": "model_type",
    "vocab_size": "vocab_size",
    "n_layers": "num_hidden_layers",
    "d_model": "hidden_size",
    "n_heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "n_experts": "num_local_experts",
    "top_k": "num_experts_per_tok",
    "expert_hidden": "intermediate_size",
    "rope_theta": "rope_theta",
    "rope_scaling": "rope_parameters",
    "norm_eps": "rms_norm_eps",
    "tie_embeddings": "tie_word_embeddings",
    "qkv_bias": "attention_bias",
    "o_bias": "attention_bias",
}


class Engine:
    """Model, tokenizer, scheduler, script and faults behind the routes (one per app)."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model = self._initial_model(config)
        if config.max_model_len is not None:  # vLLM's --max-model-len: the context served
            self.model.config = replace(self.model.config, max_model_len=config.max_model_len)
        self.tokenizer: EngineTokenizer = self.model.tokenizer
        self._reload_lock = asyncio.Lock()
        self.weight_version = config.weight_version
        self.scheduler = Scheduler(
            self.model,
            version=lambda: self.weight_version,
            max_batch_size=config.max_batch_size,
            seed=config.seed,
            prefill_chunk_tokens=config.prefill_chunk_tokens,
            # the token budget, within the memory budget (a real model's KV is ~10x the toy's)
            prefix_cache_tokens=min(
                config.prefix_cache_tokens,
                config.prefix_cache_mib * 2**20 // self.model.config.kv_bytes_per_token,
            ),
        )
        self.script: Script | None = (
            load_script(config.scripted) if config.scripted is not None else None
        )
        self.faults = FaultInjector(config.faults)
        self.created = int(time.time())
        #: LoRA adapters loaded by name (``/v1/load_lora_adapter``), in load order
        self.adapters: dict[str, ServedAdapter] = {}
        self._adapter_tags = 0

    @staticmethod
    def _initial_model(config: EngineConfig, tokenizer: EngineTokenizer | None = None) -> TinyModel:
        if config.model_dir is not None:  # the engine's own folder or a Hugging Face one
            return TinyModel.load(config.model_dir, tokenizer=tokenizer)
        mc = config.model or ModelConfig()
        seed = config.seed if config.model is None else mc.seed
        return TinyModel(replace(mc, seed=seed), tokenizer)

    # ------------------------------------------------------------------ weights and pausing
    def _compatible(self, path: str | Path | None) -> TinyModel:
        """The weights at ``path`` (None: what the engine started from) as a model of the served
        shape, with the served tokenizer and context; raises :class:`WeightsError`."""
        tok = self.tokenizer
        if path is None:
            new = self._initial_model(self.config, tok)
        else:
            new = TinyModel.load(path, tokenizer=tok)
        served, got = self.model.config, new.config
        for name in _SHAPE_FIELDS:
            if getattr(got, name) != getattr(served, name):
                raise WeightsError(
                    f"{path or 'the start-up model'} has {_SHAPE_FIELDS[name]} "
                    f"{getattr(got, name)!r} but the engine serves {getattr(served, name)!r}; a "
                    "reload swaps weights of the same shape (start a new engine for another model)"
                )
        return TinyModel(served, tok, _weights=new.w)

    async def reload_weights(self, path: str | Path | None, *, version: str | None = None) -> None:
        """Load new weights off the event loop, then swap them in between two scheduler steps
        (dropping the prefix cache); ``version`` is set in the same step. On any problem the old
        weights keep serving and :class:`WeightsError` says what was wrong."""
        async with self._reload_lock:
            model = await asyncio.to_thread(self._compatible, path)
            # the adapters stay loaded, as in vLLM: applied to the new base
            adapters = await asyncio.to_thread(self._reapplied, model)

            def swap() -> None:
                self.scheduler.swap_model(model, adapters)
                self.model = model
                self.adapters = adapters
                if version is not None:
                    self.weight_version = version

            await asyncio.wrap_future(self.scheduler.between_steps(swap))

    def _served(
        self, name: str, path: str, version: str, deltas: Sequence[LoraDelta], base: TinyModel
    ) -> ServedAdapter:
        self._adapter_tags += 1
        # the injected fault: the load answers success, the base weights keep answering
        model = base if self.config.faults.ignore_lora_loads else adapted(base, deltas)
        return ServedAdapter(name, path, version, model, self._adapter_tags, tuple(deltas))

    def _reapplied(self, base: TinyModel) -> dict[str, ServedAdapter]:
        return {
            n: self._served(n, a.path, a.version, a.deltas, base) for n, a in self.adapters.items()
        }

    async def load_adapter(self, name: str, path: str, *, replace: bool = False) -> None:
        """Load the PEFT LoRA folder ``path`` under ``name`` (off the event loop; swapped in
        between two scheduler steps). A name already loaded is an error unless ``replace``; a
        bad folder raises :class:`WeightsError` and changes nothing."""
        async with self._reload_lock:
            if name in self.adapters and not replace:
                raise WeightsError(f"The lora adapter '{name}' has already been loaded.")
            if name in self.config.served_model_names:
                raise WeightsError(f"{name!r} is the base model's served name; pick another")
            base = self.model
            deltas = await asyncio.to_thread(read_adapter, path, base.config)
            version = adapter_version(name, self.weight_version)
            served = await asyncio.to_thread(self._served, name, path, version, deltas, base)
            await asyncio.wrap_future(
                self.scheduler.between_steps(lambda: self._set_adapter(name, served))
            )

    async def unload_adapter(self, name: str) -> None:
        """Forget the adapter ``name`` (requests under way keep its weights until they end);
        raises ``KeyError`` when it is not loaded."""
        async with self._reload_lock:
            if name not in self.adapters:
                raise KeyError(name)
            await asyncio.wrap_future(
                self.scheduler.between_steps(lambda: self._set_adapter(name, None))
            )

    def _set_adapter(self, name: str, served: ServedAdapter | None) -> None:
        adapters = dict(self.adapters)
        if served is None:
            adapters.pop(name, None)
        else:
            adapters[name] = served
        self.adapters = adapters
        self.scheduler.adapters = adapters
        self.scheduler.prefix_cache.drop_tag(name)

    async def reset_prefix_cache(self) -> None:
        """Empty the prefix KV cache (between two steps: the worker owns it)."""
        await asyncio.wrap_future(self.scheduler.between_steps(self.scheduler.prefix_cache.clear))

    async def pause(self, mode: PauseMode, *, clear_cache: bool = True) -> int:
        """vLLM's pause: hold new requests; ``abort``/``wait`` return once the requests in flight
        ended (then ``clear_cache`` empties the prefix cache), ``keep`` once they are frozen.
        Returns how many requests were in flight."""
        inflight = self.scheduler.pause(mode)
        while not self.scheduler.settled(mode, inflight):
            await asyncio.sleep(0.002)
        if clear_cache and mode != "keep":
            await self.reset_prefix_cache()
        return len(inflight)

    def resume(self) -> None:
        """Continue after :meth:`pause`."""
        self.scheduler.resume()

    @property
    def model_name(self) -> str:
        """The id served by ``/v1/models``."""
        return self.config.model_name

    def forced_text(
        self, messages: list[dict[str, Any]] | None, tools: Any, session_id: str | None
    ) -> str | None:
        """The assistant text the script forces for this request, or None."""
        if self.script is None:
            return None
        try:
            text = self.script.lookup(messages, tools, session_id)
        except Exception as exc:
            logger.exception("engine: the script raised")
            raise _HTTPError(500, f"the script raised {type(exc).__name__}: {exc}") from exc
        if text is not None and not isinstance(text, str):
            raise _HTTPError(
                500, f"the script returned {type(text).__name__}, expected str or None"
            )
        return text

    def forced_ids(self, text: str | None) -> list[int] | None:
        """Token ids of a forced text, ending in the turn's end (``<|im_end|>`` in ChatML;
        None stays None)."""
        if text is None:
            return None
        return [*self.tokenizer.encode(text), self.tokenizer.eos_id]

    def submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        emit: Callable[[Any], None],
        *,
        forced: list[int] | None = None,
        stream: bool = False,
        request_id: str | None = None,
        want_experts: bool = False,
        model: str | None = None,
    ) -> GenerationRequest:
        """Queue one generation on the worker thread (``model``: a loaded LoRA adapter's name
        serves it with that adapter; any other name, with the base weights)."""
        if not prompt_ids:
            raise _HTTPError(400, "the prompt is empty; send at least one token")
        limit = self.model.config.max_model_len
        if len(prompt_ids) + (len(forced) if forced else params.max_tokens) > limit:
            raise _HTTPError(
                400,
                f"prompt ({len(prompt_ids)} tokens) plus max_tokens ({params.max_tokens}) exceeds "
                f"max_model_len {limit}; shorten the prompt or lower max_tokens",
            )
        bad = [t for t in prompt_ids if not 0 <= t < self.model.config.vocab_size]
        if bad:
            raise _HTTPError(
                400, f"token ids out of range [0, {self.model.config.vocab_size}): {bad[:5]}"
            )
        req = GenerationRequest(
            prompt_ids=list(prompt_ids),
            params=params,
            emit=emit,
            request_id=request_id or uuid.uuid4().hex,
            forced_ids=forced,
            stream=stream,
            logprobs_mode=self.config.logprobs_mode,
            want_experts=want_experts,
            lora=self.adapters.get(model) if model else None,
        )
        self.scheduler.submit(req)
        return req

    async def generate_many(
        self,
        prompt_ids: list[int],
        params: list[SamplingParams],
        *,
        forced: list[int] | None = None,
        stream: bool = False,
        request_id: str | None = None,
        want_experts: bool = False,
        model: str | None = None,
    ) -> tuple[list[GenerationRequest], asyncio.Queue[tuple[int, Any]]]:
        """Submit one request per ``params`` entry; events arrive on the queue as ``(index, event)``."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        reqs = []
        for i, p in enumerate(params):

            def emit(ev: Any, i: int = i) -> None:
                with contextlib.suppress(RuntimeError):  # loop already closed: nobody is listening
                    loop.call_soon_threadsafe(q.put_nowait, (i, ev))

            rid = request_id if len(params) == 1 and request_id else None
            reqs.append(
                self.submit(
                    prompt_ids,
                    p,
                    emit,
                    forced=forced,
                    stream=stream,
                    request_id=rid,
                    want_experts=want_experts,
                    model=model,
                )
            )
        return reqs, q

    async def complete(
        self, prompt_ids: list[int], params: list[SamplingParams], **kw: Any
    ) -> list[Completion]:
        """Run requests to completion (non-streaming)."""
        reqs, q = await self.generate_many(prompt_ids, params, **kw)
        done: dict[int, Completion] = {}
        try:
            while len(done) < len(reqs):
                i, ev = await q.get()
                if isinstance(ev, Exception):
                    # Requests are validated before they reach the worker: anything it raises
                    # is an engine bug, never the caller's fault.
                    raise _HTTPError(500, f"engine error: {type(ev).__name__}: {ev}")
                if isinstance(ev, Completion):
                    done[i] = ev
        finally:
            for r in reqs:
                if not r.aborted and len(done) < len(reqs):
                    r.abort()
        return [done[i] for i in range(len(reqs))]


async def _apply_faults(engine: Engine) -> FaultDraw:
    draw = engine.faults.draw()
    if draw.latency_s:
        await asyncio.sleep(draw.latency_s)
    if draw.error:
        raise _HTTPError(500, "injected fault: internal server error (--fault-error-rate)")
    if draw.throttle:
        raise _HTTPError(
            429,
            "injected fault: too many requests (--fault-throttle-rate); retry later",
            headers={"Retry-After": str(engine.config.faults.retry_after_s)},
        )
    return draw


def _token_route_forced(
    engine: Engine, request: Request, body: dict[str, Any], ids: list[int]
) -> list[int] | None:
    if engine.script is None:
        return None
    # Token-in routes have no messages; recover the ChatML turns so regex rules still match.
    messages = messages_from_prompt(engine.tokenizer.decode(ids))
    return engine.forced_ids(engine.forced_text(messages, None, _session_id(request, body)))
