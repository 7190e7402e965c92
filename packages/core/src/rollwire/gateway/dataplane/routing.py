"""Routing replay by default: a backend that has returned routed experts gets them captured on
every call, streams included (docs/design-notes.md, "Routing on streams").

vLLM and SGLang put routing on whole responses only. The gateway learns per backend, from the
first answer that carries ``routed_experts``, that it serves an MoE model with routing on; from
then on a session that did not say otherwise (``routed_experts`` unset) has its streamed
passthrough calls asked non-streamed and re-streamed, as ``routed_experts: true`` does.
``routed_experts: false`` opts a session out.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rollwire.data.protocol import ModelCall
    from rollwire.gateway.backends.pool import Backend
    from rollwire.gateway.ports import GatewayPort
    from rollwire.store import SessionRecord

__all__ = ["learn_routing", "wants_routing"]

log = logging.getLogger("rollwire.gateway")


def learn_routing(gw: GatewayPort, call: ModelCall) -> None:
    """Note that the backend that answered ``call`` (which carries routed experts) returns them."""
    backend = gw.pool.backends.get(call.backend or "")
    if backend is not None and not backend.returns_routing:
        backend.returns_routing = True
        log.info(
            "backend %s (%s) returns routed experts: its calls capture routing from now on "
            "(streams are asked whole and re-streamed; routed_experts=false opts a session out)",
            backend.name,
            backend.url,
        )


def wants_routing(rec: SessionRecord, backend: Backend) -> bool:
    """Whether a call of ``rec`` to ``backend`` must carry routing: the session's choice when it
    made one, else whether the backend is known to return it."""
    if rec.routed_experts is not None:
        return rec.routed_experts
    return backend.returns_routing
