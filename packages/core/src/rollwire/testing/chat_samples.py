"""ChatML rollouts written as text, with a one-character-per-token tokenizer.

Every fork class, a failed rollout with a failed call, an off-policy call, tool calls and tool
results, and a MoE rollout with routed experts: the cases a reader of rollouts (``rollwire
inspect``, evaluation, metrics) must show. No gateway, no engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rollwire.data.protocol import Group, ModelCall, Rollout

__all__ = ["CHAR_TOKENIZER", "CharTokenizer", "chat_batch", "chat_rollout"]

LAYERS, TOP_K, EXPERTS = 2, 2, 8


class CharTokenizer:
    """One id per character; ids >= 1000 are the ChatML control tokens and ``<think>`` markup."""

    SPECIAL = {1000: "<|im_start|>", 1001: "<|im_end|>", 1002: "<think>", 1003: "</think>"}

    @property
    def all_special_ids(self) -> list[int]:
        """The control and markup ids."""
        return list(self.SPECIAL)

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``: control tokens written out become one id each."""
        out: list[int] = []
        i = 0
        while i < len(text):
            for sid, s in self.SPECIAL.items():
                if text.startswith(s, i):
                    out.append(sid)
                    i += len(s)
                    break
            else:
                out.append(ord(text[i]))
                i += 1
        return out

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of ``token_ids``."""
        return "".join(
            ("" if skip_special_tokens else self.SPECIAL[t]) if t in self.SPECIAL else chr(t)
            for t in token_ids
        )


CHAR_TOKENIZER = CharTokenizer()

SYSTEM = "<|im_start|>system\nYou play Wordle. Guess with the guess tool.<|im_end|>\n"
ASK = "<|im_start|>user\nGuess the word.<|im_end|>\n<|im_start|>assistant\n"
GUESS = '<tool_call>{"name": "guess", "arguments": {"word": "crane"}}</tool_call><|im_end|>'
TOOL = "\n<|im_start|>user\n<tool_response>C?R?A?N?E?</tool_response><|im_end|>\n"
NEXT = "<|im_start|>assistant\n"


def _ids(text: str) -> np.ndarray:
    return np.asarray(CHAR_TOKENIZER.encode(text), dtype=np.int32)


def _response(completion: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": completion}
    if "<tool_call>" in completion:
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "guess", "arguments": '{"word": "crane"}'},
                }
            ],
        }
    return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}


def chat_rollout(
    rid: str,
    turns: Sequence[tuple[str, str]],
    *,
    group_id: str = "g",
    reward: float | None = 1.0,
    status: str = "completed",
    error: str | None = None,
    call_options: dict[int, dict[str, Any]] | None = None,
    experts: bool = False,
) -> Rollout:
    """A rollout of ``(prompt text, completion text)`` calls; ``call_options[i]`` sets call fields."""
    calls = []
    rng = np.random.default_rng(abs(hash(rid)) % 2**32)
    for i, (prompt_text, completion_text) in enumerate(turns):
        prompt, completion = _ids(prompt_text), _ids(completion_text)
        kw: dict[str, Any] = dict((call_options or {}).get(i, {}))
        if experts:
            full = prompt.shape[0] + completion.shape[0] - 1
            kw["routed_experts"] = rng.integers(0, EXPERTS, (full, LAYERS, TOP_K)).astype(np.int16)
        calls.append(
            ModelCall(
                call_id=f"{rid}-c{i}",
                session_id=rid,
                index=i,
                prompt_ids=prompt,
                completion_ids=completion,
                logprobs=-np.round(rng.uniform(0.01, 2.5, completion.shape[0]), 3).astype(
                    np.float32
                ),
                finish_reason="stop",
                latency_ms=12.5 + i,
                policy_version="v3",
                sampling={"temperature": 1.0},
                response=_response(completion_text),
                **kw,
            )
        )
    return Rollout(
        rollout_id=rid,
        group_id=group_id,
        task_id=group_id,
        status=status,  # type: ignore[arg-type]
        reward=reward,
        error=error,
        metrics={"turns": float(len(turns))},
        calls=calls,
    )


def _forks(group_id: str) -> list[Rollout]:
    """One rollout per fork class, each forking once after its first call."""
    first = SYSTEM + ASK
    done = "<|im_start|>user\nSolved?<|im_end|>\n" + NEXT
    cases = {
        # a control token re-rendered: the history has "\n" where the model sampled <|im_end|>
        "template": ("answer<|im_end|>", "answer\n<|im_end|>"),
        # tool-call JSON re-serialized without spaces
        "retokenized": (GUESS, GUESS.replace(": ", ":").replace(", ", ",")),
        # the reasoning was removed from the history
        "think_stripped": ("<think>plan: try crane</think>" + GUESS, GUESS),
        # an edit that is none of the above
        "other": ("x: a b<|im_end|>", "x: ab more<|im_end|>"),
    }
    out = []
    for i, (kind, (sampled, history)) in enumerate(cases.items()):
        out.append(
            chat_rollout(
                f"{group_id}-{kind}",
                [(first, sampled), (first + history + TOOL + done, "yes<|im_end|>")],
                group_id=group_id,
                reward=[1.0, 0.5, 0.0, -0.5][i],
            )
        )
    # the agent dropped its first exchange (a sliding window): the history was cut
    u2 = "<|im_start|>user\nAgain, another word.<|im_end|>\n" + NEXT
    out.append(
        chat_rollout(
            f"{group_id}-truncated",
            [
                (first, "first answer<|im_end|>"),
                (first + "first answer<|im_end|>\n" + u2, "second answer<|im_end|>"),
                (
                    SYSTEM + u2 + "second answer<|im_end|>\n<|im_start|>user\nthird question, "
                    "rather longer than the others<|im_end|>\n" + NEXT,
                    "z<|im_end|>",
                ),
            ],
            group_id=group_id,
            reward=0.25,
        )
    )
    return out


def chat_batch() -> list[Group]:
    """Two groups: every fork class; then merged tool use, failures, off-policy and MoE."""
    forks = _forks("g-forks")
    first = SYSTEM + ASK
    merged = [(first, GUESS), (first + GUESS + TOOL + NEXT, "crane<|im_end|>")]
    other = [
        chat_rollout("tools-merged", merged, group_id="g-mixed", reward=1.0),
        chat_rollout(
            "off-policy",
            merged,
            group_id="g-mixed",
            reward=0.0,
            call_options={1: {"off_policy": True, "trainable": False, "flags": ["logit_bias"]}},
        ),
        chat_rollout("moe", merged, group_id="g-mixed", reward=0.5, experts=True),
        chat_rollout(
            "failed",
            [(first, GUESS), (first + GUESS + TOOL + NEXT, "")],
            group_id="g-mixed",
            reward=None,
            status="failed",
            error="TimeoutError: the agent did not finish within 60 s",
            call_options={1: {"status": "failed", "error": "upstream 503: backend unavailable"}},
        ),
    ]
    return [
        Group(group_id="g-forks", task_id="g-forks", rollouts=forks),
        Group(group_id="g-mixed", task_id="g-mixed", rollouts=other),
    ]
