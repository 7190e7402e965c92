"""Reading token ids, log-probs and routed experts out of vLLM / SGLang / OpenAI responses, and
stripping the vendor fields the agent did not ask for. Pure functions over parsed JSON."""

from __future__ import annotations

import base64
import io
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rollwire.data.protocol import VersionSpan, version_spans_from_wire

__all__ = [
    "VERSIONS_INVALID_FLAG",
    "Asked",
    "Captured",
    "StreamAccumulator",
    "capture_spans",
    "extract",
    "int32_ids",
    "resolve_policy_version",
    "strip_chunk",
    "strip_response",
]

_EMPTY_I32 = np.zeros(0, dtype=np.int32)
_EMPTY_F32 = np.zeros(0, dtype=np.float32)


#: What vLLM reports as its weight version until someone calls ``/update_weight_version``.
UNSET_WEIGHT_VERSIONS = frozenset({"default"})


def resolve_policy_version(
    reported: str | None, current: str | None
) -> tuple[str | None, str | None]:
    """The policy version to record for a call, and the flag it earns (or None).

    ``reported`` is what the backend says it sampled with, ``current`` the version the trainer
    set on the gateway. The backend's word wins; a disagreement is worth knowing about (a weight
    sync not yet landed, a stale replica): ``policy_version_mismatch``. vLLM's ``"default"``
    (nobody set a version) counts as no report. Without a report the trainer's version is
    recorded, flagged ``weight_version_unreported`` once the trainer has set one, because
    stale-weight detection cannot work for such a call (vLLM 0.32 reports no version on its
    OpenAI routes)."""
    if reported in UNSET_WEIGHT_VERSIONS:
        reported = None
    if reported is None:
        return current, "weight_version_unreported" if current is not None else None
    if current is not None and current != reported:
        return reported, "policy_version_mismatch"
    return reported, None


@dataclass
class Asked:
    """Which vendor fields the agent itself asked for (those are passed through)."""

    token_ids: bool = False
    logprobs: bool = False
    weight_versions: bool = False
    prompt_logprobs: bool = False
    routed_experts: bool = False

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Asked:
        """What the request asked for."""
        return cls(
            token_ids=bool(body.get("return_token_ids"))
            or bool(body.get("return_output_ids_in_sglext")),
            logprobs=body.get("logprobs") not in (None, False),
            weight_versions=bool(body.get("return_weight_versions")),
            prompt_logprobs=body.get("prompt_logprobs") is not None,
            routed_experts=bool(body.get("return_routed_experts")),
        )

    @property
    def everything(self) -> bool:
        """True when nothing needs stripping."""
        return (
            self.token_ids
            and self.logprobs
            and self.weight_versions
            and self.prompt_logprobs
            and self.routed_experts
        )


@dataclass
class Captured:
    """What one call produced, as far as the backend told us."""

    prompt_ids: np.ndarray = field(default_factory=lambda: _EMPTY_I32)
    completion_ids: np.ndarray = field(default_factory=lambda: _EMPTY_I32)
    logprobs: np.ndarray = field(default_factory=lambda: _EMPTY_F32)
    routed_experts: np.ndarray | None = None
    finish_reason: str | None = None
    weight_version: str | None = None
    #: the backend's per-token ``weight_versions`` spans as it sent them (vLLM's shape)
    weight_spans: Any = None
    has_ids: bool = False
    usage: dict[str, Any] | None = None
    #: the model name the answer gives (a LoRA adapter's when one served it)
    model: Any = None


#: ``struct`` packers of n native int32s, by n (bounded: cleared when it gets large)
_INT32_PACKERS: dict[int, struct.Struct] = {}


def int32_ids(value: list[Any]) -> np.ndarray:
    """A list of plain ints as int32 in one C loop (~40% cheaper than ``np.fromiter``'s
    per-item conversion); :class:`ValueError` when one is not an int or is out of range."""
    n = len(value)
    if not n:
        return _EMPTY_I32
    packer = _INT32_PACKERS.get(n)
    if packer is None:
        if len(_INT32_PACKERS) >= 1024:
            _INT32_PACKERS.clear()
        packer = _INT32_PACKERS[n] = struct.Struct(f"={n}i")
    arr = np.empty(n, dtype=np.int32)
    try:
        packer.pack_into(arr.data, 0, *value)
    except struct.error as exc:
        raise ValueError(str(exc)) from None
    return arr


