"""Scripted mode: force the assistant text per request (by session, by regex, or by a callable).

The engine teacher-forces the scripted text, so tokens are exactly the script's while log-probs and
routed experts stay the model's real values for those tokens.

Script file format (JSON or YAML)::

    sessions:               # consumed in order, one text per request of that session
      sess-1: ["<tool_call>\\n{...}\\n</tool_call>", "The answer is 42."]
    rules:                  # first regex that matches the last user/tool message wins
      - match: "weather in (\\\\w+)"
        reply: "It is sunny in \\\\1."
    default: null           # text when nothing matches; null lets the model sample
"""

from __future__ import annotations

import importlib
import json
import re
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

__all__ = ["Script", "load_script", "messages_from_prompt"]

ScriptCallable = Callable[[list[dict[str, Any]], "list[dict[str, Any]] | None"], "str | None"]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


class Script:
    """A request → forced-text lookup built from a mapping or a callable."""

    def __init__(self, spec: Mapping[str, Any] | ScriptCallable) -> None:
        self._fn: ScriptCallable | None = None
        self._sessions: dict[str, list[str]] = {}
        self._rules: list[tuple[re.Pattern[str], str]] = []
        self._default: str | None = None
        self._cursor: dict[str, int] = {}
        self._lock = threading.Lock()
        if callable(spec):
            self._fn = spec
            return
        unknown = set(spec) - {"sessions", "rules", "default"}
        if unknown:
            raise ValueError(
                f"unknown keys in script: {sorted(unknown)}; expected sessions, rules, default"
            )
        for sid, texts in (spec.get("sessions") or {}).items():
            if isinstance(texts, str):
                texts = [texts]
            self._sessions[str(sid)] = [str(t) for t in texts]
        for i, rule in enumerate(spec.get("rules") or []):
            if "match" not in rule or "reply" not in rule:
                raise ValueError(
                    f"script rule #{i} needs 'match' and 'reply' keys, got {sorted(rule)}"
                )
            pattern = re.compile(rule["match"], re.DOTALL)
            reply = str(rule["reply"])
            _check_group_refs(pattern, reply, i)
            self._rules.append((pattern, reply))
        default = spec.get("default")
        self._default = None if default is None else str(default)

    def lookup(
        self,
        messages: list[dict[str, Any]] | None,
        tools: list[dict[str, Any]] | None = None,
        session_id: str | None = None,
    ) -> str | None:
        """The forced assistant text for this request, or None to let the model sample."""
        if self._fn is not None:
            return self._fn(list(messages or []), tools)
        if session_id is not None and session_id in self._sessions:
            with self._lock:
                i = self._cursor.get(session_id, 0)
                texts = self._sessions[session_id]
                if i < len(texts):
                    self._cursor[session_id] = i + 1
                    return texts[i]
        last = ""
        for m in reversed(messages or []):
            if m.get("role") in ("user", "tool"):
                last = _text(m.get("content"))
                break
        for pattern, reply in self._rules:
            match = pattern.search(last)
            if match:
                return expand_groups(match, reply)
        return self._default


# ``\1``..``\99`` and ``\g<name>``/``\g<3>``; every other backslash is literal text.
_GROUP_REF = re.compile(r"\\(?:(\d{1,2})|g<(\w+)>)")


def _group_key(num: str | None, name: str | None) -> int | str:
    ref = num if num is not None else name
    assert ref is not None
    return int(ref) if ref.isdigit() else ref


def expand_groups(match: re.Match[str], reply: str) -> str:
    """Substitute ``\\1`` and ``\\g<name>`` in ``reply`` with the match's groups.

    Unlike ``Match.expand`` no other escape is interpreted, so a ``\\n`` inside a JSON string of a
    scripted tool call stays the two characters JSON needs (an unmatched group gives "").
    """
    return _GROUP_REF.sub(lambda m: match.group(_group_key(*m.groups())) or "", reply)


def _check_group_refs(pattern: re.Pattern[str], reply: str, index: int) -> None:
    for ref in _GROUP_REF.finditer(reply):
        key = _group_key(*ref.groups())
        ok = key <= pattern.groups if isinstance(key, int) else key in pattern.groupindex
        if not ok:
            raise ValueError(
                f"script rule #{index}: reply refers to group {ref.group(0)!r}, but "
                f"{pattern.pattern!r} has no such group"
            )


def load_script(source: str | Path | Mapping[str, Any] | ScriptCallable) -> Script:
    """Build a :class:`Script` from a file path, a ``module:function`` string, a mapping or a callable."""
    if callable(source) or isinstance(source, Mapping):
        return Script(source)
    text = str(source)
    path = Path(text)
    if path.exists():
        raw = path.read_text("utf-8")
        data = json.loads(raw) if path.suffix == ".json" else yaml.safe_load(raw)
        if not isinstance(data, Mapping):
            raise ValueError(
                f"script {path} must hold a mapping with sessions/rules/default, got {type(data).__name__}"
            )
        return Script(data)
    if ":" in text:
        module, _, attr = text.partition(":")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"cannot load script callable {text!r}: {exc}") from exc
        return Script(fn)
    raise FileNotFoundError(f"script {text!r} is neither a file nor a 'module:function' reference")


_TURN_RE = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>|$)", re.DOTALL)


def messages_from_prompt(prompt: str) -> list[dict[str, Any]]:
    """Recover ChatML turns from a rendered prompt (for scripting token-in routes like ``/generate``)."""
    return [
        {"role": m.group(1), "content": m.group(2)}
        for m in _TURN_RE.finditer(prompt)
        if m.group(2) or m.group(1) != "assistant"
    ]
