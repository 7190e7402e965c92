from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollwire.gateway.tokens.heal import Healer, same_assistant
from rollwire.gateway.tokens.parsers import HermesParser
from rollwire.gateway.tokens.render import ChatRenderer

from .conftest import TOOLS

SYSTEM = {"role": "system", "content": "You are a shop assistant."}


def _call(name: str, args: dict[str, Any], compact: bool = False) -> str:
    sep = (",", ":") if compact else None
    return (
        "<tool_call>\n"
        + json.dumps({"name": name, "arguments": args}, separators=sep)
        + "\n</tool_call>"
    )


def _client(
    msg: dict[str, Any], *, compact: bool = True, keep_reasoning: bool = False
) -> dict[str, Any]:
    """What a framework sends back: reasoning dropped, arguments re-serialized."""
    out: dict[str, Any] = {"role": "assistant", "content": msg.get("content")}
    if keep_reasoning and msg.get("reasoning"):
        out["reasoning_content"] = msg["reasoning"]
    if msg.get("tool_calls"):
        sep = (",", ":") if compact else (", ", ": ")
        out["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {
                    "name": c["function"]["name"],
                    "arguments": json.dumps(json.loads(c["function"]["arguments"]), separators=sep),
                },
            }
            for c in msg["tool_calls"]
        ]
    return out


class Agent:
    """Drives a Healer like the gateway does, with 'sampled' completions given as text."""

    def __init__(self, renderer: ChatRenderer, tools: Any = TOOLS) -> None:
        self.r = renderer
        self.healer = Healer(renderer)
        self.tools = tools
        self.parser = HermesParser()

    def call(
        self, messages: list[dict[str, Any]], sampled: str, *, eos: bool = True, **kw: Any
    ) -> tuple[Any, np.ndarray, dict[str, Any]]:
        res = self.healer.prompt(messages, self.tools, kw or None)
        completion = self.r.encode(sampled)
        if eos:
            completion = np.concatenate([completion, np.asarray([self.r.eos_id], np.int32)])
        msg = self.parser.parse(sampled, self.tools).message()
        self.healer.record(res, messages, self.tools, kw or None, completion, msg)
        return res, completion, msg


def test_heals_think_and_reserialized_tool_calls(renderer: ChatRenderer) -> None:
    agent = Agent(renderer)
    msgs: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "Find red shoes."}]
    script = [
        "<think>\nSearch first.\n</think>\n\n"
        + _call("search", {"query": "red shoes", "filters": {"size": [42]}}),
        "<think>\nBook it.\n</think>\n\n" + _call("book", {"item": 7}, compact=True),
        "<think>\nDone.\n</think>\n\nBooked item 7.",
    ]
    follow = [
        {"role": "tool", "tool_call_id": "a", "content": '[{"id": 7}]'},
        {"role": "tool", "tool_call_id": "b", "content": "ok"},
    ]
    expected = None
    for k, sampled in enumerate(script):
        res, completion, msg = agent.call(msgs, sampled)
        if k == 0:
            assert not res.healed and res.branch == 0 and res.fork_reason is None
            np.testing.assert_array_equal(res.prompt_ids, renderer.render(msgs, TOOLS))
        else:
            assert res.healed and res.branch == 0 and res.fork_reason is None
            assert expected is not None
            np.testing.assert_array_equal(res.prompt_ids[: expected.shape[0]], expected)
            # The suffix is exactly what the template puts after the assistant turn.
            full = renderer.render(msgs, TOOLS)
            np.testing.assert_array_equal(full[-res.suffix_ids.shape[0] :], res.suffix_ids)
            assert renderer.decode(res.suffix_ids).startswith("\n<|im_start|>user\n<tool_response>")
        expected = np.concatenate([res.prompt_ids, completion])
        msgs = [*msgs, _client(msg), *follow[k : k + 1]]
    text = renderer.decode(expected)  # type: ignore[arg-type]
    assert text.count("<think>") == 3  # every sampled reasoning block stays in the context


def test_truncated_completion_gets_the_close(renderer: ChatRenderer) -> None:
    agent = Agent(renderer, tools=None)
    msgs = [{"role": "user", "content": "Tell me a story."}]
    _, _, msg = agent.call(msgs, "Once upon a", eos=False)
    nxt = [
        *msgs,
        {"role": "assistant", "content": msg["content"]},
        {"role": "user", "content": "Go on."},
    ]
    res2 = agent.healer.prompt(nxt, None)
    assert res2.healed
    assert renderer.decode(res2.suffix_ids).startswith("<|im_end|>\n<|im_start|>user\nGo on.")


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (
            lambda m: [{**m[0], "content": "Different."}, *m[1:]],
            "messages[0] (system): content changed",
        ),
        (lambda m: m[:1] + m[3:], "history has"),
        (
            lambda m: [*m[:2], {**m[2], "content": "I said something else."}, *m[3:]],
            "assistant content differs",
        ),
    ],
)
def test_edited_history_forks_with_reason(renderer: ChatRenderer, mutate: Any, reason: str) -> None:
    agent = Agent(renderer, tools=None)
    msgs = [SYSTEM, {"role": "user", "content": "Hi"}]
    _, _, msg = agent.call(msgs, "Hello.")
    nxt = mutate([*msgs, _client(msg), {"role": "user", "content": "More"}])
    res = agent.healer.prompt(nxt, None)
    assert not res.healed and res.branch == 1
    assert res.fork_reason is not None and reason in res.fork_reason
    np.testing.assert_array_equal(res.prompt_ids, renderer.render(nxt))