def _ids(value: Any) -> np.ndarray:
    if not value:
        return _EMPTY_I32
    if isinstance(value, list):
        try:
            return int32_ids(value)
        except ValueError:
            pass  # not all plain ints in range: numpy says what they are (or why not)
    return np.array(value, dtype=np.int32)


def decode_experts(value: Any) -> np.ndarray | None:
    """vLLM's ``routed_experts``: base64 of an ``.npy`` file (or a nested list)."""
    if value is None:
        return None
    if isinstance(value, str):
        raw = base64.b64decode(value)
        if raw[:6] != b"\x93NUMPY":
            return None  # raw bytes with no shape: cannot be reshaped safely
        arr = np.load(io.BytesIO(raw), allow_pickle=False)
    else:
        arr = np.asarray(value)
    return np.ascontiguousarray(arr, dtype=np.int16)


def _chat_logprobs(lp: Any) -> list[float]:
    if not isinstance(lp, dict):
        return []
    content = lp.get("content")
    if isinstance(content, list):
        return [e["logprob"] for e in content]
    tl = lp.get("token_logprobs")  # completions API
    if isinstance(tl, list):
        return [0.0 if v is None else v for v in tl]
    return []


#: flag of a call whose backend labelled its tokens with versions that do not fit them
VERSIONS_INVALID_FLAG = "weight_versions_invalid"


def capture_spans(raw: Any, n: int) -> tuple[list[VersionSpan] | None, str | None]:
    """``(spans, flag)``: the backend's per-token version spans for ``ModelCall.weight_versions``
    (None for one version), or None and ``weight_versions_invalid`` when they do not fit."""
    try:
        return version_spans_from_wire(raw, n), None
    except ValueError:
        return None, VERSIONS_INVALID_FLAG


def _weight_version(choice: dict[str, Any], data: dict[str, Any]) -> str | None:
    wv = choice.get("weight_versions") or data.get("weight_versions")
    if isinstance(wv, list) and wv:
        last = wv[-1]
        if isinstance(last, dict) and last.get("version") is not None:
            return str(last["version"])
    one = data.get("weight_version") or choice.get("weight_version")
    return str(one) if one is not None else None


def extract(data: dict[str, Any], prompt_ids: np.ndarray | None = None) -> Captured:
    """Capture from a non-streaming chat or completions response (first choice); its prompt's
    ids are ``prompt_ids`` when given (read apart from ``data`` by :mod:`.answer`)."""
    cap = Captured()
    choices = data.get("choices") or []
    choice = choices[0] if choices else {}
    completion = choice.get("token_ids")
    if completion is None:
        completion = choice.get("response_token_ids")  # SGLang's OpenAI chat
    if prompt_ids is not None:
        cap.has_ids = completion is not None
        cap.prompt_ids = prompt_ids
    else:
        prompt = data.get("prompt_token_ids")
        if prompt is None:
            prompt = choice.get("prompt_token_ids")
        cap.has_ids = prompt is not None and completion is not None
        cap.prompt_ids = _ids(prompt)
    cap.completion_ids = _ids(completion)
    lps = _chat_logprobs(choice.get("logprobs"))
    cap.logprobs = np.array(lps, dtype=np.float32) if lps else _EMPTY_F32
    cap.routed_experts = decode_experts(choice.get("routed_experts"))
    cap.finish_reason = choice.get("finish_reason")
    cap.weight_version = _weight_version(choice, data)
    cap.weight_spans = choice.get("weight_versions")
    cap.usage = data.get("usage")
    cap.model = data.get("model")
    return cap


def strip_response(data: dict[str, Any], asked: Asked) -> None:
    """Remove, in place, the vendor fields the agent did not ask for."""
    if not asked.token_ids:
        data.pop("prompt_token_ids", None)
        data.pop("sglext", None)
    if not asked.prompt_logprobs:
        data.pop("prompt_logprobs", None)
    if not asked.weight_versions:
        data.pop("weight_versions", None)
        data.pop("weight_version", None)
    for choice in data.get("choices") or ():
        if not asked.token_ids:
            choice.pop("token_ids", None)
            choice.pop("prompt_token_ids", None)
            choice.pop("response_token_ids", None)
        if not asked.logprobs and choice.get("logprobs") is not None:
            choice["logprobs"] = None
        if not asked.routed_experts:
            choice.pop("routed_experts", None)
        if not asked.weight_versions:
            choice.pop("weight_versions", None)
        if not asked.prompt_logprobs:
            choice.pop("prompt_logprobs", None)


