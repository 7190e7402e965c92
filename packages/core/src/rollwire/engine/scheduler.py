"""Continuous batching: one worker thread prefills new requests chunk by chunk, interleaved with
decode steps that advance all active ones together.

The HTTP server never runs model code on its event loop; it submits a :class:`GenerationRequest`
and receives events through a thread-safe callback.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Literal, TypeVar

import numpy as np

from ._blas import acquire_single_thread_blas, release_single_thread_blas
from .lora import ServedAdapter
from .model import TinyModel
from .prefix_cache import PrefixCache
from .requests import Completion, FinishReason, GenerationRequest, TokenEvent
from .sampling import choose_token, token_logprobs, token_rank, top_logprobs

__all__ = ["Completion", "GenerationRequest", "PauseMode", "Scheduler", "TokenEvent"]

#: vLLM's ``/pause`` modes: abort in-flight requests, wait for them, or freeze them in place.
PauseMode = Literal["abort", "wait", "keep"]
_T = TypeVar("_T")

logger = logging.getLogger(__name__)


class Scheduler:
    """Owns the model's compute: a worker thread that interleaves chunked prefills with batched
    decode steps, and reuses cached prompt prefixes."""

    def __init__(
        self,
        model: TinyModel,
        *,
        version: Callable[[], str],
        max_batch_size: int = 64,
        seed: int = 0,
        prefill_chunk_tokens: int = 256,
        prefix_cache_tokens: int = 32768,
    ) -> None:
        if prefill_chunk_tokens < 1:
            raise ValueError(f"prefill_chunk_tokens must be >= 1, got {prefill_chunk_tokens}")
        self.model = model
        #: the LoRA adapters by name (replaced whole, between steps, by the engine)
        self.adapters: dict[str, ServedAdapter] = {}
        self._version = version
        self._max_batch = max_batch_size
        self._chunk = prefill_chunk_tokens
        self._queue: queue.Queue[GenerationRequest | None] = queue.Queue()
        self._active: list[GenerationRequest] = []
        self._prefilling: deque[GenerationRequest] = deque()
        self._by_id: dict[str, GenerationRequest] = {}
        self._lock = threading.Lock()
        self._seeds = np.random.SeedSequence(seed)
        self._thread: threading.Thread | None = None
        self._running = False
        #: Paused: new requests wait in ``_held`` (not the worker's queue) until resume.
        self._hold = False
        self._held: list[GenerationRequest] = []
        #: ``keep`` pause: the worker does no model work; ``_frozen_seen`` once it stopped.
        self._frozen = False
        self._frozen_seen = threading.Event()
        self._kick = threading.Event()
        self._control: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = (
            queue.SimpleQueue()
        )
        #: Bumped by :meth:`swap_model`; requests admitted before a swap skip the prefix cache.
        self.weights_gen = 0
        self.prefix_cache = PrefixCache(prefix_cache_tokens)
        #: Decode steps and prefill chunks run so far (tests check batching and interleaving).
        self.steps = 0
        self.prefill_chunks = 0

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Start the worker thread (idempotent); BLAS runs single-threaded until the last stop."""
        if self._thread is not None:
            return
        acquire_single_thread_blas()
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="rollwire-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Abort everything, join the worker and give back the BLAS thread setting."""
        self._running = False
        self._wake()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
            release_single_thread_blas()

    def submit(self, req: GenerationRequest) -> None:
        """Queue a request (held until :meth:`resume` while paused); results arrive through
        ``req.emit``."""
        with self._lock:
            self._by_id[req.request_id] = req
            if self._hold:
                req.held = True
                self._held.append(req)
                return
        self._queue.put(req)

    def abort(self, request_ids: list[str] | None = None) -> int:
        """Abort the named requests (all when None); returns how many were found. A held
        request ends at once (it has no model state); the others at the worker's next step."""
        with self._lock:
            reqs = (
                list(self._by_id.values())
                if request_ids is None
                else [self._by_id[r] for r in request_ids if r in self._by_id]
            )
            held = [r for r in reqs if r.held]
            self._held = [r for r in self._held if r not in held]
        for r in reqs:
            r.abort()
        for r in held:
            self._finish(r, "abort", None)
        return len(reqs)

    # ----------------------------------------------------------------- pause and weights
    def pause(self, mode: PauseMode = "keep") -> list[GenerationRequest]:
        """Hold new requests until :meth:`resume`; ``abort`` aborts the requests in flight,
        ``wait`` lets them run, ``keep`` freezes them in place. Returns the requests in flight
        (a caller of ``abort``/``wait`` waits for them to finish, see :meth:`settled`)."""
        with self._lock:
            self._hold = True
            inflight = [r for r in self._by_id.values() if not r.held]
        if mode == "keep":
            self._frozen_seen.clear()
            self._frozen = True
        else:
            self._frozen = False
            if mode == "abort":
                for r in inflight:
                    r.abort()
        self._wake()
        return inflight

    def resume(self) -> None:
        """Continue after :meth:`pause`: frozen requests go on, held ones are queued in order."""
        with self._lock:
            self._hold = False
            self._frozen = False
            for r in self._held:
                r.held = False
                self._queue.put(r)
            self._held = []
        self._wake()

    def settled(self, mode: PauseMode, inflight: list[GenerationRequest]) -> bool:
        """Whether a :meth:`pause` took effect: the worker stopped (``keep``), or every request
        it returned finished (``abort``, ``wait``)."""
        if mode == "keep":
            return self._thread is None or self._frozen_seen.is_set() or not self._frozen
        return all(r.finished for r in inflight)

    @property
    def paused(self) -> bool:
        """Whether new requests are held (between :meth:`pause` and :meth:`resume`)."""
        return self._hold

    @property
    def num_active(self) -> int:
        """Requests admitted, queued or held."""
        with self._lock:
            return len(self._by_id)

    @property
    def num_held(self) -> int:
        """Requests submitted during a pause, waiting for :meth:`resume`."""
        with self._lock:
            return len(self._held)

    def find(self, request_id: str) -> GenerationRequest | None:
        """The unfinished request with this id (its token lists are the worker's: read only)."""
        with self._lock:
            return self._by_id.get(request_id)

    def between_steps(self, fn: Callable[[], _T]) -> Future[_T]:
        """Run ``fn`` on the worker thread between two steps (also while frozen), so no forward
        pass sees half of what it changes; runs it at once when the worker is not running."""
        fut: Future[_T] = Future()
        if self._thread is None or not self._running:
            try:
                fut.set_result(fn())
            except Exception as exc:
                fut.set_exception(exc)
            return fut
        self._control.put((fn, fut))
        self._wake()
        return fut

    def swap_model(
        self, model: TinyModel, adapters: dict[str, ServedAdapter] | None = None
    ) -> None:
        """Serve ``model`` (and ``adapters`` applied to it) from the next step on and drop the
        prefix cache (its KV came from the old weights); call it through :meth:`between_steps`
        while the worker runs."""
        self.model = model
        if adapters is not None:
            self.adapters = adapters
        self.weights_gen += 1
        self.prefix_cache.clear()

    def _model(self, req: GenerationRequest) -> TinyModel:
        """The weights ``req`` runs on: its adapter's (as reloaded, while loaded), or the base."""
        if req.lora is None:
            return self.model
        req.lora = self.adapters.get(req.lora.name, req.lora)
        return req.lora.model

    def _version_of(self, req: GenerationRequest) -> str:
        return self._version() if req.lora is None else req.lora.version

    # ----------------------------------------------------------------- worker
    def _wake(self) -> None:
        self._kick.set()
        self._queue.put(None)  # unblocks a worker idle on the queue

    def _run_control(self) -> None:
        while True:
            try:
                fn, fut = self._control.get_nowait()
            except queue.Empty:
                return
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except Exception as exc:
                fut.set_exception(exc)

    def _loop(self) -> None:
        while self._running:
            try:
                self._run_control()
                if self._frozen:
                    self._idle_frozen()
                    continue
                self._admit_queued()
                # One prefill chunk, then one decode step: a long prompt delays the other
                # streams by a chunk's worth of compute per token, never by its whole prefill.
                self._prefill_chunk()
                self._step()
            except Exception as exc:  # a bug: fail the requests in flight rather than hang them
                inflight = [*self._active, *self._prefilling]
                logger.exception(
                    "engine worker failed; failing %d request(s) in flight", len(inflight)
                )
                for r in inflight:
                    self._fail(r, exc)
                self._active = []
                self._prefilling.clear()
        self._shut_down()

    def _admit_queued(self) -> None:
        block = not self._active and not self._prefilling
        while len(self._active) + len(self._prefilling) < self._max_batch:
            try:
                req = self._queue.get(block=block, timeout=0.5 if block else None)
            except queue.Empty:
                return
            if req is None:  # a wake-up: look at the control queue and the pause first
                return
            block = False
            self._admit(req)

    def _idle_frozen(self) -> None:
        # Frozen requests keep their place; only aborts (cheap, no model work) are honoured.
        for r in [r for r in self._active if r.aborted]:
            self._finish(r, "abort", None)
        for r in [r for r in self._prefilling if r.aborted]:
            self._finish(r, "abort", None)
        self._active = [r for r in self._active if not r.aborted]
        self._prefilling = deque(r for r in self._prefilling if not r.aborted)
        self._frozen_seen.set()
        self._kick.wait(0.5)
        self._kick.clear()

    def _shut_down(self) -> None:
        for r in [*self._active, *self._prefilling]:
            r.aborted = True
            self._finish(r, "abort", None)
        self._active = []
        self._prefilling.clear()
        with self._lock:
            held, self._held = self._held, []
        while True:
            try:
                req = self._queue.get_nowait()
            except queue.Empty:
                break
            if req is not None:
                held.append(req)
        for req in held:
            self._fail(req, RuntimeError("engine stopped"))
        self._run_control()

    def _fail(self, req: GenerationRequest, exc: Exception) -> None:
        with self._lock:
            self._by_id.pop(req.request_id, None)
        req.cache = None
        req.finished = True
        req.emit(exc)

    def _admit(self, req: GenerationRequest) -> None:
        try:
            if req.aborted:
                self._finish(req, "abort", None)
                return
            p = req.params
            req.weights_gen = self.weights_gen
            model = self._model(req)
            req.cache_tag = req.lora.tag if req.lora is not None else 0
            req.rng = np.random.default_rng(
                p.seed if p.seed is not None else self._seeds.spawn(1)[0]
            )
            stops = set(p.stop_token_ids)
            if not p.ignore_eos:
                tok = self.model.tokenizer
                stops |= tok.stop_ids
            req.stop_ids = frozenset(stops)
            if req.forced_ids is not None:
                forced, reason, stop_reason = req.cut_forced(self.model.tokenizer)
                req.forced_ids = forced
                req.forced_end = (reason, stop_reason)
            req.seq = req.prompt_ids + (req.forced_ids or [])
            # Prompt log-probs need logits at every prompt position: compute them all.
            limit = len(req.prompt_ids) - 1 if p.prompt_logprobs is None else 0
            req.cache, experts = self.prefix_cache.restore(model, req.seq, limit, req.cache_tag)
            req.fed = req.cached_tokens = req.cache.length
            if experts is not None:
                req.experts.append(experts)
            if p.prompt_logprobs is not None:
                req.prompt_lp = [None]
            self._prefilling.append(req)
        except Exception as exc:
            logger.exception("engine: admitting request %s failed", req.request_id)
            self._fail(req, exc)

    def _prefill_chunk(self) -> None:
        """Feed the next chunk of the oldest prefilling request (round-robin between prompts)."""
        if not self._prefilling:
            return
        req = self._prefilling.popleft()
        if req.aborted:
            self._finish(req, "abort", None)
            return
        try:
            self._feed(req)
        except Exception as exc:  # a bug: fail this request, keep serving the others
            logger.exception("engine: prefill of request %s failed", req.request_id)
            self._fail(req, exc)

    def _feed(self, req: GenerationRequest) -> None:
        assert req.cache is not None
        p = req.params
        P = len(req.prompt_ids)
        forced = req.forced_ids
        a = req.fed
        b = min(a + self._chunk, len(req.seq))
        # Rows before the last prompt token are only read for prompt log-probs.
        skip = 0 if req.prompt_lp is not None else min(max(P - 1 - a, 0), b - a)
        logits, experts = self._model(req).forward(req.seq[a:b], req.cache, logits_from=skip)
        self.prefill_chunks += 1
        req.experts.append(experts)
        req.fed = b
        base = a + skip  # position of logits row 0; row i predicts the token at base + i + 1
        if req.prompt_lp is not None and min(b, P - 1) > base:
            end = min(b, P - 1)
            lps = token_logprobs(logits[: end - base], req.logprobs_mode, p.temperature)
            k = p.prompt_logprobs or 0
            for i in range(end - base):
                tid = req.prompt_ids[base + i + 1]
                row = lps[i]
                req.prompt_lp.append(
                    (tid, float(row[tid]), token_rank(row, tid), top_logprobs(row, k))
                )
        if forced:
            f0, f1 = max(base, P - 1), min(b, P - 1 + len(forced))
            if f1 > f0:
                lps = token_logprobs(
                    logits[f0 - base : f1 - base], req.logprobs_mode, p.temperature
                )
                version = self._version_of(req)
                for i in range(f1 - f0):
                    req.record(forced[f0 - P + 1 + i], lps[i], version)
        if b < len(req.seq):
            self._prefilling.append(req)
            return
        if forced is not None:
            reason, stop_reason = req.forced_end
            self._finish(req, reason, stop_reason)
        elif p.max_tokens == 0:
            self._finish(req, "length", None)
        elif not self._accept(req, logits[-1]):
            self._active.append(req)

    def _accept(self, req: GenerationRequest, logits: np.ndarray) -> bool:
        """Sample from ``logits``, record the token and finish if a stop condition hit; True if finished."""
        p = req.params
        assert req.rng is not None
        tid = choose_token(logits, p, req.rng)
        lp = token_logprobs(logits, req.logprobs_mode, p.temperature)
        req.record(tid, lp, self._version_of(req))
        if req.aborted:
            self._finish(req, "abort", None)
            return True
        if tid in req.stop_ids:
            self._finish(req, "stop", tid if tid in p.stop_token_ids else None)
            return True
        if p.stop:
            text = self.model.tokenizer.decode(
                req.output_ids, skip_special_tokens=p.skip_special_tokens
            )
            for s in p.stop:
                if s and s in text:
                    self._finish(req, "stop", s)
                    return True
        if len(req.output_ids) >= p.max_tokens:
            self._finish(req, "length", None)
            return True
        if req.cache is not None and req.cache.length + 1 > self.model.config.max_model_len:
            self._finish(req, "length", None)
            return True
        return False

    def _step(self) -> None:
        live: list[GenerationRequest] = []
        for r in self._active:
            if r.aborted:
                self._finish(r, "abort", None)
            else:
                live.append(r)
        self._active = live
        if not live:
            return
        # one batched decode per weight set (the base, each adapter in use)
        groups: dict[int, list[GenerationRequest]] = {}
        models: dict[int, TinyModel] = {}
        for r in live:
            model = self._model(r)
            models[id(model)] = model
            groups.setdefault(id(model), []).append(r)
        self.steps += 1
        still: list[GenerationRequest] = []
        for key, reqs in groups.items():
            caches = [r.cache for r in reqs]
            assert all(c is not None for c in caches)
            ids = [r.output_ids[-1] for r in reqs]
            logits, experts = models[key].decode_batch(ids, caches)  # type: ignore[arg-type]
            for i, r in enumerate(reqs):
                r.experts.append(experts[i : i + 1])
                if not self._accept(r, logits[i]):
                    still.append(r)
        self._active = still

    def _finish(
        self,
        req: GenerationRequest,
        reason: FinishReason,
        stop_reason: str | int | None,
    ) -> None:
        with self._lock:
            self._by_id.pop(req.request_id, None)
        all_experts = np.concatenate(req.experts).astype(np.int32) if req.experts else None
        if (
            req.cache is not None
            and all_experts is not None
            and req.weights_gen == self.weights_gen
            and req.cache_tag == (req.lora.tag if req.lora is not None else 0)
        ):
            fed = req.seq if req.forced_ids is not None else req.prompt_ids + req.output_ids
            name = req.lora.name if req.lora is not None else None
            self.prefix_cache.insert(fed, req.cache, all_experts, req.cache_tag, name)
        completion = req.completion(reason, stop_reason, self.model.tokenizer, all_experts)
        req.cache = None
        req.experts = []
        req.finished = True
        req.emit(completion)
