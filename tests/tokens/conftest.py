"""Shared fixtures for the tokens-mode tests: the embedded engine's tokenizer as a ChatRenderer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from rollwire.gateway.tokens.render import ChatRenderer

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the catalogue.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "filters": {"type": "object"}},
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "book",
            "description": "Book an item.",
            "parameters": {"type": "object", "properties": {"item": {"type": "integer"}}},
        },
    },
]


@pytest.fixture(scope="session")
def tokenizer_path() -> Path:
    from rollwire.engine import tokenizer_dir

    return Path(tokenizer_dir())


@pytest.fixture(scope="session")
def renderer(tokenizer_path: Path) -> ChatRenderer:
    return ChatRenderer.from_dir(tokenizer_path)


def tokenizer_with_template(src: Path, dst: Path, template: str) -> Path:
    """A copy of the tokenizer folder ``src`` whose chat template is ``template``."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    (dst / "chat_template.jinja").unlink(missing_ok=True)
    return dst
