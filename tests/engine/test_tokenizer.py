from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import rollwire.engine
from rollwire.engine import EngineTokenizer, render_chat, tokenizer_dir
from rollwire.engine.tokenizer import _train, build_tokenizer, chat_template

from .conftest import TOOLS

CONVERSATIONS: list[tuple[list[dict[str, Any]], Any, dict[str, Any]]] = [
    ([{"role": "user", "content": "Hello!"}], None, {}),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], None, {}),
    ([{"role": "user", "content": "weather in Paris?"}], TOOLS, {}),
    (
        [
            {"role": "system", "content": "You help."},
            {"role": "user", "content": "weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": "<think>\ntwo cities\n</think>\n\n",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    },
                    {
                        "id": "c2",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Rome"}},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "c2", "content": "rainy"},
        ],
        TOOLS,
        {},
    ),
    (
        [
            {"role": "user", "content": "q1"},
            {"role": "assistant", "content": "<think>\nold thought\n</think>\n\na1"},
            {"role": "user", "content": [{"type": "text", "text": "q2"}]},
        ],
        None,
        {"enable_thinking": False},
    ),
]


def test_build_is_deterministic() -> None:
    assert _train().to_str() == _train().to_str()


def test_shipped_folder_equals_a_fresh_build(tmp_path: Path) -> None:
    # The shipped folder is what `rollwire engine build-tokenizer` writes with the pinned
    # tokenizers version: same vocabulary, merges, added tokens and config files.
    shipped = tokenizer_dir()
    assert shipped.parent == Path(rollwire.engine.__file__).parent  # in the package, not in ~
    fresh = build_tokenizer(tmp_path / "tok")
    a = json.loads((shipped / "tokenizer.json").read_text())
    b = json.loads((fresh / "tokenizer.json").read_text())
    assert a["model"]["vocab"] == b["model"]["vocab"]
    assert a["model"]["merges"] == b["model"]["merges"]
    assert a == b
    for name in ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        assert (shipped / name).read_text() == (fresh / name).read_text(), name


def test_all_special_ids_match_autotokenizer() -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir()))
    tok = EngineTokenizer()
    assert sorted(tok.all_special_ids) == sorted(hf.all_special_ids) == sorted(tok.special_ids)
    markup = tok.encode("<tool_call></tool_call><think></think><tool_response></tool_response>")
    assert len(markup) == 6 and not set(markup) & set(tok.all_special_ids)
    # Markup tokens survive skip_special_tokens in both tokenizers; control tokens do not.
    ids = tok.encode("<|im_start|>assistant\n<tool_call>x</tool_call><|im_end|>")
    assert (
        tok.decode(ids, skip_special_tokens=True)
        == hf.decode(ids, skip_special_tokens=True)
        == "assistant\n<tool_call>x</tool_call>"
    )


def test_special_tokens() -> None:
    tok = EngineTokenizer()
    assert tok.decode([tok.eos_id]) == "<|im_end|>"
    assert tok.decode([tok.pad_id]) == "<|endoftext|>"
    assert tok.eos_id in tok.special_ids and tok.pad_id in tok.special_ids
    for t in (
        "<tool_call>",
        "</tool_call>",
        "<think>",
        "</think>",
        "<tool_response>",
        "</tool_response>",
    ):
        assert len(tok.encode(t)) == 1, t
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert tok.decode(ids, skip_special_tokens=True) == "user\nhi"
    assert 1024 <= tok.vocab_size <= 4096
    text = 'Ünïcödé ✓ and JSON {"a": [1, 2]}'
    assert tok.decode(tok.encode(text)) == text
    assert b"".join(tok.token_bytes(i) for i in tok.encode(text)) == text.encode()


@pytest.mark.parametrize("case", range(len(CONVERSATIONS)))
def test_autotokenizer_matches_renderer(case: int) -> None:
    transformers = pytest.importorskip("transformers")
    messages, tools, kwargs = CONVERSATIONS[case]
    hf = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir()))
    ours = EngineTokenizer().apply_chat_template(
        messages, tools, add_generation_prompt=True, **kwargs
    )
    theirs = hf.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=True, **kwargs
    )
    if not isinstance(theirs, list):
        theirs = theirs["input_ids"]
    assert list(theirs) == ours
    assert hf.eos_token == "<|im_end|>"


def test_template_features() -> None:
    msgs, tools, _ = CONVERSATIONS[3]
    text = render_chat(msgs, tools)
    assert text.startswith("<|im_start|>system\nYou help.\n\n# Tools")
    assert "<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>" in text
    # Both tool calls rendered; string arguments verbatim, dict arguments as JSON.
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>'
        in text
    )
    # Consecutive tool results grouped into one user turn.
    assert (
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrainy\n</tool_response><|im_end|>"
        in text
    )
    # Reasoning after the last user query is kept.
    assert "<think>\ntwo cities\n</think>" in text
    assert text.endswith("<|im_start|>assistant\n")

    msgs2, _, kwargs2 = CONVERSATIONS[4]
    text2 = render_chat(msgs2, **kwargs2)
    assert "old thought" not in text2  # dropped: before the last user message
    assert "<|im_start|>assistant\na1<|im_end|>" in text2
    assert text2.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert render_chat(msgs2, add_generation_prompt=False).endswith("q2<|im_end|>\n")


def test_reasoning_field_rendered_on_last_turn() -> None:
    msgs = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "reasoning_content": "because"},
    ]
    assert render_chat(msgs, add_generation_prompt=False).endswith(
        "<|im_start|>assistant\n<think>\nbecause\n</think>\n\na<|im_end|>\n"
    )
    msgs.append({"role": "user", "content": "q2"})
    assert "because" not in render_chat(msgs)


def test_one_chat_template_file_read_by_engine_and_transformers() -> None:
    # One template file in the package; the tokenizer folder's config carries no second copy,
    # and transformers reads the very same text the engine renders with.
    package = Path(rollwire.engine.__file__).parent
    templates = sorted(p.relative_to(package) for p in package.rglob("*.jinja"))
    assert templates == [Path("hf_tokenizer/chat_template.jinja")]
    config = json.loads((tokenizer_dir() / "tokenizer_config.json").read_text())
    assert "chat_template" not in config
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir()))
    assert hf.chat_template == chat_template() == EngineTokenizer()._template_text
    messages = [{"role": "user", "content": "hi"}]
    assert hf.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    ) == render_chat(messages, add_generation_prompt=True)
