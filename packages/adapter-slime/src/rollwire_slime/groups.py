"""How slime reads a group of Samples, and what rollwire does about it.

slime's dynamic-sampling filters and its partial-rollout abort path read every element of a group
as a ``Sample``. :func:`apply_dynamic_filter` runs such a filter over rollwire's flat groups;
:func:`refuse_group_reading_paths` stops the per-sample generate hook, whose groups hold a list
per rollout, from being combined with them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["apply_dynamic_filter", "refuse_group_reading_paths"]


def refuse_group_reading_paths(args: Any) -> None:
    """The generate hook returns a list per rollout; slime's filters and abort path cannot read it."""
    used = [
        flag
        for flag, attr in (
            ("--dynamic-sampling-filter-path", "dynamic_sampling_filter_path"),
            ("--partial-rollout", "partial_rollout"),
        )
        if getattr(args, attr, None)
    ]
    if used:
        raise ValueError(
            f"rollwire_slime.generate cannot run with {' and '.join(used)}: slime's dynamic-sampling "
            "filters and partial-rollout abort path call sample.get_reward_value() / read "
            "sample.response on each element of a group, and this hook returns a list of Samples "
            "per rollout (a forked rollout has several). Use --rollout-function-path "
            "rollwire_slime.generate_rollout instead: its groups are flat lists of Samples and it "
            "applies --dynamic-sampling-filter-path itself"
        )


def apply_dynamic_filter(
    args: Any, groups: list[list[Any]], metrics: dict[str, Any]
) -> list[list[Any]]:
    """slime's ``--dynamic-sampling-filter-path`` applied to each flat group of Samples.

    A group the filter rejects is left out and counted under
    ``rollout/dynamic_filter/drop_<reason>`` (slime's metric names). rollwire does not over-sample
    to refill, so when every group would be rejected the batch is kept whole rather than empty.
    """
    path = getattr(args, "dynamic_sampling_filter_path", None)
    if not path:
        return groups
    from slime.rollout.filter_hub.base_types import call_dynamic_filter
    from slime.utils.misc import load_function

    fn = load_function(path)
    kept: list[list[Any]] = []
    drops: dict[str, int] = {}
    for group in groups:
        verdict = call_dynamic_filter(fn, args, group)
        if verdict.keep:
            kept.append(group)
        else:
            reason = f"rollout/dynamic_filter/drop_{verdict.reason or 'filtered'}"
            drops[reason] = drops.get(reason, 0) + 1
    if not kept:
        metrics["rollwire/dynamic_filter_kept_all"] = 1
        return groups
    metrics.update(drops)
    return kept
