"""``GRPOTrainer`` that corrects for the policy that really sampled: the captured log-probs.

TRL 1.16 applies its importance-sampling correction (``vllm_importance_sampling_mode``:
``token_truncate``, ``token_mask``, ``sequence_truncate``, ``sequence_mask``) only on its vLLM path
(``use_vllm=True``); without it the log-probs a ``rollout_func`` returns are ignored and the "old"
policy is the trainer's own. Here the servers behind rollwire's gateway are that vLLM: with
``vllm_importance_sampling_correction=True`` (TRL's default) and a ``rollout_func``, this trainer
takes TRL's vLLM branch after construction — the ratio ``exp(trainer log-prob - captured
log-prob)`` per token or per sequence, truncated or masked at ``vllm_importance_sampling_clip_min``
/ ``_max`` — while generation stays rollwire's and weights reach the servers through
:class:`~rollwire_trl.sync.WeightSyncCallback` (TRL's own vLLM weight push is a no-op here).

It also logs the behaviour policy's KL to the trainer's (``rollwire/kl_behaviour``, the k3
estimator over trainable tokens) next to TRL's ``sampling/importance_sampling_ratio/*`` and
``sampling/sampling_logp_difference/*``.
"""

from __future__ import annotations

from typing import Any

import torch
from trl import GRPOTrainer

__all__ = ["RollwireGRPOTrainer"]


class _WeightsSyncedByRollwire:
    """Stands in for TRL's vLLM client: the callback has already pushed this step's weights."""

    def sync_weights(self) -> None:
        return None


class RollwireGRPOTrainer(GRPOTrainer):  # type: ignore[misc]
    """``GRPOTrainer`` + importance sampling against the captured log-probs (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.rollout_func is None:
            raise ValueError(
                "RollwireGRPOTrainer needs rollout_func (a rollwire_trl.RolloutFunction): it "
                "trains on what rollwire's gateway captured"
            )
        if self.tools:
            raise ValueError(
                "RollwireGRPOTrainer runs the agent's own tools through rollwire; do not pass "
                "TRL tools= (the agent calls them, the gateway masks their output)"
            )
        self.importance_sampling = bool(self.args.vllm_importance_sampling_correction)
        if self.importance_sampling and not getattr(self, "use_vllm", False):
            # Take TRL's vLLM scoring branch (old log-probs, the IS ratio, its metrics and the
            # loss weight) without a vLLM client: the rollout_func's log-probs are the sampler's.
            self.use_vllm = True
            self.vllm_generation = _WeightsSyncedByRollwire()
            self._last_loaded_step = -1

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output: dict[str, Any] = super()._generate_and_score_completions(inputs)
        old = output.get("old_per_token_logps")
        sampled = output.get("sampling_per_token_logps")
        if old is not None and sampled is not None:
            mask = output["completion_mask"]
            if "tool_mask" in output:
                mask = mask * output["tool_mask"]
            mode = "train" if self.model.training else "eval"
            self._metrics[mode]["rollwire/kl_behaviour"].append(
                behaviour_kl(old, sampled, mask).item()
            )
        return output


def behaviour_kl(
    trainer_logps: torch.Tensor, sampled_logps: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """KL(behaviour ‖ trainer) over masked-in tokens, k3 estimator on the sampled tokens:
    ``mean(exp(d) - d - 1)`` with ``d = trainer - behaviour`` (0 when they agree)."""
    keep = mask.bool() & ~torch.isnan(sampled_logps)
    if not keep.any():
        return torch.zeros((), device=trainer_logps.device)
    d = (trainer_logps - sampled_logps)[keep]
    return (torch.exp(d) - d - 1).mean()
