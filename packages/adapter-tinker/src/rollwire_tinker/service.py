"""Which Tinker service ``rollwire train --trainer tinker`` trains on, and the model it starts from.

With ``--base-url`` it is that service (hosted Tinker, a SageMaker training session, a SkyRL
cluster) and ``--base-model`` names one of its models. Without it, SkyRL's server is started
here on ``--model`` (a local folder), or on the embedded engine's model made dense
(:mod:`rollwire_tinker.tiny`) for the built-in task, and stopped when the run ends.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rollwire_tinker.skyrl import SkyRLServer
from rollwire_tinker.tiny import write_dense_model

__all__ = ["SKYRL_HINT", "Service", "tinker_service"]

SKYRL_HINT = (
    'a local Tinker server needs SkyRL: pip install "skyrl[tinker,jax]==0.3.0" "tinker==0.18.2" '
    "(CPU torch first); in a rollwire checkout, bash packages/adapter-tinker/ci/setup-venv.sh "
    "builds .venv-tinker. Or pass --base-url of a running Tinker service"
)


@dataclass
class Service:
    """A Tinker service to train on: its URL, the base model's name there, its tokenizer."""

    base_url: str
    base_model: str
    #: the folder (or hub name) tokens mode renders prompts with: the base model's tokenizer
    tokenizer: str
    #: True when this run started SkyRL's server (``base_url`` is on 127.0.0.1)
    local: bool = False


@contextlib.contextmanager
def tinker_service(
    out: Path,
    *,
    base_url: str | None,
    base_model: str | None,
    model: Path | None,
    seed: int,
    lora_rank: int,
    max_batch: int,
) -> Iterator[Service]:
    """The service of a run (module docstring); SkyRL's, when started here, lives as long as
    the ``with`` block, with its database, checkpoints and log under ``out/skyrl``."""
    if base_url is not None:
        name = base_model or (str(model) if model is not None else None)
        if name is None:
            raise ValueError(
                "--base-url needs --base-model: the name of a model that service trains "
                "(hosted Tinker: e.g. Qwen/Qwen3-8B; SkyRL: the folder it was started with)"
            )
        yield Service(base_url.rstrip("/"), name, name)
        return
    if base_model is not None:
        raise ValueError(
            f"--base-model {base_model!r} names a model of a running service: pass its "
            "--base-url too, or --model DIR for a folder SkyRL's server should load here"
        )
    if importlib.util.find_spec("skyrl") is None:
        raise ValueError(f"no --base-url given and SkyRL is not installed: {SKYRL_HINT}")
    folder = Path(model) if model is not None else write_dense_model(out / "base", seed)
    server = SkyRLServer(
        folder.resolve(),
        out / "skyrl",
        max_lora_adapters=2,
        max_lora_rank=lora_rank,
        backend_config={"sample_max_num_sequences": max_batch},
    )
    with server:
        yield Service(server.base_url, str(folder.resolve()), str(folder.resolve()), local=True)
