"""Completion text → OpenAI assistant message (content, reasoning, tool_calls), per model family.

The registry is ordered: :func:`detect_parser` returns the first parser whose ``matches`` accepts
a chat template. Built in: ``hermes`` (Hermes / Qwen2.5 / Qwen3 JSON ``<tool_call>`` blocks) and
``qwen3_coder`` (``<function=name><parameter=x>...</parameter></function>`` XML). Both read
``<think>...</think>`` reasoning. Add one with :func:`register_parser`.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "HermesParser",
    "ParsedCompletion",
    "Qwen3CoderParser",
    "TemplateNotSupported",
    "ToolParser",
    "check_template_supported",
    "detect_parser",
    "parse_completion",
    "parsers",
    "register_parser",
    "split_reasoning",
]


class TemplateNotSupported(ValueError):
    """No registered tool-call parser understands this chat template."""


@dataclass
class ParsedCompletion:
    """What a completion says, in OpenAI terms; ``ill_formed`` when the markup did not parse."""

    content: str | None
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    ill_formed: bool = False
    error: str | None = None

    def message(self) -> dict[str, Any]:
        """The OpenAI ``message`` object (``reasoning`` as vLLM names it, plus ``reasoning_content``)."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning is not None:
            msg["reasoning"] = self.reasoning
            msg["reasoning_content"] = self.reasoning
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg


@runtime_checkable
class ToolParser(Protocol):
    """Parses one model family's completion markup."""

    name: str

    def matches(self, chat_template: str) -> bool:
        """True when ``chat_template`` renders tool calls in this parser's format."""
        ...

    def parse(
        self, text: str, tools: Sequence[Mapping[str, Any]] | None = None
    ) -> ParsedCompletion:
        """Split a completion's text into content, reasoning and tool calls."""
        ...


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _tool_call(name: str, arguments: Any) -> dict[str, Any]:
    return {
        "id": _call_id(),
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def _content(text: str) -> str | None:
    """A reply's content exactly as sampled (the agent must see what the policy produced), or
    None when it is only whitespace.

    Before a tool call this is the text before the first block, byte for byte (the newline the
    template writes between content and ``<tool_call>`` included, when the model sampled it).
    Whitespace between and after the blocks has no place in an OpenAI message: it is dropped from
    the answer, stays in the sampled ids, and healing reuses those ids, so the trainer sees it.
    """
    return text if text.strip() else None


def split_reasoning(text: str) -> tuple[str | None, str, str | None]:
    """``(reasoning, rest, error)`` of a completion: ``<think>...</think>`` at its start.

    A completion whose prompt already opened ``<think>`` (Qwen3 thinking) has only ``</think>``;
    the text before it is the reasoning. An unclosed ``<think>`` is an error (truncated output).
    """
    start = text.find("<think>")
    end = text.find("</think>")
    if end < 0:
        if start >= 0 and not text[:start].strip():
            return text[start + len("<think>") :].strip("\n"), "", "unclosed <think> block"
        return None, text, None
    if start < 0 or start > end:
        head = text[:end]
    else:
        if text[:start].strip():
            return None, text, None
        head = text[start + len("<think>") : end]
    return head.strip("\n"), text[end + len("</think>") :].lstrip("\n"), None


_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class HermesParser:
    """Hermes / Qwen2.5 / Qwen3: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``."""

    name = "hermes"

    def matches(self, chat_template: str) -> bool:
        """Templates that print ``<tool_call>`` JSON blocks (and not Qwen3-Coder's XML)."""
        return "<tool_call>" in chat_template and "<function=" not in chat_template

    def parse(
        self, text: str, tools: Sequence[Mapping[str, Any]] | None = None
    ) -> ParsedCompletion:
        """See :class:`ToolParser`."""
        reasoning, rest, err = split_reasoning(text)
        if err:
            return ParsedCompletion(content=text, ill_formed=True, error=err)
        first = rest.find("<tool_call>")
        if first < 0:
            return ParsedCompletion(content=_content(rest), reasoning=reasoning)
        calls: list[dict[str, Any]] = []
        pos = first
        for m in _HERMES_BLOCK.finditer(rest, first):
            if rest[pos : m.start()].strip():
                return _bad(text, "text between <tool_call> blocks")
            try:
                obj = json.loads(m.group(1))
            except json.JSONDecodeError as exc:
                return _bad(text, f"tool call is not JSON: {exc}")
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                return _bad(text, "tool call JSON has no string 'name'")
            args = obj.get("arguments", obj.get("parameters", {}))
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    return _bad(text, "tool call 'arguments' is a string that is not JSON")
            calls.append(_tool_call(obj["name"], args))
            pos = m.end()
        if rest[pos:].strip():
            return _bad(text, "unclosed <tool_call> block or text after the tool calls")
        content = _content(rest[:first])
        return ParsedCompletion(content=content, reasoning=reasoning, tool_calls=calls)


_CODER_FUNC = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL)
_CODER_PARAM = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