def strip_chunk(chunk: dict[str, Any], asked: Asked) -> bool:
    """Strip a streaming chunk in place; False when nothing is left worth sending."""
    had_sglext = "sglext" in chunk
    strip_response(chunk, asked)
    empty = not chunk.get("choices") and not chunk.get("usage")
    return not (had_sglext and not asked.token_ids and empty)


class StreamAccumulator:
    """Collects ids, log-probs, text and tool-call deltas (merged by index) from SSE chunks."""

    def __init__(self) -> None:
        self.prompt: list[int] | None = None
        self.completion: list[int] = []
        self.saw_ids = False
        self.logprobs: list[float] = []
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.weight_version: str | None = None
        self.weight_spans: Any = None
        self.usage: dict[str, Any] | None = None
        self.head: dict[str, Any] = {}
        self.role: str = "assistant"

    def add(self, chunk: dict[str, Any]) -> None:
        """Fold one parsed chunk in (only choice 0 is captured)."""
        if not self.head:
            self.head = {k: chunk[k] for k in ("id", "object", "created", "model") if k in chunk}
        prompt = chunk.get("prompt_token_ids")
        if prompt is not None:
            self.prompt = prompt
        ext = chunk.get("sglext")
        if isinstance(ext, dict):
            if ext.get("input_ids") is not None:
                self.prompt = ext["input_ids"]
            if ext.get("output_ids") is not None:
                self.completion = list(ext["output_ids"])
                self.saw_ids = True
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            if self.prompt is None and choice.get("prompt_token_ids") is not None:
                self.prompt = choice["prompt_token_ids"]
            ids = choice.get("token_ids")
            if ids is not None:
                self.completion.extend(ids)
                self.saw_ids = True
            self.logprobs.extend(_chat_logprobs(choice.get("logprobs")))
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
            wv = _weight_version(choice, chunk)
            if wv is not None:
                self.weight_version = wv
            if choice.get("weight_versions"):  # vLLM: on the final chunk, over the whole output
                self.weight_spans = choice["weight_versions"]
            if choice.get("text"):
                self.text.append(choice["text"])
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                continue
            if delta.get("role"):
                self.role = delta["role"]
            if delta.get("content"):
                self.text.append(delta["content"])
            r = delta.get("reasoning_content") or delta.get("reasoning")
            if r:
                self.reasoning.append(r)
            for tc in delta.get("tool_calls") or ():
                self._merge_tool_call(tc)

    def _merge_tool_call(self, tc: dict[str, Any]) -> None:
        idx = int(tc.get("index", len(self.tool_calls)))
        cur = self.tool_calls.get(idx)
        fn = tc.get("function") or {}
        if cur is None:
            cur = {
                "id": tc.get("id"),
                "type": tc.get("type") or "function",
                "function": {"name": fn.get("name") or "", "arguments": ""},
            }
            self.tool_calls[idx] = cur
        else:
            if tc.get("id") and not cur["id"]:
                cur["id"] = tc["id"]
            if fn.get("name") and not cur["function"]["name"]:
                cur["function"]["name"] = fn["name"]
        if fn.get("arguments"):
            cur["function"]["arguments"] += fn["arguments"]

    def captured(self) -> Captured:
        """The capture, once the stream has ended."""
        return Captured(
            prompt_ids=_ids(self.prompt),
            completion_ids=_ids(self.completion),
            logprobs=np.array(self.logprobs, dtype=np.float32) if self.logprobs else _EMPTY_F32,
            finish_reason=self.finish_reason,
            weight_version=self.weight_version,
            weight_spans=self.weight_spans,
            has_ids=self.prompt is not None and self.saw_ids,
            usage=self.usage,
            model=self.head.get("model"),
        )

    def response(self, chat: bool) -> dict[str, Any]:
        """The streamed answer folded into one non-streaming response body (for the record)."""
        text = "".join(self.text)
        if chat:
            message: dict[str, Any] = {"role": self.role, "content": text or None}
            if self.reasoning:
                message["reasoning_content"] = "".join(self.reasoning)
            if self.tool_calls:
                message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
            choice: dict[str, Any] = {"index": 0, "message": message}
        else:
            choice = {"index": 0, "text": text}
        choice["finish_reason"] = self.finish_reason
        out = dict(self.head)
        out["object"] = "chat.completion" if chat else "text_completion"
        out["choices"] = [choice]
        if self.usage is not None:
            out["usage"] = self.usage
        return out
