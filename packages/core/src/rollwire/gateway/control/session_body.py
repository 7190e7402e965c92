"""The body of ``POST /api/sessions``, checked field by field, as the :class:`SessionRecord` it asks
for (400 naming the field otherwise)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson

from rollwire.gateway.control.base import (
    MAX_LABEL,
    MAX_METADATA,
    check_session_id,
    positive_int,
    positive_seconds,
)
from rollwire.gateway.dataplane.sampling import POLICIES, check_sampling
from rollwire.gateway.dataplane.staleness import ON_STALE
from rollwire.gateway.errors import GatewayError
from rollwire.store import SessionRecord

__all__ = ["session_record"]


_CREATE_FIELDS = {
    "session_id",
    "group_id",
    "task_id",
    "metadata",
    "sampling",
    "sampling_policy",
    "ttl",
    "max_calls",
    "max_tokens",
    "capture",
    "allow_off_policy",
    "routed_experts",
    "chat_template_kwargs",
    "max_staleness",
    "on_stale",
}


def _check_labels(body: dict[str, Any]) -> None:
    """``session_id``, ``group_id`` and ``task_id``: bounded strings (a number becomes one)."""
    for key in ("session_id", "group_id", "task_id"):
        value = body.get(key)
        if type(value) is int:
            body[key] = str(value)  # a numeric task index names the task as well
        elif value is not None and not isinstance(value, str):
            raise GatewayError(400, f"{key} must be a string, got {value!r}", code="invalid_field")
        elif isinstance(value, str) and len(value) > MAX_LABEL:
            raise GatewayError(
                400, f"{key} is over {MAX_LABEL} characters ({len(value)})", code="invalid_field"
            )


def _staleness(body: dict[str, Any]) -> tuple[int | None, str]:
    """``max_staleness`` (a count of policy versions, 0 or more) and ``on_stale``."""
    bound = body.get("max_staleness")
    if bound is not None and (type(bound) is not int or bound < 0):
        raise GatewayError(
            400,
            f"max_staleness must be a whole number of policy versions (0 or more), got {bound!r}",
            code="invalid_field",
        )
    on_stale = body.get("on_stale")
    if on_stale is None:
        on_stale = "hold"
    elif on_stale not in ON_STALE:
        raise GatewayError(
            400, f"on_stale must be one of {ON_STALE}, got {on_stale!r}", code="invalid_field"
        )
    return bound, on_stale


def session_record(body: dict[str, Any], default_ttl: float) -> SessionRecord:
    """The session a ``POST /api/sessions`` body asks for (400 on a field of the wrong kind)."""
    unknown = set(body) - _CREATE_FIELDS
    if unknown:
        raise GatewayError(
            400, f"unknown session fields {sorted(unknown)}; allowed: {sorted(_CREATE_FIELDS)}"
        )
    capture = body.get("capture") or "passthrough"
    if capture not in ("passthrough", "tokens"):
        raise GatewayError(400, f"capture must be 'passthrough' or 'tokens', got {capture!r}")
    policy = body.get("sampling_policy") or {}
    if not isinstance(policy, dict) or any(v not in POLICIES for v in policy.values()):
        raise GatewayError(400, f"sampling_policy values must be one of {POLICIES}, got {policy!r}")
    for key in ("metadata", "sampling", "chat_template_kwargs"):
        if body.get(key) is not None and not isinstance(body[key], dict):
            raise GatewayError(
                400, f"{key} must be an object, got {body[key]!r}", code="invalid_field"
            )
    _check_labels(body)
    if body.get("session_id") is not None:
        check_session_id(body["session_id"])
    if body.get("metadata") and len(orjson.dumps(body["metadata"])) > MAX_METADATA:
        raise GatewayError(
            400, f"metadata is over {MAX_METADATA} bytes as JSON", code="invalid_field"
        )
    sampling_in = body.get("sampling") or {}
    if "stream" in sampling_in:
        raise GatewayError(
            400,
            "sampling must not set 'stream': whether to stream is the agent's choice per call",
            code="invalid_field",
        )
    aop = body.get("allow_off_policy")
    if aop is None:
        aop = False
    elif not isinstance(aop, bool):
        raise GatewayError(
            400, f"allow_off_policy must be true or false, got {aop!r}", code="invalid_field"
        )
    experts = body.get("routed_experts")
    if experts is not None and not isinstance(experts, bool):
        raise GatewayError(
            400, f"routed_experts must be true or false, got {experts!r}", code="invalid_field"
        )
    max_staleness, on_stale = _staleness(body)
    ttl = default_ttl
    if body.get("ttl") is not None:
        ttl = positive_seconds(body["ttl"], "ttl")
    max_calls = positive_int(body, "max_calls")
    max_tokens = positive_int(body, "max_tokens")
    now = time.time()
    sampling = dict(body.get("sampling") or {})
    try:
        check_sampling(sampling, where="sampling")
    except ValueError as exc:
        raise GatewayError(400, str(exc), code="invalid_field") from exc
    if "max_completion_tokens" in sampling:
        sampling.setdefault("max_tokens", sampling.pop("max_completion_tokens"))
    rec = SessionRecord(
        session_id=body.get("session_id") or uuid.uuid4().hex,
        group_id=body.get("group_id"),
        task_id=body.get("task_id"),
        metadata=dict(body.get("metadata") or {}),
        sampling=sampling,
        sampling_policy=dict(policy),
        capture=capture,
        allow_off_policy=aop,
        routed_experts=experts,
        max_staleness=max_staleness,
        on_stale=on_stale,
        chat_template_kwargs=body.get("chat_template_kwargs"),
        max_calls=max_calls,
        max_tokens=max_tokens,
        expires_at=now + ttl,
        created_at=now,
    )
    return rec