def _param_types(tools: Sequence[Mapping[str, Any]] | None, name: str) -> dict[str, Any]:
    for tool in tools or ():
        fn = tool.get("function", tool)
        if isinstance(fn, Mapping) and fn.get("name") == name:
            params = fn.get("parameters") or {}
            props = params.get("properties") if isinstance(params, Mapping) else None
            return dict(props) if isinstance(props, Mapping) else {}
    return {}


def _coerce(raw: str, schema: Any) -> Any:
    value = raw.strip("\n")
    kind = schema.get("type") if isinstance(schema, Mapping) else None
    if kind == "string":
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


class Qwen3CoderParser:
    """Qwen3-Coder: ``<tool_call>\\n<function=f>\\n<parameter=x>\\nv\\n</parameter>\\n</function>\\n</tool_call>``.

    Parameter values are text; they are converted with the tool's JSON schema (strings stay
    strings, anything else is read as JSON when it parses).
    """

    name = "qwen3_coder"

    def matches(self, chat_template: str) -> bool:
        """Templates that print ``<function=...>`` / ``<parameter=...>`` XML."""
        return "<function=" in chat_template and "<parameter=" in chat_template

    def parse(
        self, text: str, tools: Sequence[Mapping[str, Any]] | None = None
    ) -> ParsedCompletion:
        """See :class:`ToolParser`."""
        reasoning, rest, err = split_reasoning(text)
        if err:
            return ParsedCompletion(content=text, ill_formed=True, error=err)
        first_tc = rest.find("<tool_call>")
        first_fn = rest.find("<function=")
        starts = [i for i in (first_tc, first_fn) if i >= 0]
        if not starts:
            return ParsedCompletion(content=_content(rest), reasoning=reasoning)
        first = min(starts)
        body = rest[first:]
        calls: list[dict[str, Any]] = []
        leftover = _CODER_FUNC.sub("", body)
        leftover = leftover.replace("<tool_call>", "").replace("</tool_call>", "")
        if leftover.strip():
            return _bad(text, "unclosed <function=...> block or stray text among tool calls")
        for m in _CODER_FUNC.finditer(body):
            name = m.group(1).strip()
            types = _param_types(tools, name)
            inner = m.group(2)
            if _CODER_PARAM.sub("", inner).strip():
                return _bad(text, f"stray text inside <function={name}>")
            args = {
                p.group(1).strip(): _coerce(p.group(2), types.get(p.group(1).strip()))
                for p in _CODER_PARAM.finditer(inner)
            }
            calls.append(_tool_call(name, args))
        if body.count("<tool_call>") != body.count("</tool_call>"):
            return _bad(text, "unbalanced <tool_call> tags")
        content = _content(rest[:first])
        return ParsedCompletion(content=content, reasoning=reasoning, tool_calls=calls)


def _bad(text: str, why: str) -> ParsedCompletion:
    return ParsedCompletion(content=text, ill_formed=True, error=why)


_REGISTRY: list[ToolParser] = [HermesParser(), Qwen3CoderParser()]


def parsers() -> list[ToolParser]:
    """The registered parsers, in the order :func:`detect_parser` tries them."""
    return list(_REGISTRY)


def register_parser(parser: ToolParser, *, first: bool = False) -> None:
    """Add a parser (``first=True`` to try it before the built-in ones); same name replaces."""
    existing = [p for p in _REGISTRY if p.name != parser.name]
    _REGISTRY[:] = [parser, *existing] if first else [*existing, parser]


def detect_parser(chat_template: str) -> ToolParser | None:
    """The first registered parser that understands ``chat_template``, or None."""
    for parser in _REGISTRY:
        if parser.matches(chat_template):
            return parser
    return None


def check_template_supported(renderer: Any, *, tools: bool = True) -> ToolParser | None:
    """The parser for ``renderer``'s template; raise :class:`TemplateNotSupported` when none fits.

    With ``tools=False`` a template without tool markup is accepted (returns None): plain chats
    need no tool parser. Call it when a ``capture="tokens"`` session is created.
    """
    template = getattr(renderer, "chat_template", "") or ""
    if not template:
        raise TemplateNotSupported(
            f"tokenizer {getattr(renderer, 'source', None)!r} has no chat template; tokens mode "
            "needs one to render prompts"
        )
    parser = detect_parser(template)
    if parser is None and tools:
        names = ", ".join(p.name for p in _REGISTRY)
        raise TemplateNotSupported(
            f"no tool-call parser understands the chat template of "
            f"{getattr(renderer, 'source', None)!r} (tried: {names}). Use capture='passthrough' "
            "with the server's own tool parser, or register one with "
            "rollwire.gateway.tokens.parsers.register_parser"
        )
    return parser


def parse_completion(
    text: str, parser: ToolParser | None, tools: Sequence[Mapping[str, Any]] | None
) -> ParsedCompletion:
    """Content, reasoning and tool calls of a completion; tool markup is read only with tools."""
    if tools and parser is not None:
        return parser.parse(text, tools)
    reasoning, rest, err = split_reasoning(text)
    if err:
        return ParsedCompletion(content=text, ill_formed=True, error=err)
    return ParsedCompletion(content=_content(rest), reasoning=reasoning)
