"""Real SDKs through the gateway on the embedded engine, in both capture modes.

For every client (openai ``responses.create`` sync/async, streamed or not, with full input replay
or ``previous_response_id``; the Agents SDK's default ``OpenAIResponsesModel``; the anthropic SDK's
``messages.create`` / ``messages.stream``; LangChain's ``ChatAnthropic``) the five-turn scripted
tool task must be captured as five calls whose completion ids decode to exactly what the client
received, with routed experts, and — in tokens mode — train as one row.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import openai
import pytest

from rollwire.agent.context import anthropic_client, async_anthropic_client
from rollwire.gateway import RunningGateway
from rollwire.gateway.tokens.render import ChatRenderer
from rollwire.trainer.gateway_client import SessionHandle

from .conftest import PARAMETERS, SCRIPT, SYSTEM, TASK, expected, script

Turn = tuple[str, str, list[tuple[str, dict[str, Any]]]]
RESPONSES_TOOLS = [
    {"type": "function", "name": "add", "description": "Add.", "parameters": PARAMETERS}
]
ANTHROPIC_TOOLS = [{"name": "add", "description": "Add.", "input_schema": PARAMETERS}]


def _payload(h: SessionHandle) -> dict[str, Any]:
    return {
        "_rollwire": {
            "session_id": h.session_id,
            "base_url": h.base_url,
            "api_key": h.token,
            "complete_url": h.complete_url,
        }
    }


def _result(args: dict[str, Any]) -> str:
    return str(args["a"] + args["b"])


# ------------------------------------------------------------------------------- Responses
def _responses_turn(r: Any) -> Turn:
    """What a client reads from a ``Response`` (or the Agents SDK's ``ModelResponse``)."""
    reasoning = "".join(
        c.text for o in r.output if o.type == "reasoning" for c in (o.content or ())
    )
    text = "".join(c.text for o in r.output if o.type == "message" for c in o.content)
    calls = [(o.name, json.loads(o.arguments)) for o in r.output if o.type == "function_call"]
    return reasoning, text, calls


def responses_replay(h: SessionHandle, stream: bool) -> list[Turn]:
    """Sync client, the whole conversation re-sent as input items every turn."""
    oai = openai.OpenAI(base_url=h.base_url, api_key=h.token, max_retries=0)
    items: list[Any] = [{"role": "user", "content": TASK}]
    got: list[Turn] = []
    for _ in range(len(SCRIPT)):
        kw: dict[str, Any] = {
            "model": "policy",
            "instructions": SYSTEM,
            "input": items,
            "tools": RESPONSES_TOOLS,
        }
        if stream:
            with oai.responses.stream(**kw) as events:
                for _event in events:
                    pass
                r = events.get_final_response()
        else:
            r = oai.responses.create(**kw)
        got.append(_responses_turn(r))
        items += [o.model_dump(exclude_none=True) for o in r.output]
        items += [
            {"type": "function_call_output", "call_id": o.call_id, "output": _result(args)}
            for o, (_, args) in zip([o for o in r.output if o.type == "function_call"], got[-1][2])
        ]
    return got


def responses_chained(h: SessionHandle, stream: bool) -> list[Turn]:
    """Async client, each turn sends only the tool outputs and ``previous_response_id``."""

    async def run() -> list[Turn]:
        oai = openai.AsyncOpenAI(base_url=h.base_url, api_key=h.token, max_retries=0)
        got: list[Turn] = []
        new: Any = TASK
        previous = None
        for _ in range(len(SCRIPT)):
            kw: dict[str, Any] = {
                "model": "policy",
                "instructions": SYSTEM,
                "input": new,
                "tools": RESPONSES_TOOLS,
            }
            if previous is not None:
                kw["previous_response_id"] = previous
            if stream:
                r = None
                async for event in await oai.responses.create(**kw, stream=True):
                    if event.type == "response.completed":
                        r = event.response
                assert r is not None
            else:
                r = await oai.responses.create(**kw)
            got.append(_responses_turn(r))
            previous = r.id
            new = [
                {"type": "function_call_output", "call_id": o.call_id, "output": _result(args)}
                for o, (_, args) in zip(
                    [o for o in r.output if o.type == "function_call"], got[-1][2]
                )
            ]
        await oai.close()
        return got

    return asyncio.run(run())


def agents_sdk(h: SessionHandle, stream: bool) -> list[Turn]:
    """The OpenAI Agents SDK with its default Responses model, wired by the adapter."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool

    from rollwire.agent.openai_agents import agents_model

    @function_tool
    def add(a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)

    production = OpenAIResponsesModel("gpt-4.1", openai.AsyncOpenAI(api_key="production-key"))
    model = agents_model(_payload(h), model=production)
    assert isinstance(model, OpenAIResponsesModel)
    agent = Agent(
        name="adder", instructions=SYSTEM, tools=[add], model=model, model_settings=ModelSettings()
    )

    async def run() -> Any:
        if stream:
            result = Runner.run_streamed(agent, TASK, max_turns=10)
            async for _ in result.stream_events():
                pass
            return result
        return await Runner.run(agent, TASK, max_turns=10)

    result = asyncio.run(run())
    return [_responses_turn(r) for r in result.raw_responses]


# ------------------------------------------------------------------------------- Anthropic
def _anthropic_turn(msg: Any) -> Turn:
    reasoning = "".join(b.thinking for b in msg.content if b.type == "thinking")
    text = "".join(b.text for b in msg.content if b.type == "text")
    calls = [(b.name, dict(b.input)) for b in msg.content if b.type == "tool_use"]
    return reasoning, text, calls


def anthropic_sdk(h: SessionHandle, stream: bool) -> list[Turn]:
    """The anthropic SDK (from ``anthropic_client``), ``messages.create`` or ``messages.stream``."""
    client = anthropic_client(_payload(h))
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    got: list[Turn] = []
    for _ in range(len(SCRIPT)):
        kw: dict[str, Any] = {
            "model": "policy",
            "max_tokens": 256,
            "system": SYSTEM,
            "messages": messages,
            "tools": ANTHROPIC_TOOLS,
        }
        if stream:
            with client.messages.stream(**kw) as events:
                for _event in events:
                    pass
                msg = events.get_final_message()
        else:
            msg = client.messages.create(**kw)
        got.append(_anthropic_turn(msg))
        messages.append(
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]}
        )
        results = [
            {"type": "tool_result", "tool_use_id": b.id, "content": _result(dict(b.input))}
            for b in msg.content
            if b.type == "tool_use"
        ]
        if results:
            messages.append({"role": "user", "content": results})
    return got


def anthropic_async(h: SessionHandle, stream: bool) -> list[Turn]:
    """``AsyncAnthropic`` from ``async_anthropic_client``, one call per turn (streamed or not)."""

    async def run() -> list[Turn]:
        client = async_anthropic_client(_payload(h))
        messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
        got: list[Turn] = []
        for _ in range(len(SCRIPT)):
            kw: dict[str, Any] = {
                "model": "policy",
                "max_tokens": 256,
                "system": SYSTEM,
                "messages": messages,
                "tools": ANTHROPIC_TOOLS,
            }
            if stream:
                async with client.messages.stream(**kw) as events:
                    msg = await events.get_final_message()
            else:
                msg = await client.messages.create(**kw)
            got.append(_anthropic_turn(msg))
            messages.append(
                {
                    "role": "assistant",
                    "content": [b.model_dump(exclude_none=True) for b in msg.content],
                }
            )
            results = [
                {"type": "tool_result", "tool_use_id": b.id, "content": _result(dict(b.input))}
                for b in msg.content
                if b.type == "tool_use"
            ]
            if results:
                messages.append({"role": "user", "content": results})
        await client.close()
        return got

    return asyncio.run(run())


def langchain_anthropic(h: SessionHandle, stream: bool) -> list[Turn]:
    """LangChain's ``ChatAnthropic`` (from the LangGraph adapter) with bound tools."""
    from langchain_anthropic import ChatAnthropic
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    from rollwire_langgraph import anthropic_chat_model

    llm = anthropic_chat_model(
        _payload(h), model="claude-production", api_key="prod", max_tokens=256, streaming=stream
    )
    assert isinstance(llm, ChatAnthropic) and llm.model == "policy"
    bound = llm.bind_tools([{"name": "add", "description": "Add.", "input_schema": PARAMETERS}])
    messages: list[Any] = [SystemMessage(SYSTEM), HumanMessage(TASK)]
    got: list[Turn] = []
    for _ in range(len(SCRIPT)):
        ai = bound.invoke(messages)
        assert isinstance(ai, AIMessage)
        blocks = (
            ai.content if isinstance(ai.content, list) else [{"type": "text", "text": ai.content}]
        )
        reasoning = "".join(
            b.get("thinking", "")
            for b in blocks
            if isinstance(b, dict) and b.get("type") == "thinking"
        )
        text = "".join(
            b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text"
        )
        got.append((reasoning, text, [(c["name"], dict(c["args"])) for c in ai.tool_calls]))
        messages.append(ai)
        messages += [ToolMessage(_result(c["args"]), tool_call_id=c["id"]) for c in ai.tool_calls]
    return got


def strands_anthropic(h: SessionHandle, stream: bool) -> list[Turn]:
    """A Strands ``Agent`` on the adapter's ``AnthropicModel`` (Strands always streams)."""
    from strands import Agent, tool

    from rollwire_strands import anthropic_model

    @tool
    def add(a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)

    model = anthropic_model(_payload(h), model_id="claude-production", max_tokens=256)
    agent = Agent(model=model, tools=[add], system_prompt=SYSTEM, callback_handler=None)
    agent(TASK)
    got: list[Turn] = []
    for msg in agent.messages:
        if msg["role"] != "assistant":
            continue
        blocks = msg["content"]
        reasoning = "".join(
            b["reasoningContent"]["reasoningText"]["text"]
            for b in blocks
            if "reasoningContent" in b
        )
        text = "".join(b["text"] for b in blocks if "text" in b)
        calls = [
            (b["toolUse"]["name"], dict(b["toolUse"]["input"])) for b in blocks if "toolUse" in b
        ]
        got.append((reasoning, text, calls))
    return got


DRIVERS: dict[str, Callable[[SessionHandle, bool], list[Turn]]] = {
    "responses-replay": responses_replay,
    "responses-chained": responses_chained,
    "agents-sdk": agents_sdk,
    "anthropic": anthropic_sdk,
    "anthropic-async": anthropic_async,
    "langchain-anthropic": langchain_anthropic,
    "strands-anthropic": strands_anthropic,
}


@pytest.mark.parametrize("capture", ["tokens", "passthrough"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("driver", sorted(DRIVERS))
def test_five_turn_tool_task(
    gateway: RunningGateway, renderer: ChatRenderer, driver: str, stream: bool, capture: str
) -> None:
    with gateway.client() as client:
        h = client.create_session(capture=capture)
        got = DRIVERS[driver](h, stream)
        calls = client.calls(h.session_id)
        client.complete(h.session_id, reward=1.0)
        rows = client.trajectory(h.session_id)
    assert len(got) == len(SCRIPT) == len(calls)
    for k, (call, received) in enumerate(zip(calls, got)):
        reasoning, text, tools = expected(k)
        # What the client received is what the scripted completion says ...
        assert received[1].strip() == text and received[2] == tools, (k, received)
        assert received[0] in ("", reasoning), (k, received)
        # ... and the captured ids decode to exactly that completion.
        assert renderer.decode(call.completion_ids, skip_special_tokens=True) == SCRIPT[k]
        assert call.status == "ok" and call.trainable, (call.flags, call.error)
        assert call.capture == capture and call.stream is False
        assert call.logprobs.shape == call.completion_ids.shape
        experts = call.routed_experts
        assert experts is not None
        assert experts.shape[0] == call.prompt_ids.shape[0] + call.completion_ids.shape[0] - 1
    if capture == "tokens":
        assert len(rows) == 1, [r.fork for r in rows]
        row = rows[0]
        assert int(row.loss_mask.sum()) == sum(c.completion_ids.shape[0] for c in calls)
        assert row.routed_experts is not None and row.reward == 1.0
    assert script  # the engine is driven by the conftest's script


def test_session_token_on_fixed_base_urls(gateway: RunningGateway) -> None:
    """``/v1/responses`` with the token as Bearer, ``/v1/messages`` with ``x-api-key``."""
    with gateway.client() as client:
        h = client.create_session()
        root = h.base_url.split("/s/")[0]
        oai = openai.OpenAI(base_url=root + "/v1", api_key=h.token, max_retries=0)
        r = oai.responses.create(model="policy", input=TASK, tools=RESPONSES_TOOLS)
        assert [o.name for o in r.output if o.type == "function_call"] == ["add"]
        ant = anthropic.Anthropic(base_url=root, api_key=h.token, max_retries=0)
        m = ant.messages.create(
            model="policy", max_tokens=64, messages=[{"role": "user", "content": TASK}]
        )
        assert m.stop_reason in ("end_turn", "tool_use", "max_tokens")
        assert len(client.calls(h.session_id)) == 2
        bad = anthropic.Anthropic(base_url=root, api_key="forged", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as info:
            bad.messages.create(
                model="policy", max_tokens=8, messages=[{"role": "user", "content": "x"}]
            )
        assert info.value.body["type"] == "error"  # type: ignore[index]


def test_previous_response_id_stays_in_its_session(gateway: RunningGateway) -> None:
    with gateway.client() as client:
        a, b = client.create_session(), client.create_session()
        oa = openai.OpenAI(base_url=a.base_url, api_key=a.token, max_retries=0)
        ob = openai.OpenAI(base_url=b.base_url, api_key=b.token, max_retries=0)
        first = oa.responses.create(model="policy", input=TASK, tools=RESPONSES_TOOLS)
        with pytest.raises(openai.NotFoundError, match="not found in this session"):
            ob.responses.create(model="policy", input="go on", previous_response_id=first.id)
        unstored = oa.responses.create(model="policy", input=TASK, store=False)
        with pytest.raises(openai.NotFoundError):
            oa.responses.create(model="policy", input="go on", previous_response_id=unstored.id)
        follow = oa.responses.create(model="policy", input="go on", previous_response_id=first.id)
        assert follow.previous_response_id == first.id
        calls = client.calls(a.session_id)
    # The follow-up's prompt holds the first call's history (instructions, task, reply).
    assert len(calls) == 3 and calls[2].request["messages"][0] == {"role": "user", "content": TASK}
    assert calls[2].request["messages"][1]["role"] == "assistant"


def test_refusals_come_in_the_dialects_error_shape(gateway: RunningGateway) -> None:
    with gateway.client() as client:
        h = client.create_session()
        base = h.base_url
        r = httpx.post(base + "/responses", json={"input": "x", "tools": [{"type": "web_search"}]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0].type"
        r = httpx.post(base + "/messages", json={"messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 400
        assert r.json() == {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "'max_tokens' (an integer) is required",
            },
        }
        assert client.calls(h.session_id) == []


def test_count_tokens_is_the_rendered_prompt(
    gateway: RunningGateway, renderer: ChatRenderer
) -> None:
    with gateway.client() as client:
        h = client.create_session()
        ant = anthropic_client(_payload(h))
        body: dict[str, Any] = {
            "model": "policy",
            "system": SYSTEM,
            "messages": [{"role": "user", "content": TASK}],
            "tools": ANTHROPIC_TOOLS,
        }
        n = ant.messages.count_tokens(**body).input_tokens
        assert client.calls(h.session_id) == []  # counting is not a model call
    chat_tools = [
        {
            "type": "function",
            "function": {"name": "add", "description": "Add.", "parameters": PARAMETERS},
        }
    ]
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    assert n == len(renderer.render(messages, chat_tools))


def test_previous_response_id_survives_losing_the_session_state(gateway: RunningGateway) -> None:
    """Past the in-memory cache (or after a restart) the earlier response is found in the store."""
    with gateway.client() as client:
        h = client.create_session()
        oai = openai.OpenAI(base_url=h.base_url, api_key=h.token, max_retries=0)
        first = oai.responses.create(model="policy", input=TASK, tools=RESPONSES_TOOLS)
        gateway.gateway.sessions[h.session_id].state.clear()  # what a restart forgets
        call = next(o for o in first.output if o.type == "function_call")
        follow = oai.responses.create(
            model="policy",
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "3"}],
            tools=RESPONSES_TOOLS,
        )
        assert follow.status == "completed"
        calls = client.calls(h.session_id)
    roles = [m["role"] for m in calls[1].request["messages"]]
    assert roles == ["user", "assistant", "tool"]
    assert calls[1].request["messages"][1]["tool_calls"][0]["id"] == call.call_id


@pytest.mark.parametrize("route", ["/responses", "/messages"])
def test_sdk_retries_are_matched_for_dialects(gateway: RunningGateway, route: str) -> None:
    """A retried dialect request (same bytes, ``x-stainless-retry-count``) supersedes the first."""
    if route == "/responses":
        body: dict[str, Any] = {"model": "policy", "input": "hello"}
    else:
        body = {
            "model": "policy",
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "hello"}],
        }
    with gateway.client() as client:
        h = client.create_session()
        with httpx.Client(timeout=120) as http:  # a busy machine outlasts httpx's 5 s
            assert http.post(h.base_url + route, json=body).status_code == 200
            retry = http.post(
                h.base_url + route, json=body, headers={"x-stainless-retry-count": "1"}
            )
            assert retry.status_code == 200
        first, second = client.calls(h.session_id)
    assert second.retry_of == first.call_id and second.retry_count == 1
    assert not first.trainable and "superseded_by_retry" in first.flags


def test_messages_refusals_of_the_gateway_are_anthropic_shaped(gateway: RunningGateway) -> None:
    with gateway.client() as client:
        h = client.create_session(max_calls=1)
        ant = anthropic_client(_payload(h))
        kw: dict[str, Any] = {
            "model": "policy",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "x"}],
        }
        ant.messages.create(**kw)
        with pytest.raises(anthropic.RateLimitError) as info:
            ant.with_options(max_retries=0).messages.create(**kw)
    assert info.value.body == {  # type: ignore[comparison-overlap]
        "type": "error",
        "error": {
            "type": "rate_limit_error",
            "message": f"session {h.session_id!r} reached its budget of 1 model calls",
        },
    }
