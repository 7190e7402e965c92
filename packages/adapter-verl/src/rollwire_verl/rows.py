"""One rollwire row as verl's agent loops shape theirs: cut to the length limits, turns counted.

Shared by the padded layout (:mod:`rollwire_verl.layout`) and the agent loop's outputs
(:mod:`rollwire_verl.outputs`), so both cut and count the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rollwire.data.protocol import Row

__all__ = ["RowCut", "cut_row", "verl_num_turns"]


@dataclass(frozen=True)
class RowCut:
    """The kept part of a row: its prompt and response slices, mask, log-probs and routing."""

    prompt: np.ndarray
    response: np.ndarray
    mask: np.ndarray
    logprobs: np.ndarray
    #: routing of the kept tokens from the first kept prompt token on, or None
    experts: np.ndarray | None
    truncated: bool
    #: per kept response token: index into the row's ``weight_versions`` (-1: none), or None
    version_ids: np.ndarray | None = None
    #: per kept response token step credit / step reward (None without step rewards)
    advantages: np.ndarray | None = None
    step_rewards: np.ndarray | None = None


def cut_row(
    row: Row, *, max_prompt_length: int | None = None, max_response_length: int | None = None
) -> RowCut:
    """``row`` cut to the limits: the **last** ``max_prompt_length`` prompt tokens (the model sees
    the recent context) and the **first** ``max_response_length`` response tokens (what was sampled
    first stays aligned), with mask, log-probs and routing cut alongside. ``None`` = no limit.

    ``experts[j]`` of the result is the routing of kept token ``j``, as verl's agent loops cut it
    (``routed_experts[: len(prompt) + response_length]``).
    """
    plen = row.prompt_len
    rlen = row.input_ids.shape[0] - plen
    too_long_p = max_prompt_length is not None and plen > max_prompt_length
    too_long_r = max_response_length is not None and rlen > max_response_length
    p_start = plen - max_prompt_length if too_long_p and max_prompt_length is not None else 0
    r_keep = max_response_length if too_long_r and max_response_length is not None else rlen
    experts = None
    if row.routed_experts is not None:
        # experts[j] is the routing of token j; keep the tokens that are kept.
        experts = row.routed_experts[p_start : plen + r_keep]
    return RowCut(
        prompt=row.input_ids[p_start:plen],
        response=row.input_ids[plen : plen + r_keep],
        mask=row.loss_mask[:r_keep],
        logprobs=row.logprobs[:r_keep],
        experts=experts,
        truncated=bool(too_long_p or too_long_r),
        version_ids=None if row.version_ids is None else row.version_ids[:r_keep],
        advantages=None if row.advantages is None else row.advantages[:r_keep],
        step_rewards=None if row.step_rewards is None else row.step_rewards[:r_keep],
    )


def verl_num_turns(row: Row) -> int:
    """verl's ``num_turns`` of a row: ``1 + assistant turns + user/tool turns`` (one call = 2).

    verl's loops count the prompt, each generation and each tool/user message appended between
    generations (``user_turns + assistant_turns + 1``); rollwire's equivalents are the row's calls
    and its context insertions (runs of ``turn_ids == -1`` in the response region).
    """
    turns = row.turn_ids
    context = turns == -1
    insertions = int(np.count_nonzero(context[1:] & ~context[:-1])) + int(
        bool(context.shape[0]) and bool(context[0])
    )
    return 1 + len(row.call_ids) + insertions
