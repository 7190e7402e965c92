"""Tokenizers the report can decode with: any ``tokenizer.json`` folder (no transformers).

The embedded engine's tokenizer (``--tokenizer embedded``) is resolved by the CLI, which may import
the engine; this module may not, since the gateway's ``/ui`` uses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rollwire.report.tokens import ReportTokenizer

__all__ = ["FileTokenizer", "load_tokenizer"]


class FileTokenizer:
    """A Hugging Face ``tokenizer.json`` read with the ``tokenizers`` library (no transformers)."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer

        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise ValueError(
                f"no tokenizer at {path}: give a folder holding tokenizer.json, the file itself, "
                "or 'embedded' for the embedded engine's tokenizer"
            )
        self._tok = Tokenizer.from_file(str(file))
        self.all_special_ids: list[int] = sorted(
            int(i) for i, t in self._tok.get_added_tokens_decoder().items() if t.special
        )

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of ``token_ids``."""
        return str(self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens))


def load_tokenizer(spec: str | None) -> ReportTokenizer | None:
    """``None`` -> no tokenizer; else a tokenizer.json folder or file."""
    if spec is None or spec == "":
        return None
    return FileTokenizer(spec)
