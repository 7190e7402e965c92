"""The ``verl`` trainer adapter object (entry point ``rollwire.trainers: verl``).

Light on purpose: importing this module imports neither torch nor verl (rollwire's plugin loader
reads ``requires`` first); the conversion modules are imported when a method is called.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rollwire.plugins.protocols import Batch, ExportedRow

__all__ = ["DEFAULT_PAD_TOKEN_ID", "VerlAdapter", "adapter"]

#: ``pad_token_id`` used when ``convert``/``export`` get none. Pads are masked out (attention 0),
#: so the value only matters to code that reads pads; pass your tokenizer's ``pad_token_id``.
DEFAULT_PAD_TOKEN_ID = 0


class VerlAdapter:
    """rollwire rollouts → padded ``verl.DataProto`` (see :func:`rollwire_verl.to_dataproto`)."""

    name = "verl"
    requires: tuple[str, ...] = ("verl>=0.9.1", "torch>=2.4", "tensordict")
    #: ``DataProto.save_to_disk`` writes a pickle
    export_suffix = ".dataproto.pkl"

    def convert(self, batch: Batch, **options: Any) -> Any:
        """``to_dataproto(batch, **options)``; ``pad_token_id`` defaults to 0."""
        from rollwire_verl.dataproto import to_dataproto

        options.setdefault("pad_token_id", DEFAULT_PAD_TOKEN_ID)
        return to_dataproto(batch, **options)

    def export(self, batch: Batch, path: str | Path, **options: Any) -> Path:
        """Convert and write with ``DataProto.save_to_disk`` (read back with ``load_from_disk``)."""
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        self.convert(batch, **options).save_to_disk(str(out))
        return out

    def flatten(self, converted: Any) -> list[ExportedRow]:
        """Rows of a converted ``DataProto``, pads stripped by its attention mask."""
        from rollwire_verl.dataproto import flatten_dataproto

        return flatten_dataproto(converted)


#: The adapter instance the entry point names.
adapter = VerlAdapter()
