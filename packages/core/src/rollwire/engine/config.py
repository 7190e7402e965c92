"""Configuration of the embedded engine: one explicit object, passed in (no globals)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .model import ModelConfig

__all__ = ["EngineConfig", "FaultConfig", "ScriptFn"]

#: ``fn(messages, tools) -> text | None``; ``None`` lets the model sample.
ScriptFn = Callable[[list[dict[str, Any]], "list[dict[str, Any]] | None"], "str | None"]


@dataclass(frozen=True)
class FaultConfig:
    """Seeded fault injection on the generation routes, for reliability tests.

    Each rate is a probability per request; draws come from one ``random.Random(seed)`` in request
    order, so a run with the same requests sees the same faults.
    """

    error_rate: float = 0.0
    throttle_rate: float = 0.0
    latency_ms: float = 0.0
    truncate_stream_rate: float = 0.0
    drop_token_ids_rate: float = 0.0
    seed: int = 0
    retry_after_s: int = 1
    #: Not drawn per request: ``/v1/load_lora_adapter`` answers success and lists the adapter,
    #: but requests naming it are served by the base weights (an adapter that never arrived;
    #: a weight sync's probe must catch it)
    ignore_lora_loads: bool = False

    @property
    def active(self) -> bool:
        """Whether any per-request fault can fire."""
        return any(
            (
                self.error_rate,
                self.throttle_rate,
                self.latency_ms,
                self.truncate_stream_rate,
                self.drop_token_ids_rate,
            )
        )


@dataclass(frozen=True)
class EngineConfig:
    """Everything the embedded engine needs: model, log-prob semantics, scripting and faults.

    ``scripted`` is a path to a JSON/YAML script, a ``"module:function"`` string, a mapping in the
    script format, or a Python callable ``fn(messages, tools) -> str | None``.
    """

    model_dir: str | Path | None = None
    seed: int = 0
    model: ModelConfig | None = None
    #: Names ``/v1/models`` lists (vLLM's ``--served-model-name``); the first is the default.
    served_model_names: Sequence[str] = ("rollwire-tiny",)
    #: When True (vLLM's behaviour), a request naming another model gets a 404; the gateway sends
    #: the served name it discovers from ``/v1/models``. False accepts and echoes any name.
    strict_model_name: bool = True
    logprobs_mode: Literal["raw", "processed"] = "raw"
    return_routed_experts: bool = False
    #: how tool calls are read from the model's text when a request offers tools (vLLM's
    #: ``--tool-call-parser``): ``hermes`` (``<tool_call>`` JSON blocks, what the engine's and
    #: SmolLM2's templates teach) or ``mistral`` (``[TOOL_CALLS]`` JSON; non-streamed answers)
    tool_call_parser: Literal["hermes", "mistral"] = "hermes"
    scripted: str | Path | Mapping[str, Any] | ScriptFn | None = None
    faults: FaultConfig = field(default_factory=FaultConfig)
    weight_version: str = "0"
    #: Used when a request names no ``max_tokens``; vLLM would use the whole context, which for a
    #: random model means thousands of tokens of noise per call.
    default_max_tokens: int = 512
    #: The context served (vLLM's ``--max-model-len``; reported as ``max_model_len`` by
    #: ``/v1/models`` and ``/tokenize``); None keeps the model's own (8192 for the default model).
    max_model_len: int | None = None
    max_batch_size: int = 64
    max_top_logprobs: int = 20
    #: Prompt tokens per prefill chunk; decode steps of other requests run between chunks.
    prefill_chunk_tokens: int = 256
    #: Token budget of the prefix KV cache (about 4 KiB per token for the default model); 0 disables.
    prefix_cache_tokens: int = 32768
    #: Memory budget of the prefix KV cache in MiB: it holds at most this much KV, whatever
    #: ``prefix_cache_tokens`` says (SmolLM2-135M: 45 KiB per token, so about 11,600 tokens).
    prefix_cache_mib: int = 512
    #: Where the OpenAI routes put token ids when asked. ``"vllm"``: ``return_token_ids`` adds
    #: ``prompt_token_ids`` and per-choice ``token_ids``. ``"sglang"`` (SGLang's OpenAI server):
    #: a non-streamed chat choice carries ``prompt_token_ids`` and ``response_token_ids``, and a
    #: streamed chat refuses ``return_token_ids`` (400). Either way a stream honours
    #: ``return_output_ids_in_sglext``: one final chunk ``{"choices": [], "sglext": {input_ids,
    #: output_ids}}`` before ``[DONE]``.
    openai_ids_style: Literal["vllm", "sglang"] = "vllm"

    def __post_init__(self) -> None:
        names = (
            (self.served_model_names,)
            if isinstance(self.served_model_names, str)
            else tuple(str(n) for n in self.served_model_names)
        )
        if not names or not all(names):
            raise ValueError(
                f"served_model_names needs at least one non-empty name, got {self.served_model_names!r}"
            )
        object.__setattr__(self, "served_model_names", names)
        if self.openai_ids_style not in ("vllm", "sglang"):
            raise ValueError(
                f"openai_ids_style must be 'vllm' or 'sglang', got {self.openai_ids_style!r}"
            )
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be at least 2, got {self.max_model_len!r}")
        if self.logprobs_mode not in ("raw", "processed"):
            raise ValueError(
                f"logprobs_mode must be 'raw' or 'processed', got {self.logprobs_mode!r}"
            )

    @property
    def model_name(self) -> str:
        """The default served name (the first of ``served_model_names``)."""
        return self.served_model_names[0]
