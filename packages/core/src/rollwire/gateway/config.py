"""Gateway configuration: one explicit object, passed in (no globals)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["BackendSpec", "GatewayConfig"]

BACKEND_KINDS = ("vllm", "sglang", "openai", "tinker")


@dataclass
class BackendSpec:
    """An inference server: base ``url`` (with or without ``/v1``) and its API ``kind``."""

    url: str
    kind: str = "vllm"
    name: str | None = None
    #: the name the server serves its model under; requests are sent with it whatever model name
    #: the agent used (agents are told ``policy``). When not given it is read from
    #: ``GET /v1/models`` of ``vllm``/``sglang`` backends at every passing health check (so a
    #: backend restarted under a new name is followed); ``openai`` backends are never rewritten
    #: unless set.
    model: str | None = None
    #: the tokenizer folder (or hub id) capture="tokens" renders prompts for this server with;
    #: needed for a remote vLLM, whose ``/v1/models`` names a path on its own host. A session's
    #: ``metadata["tokenizer"]`` still wins.
    tokenizer: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in BACKEND_KINDS:
            raise ValueError(
                f"unknown backend kind {self.kind!r} for {self.url}: use one of {BACKEND_KINDS}"
            )
        if self.kind == "tinker" and not self.model:
            raise ValueError(
                f"a tinker backend ({self.url}) needs model: the base model it samples until the "
                "first weight push (e.g. Qwen/Qwen3-8B) or a tinker://…/sampler_weights/… path"
            )
        url = self.url.rstrip("/")
        if url.endswith("/v1"):
            url = url[:-3]
        self.url = url

    @classmethod
    def parse(cls, spec: str | tuple[str, str] | BackendSpec | dict[str, Any]) -> BackendSpec:
        """From ``"URL"``, ``"URL=kind"``, ``(url, kind)``, a dict or a BackendSpec."""
        if isinstance(spec, BackendSpec):
            return spec
        if isinstance(spec, dict):
            return cls(**spec)
        if isinstance(spec, tuple):
            return cls(spec[0], spec[1])
        url, sep, kind = spec.rpartition("=")
        if sep and kind in BACKEND_KINDS:
            return cls(url, kind)
        return cls(spec)


@dataclass
class GatewayConfig:
    """Everything the gateway can be told. Defaults suit a local run."""

    backends: list[BackendSpec] = field(default_factory=list)
    store: str = "sqlite::memory:"
    admin_key: str | None = None
    secret: str | None = None  # HMAC key for session tokens; generated when None
    open: bool = False  # accept any session id as token (local development only)
    public_url: str | None = None  # how agents reach the gateway (for base_url); default: bound url
    max_body_bytes: int = 8 * 1024 * 1024
    default_ttl: float = 3600.0
    upstream_timeout: float = 600.0
    connect_timeout: float = 10.0
    health_interval: float = 5.0
    pool_size: int = 1024
    tune_gc: bool = False  # gc.freeze() + higher gen-0 threshold (the CLI turns it on)
    #: seconds between returns of the C heap's free pages to the OS, 0 never (the CLI: 2)
    memory_trim_interval: float = 0.0
    wait_poll_interval: float = 0.5
    #: seconds between reads of the state gateways share through the store (pause, policy
    #: version); a pause set through one gateway holds the others within this interval
    shared_state_interval: float = 0.5
    private_metrics: bool = False
    sweep_interval: float = 30.0  # seconds between sweeps that time out abandoned sessions  # /metrics and /health need the admin key too
