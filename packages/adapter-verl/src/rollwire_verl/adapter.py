"""The ``verl`` trainer adapter object (entry point ``rollwire.trainers: verl``).

Light on purpose: importing this module imports neither torch nor verl (rollwire's plugin loader
reads ``requires`` first); the conversion modules are imported when a method is called.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rollwire.plugins.protocols import Batch, ExportedRow, TrainerOption

__all__ = ["DEFAULT_PAD_TOKEN_ID", "VerlAdapter", "adapter"]

#: ``pad_token_id`` used when ``convert``/``export`` get none. Pads are masked out (attention 0),
#: so the value only matters to code that reads pads; pass your tokenizer's ``pad_token_id``.
DEFAULT_PAD_TOKEN_ID = 0

#: what ``rollwire train --trainer verl`` needs (printed when verl or torch is missing)
INSTALL_HINT = (
    "rollwire train --trainer verl needs verl 0.9.1 and torch. CPU-only torch first, then the "
    "extra: pip install torch --index-url https://download.pytorch.org/whl/cpu && pip install "
    '"rollwire[verl]"; in a rollwire checkout, bash packages/adapter-verl/ci/setup-venv.sh '
    "builds .venv-verl (then run .venv-verl/bin/rollwire train --trainer verl)"
)


class VerlAdapter:
    """rollwire rollouts → padded ``verl.DataProto`` (see :func:`rollwire_verl.to_dataproto`)."""

    name = "verl"
    requires: tuple[str, ...] = ("verl>=0.9.1", "torch>=2.4", "tensordict")
    #: ``DataProto.save_to_disk`` writes a pickle
    export_suffix = ".dataproto.pkl"
    #: what :meth:`policy_trainer` needs besides ``requires`` (verl's actor loads the model
    #: with transformers)
    train_requires: tuple[str, ...] = (*requires, "transformers>=5.5.3")
    install_hint = INSTALL_HINT
    #: ``rollwire train --trainer verl``'s own options
    train_options = (
        TrainerOption(
            "--rollout-is",
            "rollout_is",
            "token",
            "verl's rollout correction: importance weights against the captured log-probs",
            str,
            ("token", "sequence", "off"),
        ),
        TrainerOption(
            "--rollout-is-threshold",
            "rollout_is_threshold",
            2.0,
            "where verl truncates the importance weights",
            float,
        ),
        TrainerOption("--clip-ratio", "clip_ratio", 0.2, "PPO's clip range (both sides)", float),
        TrainerOption(
            "--loss-agg-mode",
            "loss_agg_mode",
            "token-mean",
            "how verl's PPO loss averages over tokens and rows",
            str,
            ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"),
        ),
        TrainerOption("--max-grad-norm", "max_grad_norm", 1.0, "gradient clipping", float),
        TrainerOption(
            "--threads",
            "threads",
            1,
            "torch threads (the embedded model's ops are too small to gain from more)",
            int,
        ),
    )

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

    def train_rows(self, batch: Any) -> list[ExportedRow]:
        """The rows of the loop's batch exactly as the update feeds them to verl's actor (NumPy
        only: :func:`rollwire_verl.train_rows.train_arrays`)."""
        from rollwire_verl.train_rows import exported_rows, train_arrays

        return exported_rows(train_arrays(batch.rows))

    def policy_trainer(self, spec: Any) -> Any:
        """The trainer of ``rollwire train --trainer verl`` (imports torch and verl)."""
        from rollwire_verl.policy_trainer import VerlTrainer

        return VerlTrainer(spec)

    def flatten(self, converted: Any) -> list[ExportedRow]:
        """Rows of a converted ``DataProto``, pads stripped by its attention mask."""
        from rollwire_verl.dataproto import flatten_dataproto

        return flatten_dataproto(converted)


#: The adapter instance the entry point names.
adapter = VerlAdapter()
