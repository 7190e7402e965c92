from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollwire.engine.scripted import load_script, messages_from_prompt
from rollwire.engine.tokenizer import render_chat


def reply(messages: list[dict[str, object]], tools: object) -> str | None:
    return "from module"


def test_yaml_file_sessions_rules_default(tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(
        'sessions:\n  s1: ["one", "two"]\nrules:\n  - match: "weather in (\\\\w+)"\n    reply: "Sunny in \\\\1."\ndefault: "fallback"\n'
    )
    s = load_script(f)
    user = [{"role": "user", "content": "weather in Oslo?"}]
    assert s.lookup(user, None, "s1") == "one"
    assert s.lookup(user, None, "s1") == "two"
    assert s.lookup(user, None, "s1") == "Sunny in Oslo."
    assert s.lookup([{"role": "user", "content": "hm"}], None, None) == "fallback"


def test_module_callable_and_errors(tmp_path: Path) -> None:
    assert load_script(f"{__name__}:reply").lookup([], None) == "from module"
    with pytest.raises(FileNotFoundError):
        load_script(str(tmp_path / "missing.yaml"))
    with pytest.raises(ValueError, match="unknown keys"):
        load_script({"sesions": {}})


def test_messages_from_prompt() -> None:
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert messages_from_prompt(render_chat(msgs)) == msgs


def test_reply_keeps_backslashes_other_than_group_refs() -> None:
    # JSON in a tool call: "\n" inside a string must stay backslash + n, or the JSON breaks.
    reply = (
        '<tool_call>\n{"name": "write", "arguments": {"path": "\\1", "text": "a\\nb \\"q\\" \\\\ c"}}'
        "\n</tool_call> \\g<city>!"
    )
    s = load_script({"rules": [{"match": r"save to (?P<city>\w+)", "reply": reply}]})
    out = s.lookup([{"role": "user", "content": "save to Oslo"}])
    assert out is not None
    body = out.split("\n")[1]
    assert json.loads(body)["arguments"] == {"path": "Oslo", "text": 'a\nb "q" \\ c'}
    assert out.endswith("</tool_call> Oslo!")


def test_reply_with_unknown_group_is_refused() -> None:
    with pytest.raises(ValueError, match="no such group"):
        load_script({"rules": [{"match": r"x(\d)", "reply": "\\2"}]})
    with pytest.raises(ValueError, match="no such group"):
        load_script({"rules": [{"match": r"x", "reply": "\\g<name>"}]})
