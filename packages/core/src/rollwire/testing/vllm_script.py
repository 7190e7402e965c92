"""A vLLM logits processor that forces scripted assistant text, like the engine's ``--scripted``.

Serve a model with it and a script, and real vLLM answers the way the embedded engine's scripted
mode does: the tokens are the script's, while log-probs stay the model's own (vLLM computes its
default ``raw_logprobs`` from the logits *before* logits processors run)::

    ROLLWIRE_VLLM_SCRIPT=script.yaml python -m vllm.entrypoints.openai.api_server --model DIR \\
        --logits-processors rollwire.testing.vllm_script:ScriptedLogitsProcessor

``ROLLWIRE_VLLM_SCRIPT`` takes what ``EngineConfig.scripted`` takes as a string: a JSON/YAML script
file or ``module:function``. vLLM hands a logits processor the prompt's token ids only, so the
script sees the ChatML turns recovered from the decoded prompt (as on the engine's token-in
routes): no ``tools`` argument and no session id (``sessions`` entries of a script never match).
A request opts out with ``vllm_xargs: {"rollwire_script": false}``. This module needs torch and
vLLM; it runs inside the vLLM server process, never in the gateway.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from rollwire.engine.scripted import Script, load_script, messages_from_prompt

__all__ = ["ENV_SCRIPT", "ScriptedLogitsProcessor"]

#: Environment variable naming the script (read when vLLM builds its logits processors).
ENV_SCRIPT = "ROLLWIRE_VLLM_SCRIPT"


class ScriptedLogitsProcessor(LogitsProcessor):  # type: ignore[misc]
    """Forces, token by token, the text the script gives for a request's prompt, then the eos token.

    A request whose prompt the script has no text for (``None``) samples freely.
    """

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        from transformers import AutoTokenizer

        source = os.environ.get(ENV_SCRIPT)
        self._script: Script | None = load_script(source) if source else None
        model_config = vllm_config.model_config
        self._tok = AutoTokenizer.from_pretrained(model_config.tokenizer)
        if self._tok.eos_token_id is None:
            raise ValueError(f"tokenizer {model_config.tokenizer} has no eos token to end a reply")
        # batch index -> (forced ids, the request's live output ids)
        self._forced: dict[int, tuple[list[int], list[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        """Forcing changes what greedy sampling picks."""
        return False

    def _forced_ids(self, prompt_ids: list[int]) -> list[int] | None:
        assert self._script is not None
        prompt = str(self._tok.decode(prompt_ids, skip_special_tokens=False))
        text = self._script.lookup(messages_from_prompt(prompt), None, None)
        if text is None:
            return None
        if not isinstance(text, str):
            raise TypeError(f"the script returned {type(text).__name__}, expected str or None")
        ids = list(self._tok.encode(text, add_special_tokens=False))
        return [*ids, int(self._tok.eos_token_id)]

    def _new_state(
        self, params: Any, prompt_ids: list[int] | None, output_ids: list[int]
    ) -> tuple[list[int], list[int]] | None:
        if self._script is None or not prompt_ids:
            return None
        extra = getattr(params, "extra_args", None) or {}
        if extra.get("rollwire_script") is False:
            return None
        forced = self._forced_ids(list(prompt_ids))
        return None if forced is None else (forced, output_ids)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Track the requests of the batch (added, removed, moved) and what each must emit."""
        process_dict_updates(self._forced, batch_update, self._new_state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Leave only the next forced token possible in each scripted row."""
        for index, (forced, output_ids) in self._forced.items():
            step = len(output_ids)
            if step < len(forced):
                row = logits[index]
                row.fill_(float("-inf"))
                row[forced[step]] = 0.0
        return logits
