"""The rollwire gateway: an OpenAI-compatible proxy that captures every model call for RL.

``serve_in_thread(backends=[(url, "vllm")])`` runs one in-process; ``rollwire gateway`` runs one
from the command line. See docs/gateway.md and docs/control-api.md.
"""

from __future__ import annotations

from rollwire.gateway.app import Gateway
from rollwire.gateway.config import BackendSpec, GatewayConfig
from rollwire.gateway.context import ChatContext
from rollwire.gateway.errors import GatewayError, error_response
from rollwire.gateway.running import RunningGateway, serve_in_thread

__all__ = [
    "BackendSpec",
    "ChatContext",
    "Gateway",
    "GatewayConfig",
    "GatewayError",
    "RunningGateway",
    "error_response",
    "serve_in_thread",
]
