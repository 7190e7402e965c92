"""The agent's view of a rollout: the ``_rollwire`` key of the payload (DESIGN §7), and model clients.

The same agent code serves production and training: :func:`openai_client` (and
:func:`anthropic_client` for Anthropic Messages agents) returns a client wired to the rollout
session when the payload carries ``_rollwire`` and the production client otherwise. Light on
purpose (agent containers import it): ``openai`` / ``anthropic`` are imported only when a client
is built.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import anthropic
    import openai

__all__ = [
    "PAYLOAD_KEY",
    "RolloutContext",
    "anthropic_client",
    "async_anthropic_client",
    "async_openai_client",
    "openai_client",
    "rollout_context",
    "rollout_create_kwargs",
    "rollout_model",
    "split_sampling",
]

#: The reserved payload key the trainer adds to a dataset row.
PAYLOAD_KEY = "_rollwire"
#: Retries of the OpenAI client inside a rollout; the gateway records them via
#: ``x-stainless-retry-count`` so a retried call is not trained twice.
ROLLOUT_MAX_RETRIES = 2
#: The payload versions this module reads (the ``_rollwire.version`` major number).
SUPPORTED_VERSIONS = frozenset({1})
_DEFAULT_TIMEOUT_S = 600.0
#: Keyword arguments of ``chat.completions.create`` a session sampling key may be passed as; any
#: other key (``top_k``, ``min_p``, ``repetition_penalty``...) goes in ``extra_body``.
CREATE_PARAMS = frozenset(
    {
        "temperature",
        "top_p",
        "max_tokens",
        "max_completion_tokens",
        "presence_penalty",
        "frequency_penalty",
        "seed",
        "stop",
        "n",
        "logprobs",
        "top_logprobs",
        "logit_bias",
        "reasoning_effort",
    }
)


@dataclass(frozen=True)
class RolloutContext:
    """Typed view of ``payload["_rollwire"]``: where the policy lives and where to report."""

    session_id: str
    base_url: str
    api_key: str
    complete_url: str
    model: str = "policy"
    sampling: dict[str, Any] = field(default_factory=dict)
    deadline: float | None = None
    group_id: str | None = None
    task_id: str | None = None
    version: int = 1

    @property
    def anthropic_base_url(self) -> str:
        """The session's base URL as Anthropic clients take it: without the ``/v1`` they add
        themselves (``{gateway}/s/{token}``)."""
        base = self.base_url.rstrip("/")
        return base[: -len("/v1")] if base.endswith("/v1") else base

    def remaining(self, now: float | None = None) -> float | None:
        """Seconds until the deadline (may be negative), or None when there is none."""
        if self.deadline is None:
            return None
        return self.deadline - (time.time() if now is None else now)

    def call_timeout(self, max_s: float = _DEFAULT_TIMEOUT_S) -> float:
        """Timeout for one model call: never past the rollout's deadline, at least 1 s."""
        remaining = self.remaining()
        return max_s if remaining is None else max(1.0, min(max_s, remaining))

    def to_payload(self) -> dict[str, Any]:
        """The ``_rollwire`` dict this context was read from."""
        return {
            "version": self.version,
            "session_id": self.session_id,
            "base_url": self.base_url,
            "api_key": self.api_key,
            "model": self.model,
            "sampling": dict(self.sampling),
            "complete_url": self.complete_url,
            "deadline": self.deadline,
            "group_id": self.group_id,
            "task_id": self.task_id,
        }


def rollout_context(payload: Any) -> RolloutContext | None:
    """The rollout context in ``payload``, or None for a production request (no ``_rollwire``).

    A ``_rollwire`` value that is present but malformed raises ``ValueError``: silently serving a
    training rollout with the production model would train on the wrong data.
    """
    if not isinstance(payload, Mapping):
        return None
    raw = payload.get(PAYLOAD_KEY)
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ValueError(f"payload[{PAYLOAD_KEY!r}] must be an object, got {type(raw).__name__}")
    missing = [k for k in ("session_id", "base_url", "api_key", "complete_url") if not raw.get(k)]
    if missing:
        raise ValueError(
            f"payload[{PAYLOAD_KEY!r}] lacks {', '.join(missing)}; it must be built by "
            "rollwire's RolloutClient (DESIGN §7)"
        )
    version = _version(raw.get("version"))
    deadline = raw.get("deadline")
    if deadline is not None:
        if isinstance(deadline, bool):
            deadline = math.nan
        try:
            deadline = float(deadline)
        except (TypeError, ValueError):
            deadline = math.nan
        if not math.isfinite(deadline):
            raise ValueError(
                f"payload[{PAYLOAD_KEY!r}]['deadline'] must be a finite epoch time in seconds, "
                f"got {raw.get('deadline')!r}"
            )
    sampling = raw.get("sampling") or {}
    if not isinstance(sampling, Mapping):
        raise ValueError(
            f"payload[{PAYLOAD_KEY!r}]['sampling'] must be an object, got {sampling!r}"
        )
    return RolloutContext(
        session_id=str(raw["session_id"]),
        base_url=str(raw["base_url"]),
        api_key=str(raw["api_key"]),
        complete_url=str(raw["complete_url"]),
        model=str(raw.get("model") or "policy"),
        sampling=dict(sampling),
        deadline=deadline,
        group_id=None if raw.get("group_id") is None else str(raw["group_id"]),
        task_id=None if raw.get("task_id") is None else str(raw["task_id"]),
        version=version,
    )


