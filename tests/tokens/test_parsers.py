from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rollwire.gateway.tokens.parsers import (
    HermesParser,
    ParsedCompletion,
    Qwen3CoderParser,
    TemplateNotSupported,
    check_template_supported,
    detect_parser,
    parse_completion,
    parsers,
    register_parser,
    split_reasoning,
)
from rollwire.gateway.tokens.render import ChatRenderer

from .conftest import TOOLS, tokenizer_with_template

QWEN3_CODER_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for tc in m.tool_calls or [] %}<tool_call>\n<function={{ tc.function.name }}>\n"
    "{% for k, v in tc.function.arguments.items() %}<parameter={{ k }}>\n{{ v }}\n</parameter>\n{% endfor %}"
    "</function>\n</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _args(call: dict[str, Any]) -> Any:
    return json.loads(call["function"]["arguments"])


def test_split_reasoning() -> None:
    assert split_reasoning("<think>\na\n</think>\n\nb") == ("a", "b", None)
    assert split_reasoning("a\n</think>\n\nb") == ("a", "b", None)  # prompt opened <think>
    assert split_reasoning("plain") == (None, "plain", None)
    r, _, err = split_reasoning("<think>\nunfinished")
    assert r == "unfinished" and err


def test_hermes_content_reasoning_and_calls() -> None:
    text = (
        "<think>\nsearch first\n</think>\n\nLet me look.\n<tool_call>\n"
        '{"name": "search", "arguments": {"query": "x", "filters": {"a": [1, 2]}}}\n</tool_call>\n'
        '<tool_call>\n{"name":"book","arguments":{"item":7}}\n</tool_call>'
    )
    p = HermesParser().parse(text, TOOLS)
    assert not p.ill_formed
    assert p.reasoning == "search first" and p.content == "Let me look.\n"
    assert [c["function"]["name"] for c in p.tool_calls] == ["search", "book"]
    assert _args(p.tool_calls[0]) == {"query": "x", "filters": {"a": [1, 2]}}
    assert _args(p.tool_calls[1]) == {"item": 7}
    assert p.tool_calls[0]["id"].startswith("call_") and p.tool_calls[0]["type"] == "function"
    msg = p.message()
    assert msg["reasoning"] == "search first" and msg["role"] == "assistant"


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "search", "arguments": {"query": \n</tool_call>',  # bad JSON
        '<tool_call>\n{"name": "search", "arguments": {"query": "x"}}',  # unclosed
        '<tool_call>\n{"arguments": {}}\n</tool_call>',  # no name
        "<think>\nnever closed",
    ],
)
def test_hermes_ill_formed_is_text(text: str) -> None:
    p = HermesParser().parse(text, TOOLS)
    assert p.ill_formed and p.content == text and not p.tool_calls and p.error


def test_qwen3_coder_parser_uses_schema_types() -> None:
    text = (
        "I'll book it.\n<tool_call>\n<function=book>\n<parameter=item>\n7\n</parameter>\n</function>\n"
        "</tool_call>\n<tool_call>\n<function=search>\n<parameter=query>\n42\n</parameter>\n"
        '<parameter=filters>\n{"a": 1}\n</parameter>\n</function>\n</tool_call>'
    )
    p = Qwen3CoderParser().parse(text, TOOLS)
    assert not p.ill_formed and p.content == "I'll book it.\n"
    assert _args(p.tool_calls[0]) == {"item": 7}
    assert _args(p.tool_calls[1]) == {"query": "42", "filters": {"a": 1}}  # string stays string
    bad = Qwen3CoderParser().parse("<tool_call>\n<function=book>\n<parameter=item>\n7\n", TOOLS)
    assert bad.ill_formed


@pytest.mark.parametrize(
    ("parser", "block"),
    [
        (HermesParser(), '<tool_call>\n{"name": "book", "arguments": {"item": 7}}\n</tool_call>'),
        (
            Qwen3CoderParser(),
            "<tool_call>\n<function=book>\n<parameter=item>\n7\n</parameter>\n</function>\n"
            "</tool_call>",
        ),
    ],
    ids=["hermes", "qwen3_coder"],
)
def test_content_before_tool_calls_is_the_sampled_text(parser: Any, block: str) -> None:
    before = " \n  I'll\t book\n\n it.  \n\n"
    p = parser.parse(before + block + "\n \n" + block + "\n", TOOLS)
    assert not p.ill_formed and p.content == before  # byte for byte
    assert [_args(c) for c in p.tool_calls] == [{"item": 7}, {"item": 7}]
    # only whitespace before the first block reads null, as OpenAI servers answer
    assert parser.parse("\n  \n" + block, TOOLS).content is None
    thought = parser.parse("<think>\nhm\n</think>\n\n  Sure. \n" + block, TOOLS)
    assert thought.reasoning == "hm" and thought.content == "  Sure. \n"


def test_detect_parser(renderer: ChatRenderer) -> None:
    assert detect_parser(renderer.chat_template).name == "hermes"  # type: ignore[union-attr]
    assert detect_parser(QWEN3_CODER_TEMPLATE).name == "qwen3_coder"  # type: ignore[union-attr]
    assert detect_parser("{{ messages }}") is None
    assert check_template_supported(renderer) is not None


def test_check_template_supported_refuses(tmp_path: Path, tokenizer_path: Path) -> None:
    plain = tokenizer_with_template(
        tokenizer_path,
        tmp_path / "plain",
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}",
    )
    r = ChatRenderer.from_dir(plain)
    with pytest.raises(TemplateNotSupported, match="no tool-call parser"):
        check_template_supported(r)
    assert check_template_supported(r, tools=False) is None


def test_parse_completion_without_tools_keeps_markup() -> None:
    text = '<think>\nx\n</think>\n\n<tool_call>\n{"name": "a"}\n</tool_call>'
    p = parse_completion(text, HermesParser(), None)
    assert p.reasoning == "x" and p.content is not None and p.content.startswith("<tool_call>")


def test_register_parser_first() -> None:
    class Shouty:
        name = "shouty"

        def matches(self, chat_template: str) -> bool:
            return "SHOUT" in chat_template

        def parse(self, text: str, tools: Any = None) -> ParsedCompletion:
            return ParsedCompletion(content=text.upper())

    before = parsers()
    try:
        register_parser(Shouty(), first=True)
        assert detect_parser("SHOUT <tool_call>").name == "shouty"  # type: ignore[union-attr]
    finally:
        from rollwire.gateway.tokens import parsers as mod

        mod._REGISTRY[:] = before