def test_tool_args_and_tools_changes_fork(renderer: ChatRenderer) -> None:
    agent = Agent(renderer)
    msgs = [{"role": "user", "content": "Find shoes"}]
    _, _, msg = agent.call(msgs, _call("search", {"query": "shoes"}))
    sent = _client(msg)
    sent["tool_calls"][0]["function"]["arguments"] = '{"query": "boots"}'
    res = agent.healer.prompt([*msgs, sent, {"role": "tool", "content": "[]"}], TOOLS)
    assert not res.healed and "arguments differ" in (res.fork_reason or "")
    res = agent.healer.prompt([*msgs, _client(msg), {"role": "tool", "content": "[]"}], TOOLS[:1])
    assert not res.healed and "tools changed" in (res.fork_reason or "")
    res = agent.healer.prompt(
        [*msgs, _client(msg), {"role": "tool", "content": "[]"}], TOOLS, {"enable_thinking": False}
    )
    assert not res.healed and "chat_template_kwargs" in (res.fork_reason or "")


def test_repeat_reuses_prompt_on_new_branch(renderer: ChatRenderer) -> None:
    agent = Agent(renderer, tools=None)
    msgs = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    first, _, _ = agent.call(msgs, "Hello.")
    again = agent.healer.prompt([{"role": "user", "content": "Hi"}], None)
    assert (
        not again.healed and again.branch == 1 and again.fork_reason == "repeats an earlier request"
    )
    np.testing.assert_array_equal(again.prompt_ids, first.prompt_ids)


def test_interleaved_subagent_keeps_both_branches(renderer: ChatRenderer) -> None:
    agent = Agent(renderer, tools=None)
    main = [{"role": "user", "content": "Plan a trip."}]
    sub = [
        {"role": "system", "content": "You are a researcher."},
        {"role": "user", "content": "Find flights."},
    ]
    _, _, m1 = agent.call(main, "Asking a helper.")
    r_sub, _, s1 = agent.call(sub, "Flight A.")
    assert r_sub.branch == 1 and not r_sub.healed
    r_main, _, _ = agent.call(
        [*main, _client(m1), {"role": "user", "content": "Result: Flight A."}], "Book A."
    )
    assert r_main.healed and r_main.branch == 0
    r_sub2, _, _ = agent.call(
        [*sub, _client(s1), {"role": "user", "content": "Cheaper?"}], "Flight B."
    )
    assert r_sub2.healed and r_sub2.branch == 1


def test_reasoning_sent_back_must_match() -> None:
    returned = {"role": "assistant", "content": "x", "reasoning": "because"}
    assert same_assistant({"role": "assistant", "content": " x\n"}, returned) is None
    assert (
        same_assistant(
            {"role": "assistant", "content": "x", "reasoning_content": "because"}, returned
        )
        is None
    )
    assert (
        same_assistant(
            {"role": "assistant", "content": "<think>\nbecause\n</think>\n\nx"}, returned
        )
        is None
    )
    assert "reasoning differs" in (
        same_assistant({"role": "assistant", "content": "x", "reasoning": "no"}, returned) or ""
    )


def test_healing_is_incremental(renderer: ChatRenderer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Render work per healed call depends on the new messages, not on the history length."""
    agent = Agent(renderer, tools=None)
    rendered: list[int] = []
    real = renderer.render_text

    def counting(messages: Any, *a: Any, **kw: Any) -> str:
        rendered.append(len(messages))
        return real(messages, *a, **kw)

    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Start."}]
    per_call: list[int] = []
    for k in range(30):
        monkeypatch.setattr(renderer, "render_text", counting)
        rendered.clear()
        res, _, msg = agent.call(msgs, f"Reply number {k}.")
        monkeypatch.undo()
        if k > 0:
            assert res.healed
            per_call.append(max(rendered))
        msgs = [*msgs, _client(msg), {"role": "user", "content": f"Next {k}."}]
    assert max(per_call) <= 4  # probe messages: user + assistant + the new user turn


_word = st.text(alphabet="abcdefghij klmnop", min_size=1, max_size=12).map(
    lambda s: s.strip() or "w"
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    turns=st.lists(
        st.tuples(
            _word,
            st.one_of(
                _word,
                st.dictionaries(
                    st.sampled_from(["query", "n", "f"]),
                    st.one_of(_word, st.integers(-5, 99)),
                    max_size=3,
                ),
            ),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_healed_prompt_equals_full_render_when_history_is_faithful(
    renderer: ChatRenderer, turns: list[tuple[str, Any]]
) -> None:
    """Without reasoning and with template-style JSON, healing and re-rendering must agree exactly."""
    agent = Agent(renderer)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for user_text, reply in turns:
        sampled = _call("search", reply) if isinstance(reply, dict) else reply
        res, _, msg = agent.call(msgs, sampled)
        np.testing.assert_array_equal(res.prompt_ids, renderer.render(msgs, TOOLS))
        follow = (
            {"role": "tool", "content": user_text}
            if isinstance(reply, dict)
            else {"role": "user", "content": user_text}
        )
        msgs = [*msgs, _client(msg, compact=False), follow]
