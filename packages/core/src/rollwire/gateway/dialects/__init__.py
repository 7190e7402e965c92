"""Wire dialects other than Chat Completions, converted to and from the gateway's chat shape.

Each dialect is one module of pure functions: a request converter to a Chat Completions request
(and back), a response converter from a ``chat.completion`` body (and back), and an encoder of the
dialect's event stream from a finished response. Capture, storage, rows and exports only ever
see the converted Chat Completions call, so they never know which dialect a call came in.

- :mod:`rollwire.gateway.dialects.responses`: the OpenAI Responses API (``/v1/responses``).
- :mod:`rollwire.gateway.dialects.anthropic`: Anthropic Messages (``/v1/messages``).
"""

from __future__ import annotations

from rollwire.gateway.dialects.errors import DialectError
from rollwire.gateway.dialects.routes import (
    CALL_ROUTES,
    COUNT_TOKENS,
    MESSAGES,
    RESPONSES,
    refusal,
    serve_count_tokens,
    serve_messages,
    serve_responses,
)

__all__ = [
    "CALL_ROUTES",
    "COUNT_TOKENS",
    "MESSAGES",
    "RESPONSES",
    "DialectError",
    "refusal",
    "serve_count_tokens",
    "serve_messages",
    "serve_responses",
]
