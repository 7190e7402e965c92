"""The script both servers force replies with (the vLLM server imports it as ``vllm_scripts``).

The arithmetic task of ``rollwire.testing.agent`` (two tool calls, then the answer) whenever its
prompt is in the conversation; a fixed greeting for "say hello"; anything else samples freely.
"""

from __future__ import annotations

from typing import Any

from rollwire.testing.agent import arithmetic_script

HELLO = "Hello! I am a tiny model."
ARITHMETIC_PROMPT = "What is (2 + 3) * 4? Use the tools."


def script(messages: list[dict[str, Any]], tools: Any = None) -> str | None:
    """The forced reply for ``messages``, or None to let the model sample."""
    texts = [m.get("content") for m in messages if isinstance(m.get("content"), str)]
    if any(ARITHMETIC_PROMPT in t for t in texts):
        return arithmetic_script(messages, tools)
    last_user = next(
        (t for m, t in zip(reversed(messages), reversed(texts)) if m.get("role") == "user"), ""
    )
    if "say hello" in str(last_user).lower():
        return HELLO
    return None
