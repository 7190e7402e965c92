"""What a chat-completions capture handler gets from the gateway (the ``tokens`` mode hook).

When a session's ``capture`` is ``"tokens"``, the gateway builds a :class:`ChatContext` and calls
``rollwire.gateway.tokens.handler.handle_chat(ctx)``, which returns a Starlette ``Response`` (JSON or an
SSE stream). The handler owns tokenization and the backend call; the gateway owns auth, budgets,
sampling policy, storage and metrics, reachable through the fields below. Keep this file stable.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rollwire.gateway.dataplane.sampling import trainable_with

if TYPE_CHECKING:
    import aiohttp

    from rollwire.data.protocol import ModelCall
    from rollwire.gateway.backends.pool import Backend
    from rollwire.gateway.ports import GatewayPort
    from rollwire.store.base import SessionRecord

__all__ = ["ChatContext"]


@dataclass
class ChatContext:
    """Everything a capture handler needs for one chat-completions request.

    - ``body``: the request as the agent sent it (parsed JSON; an empty ``tools: []`` already
      dropped). The handler may modify it.
    - ``session``: the session record (``session_id``, ``sampling``, ``sampling_policy``,
      ``chat_template_kwargs``, ``allow_off_policy``, ``metadata``, ``capture``, budgets).
    - ``state``: a per-session dict that lives as long as the session does in this gateway
      process (keep healing / prefix state here).
    - ``backend``: the backend chosen for this call (``url`` without ``/v1``, ``kind``, ``name``).
    - ``http``: the gateway's pooled ``aiohttp.ClientSession`` (do not close it).
    - ``apply_sampling(params)``: applies the session's sampling policy to ``params`` in place
      (keys like ``temperature``, ``top_p``, ``max_tokens``) and returns ``(effective, flags)``:
      the effective sampling parameters to record in ``ModelCall.sampling`` and off-policy flags
      (``logit_bias``, ``guided_decoding``, ``n>1``). ``ctx.off_policy_blocked(flags)`` tells
      whether those flags make the call non-trainable for this session.
    - ``commit(call)``: stores the call and returns once it is durable; fills ``index``,
      ``parent_call_id``/``shared_prefix_len`` (prompt delta), ``policy_version`` (when unset),
      ``retry_of``/``retry_count``, ``backend`` (when unset) and updates budgets and metrics.
      Call it exactly once per request, before the response (or the final SSE event) is sent.
    - ``new_call_id()``: a fresh unique call id.
    - ``policy_version``: the policy version set through ``/api/policy_version`` (or None).
    - ``request_headers``: the incoming HTTP headers, names lower-cased.
    - ``mark_backend_failed()``: report a connection failure of ``backend`` (takes it out of
      routing until its health check passes again).
    - ``gateway``: the gateway serving the call (a :class:`~rollwire.gateway.ports.GatewayPort`) (None outside a
      gateway, e.g. in unit tests): its ``config`` (``upstream_timeout``), backend ``pool`` (to
      fail over to another healthy backend) and the per-gateway caches a handler keeps.
    """

    body: dict[str, Any]
    session: SessionRecord
    state: dict[str, Any]
    backend: Backend
    http: aiohttp.ClientSession
    apply_sampling: Callable[[dict[str, Any]], tuple[dict[str, Any], list[str]]]
    commit: Callable[[ModelCall], Awaitable[None]]
    new_call_id: Callable[[], str]
    policy_version: str | None
    request_headers: dict[str, str]
    mark_backend_failed: Callable[[], None] = field(default=lambda: None)
    started_at: float = 0.0
    gateway: GatewayPort | None = None

    def off_policy_blocked(self, flags: list[str]) -> bool:
        """True when ``flags`` make the call non-trainable (the session does not allow them)."""
        return not trainable_with(flags, self.session.allow_off_policy)
