"""Record what rLLM's real code makes of a fixed rollwire batch, for the CI contract tests.

    PYTHONPATH=RLLM_DEPS .venv-tinker/bin/python packages/adapter-rllm/ci/record_contract.py RLLM_CHECKOUT

Runs, on ``rollwire.testing.samples.sample_batch()`` converted by ``rollwire_rllm.to_episodes``
into rLLM's own types: ``Episode.to_dict`` (the input rLLM receives),
``transform_episodes_to_trajectory_groups`` (its grouping), ``transform_trajectory_groups_to_datums``
(its GRPO advantages and its Tinker datums: ``model_input``, ``target_tokens``, ``logprobs``,
``advantages``, ``mask``), with the configuration of its ``rllm/base.yaml``. Writes
``packages/adapter-rllm/tests/data/rllm_contract.json`` (with the batch itself, as JSON);
``tests/test_rllm_contract.py`` checks
rollwire against it without rLLM. Nothing is downloaded here: the checkout is given.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE.parent / "tests" / "data" / "rllm_contract.json"


def _plain(value: Any) -> Any:
    """JSON-ready: enums by value, numpy by list, everything else as is."""
    import enum

    import numpy as np

    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _datum(d: Any) -> dict[str, Any]:
    tokens = [t for chunk in d.model_input.chunks for t in chunk.tokens]
    return {
        "model_input": tokens,
        **{k: [float(x) for x in v.data] for k, v in d.loss_fn_inputs.items()},
    }


def record(checkout: Path, commit: str | None = None) -> dict[str, Any]:
    """rLLM's inputs and outputs on the sample batch (module docstring)."""
    sys.path.insert(0, str(checkout.resolve()))
    sys.path.insert(0, str(HERE.parent / "src"))
    import rllm.trainer.config as config_pkg
    from omegaconf import OmegaConf
    from rllm.trainer.algorithms import (
        AlgorithmConfig,
        CompactFilteringConfig,
        TransformConfig,
        transform_episodes_to_trajectory_groups,
    )
    from rllm.trainer.tinker.transform import transform_trajectory_groups_to_datums

    from rollwire.data.protocol import Group, Rollout
    from rollwire.testing.samples import sample_batch
    from rollwire_rllm import to_episodes

    base = OmegaConf.load(Path(config_pkg.__file__).parent / "rllm" / "base.yaml")
    transform_config = TransformConfig.from_config(
        base.get("transform", {}), broadcast=base.stepwise_advantage.mode == "broadcast"
    )
    cf_config = CompactFilteringConfig.from_config(base.compact_filtering)
    # the batch as JSON, and read back: the sample's log-probs are seeded by hash(), which
    # differs between processes, so the tests convert exactly these bytes
    batch_json = [
        {
            "group_id": g.group_id,
            "task_id": g.task_id,
            "rollouts": [json.loads(r.to_json()) for r in g.rollouts],
        }
        for g in sample_batch()
    ]

    def batch() -> list[Group]:
        return [
            Group(
                group_id=g["group_id"],
                task_id=g["task_id"],
                rollouts=[Rollout.from_json(json.dumps(r)) for r in g["rollouts"]],
            )
            for g in batch_json
        ]

    episodes = to_episodes(batch())
    inputs = [_plain(e.to_dict()) for e in episodes]
    out: dict[str, Any] = {
        "rllm_commit": commit
        or subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        or None,
        "source": "rollwire.testing.samples.sample_batch()",
        "batch": batch_json,
        "episodes": inputs,
        "episode_task_ids": [e.task_id for e in episodes],
        "cases": {},
    }
    for name, norm in (("grpo", True), ("grpo_no_std", False)):
        episodes = to_episodes(batch())
        groups, _ = transform_episodes_to_trajectory_groups(episodes, transform_config, cf_config)
        algorithm = AlgorithmConfig.from_config(
            OmegaConf.merge(base.algorithm, {"norm_adv_by_std_in_grpo": norm}),
            stepwise_advantage_mode=base.stepwise_advantage.mode,
        )
        datums, _metrics = transform_trajectory_groups_to_datums(groups, algorithm)
        assert isinstance(datums, list)
        by_traj = {id(t): e for e in episodes for t in e.trajectories}
        out["cases"][name] = {
            "norm_adv_by_std_in_grpo": norm,
            "groups": [
                {
                    "group_id": g.group_id,
                    "episodes": [by_traj[id(t)].id for t in g.trajectories],
                    "rewards": [t.reward for t in g.trajectories],
                    "advantages": [[s.advantage for s in t.steps] for t in g.trajectories],
                }
                for g in groups
            ],
            "datums": [_datum(d) for d in datums],
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkout", type=Path, help="an rLLM checkout (git clone rllm-org/rllm)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--commit", default=None, help="the checkout's commit (default: git's HEAD)")
    args = ap.parse_args()
    data = record(args.checkout, args.commit)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    n = sum(len(c["datums"]) for c in data["cases"].values())
    print(f"wrote {args.out}: {len(data['episodes'])} episodes, {n} datums")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
