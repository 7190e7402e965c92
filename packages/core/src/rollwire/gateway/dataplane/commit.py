"""The commit path: a captured call becomes durable in the store before its answer leaves.

Also where retries meet their originals (``retry_of``, ``superseded_by_retry``) and where budgets
and call metrics are counted.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from rollwire.data.protocol import ModelCall
from rollwire.gateway.dataplane.routing import learn_routing
from rollwire.gateway.dataplane.sessions import Attempt, SessionState
from rollwire.gateway.errors import GatewayError
from rollwire.gateway.ports import GatewayPort
from rollwire.store import SessionClosed, SessionNotFound, StoreUnavailable

__all__ = ["assign", "commit_call", "new_call", "store_unavailable"]

log = logging.getLogger("rollwire.gateway")

_CALL_DEFAULTS = ModelCall(call_id="", session_id="", index=0).__dict__
# Defaults a call may change in place (its own copy each); the others are immutable or replaced.
_MUTABLE_DEFAULTS = tuple(k for k, v in _CALL_DEFAULTS.items() if isinstance(v, (list, dict)))
_ALL_FIELDS = frozenset(_CALL_DEFAULTS)
# What ``model_construct`` does, without its per-field loop: it costs more than parsing the request.
_DIRECT = not ModelCall.__pydantic_post_init__ and not ModelCall.__pydantic_root_model__
_set = object.__setattr__


def new_call(**fields: Any) -> ModelCall:
    """A ModelCall without validation or per-field default factories (the hot path): the same
    object as ``ModelCall.model_construct`` with every field given."""
    values = dict(_CALL_DEFAULTS)
    for name in _MUTABLE_DEFAULTS:
        values[name] = values[name].copy()
    values.update(fields)
    if not _DIRECT or len(values) != len(_ALL_FIELDS):
        return ModelCall.model_construct(None, **values)  # unknown names: let pydantic say so
    call = ModelCall.__new__(ModelCall)
    _set(call, "__dict__", values)
    _set(call, "__pydantic_fields_set__", set(_ALL_FIELDS))
    _set(call, "__pydantic_extra__", None)
    _set(call, "__pydantic_private__", None)
    return call


_VALIDATES_ASSIGNMENT = bool(ModelCall.model_config.get("validate_assignment"))


def assign(call: ModelCall, **fields: Any) -> None:
    """Set fields of ``call`` as pydantic's own assignment does (no validation: the values are
    the gateway's own), without its per-attribute dispatch (the hot path sets a dozen a call)."""
    if _VALIDATES_ASSIGNMENT:
        for name, value in fields.items():
            setattr(call, name, value)
        return
    call.__dict__.update(fields)
    call.__pydantic_fields_set__.update(fields)


def store_unavailable(exc: StoreUnavailable) -> GatewayError:
    """The 503 for a store that cannot record: the call is refused, never answered unrecorded."""
    return GatewayError(
        503,
        f"the gateway's session store is unavailable, so the call was not recorded and is "
        f"refused; retry later ({exc})",
        "server_error",
        "store_unavailable",
    )


def _link_retry(gw: GatewayPort, st: SessionState, call: ModelCall, attempt: Attempt) -> None:
    rec = st.record
    if call.policy_version is None:
        call.policy_version = gw.policy_version
    if call.backend is None:
        b = gw.pool.backends.get(gw.pool._sticky.get(rec.session_id, ""))
        call.backend = b.name if b is not None else None
    if attempt.retry_count > 0:
        call.retry_count = attempt.retry_count
        if attempt.prior is not None:
            call.retry_of = attempt.prior.call_id
    if attempt.superseded_by is not None:
        # A retry of this request succeeded while this one was still running.
        call.trainable = False
        call.flags.append("superseded_by_retry")
    # Set before the await: a retry committing meanwhile queues its mark after this append.
    attempt.call_id = call.call_id
    attempt.committed = True


async def commit_call(gw: GatewayPort, st: SessionState, call: ModelCall, attempt: Attempt) -> None:
    """Store ``call`` (durable when this returns), then count it and settle its retry links.

    Raises a 409/404 :class:`GatewayError` when the session was completed or deleted meanwhile.
    """
    rec = st.record
    _link_retry(gw, st, call, attempt)
    if call.routed_experts is not None:
        learn_routing(gw, call)
    if rec.max_staleness is not None:
        gw.staleness.mark(rec, call)
    t = time.perf_counter()
    try:
        await gw.store.append_call(call, request_key=attempt.key)
    except StoreUnavailable as exc:
        gw.metrics.error("store_unavailable")
        raise store_unavailable(exc) from exc
    except SessionClosed as exc:
        raise GatewayError(
            409,
            f"session {rec.session_id!r} was completed while this call ran; the call is "
            "not recorded",
            "invalid_request_error",
            "session_closed",
        ) from exc
    except SessionNotFound as exc:
        raise GatewayError(
            404,
            f"session {rec.session_id!r} was deleted while this call ran",
            "invalid_request_error",
            "session_not_found",
        ) from exc
    gw.metrics.commit_latency.observe(time.perf_counter() - t)
    n_completion = int(call.completion_ids.shape[0])
    rec.num_calls += 1
    rec.num_tokens += n_completion
    gw.metrics.call(
        "chat" if "messages" in call.request else "completions",
        call.status,
        int(call.prompt_ids.shape[0]),
        n_completion,
    )
    if call.status == "ok":
        gw.metrics.tools.add(call)
    # The store marked the original superseded in the same commit (call.retry_of is set, or
    # it found the original by the request key); one still running marks itself when it lands.
    prior = attempt.prior
    if prior is not None and call.status == "ok" and not prior.committed:
        prior.superseded_by = call.call_id
    if call.backend is not None and call.backend != st.shared_backend:
        # The session's backend changed (first call, or a failover): tell the other gateways.
        st.shared_backend = call.backend
        ttl = max(60.0, (rec.expires_at or time.time() + 3600.0) - time.time())
        gw.spawn(_share_backend(gw, rec.session_id, call.backend, ttl))


async def _share_backend(gw: GatewayPort, session_id: str, backend: str, ttl: float) -> None:
    try:
        await gw.store.set_setting(f"sticky:{session_id}", backend, ttl=ttl)
    except Exception as exc:  # affinity is an optimisation: never fail a call for it
        log.warning("could not share the backend of session %r: %r", session_id, exc)
