from __future__ import annotations

from pathlib import Path

import pytest

from rollwire.gateway.tokens.render import ChatRenderer, message_text, normalize_messages

from .conftest import TOOLS, tokenizer_with_template


def test_message_text_shapes() -> None:
    assert message_text(None) == ""
    assert message_text("hi") == "hi"
    assert message_text([{"type": "text", "text": "a"}, {"type": "image_url"}, "b"]) == "ab"
    assert message_text({"text": "x"}) == "x"


def test_normalize_framework_shapes() -> None:
    msgs = normalize_messages(
        [
            {"role": "developer", "content": [{"type": "text", "text": "rules"}]},
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "c", "function": {"name": "f", "arguments": '{"a": {"b": 1}}'}}
                ],
            },
            {"role": "assistant", "content": "x", "tool_calls": []},
            {
                "role": "assistant",
                "content": "y",
                "tool_calls": [{"function": {"name": "g", "arguments": "not json"}}],
            },
        ]
    )
    assert msgs[0] == {"role": "system", "content": "rules"}
    assert msgs[1]["content"] == ""
    assert msgs[1]["tool_calls"][0]["function"]["arguments"] == {"a": {"b": 1}}
    assert msgs[1]["tool_calls"][0]["type"] == "function"
    assert "tool_calls" not in msgs[2]
    assert msgs[3]["tool_calls"][0]["function"]["arguments"] == "not json"


def test_render_matches_template_and_kwargs(renderer: ChatRenderer) -> None:
    msgs = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    text = renderer.render_text(msgs)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    off = renderer.render_text(msgs, chat_template_kwargs={"enable_thinking": False})
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    ids = renderer.render(msgs, TOOLS)
    assert renderer.decode(ids) == renderer.render_text(msgs, TOOLS)
    assert ids.dtype.name == "int32"
    assert renderer.eos_id is not None and renderer.special_text(renderer.eos_id) == "<|im_end|>"


def test_tool_arguments_string_becomes_object(renderer: ChatRenderer) -> None:
    call = {
        "id": "c",
        "type": "function",
        "function": {"name": "search", "arguments": '{"query":"x"}'},
    }
    text = renderer.render_text(
        [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [call]}], TOOLS
    )
    assert '{"name": "search", "arguments": {"query": "x"}}' in text


def test_from_dir_errors(tmp_path: Path, tokenizer_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot load a Hugging Face tokenizer"):
        ChatRenderer.from_dir(tmp_path / "nope")
    bare = tokenizer_with_template(tokenizer_path, tmp_path / "bare", "")
    with pytest.raises(ValueError, match="no chat template"):
        ChatRenderer.from_dir(bare)


def test_missing_transformers_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    from rollwire.gateway.tokens import render

    real = builtins.__import__

    def fake(name: str, *args: object, **kwargs: object) -> object:
        if name == "transformers":
            raise ImportError("no transformers")
        return real(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(render.MissingTokensExtra, match=r'pip install "rollwire\[tokens\]"'):
        render.ChatRenderer.from_dir("/nowhere")
