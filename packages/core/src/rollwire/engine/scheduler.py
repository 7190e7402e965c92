"""Continuous batching: one worker thread prefills new requests and steps all active ones together.

The HTTP server never runs model code on its event loop; it submits a :class:`GenerationRequest`
and receives events through a thread-safe callback.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ._blas import limit_blas_threads
from .model import KVCache, TinyModel
from .sampling import LogprobsMode, SamplingParams, choose_token, token_logprobs

__all__ = ["Completion", "GenerationRequest", "Scheduler", "TokenEvent"]

FinishReason = Literal["stop", "length", "abort"]


@dataclass
class TokenEvent:
    """One generated token (sent only to streaming requests)."""

    index: int
    token_id: int
    logprob: float
    rank: int
    top: list[tuple[int, float]] | None
    weight_version: str


@dataclass
class Completion:
    """The finished result of a request."""

    request_id: str
    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]
    ranks: list[int]
    top_logprobs: list[list[tuple[int, float]]] | None
    finish_reason: FinishReason
    #: vLLM's ``stop_reason``: the stop string or stop token id that ended it; None for EOS/length.
    stop_reason: str | int | None
    #: Visible text: stop token excluded, cut at a matched stop string.
    text: str
    #: ``[prompt + output - 1, layers, top_k]`` int32, when asked for.
    routed_experts: np.ndarray | None
    #: Weight version under which each output token was sampled.
    token_versions: list[str]
    #: Per prompt position: None for the first, else ``(token_id, logprob, rank, top)``.
    prompt_logprobs: list[tuple[int, float, int, list[tuple[int, float]]] | None] | None = None
    forced: bool = False

    def weight_versions(self) -> list[dict[str, Any]]:
        """Runs of equal version as vLLM's ``[{version, start, end}]`` (token index ranges)."""
        runs: list[dict[str, Any]] = []
        for i, v in enumerate(self.token_versions):
            if runs and runs[-1]["version"] == v:
                runs[-1]["end"] = i + 1
            else:
                runs.append({"version": v, "start": i, "end": i + 1})
        return runs


Emit = Callable[[Any], None]


@dataclass
class GenerationRequest:
    """A request handed to the scheduler; ``emit`` receives TokenEvents (if ``stream``) then a Completion
    (or an Exception)."""

    prompt_ids: list[int]
    params: SamplingParams
    emit: Emit
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    forced_ids: list[int] | None = None
    stream: bool = False
    logprobs_mode: LogprobsMode = "raw"
    want_experts: bool = False
    aborted: bool = False
    # --- state owned by the worker thread
    cache: KVCache | None = None
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)
    experts: list[np.ndarray] = field(default_factory=list)
    rng: np.random.Generator | None = None
    stop_ids: frozenset[int] = frozenset()
    prompt_lp: list[tuple[int, float, int, list[tuple[int, float]]] | None] | None = None

    def abort(self) -> None:
        """Ask the worker to stop this request at the next step (finish_reason ``abort``)."""
        self.aborted = True


def _top(lp: np.ndarray, k: int) -> list[tuple[int, float]]:
    if k <= 0:
        return []
    k = min(k, lp.shape[0])
    idx = np.argpartition(-lp, k - 1)[:k]
    idx = idx[np.argsort(-lp[idx], kind="stable")]
    return [(int(i), float(lp[i])) for i in idx]


def _rank(lp: np.ndarray, tid: int) -> int:
    return int(np.count_nonzero(lp > lp[tid])) + 1


