"""Prefix healing for ``capture="tokens"``: reuse the exact ids sampled so far, render only what is new.

When a request's messages are an earlier request's messages, plus the assistant message the
gateway returned for it, plus new messages, the prompt is that request's prompt ids + the sampled
completion ids + the rendering of the new messages — so the model sees, and the trainer trains on,
exactly what was sampled, however the agent framework re-serialized the history. Only the new
suffix is rendered (two short probe renders), so the work per call does not grow with history.
Anything else (compaction, edited history, a sub-agent) is rendered in full on a new branch, with
the reason recorded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rollwire.gateway.tokens.parsers import split_reasoning
from rollwire.gateway.tokens.render import ChatRenderer, message_text, normalize_messages

__all__ = ["FullRender", "HealResult", "Healer", "same_assistant", "same_message"]

_PROBE_USER = "rollwire probe"
_PLACEHOLDER = "ROLLWIRE-PLACEHOLDER-9f1c"
_MAX_TIPS = 8


def _role(msg: Mapping[str, Any]) -> str:
    role = str(msg.get("role"))
    return "system" if role == "developer" else role


def _args(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _calls(msg: Mapping[str, Any]) -> list[tuple[Any, Any]]:
    out = []
    for call in msg.get("tool_calls") or ():
        fn = call.get("function") or {}
        out.append((fn.get("name"), _args(fn.get("arguments"))))
    return out


def _answer_text(msg: Mapping[str, Any]) -> str:
    text = message_text(msg.get("content"))
    reasoning, rest, _ = split_reasoning(text)
    return (rest if reasoning is not None else text).strip()


def same_assistant(sent: Mapping[str, Any], returned: Mapping[str, Any]) -> str | None:
    """None when ``sent`` is the assistant message ``returned`` as a client sends it back.

    Compared semantically: role, answer text (whitespace at the ends and a leading ``<think>``
    block ignored), tool-call names and parsed arguments (JSON spelling ignored). Reasoning may be
    dropped; when sent, it must match. Otherwise a short reason.
    """
    if _role(sent) != "assistant":
        return f"role is {sent.get('role')!r}, not the assistant reply"
    if _answer_text(sent) != _answer_text(returned):
        return "assistant content differs from the reply returned"
    a, b = _calls(sent), _calls(returned)
    if len(a) != len(b):
        return f"{len(a)} tool calls where the reply had {len(b)}"
    for i, ((na, xa), (nb, xb)) in enumerate(zip(a, b, strict=True)):
        if na != nb:
            return f"tool_calls[{i}] name {na!r} is not {nb!r}"
        if xa != xb:
            return f"tool_calls[{i}] ({na}) arguments differ from the reply returned"
    sent_reasoning = sent.get("reasoning_content") or sent.get("reasoning")
    returned_reasoning = returned.get("reasoning_content") or returned.get("reasoning")
    if (
        isinstance(sent_reasoning, str)
        and sent_reasoning.strip()
        and sent_reasoning.strip() != (returned_reasoning or "").strip()
    ):
        return "assistant reasoning differs from the reply returned"
    return None


def same_message(new: Mapping[str, Any], old: Mapping[str, Any]) -> str | None:
    """None when ``new`` renders like ``old``; assistant turns compare as :func:`same_assistant`."""
    if new == old:
        return None
    if _role(new) != _role(old):
        return f"role {new.get('role')!r} where it was {old.get('role')!r}"
    if _role(old) == "assistant":
        return same_assistant(new, old)
    if message_text(new.get("content")) != message_text(old.get("content")):
        return "content changed"
    for key in ("tool_call_id", "name"):
        if new.get(key) != old.get(key):
            return f"{key} changed"
    return None


@dataclass
class _Tip:
    """A served call that later requests may extend."""

    messages: list[Any]
    tools: list[Any] | None
    kwargs: dict[str, Any]
    prompt_ids: np.ndarray
    completion_ids: np.ndarray
    assistant: dict[str, Any]
    branch: int


@dataclass
class HealResult:
    """The prompt for one request and how it was obtained."""

    prompt_ids: np.ndarray
    healed: bool
    branch: int
    fork_reason: str | None = None
    suffix_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))


@dataclass
class FullRender:
    """A request no earlier call extends: render it in full, on a new branch (:meth:`run`).

    Touches no :class:`Healer` state, so it may run in a worker thread.
    """

    renderer: ChatRenderer
    messages: list[Any]
    tools: list[Any] | None
    kwargs: dict[str, Any]
    branch: int
    fork_reason: str | None

    def run(self) -> HealResult:
        """Render the whole history with the chat template."""
        prompt = self.renderer.render(self.messages, self.tools, chat_template_kwargs=self.kwargs)
        return HealResult(prompt, False, self.branch, self.fork_reason)


class Healer:
    """Per-session healing state: the last few served calls and the probe cache."""

    def __init__(self, renderer: ChatRenderer, max_tips: int = _MAX_TIPS) -> None:
        self.renderer = renderer
        self.max_tips = max_tips
        self._tips: list[_Tip] = []
        self._next_branch = 0
        self._close: dict[str, str] = {}

    # -- public ---------------------------------------------------------------------------------

    def prompt(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Any] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> HealResult:
        """Prompt ids for ``messages``: healed from an earlier call when it extends one."""
        step = self.heal(messages, tools, chat_template_kwargs)
        return step if isinstance(step, HealResult) else step.run()

    def heal(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Any] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> HealResult | FullRender:
        """The healed prompt (cheap: work grows with the new messages only), or the full render
        still to do — which grows with the history, so an async caller runs it off the loop."""
        msgs = list(messages)
        tool_list = list(tools) if tools else None
        kwargs = dict(chat_template_kwargs or {})
        reasons: list[str] = []
        for tip in reversed(self._tips):
            why = self._extends(tip, msgs, tool_list, kwargs)
            if why is None:
                suffix = self._suffix(tip, msgs, tool_list, kwargs)
                if suffix is not None:
                    prompt = np.concatenate([tip.prompt_ids, tip.completion_ids, suffix])
                    return HealResult(prompt, True, tip.branch, None, suffix)
                why = "the chat template renders this history differently once new messages follow"
            reasons.append(why)
        branch = self._next_branch
        self._next_branch += 1
        same = self._repeat_of(msgs, tool_list, kwargs)
        if same is not None:
            return HealResult(same.prompt_ids.copy(), False, branch, "repeats an earlier request")
        return FullRender(
            self.renderer, msgs, tool_list, kwargs, branch, reasons[0] if reasons else None
        )

    def record(
        self,
        result: HealResult,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Any] | None,
        chat_template_kwargs: Mapping[str, Any] | None,
        completion_ids: np.ndarray,
        assistant: Mapping[str, Any],
    ) -> None:
        """Remember a served call so that the next request can extend it."""
        tip = _Tip(
            messages=list(messages),
            tools=list(tools) if tools else None,
            kwargs=dict(chat_template_kwargs or {}),
            prompt_ids=result.prompt_ids,
            completion_ids=np.asarray(completion_ids, dtype=np.int32),
            assistant=dict(assistant),
            branch=result.branch,
        )
        self._tips.append(tip)
        if len(self._tips) > self.max_tips:
            del self._tips[0]

    # -- matching -------------------------------------------------------------------------------

    @staticmethod
    def _extends(
        tip: _Tip, msgs: list[Any], tools: list[Any] | None, kwargs: dict[str, Any]
    ) -> str | None:
        n = len(tip.messages)
        if len(msgs) <= n:
            return (
                f"history has {len(msgs)} messages where the previous request had {n} plus the "
                "reply (compaction, truncation or a new conversation)"
            )
        if tools != tip.tools:
            return "tools changed since the previous request"
        if kwargs != tip.kwargs:
            return "chat_template_kwargs changed since the previous request"
        # One C-level comparison in the usual case; message by message only when it fails.
        if msgs[:n] != tip.messages:
            for i in range(n):
                why = same_message(msgs[i], tip.messages[i])
                if why is not None:
                    return (
                        f"messages[{i}] ({msgs[i].get('role')}): {why} since the previous request"
                    )
        why = same_assistant(msgs[n], tip.assistant)
        if why is not None:
            return f"messages[{n}]: {why}"
        return None

    def _repeat_of(
        self, msgs: list[Any], tools: list[Any] | None, kwargs: dict[str, Any]
    ) -> _Tip | None:
        for tip in reversed(self._tips):
            if (
                len(tip.messages) == len(msgs)
                and tip.tools == tools
                and tip.kwargs == kwargs
                and all(same_message(a, b) is None for a, b in zip(msgs, tip.messages, strict=True))
            ):
                return tip
        return None

    # -- suffix rendering -----------------------------------------------------------------------

    def _close_text(
        self, head: list[dict[str, Any]], tools: list[Any] | None, kwargs: dict[str, Any]
    ) -> str | None:
        """What the template writes after an assistant message's content (``<|im_end|>\\n``)."""
        key = json.dumps([head, tools, kwargs], sort_keys=True, default=str)
        if key not in self._close:
            probe = [
                *head,
                {"role": "user", "content": _PROBE_USER},
                {"role": "assistant", "content": _PLACEHOLDER},
            ]
            text = self.renderer.render_text(
                probe,
                tools,
                add_generation_prompt=False,
                chat_template_kwargs=kwargs,
                normalized=True,
            )
            at = text.rfind(_PLACEHOLDER)
            self._close[key] = text[at + len(_PLACEHOLDER) :] if at >= 0 else ""
        close = self._close[key]
        return close or None

    def _suffix(
        self, tip: _Tip, msgs: list[Any], tools: list[Any] | None, kwargs: dict[str, Any]
    ) -> np.ndarray | None:
        n = len(tip.messages)
        first = msgs[0] if msgs and _role(msgs[0]) == "system" else None
        head = normalize_messages([first]) if first is not None else []
        close = self._close_text(head, tools, kwargs)
        if close is None:
            return None
        # The assistant turn as the template sees it, minus reasoning (which some templates drop
        # once a new user turn follows; it is in the sampled ids anyway).
        reply = normalize_messages([tip.assistant])[0]
        reply.pop("reasoning", None)
        reply.pop("reasoning_content", None)
        reply["content"] = _answer_text(reply)
        before = [*head, {"role": "user", "content": _PROBE_USER}, reply]
        after = [*before, *normalize_messages(msgs[n + 1 :])]
        render = self.renderer.render_text
        text_before = render(
            before, tools, add_generation_prompt=False, chat_template_kwargs=kwargs, normalized=True
        )
        text_after = render(
            after, tools, add_generation_prompt=True, chat_template_kwargs=kwargs, normalized=True
        )
        if not text_after.startswith(text_before) or not text_before.endswith(close):
            return None
        tail = text_after[len(text_before) :]
        # The sampled ids usually end with the template's turn-closing token (<|im_end|>): the
        # suffix then starts right after it; a truncated completion gets the whole close.
        closing = close
        if tip.completion_ids.size:
            last = self.renderer.special_text(int(tip.completion_ids[-1]))
            if last and closing.startswith(last):
                closing = closing[len(last) :]
        return self.renderer.encode(closing + tail)
