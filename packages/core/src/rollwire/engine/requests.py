"""What the scheduler hands back and forth with the routes: a queued :class:`GenerationRequest`,
the :class:`TokenEvent` s of a stream and the final :class:`Completion`."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from .lora import ServedAdapter
from .model import KVCache
from .sampling import LogprobsMode, SamplingParams, token_rank, top_logprobs
from .tokenizer import EngineTokenizer

__all__ = ["Completion", "Emit", "FinishReason", "GenerationRequest", "TokenEvent"]

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
    #: ``[prompt + output - 1, layers, top_k]`` int32, when asked for (None for a dense model).
    routed_experts: np.ndarray | None
    #: Weight version under which each output token was sampled.
    token_versions: list[str]
    #: Per prompt position: None for the first, else ``(token_id, logprob, rank, top)``.
    prompt_logprobs: list[tuple[int, float, int, list[tuple[int, float]]] | None] | None = None
    forced: bool = False
    #: Prompt tokens whose KV came from the prefix cache (SGLang's ``cached_tokens``).
    cached_tokens: int = 0

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


@dataclass(eq=False)  # an entity: compared (and found in lists) by identity
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
    #: The LoRA adapter the request names (None: the base weights); the scheduler follows a
    #: reload of it by name
    lora: ServedAdapter | None = None
    aborted: bool = False
    #: Set once the request's Completion (or error) was emitted.
    finished: bool = False
    #: Submitted while the scheduler was paused: waits outside the worker's queue until resume.
    held: bool = False
    # --- state owned by the worker thread
    #: The scheduler's weights generation at admission; a reload in flight bumps it, and a
    #: sequence whose KV spans two weight sets is not offered to the prefix cache.
    weights_gen: int = 0
    #: The adapter load the request was admitted under (0: the base): its prefix-cache tag
    cache_tag: int = 0
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
    #: Prompt + forced tokens to prefill, how many are in the cache, how many came from reuse.
    seq: list[int] = field(default_factory=list)
    fed: int = 0
    cached_tokens: int = 0
    forced_end: tuple[FinishReason, str | int | None] = ("stop", None)

    def abort(self) -> None:
        """Ask the worker to stop this request at the next step (finish_reason ``abort``)."""
        self.aborted = True

    def record(self, tid: int, lp: np.ndarray, version: str) -> None:
        """Append the sampled (or forced) token ``tid`` with its log-probs row ``lp``, sampled
        under weight ``version``; a streaming request gets its :class:`TokenEvent`."""
        p = self.params
        logprob = float(lp[tid])
        rank = token_rank(lp, tid) if p.logprobs is not None else 1
        top = top_logprobs(lp, p.logprobs) if p.logprobs else []
        self.output_ids.append(tid)
        self.logprobs.append(logprob)
        self.ranks.append(rank)
        self.tops.append(top)
        self.versions.append(version)
        if self.stream:
            shown = top if p.logprobs is not None else None
            self.emit(TokenEvent(len(self.output_ids) - 1, tid, logprob, rank, shown, version))

    def cut_forced(
        self, tokenizer: EngineTokenizer
    ) -> tuple[list[int], FinishReason, str | int | None]:
        """Where the scripted reply ends under ``max_tokens`` and the stop settings, as if the
        model had sampled it: the kept tokens, the finish reason and vLLM's ``stop_reason``."""
        p, forced = self.params, self.forced_ids or []
        if p.max_tokens <= 0:
            return [], "length", None
        for n, tid in enumerate(forced, start=1):
            if tid in self.stop_ids:
                return forced[:n], "stop", tid if tid in p.stop_token_ids else None
            if p.stop:
                text = tokenizer.decode(forced[:n], skip_special_tokens=p.skip_special_tokens)
                for s in p.stop:
                    if s and s in text:
                        return forced[:n], "stop", s
            if n >= p.max_tokens and n < len(forced):
                return forced[:n], "length", None
        last = forced[-1] if forced else None
        return forced, "stop", last if last is not None and last in p.stop_token_ids else None

    def completion(
        self,
        reason: FinishReason,
        stop_reason: str | int | None,
        tokenizer: EngineTokenizer,
        all_experts: np.ndarray | None,
    ) -> Completion:
        """The finished result: visible text (stop token and stop string cut as vLLM does),
        routed experts when asked (``all_experts``: every token fed through the model)."""
        p, ids = self.params, self.output_ids
        # The stop token is in token_ids but never in the text (vLLM), unless asked for.
        text_ids = ids
        if (
            reason == "stop"
            and ids
            and ids[-1] in self.stop_ids
            and not p.include_stop_str_in_output
        ):
            text_ids = ids[:-1]
        text = tokenizer.decode(text_ids, skip_special_tokens=p.skip_special_tokens)
        if isinstance(stop_reason, str) and not p.include_stop_str_in_output:
            text = text[: text.find(stop_reason)]
        experts = None
        # A dense model routes nothing: no experts to report (an empty last axis).
        if self.want_experts and all_experts is not None and all_experts.shape[-1]:
            # Every token fed through the model has experts; the last output token never was.
            experts = all_experts[: max(len(self.prompt_ids) + len(ids) - 1, 0)]
        return Completion(
            request_id=self.request_id,
            prompt_ids=self.prompt_ids,
            output_ids=list(ids),
            logprobs=list(self.logprobs),
            ranks=list(self.ranks),
            top_logprobs=list(self.tops) if p.logprobs is not None else None,
            finish_reason=reason,
            stop_reason=stop_reason,
            text=text,
            routed_experts=experts,
            token_versions=list(self.versions),
            prompt_logprobs=self.prompt_lp,
            forced=self.forced_ids is not None,
            cached_tokens=self.cached_tokens,
        )