class Scheduler:
    """Owns the model's compute: a worker thread with continuous batching of decode steps."""

    def __init__(
        self,
        model: TinyModel,
        *,
        version: Callable[[], str],
        max_batch_size: int = 64,
        seed: int = 0,
    ) -> None:
        self.model = model
        self._version = version
        self._max_batch = max_batch_size
        self._queue: queue.Queue[GenerationRequest | None] = queue.Queue()
        self._active: list[GenerationRequest] = []
        self._by_id: dict[str, GenerationRequest] = {}
        self._lock = threading.Lock()
        self._seeds = np.random.SeedSequence(seed)
        self._thread: threading.Thread | None = None
        self._running = False
        self._paused = threading.Event()
        self._paused.set()  # set = running; cleared = paused (keep)
        self.steps = 0

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Start the worker thread (idempotent)."""
        if self._thread is not None:
            return
        limit_blas_threads(1)
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="rollwire-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Abort everything and join the worker."""
        self._running = False
        self._paused.set()
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def submit(self, req: GenerationRequest) -> None:
        """Queue a request; results arrive through ``req.emit``."""
        with self._lock:
            self._by_id[req.request_id] = req
        self._queue.put(req)

    def abort(self, request_ids: list[str] | None = None) -> int:
        """Abort the named requests (all when None); returns how many were found."""
        with self._lock:
            reqs = (
                list(self._by_id.values())
                if request_ids is None
                else [self._by_id[r] for r in request_ids if r in self._by_id]
            )
        for r in reqs:
            r.abort()
        return len(reqs)

    def pause(self) -> None:
        """Freeze decoding (requests stay in place) until :meth:`resume`."""
        self._paused.clear()

    def resume(self) -> None:
        """Continue after :meth:`pause`."""
        self._paused.set()

    @property
    def paused(self) -> bool:
        """Whether decoding is frozen."""
        return not self._paused.is_set()

    @property
    def num_active(self) -> int:
        """Requests admitted or waiting."""
        with self._lock:
            return len(self._by_id)

    # ----------------------------------------------------------------- worker
    def _loop(self) -> None:
        while self._running:
            self._paused.wait()
            try:
                block = not self._active
                while len(self._active) < self._max_batch:
                    try:
                        req = self._queue.get(block=block, timeout=0.5 if block else None)
                    except queue.Empty:
                        break
                    block = False
                    if req is None:
                        if not self._running:
                            break
                        continue
                    self._admit(req)
                self._step()
            except (
                Exception
            ) as exc:  # pragma: no cover - a bug; fail requests rather than hang them
                for r in self._active:
                    self._fail(r, exc)
                self._active = []
        for r in self._active:
            r.aborted = True
            self._finish(r, "abort", None)
        self._active = []
        while True:
            try:
                req = self._queue.get_nowait()
            except queue.Empty:
                break
            if req is not None:
                self._fail(req, RuntimeError("engine stopped"))

    def _fail(self, req: GenerationRequest, exc: Exception) -> None:
        with self._lock:
            self._by_id.pop(req.request_id, None)
        req.emit(exc)

    def _admit(self, req: GenerationRequest) -> None:
        try:
            if req.aborted:
                self._finish(req, "abort", None)
                return
            p = req.params
            req.rng = np.random.default_rng(
                p.seed if p.seed is not None else self._seeds.spawn(1)[0]
            )
            stops = set(p.stop_token_ids)
            if not p.ignore_eos:
                tok = self.model.tokenizer
                stops |= {tok.eos_id, tok.pad_id}
            req.stop_ids = frozenset(stops)
            if req.forced_ids is not None:
                self._run_forced(req)
                return
            logits, experts, cache = self.model.prefill(req.prompt_ids)
            req.cache = cache
            if req.want_experts:
                req.experts.append(experts)
            if p.prompt_logprobs is not None:
                req.prompt_lp = self._prompt_logprobs(req, logits)
            if p.max_tokens == 0:
                self._finish(req, "length", None)
                return
            if not self._accept(req, logits[-1]):
                self._active.append(req)
        except Exception as exc:
            self._fail(req, exc)

    def _prompt_logprobs(
        self, req: GenerationRequest, logits: np.ndarray
    ) -> list[tuple[int, float, int, list[tuple[int, float]]] | None]:
        p = req.params
        k = p.prompt_logprobs or 0
        out: list[tuple[int, float, int, list[tuple[int, float]]] | None] = [None]
        if len(req.prompt_ids) > 1:
            lps = token_logprobs(logits[:-1], req.logprobs_mode, p.temperature)
            for i, tid in enumerate(req.prompt_ids[1:]):
                row = lps[i]
                out.append((tid, float(row[tid]), _rank(row, tid), _top(row, k)))
        return out

    def _run_forced(self, req: GenerationRequest) -> None:
        """Teacher-force ``forced_ids``: one prefill over prompt + forced tokens gives their real
        log-probs and routed experts."""
        forced = list(req.forced_ids or [])
        p = req.params
        full = req.prompt_ids + forced
        logits, experts, _ = self.model.prefill(full)
        P = len(req.prompt_ids)
        if p.prompt_logprobs is not None:
            req.prompt_lp = self._prompt_logprobs(req, logits[:P])
        lps = token_logprobs(logits[P - 1 : P - 1 + len(forced)], req.logprobs_mode, p.temperature)
        version = self._version()
        for i, tid in enumerate(forced):
            row = lps[i]
            self._record(req, tid, row, version)
        if req.want_experts:
            req.experts.append(experts[: P + len(forced) - 1])
        last = forced[-1] if forced else None
        stop_reason = last if last is not None and last in p.stop_token_ids else None
        self._finish(req, "stop", stop_reason, counted_last=True)

    def _record(self, req: GenerationRequest, tid: int, lp: np.ndarray, version: str) -> None:
        p = req.params
        logprob = float(lp[tid])
        rank = _rank(lp, tid) if p.logprobs is not None else 1
        top = _top(lp, p.logprobs) if p.logprobs else []
        req.output_ids.append(tid)
        req.logprobs.append(logprob)
        req.ranks.append(rank)
        req.tops.append(top)
        req.versions.append(version)
        if req.stream:
            req.emit(
                TokenEvent(
                    len(req.output_ids) - 1,
                    tid,
                    logprob,
                    rank,
                    top if p.logprobs is not None else None,
                    version,
                )
            )

    def _accept(self, req: GenerationRequest, logits: np.ndarray) -> bool:
        """Sample from ``logits``, record the token and finish if a stop condition hit; True if finished."""
        p = req.params
        assert req.rng is not None
        tid = choose_token(logits, p, req.rng)
        lp = token_logprobs(logits, req.logprobs_mode, p.temperature)
        self._record(req, tid, lp, self._version())
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
        caches = [r.cache for r in live]
        assert all(c is not None for c in caches)
        logits, experts = self.model.decode_batch([r.output_ids[-1] for r in live], caches)  # type: ignore[arg-type]
        self.steps += 1
        still: list[GenerationRequest] = []
        for i, r in enumerate(live):
            if r.want_experts:
                r.experts.append(experts[i : i + 1])
            if not self._accept(r, logits[i]):
                still.append(r)
        self._active = still

    def _finish(
        self,
        req: GenerationRequest,
        reason: FinishReason,
        stop_reason: str | int | None,
        counted_last: bool = False,
    ) -> None:
        with self._lock:
            self._by_id.pop(req.request_id, None)
        p = req.params
        tok = self.model.tokenizer
        ids = req.output_ids
        # The stop token is in token_ids but never in the text (vLLM), unless asked for.
        text_ids = ids
        if (
            reason == "stop"
            and ids
            and ids[-1] in req.stop_ids
            and not p.include_stop_str_in_output
        ):
            text_ids = ids[:-1]
        text = tok.decode(text_ids, skip_special_tokens=p.skip_special_tokens)
        if isinstance(stop_reason, str) and not p.include_stop_str_in_output:
            text = text[: text.find(stop_reason)]
        experts = None
        if req.want_experts and req.experts:
            experts = np.concatenate(req.experts).astype(np.int32)
            # Every token fed through the model has experts; the last output token never was.
            experts = experts[: max(len(req.prompt_ids) + len(ids) - 1, 0)]
        completion = Completion(
            request_id=req.request_id,
            prompt_ids=req.prompt_ids,
            output_ids=list(ids),
            logprobs=list(req.logprobs),
            ranks=list(req.ranks),
            top_logprobs=list(req.tops) if p.logprobs is not None else None,
            finish_reason=reason,
            stop_reason=stop_reason,
            text=text,
            routed_experts=experts,
            token_versions=list(req.versions),
            prompt_logprobs=req.prompt_lp,
            forced=req.forced_ids is not None,
        )
        req.cache = None
        req.emit(completion)


def wait_idle(scheduler: Scheduler, timeout: float = 10.0) -> bool:
    """Block until no request is in flight (tests and pause-wait)."""
    deadline = time.monotonic() + timeout
    while scheduler.num_active:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True
