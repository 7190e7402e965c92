"""The Claude Agent SDK through rollwire: ``query`` with in-process MCP tools
(``create_sdk_mcp_server``), driving the Claude Code CLI the SDK bundles.

Claude Code speaks Anthropic Messages (``POST {base}/v1/messages``, the key as ``x-api-key``) and
always streams; the gateway serves that dialect and captures it as any other call. The SDK has
no sampling settings: the session's sampling is the gateway's to apply (the suite's rollout test
checks each call's recorded sampling).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import tempfile
from collections.abc import Mapping
from typing import Any

import pytest
from claude_agent_sdk import (
    ClaudeAgentOptions,
    ResultMessage,
    create_sdk_mcp_server,
    query,
    tool,
)

import rollwire
from rollwire.testing.agent import (
    PRODUCTION_MODEL,
    RecordedRequest,
    RecordingServer,
    ToolTask,
    arithmetic_script,
    arithmetic_task,
)

from .recipe_suite import Recipe, RecipeConformance

#: Claude Code's switches for everything that is not a model call
QUIET = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
}
SERVER = "calculator"  # the MCP server's name: Claude Code calls its tools mcp__calculator__*


def claude_session(
    payload: Mapping[str, Any],
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    model: str = "claude-sonnet-4-5",
) -> dict[str, Any]:
    """The recipe (docs/frameworks.md): ``ClaudeAgentOptions`` keywords for the session (its
    Messages endpoint and key, every model role on the session's model) or for production."""
    ctx = rollwire.rollout_context(payload)
    if ctx is None:
        env = {"ANTHROPIC_BASE_URL": base_url or "", "ANTHROPIC_API_KEY": api_key or ""}
        return {"model": model, "env": {k: v for k, v in env.items() if v} | QUIET}
    roles = (
        "SMALL_FAST_MODEL",
        "DEFAULT_HAIKU_MODEL",
        "DEFAULT_SONNET_MODEL",
        "DEFAULT_OPUS_MODEL",
    )
    env = {
        "ANTHROPIC_BASE_URL": ctx.anthropic_base_url,
        "ANTHROPIC_API_KEY": ctx.api_key,
        **{f"ANTHROPIC_{role}": ctx.model for role in roles},
    }
    return {"model": ctx.model, "env": env | QUIET}


def mcp_script(messages: list[dict[str, Any]], tools: Any = None) -> str:
    """The standard task's policy, calling the tools by the names Claude Code gives them."""
    out = arithmetic_script(messages, tools)
    return out.replace('"name": "', f'"name": "mcp__{SERVER}__')


class MessagesServer(RecordingServer):
    """The stand-in endpoint for Messages clients: answers ``reply`` as a Messages stream."""

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path.split("?")[0].endswith("/v1/messages")]

    def _completion(self, body: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": "msg_recorded",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "unknown"),
            "content": [{"type": "text", "text": self.reply}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 5, "output_tokens": 2},
        }

    def _stream_body(self, body: dict[str, Any]) -> bytes:
        message = {**self._completion(body), "content": [], "stop_reason": None}
        events: list[dict[str, Any]] = [
            {"type": "message_start", "message": message},
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": self.reply},
            },
            {"type": "content_block_stop", "index": 0},
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 2},
            },
            {"type": "message_stop"},
        ]
        return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def mcp_tool(fn: Any) -> Any:
    """``fn`` as an SDK MCP tool (integer arguments, the result as text)."""
    schema = {name: int for name in inspect.signature(fn).parameters}

    async def handler(args: dict[str, Any]) -> dict[str, Any]:
        return {"content": [{"type": "text", "text": str(fn(**args))}]}

    return tool(fn.__name__, inspect.getdoc(fn) or fn.__name__, schema)(handler)


def _session_payload(url: str) -> dict[str, Any]:
    return {
        "prompt": "task",
        "_rollwire": {
            "session_id": "sess-1",
            "base_url": url + "/s/tok-123/v1",
            "api_key": "tok-123",
            "model": "policy",
            "complete_url": url + "/api/sessions/sess-1/complete",
        },
    }


class TestClaudeAgentSDK(RecipeConformance):
    stream_modes = (True,)  # Claude Code streams every Messages call
    # the gateway serves a Messages stream from one non-streamed backend call, recorded as such
    recorded_stream = False
    recording_server = MessagesServer
    script = staticmethod(mcp_script)

    @pytest.fixture
    def adapter(self) -> Recipe:
        return Recipe("claude-agent-sdk", ("claude-agent-sdk>=0.2",), claude_session)

    def production_kwargs(self, *, base_url: str, api_key: str, model: str) -> dict[str, Any]:
        # an Anthropic base URL has no /v1: the client appends /v1/messages itself
        return {"base_url": base_url.removesuffix("/v1"), "api_key": api_key, "model": model}

    def run_agent(
        self, model: Any, task: ToolTask, *, stream: bool, payload: Mapping[str, Any]
    ) -> str:
        server = create_sdk_mcp_server(SERVER, tools=[mcp_tool(fn) for fn in task.tools])

        async def run(config: str) -> str:
            options = ClaudeAgentOptions(
                **{**model, "env": {**model["env"], "CLAUDE_CONFIG_DIR": config}},
                system_prompt=task.system_prompt,
                mcp_servers={SERVER: server},
                tools=[],  # no built-in tools: only the calculator's
                allowed_tools=[f"mcp__{SERVER}__{fn.__name__}" for fn in task.tools],
                setting_sources=[],
                max_turns=8,
            )
            answer = ""
            async for message in query(prompt=task.prompt, options=options):
                if isinstance(message, ResultMessage):
                    answer = message.result or ""
            return answer

        # Claude Code's own config folder, fresh for each run: no user settings leak in
        with tempfile.TemporaryDirectory(prefix="rollwire-claude-") as config:
            return asyncio.run(run(config))

    # The suite's two wiring tests read Chat Completions requests; Claude Code sends Messages
    # requests, so these are the same checks on the Messages wire (no non-streaming mode).

    def test_production_fallback(self, adapter: Any) -> None:
        with MessagesServer() as prod:
            kwargs = self.production_kwargs(
                base_url=prod.url + "/v1", api_key="prod-key", model=PRODUCTION_MODEL
            )
            out = self.run_agent(
                adapter.model({"prompt": "task"}, **kwargs),
                arithmetic_task(),
                stream=True,
                payload={"prompt": "task"},
            )
        assert MessagesServer.reply in out
        (req,) = prod.chat_requests
        assert req.path.split("?")[0] == "/v1/messages"
        assert req.headers.get("x-api-key") == "prod-key"
        assert req.body["model"] == PRODUCTION_MODEL and req.body["stream"] is True

    def test_session_wiring(self, adapter: Any) -> None:
        with MessagesServer() as gw:
            payload = _session_payload(gw.url)
            kwargs = self.production_kwargs(
                base_url="http://127.0.0.1:9/v1", api_key="prod-key", model=PRODUCTION_MODEL
            )
            self.run_agent(
                adapter.model(payload, **kwargs), arithmetic_task(), stream=True, payload=payload
            )
        (req,) = gw.chat_requests
        assert req.path.split("?")[0] == "/s/tok-123/v1/messages"
        assert req.headers.get("x-api-key") == "tok-123"
        assert req.body["model"] == "policy" and req.body["stream"] is True