def _version(raw: Any) -> int:
    if raw is None:
        return 1
    try:
        major = int(str(raw).split(".")[0])
    except ValueError:
        major = -1
    if major not in SUPPORTED_VERSIONS:
        raise ValueError(
            f"payload[{PAYLOAD_KEY!r}]['version'] is {raw!r}, but this agent's rollwire reads "
            f"version {', '.join(map(str, sorted(SUPPORTED_VERSIONS)))}: install the trainer's "
            "rollwire version in the agent"
        )
    return major


def rollout_model(payload: Any, default: str) -> str:
    """The model name to request: the session's policy in a rollout, ``default`` in production."""
    ctx = rollout_context(payload)
    return ctx.model if ctx is not None else default


def rollout_create_kwargs(payload: Any, **production: Any) -> dict[str, Any]:
    """Keyword arguments for ``chat.completions.create``: ``production`` as given when the payload
    has no ``_rollwire``; in a rollout, the session's ``model`` and ``sampling`` laid over them
    (OpenAI parameters at the top level, the rest in ``extra_body``).

        client.chat.completions.create(
            messages=messages, **rollout_create_kwargs(payload, model="gpt-4o", temperature=0.2)
        )
    """
    ctx = rollout_context(payload)
    if ctx is None:
        return dict(production)
    out = split_sampling(ctx.sampling, CREATE_PARAMS, production)
    out["model"] = ctx.model
    return out


def session_timeout(ctx: RolloutContext, production: Any = None) -> Any:
    """A client timeout for the session: bounded by the deadline, also when production sets one.

    A number is capped at :meth:`RolloutContext.call_timeout`; any other production value (an
    ``httpx.Timeout``) is kept as it is, since it may carry connect/read settings of its own.
    """
    if production is None:
        return ctx.call_timeout()
    if isinstance(production, (int, float)) and not isinstance(production, bool):
        return ctx.call_timeout(float(production))
    return production


def split_sampling(
    sampling: Mapping[str, Any], known: Collection[str], base: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``base`` with the session's ``sampling`` laid over it (the session wins).

    Keys a client accepts by name (``known``) go at the top level; the rest (``top_k``,
    ``min_p``...) go into ``extra_body``, which OpenAI-compatible clients send as top-level JSON.
    """
    out = dict(base or {})
    extra = dict(out.get("extra_body") or {})
    for key, value in sampling.items():
        if key in known:
            out[key] = value
            extra.pop(key, None)
        else:
            extra[key] = value
            out.pop(key, None)
    if extra:
        out["extra_body"] = extra
    return out


def _session_kwargs(ctx: RolloutContext, production_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    # Keep harmless production settings (headers, http client), replace where the calls go.
    kwargs = {
        k: v
        for k, v in production_kwargs.items()
        if k not in ("base_url", "api_key", "organization", "project")
    }
    kwargs["base_url"] = ctx.base_url
    kwargs["api_key"] = ctx.api_key
    kwargs["max_retries"] = ROLLOUT_MAX_RETRIES
    kwargs["timeout"] = session_timeout(ctx, kwargs.get("timeout"))
    return kwargs


def openai_client(payload: Any, **production_kwargs: Any) -> openai.OpenAI:
    """An ``openai.OpenAI`` client for this rollout session, or ``openai.OpenAI(**production_kwargs)``
    when the payload has no ``_rollwire`` key."""
    import openai

    ctx = rollout_context(payload)
    if ctx is None:
        return openai.OpenAI(**production_kwargs)
    return openai.OpenAI(**_session_kwargs(ctx, production_kwargs))


def async_openai_client(payload: Any, **production_kwargs: Any) -> openai.AsyncOpenAI:
    """The ``openai.AsyncOpenAI`` twin of :func:`openai_client`."""
    import openai

    ctx = rollout_context(payload)
    if ctx is None:
        return openai.AsyncOpenAI(**production_kwargs)
    return openai.AsyncOpenAI(**_session_kwargs(ctx, production_kwargs))


def _anthropic_kwargs(ctx: RolloutContext, production_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    kwargs = {
        k: v for k, v in production_kwargs.items() if k not in ("base_url", "api_key", "auth_token")
    }
    # The Anthropic SDK appends ``/v1/messages`` itself; the session token goes as ``x-api-key``.
    kwargs["base_url"] = ctx.anthropic_base_url
    kwargs["api_key"] = ctx.api_key
    kwargs["max_retries"] = ROLLOUT_MAX_RETRIES
    kwargs["timeout"] = session_timeout(ctx, kwargs.get("timeout"))
    return kwargs


def _import_anthropic() -> Any:
    try:
        import anthropic
    except ImportError as exc:
        raise ImportError(
            "anthropic_client needs the Anthropic SDK: pip install anthropic"
        ) from exc
    return anthropic


def anthropic_client(payload: Any, **production_kwargs: Any) -> anthropic.Anthropic:
    """An ``anthropic.Anthropic`` client for this rollout session (Messages API through the
    gateway), or ``anthropic.Anthropic(**production_kwargs)`` when the payload has no
    ``_rollwire`` key."""
    sdk = _import_anthropic()
    ctx = rollout_context(payload)
    if ctx is None:
        return sdk.Anthropic(**production_kwargs)  # type: ignore[no-any-return]
    return sdk.Anthropic(**_anthropic_kwargs(ctx, production_kwargs))  # type: ignore[no-any-return]


def async_anthropic_client(payload: Any, **production_kwargs: Any) -> anthropic.AsyncAnthropic:
    """The ``anthropic.AsyncAnthropic`` twin of :func:`anthropic_client`."""
    sdk = _import_anthropic()
    ctx = rollout_context(payload)
    if ctx is None:
        return sdk.AsyncAnthropic(**production_kwargs)  # type: ignore[no-any-return]
    return sdk.AsyncAnthropic(**_anthropic_kwargs(ctx, production_kwargs))  # type: ignore[no-any-return]
