"""Record what rLLM's real code makes of a fixed rollwire batch, for the CI contract tests.

    PYTHONPATH=RLLM_DEPS .venv-tinker/bin/python packages/adapter-rllm/ci/record_contract.py RLLM_CHECKOUT [--commit SHA]

Runs, on ``rollwire.testing.samples.sample_batch()`` converted by ``rollwire_rllm.to_episodes``
into rLLM's own types: ``Episode.to_dict`` (the input rLLM receives),
``transform_episodes_to_trajectory_groups`` (its grouping), ``transform_trajectory_groups_to_datums``
(its GRPO advantages and its Tinker datums: ``model_input``, ``target_tokens``, ``logprobs``,
``advantages``, ``mask``), with the configuration of its ``rllm/base.yaml``; what its verl
backend (``rllm/trainer/verl/transform.py``: ``_decode_routing_matrices``, ``_process_episode``,
the ``routed_experts`` placement) and its Tinker path (``trajectory_to_datums`` with router replay)
make of ``Step.routing_matrices``; its Episodes of further rollouts (weight versions, step credit);
the fields of its ``AgentConfig`` and ``Task``. Writes
``packages/adapter-rllm/tests/data/rllm_contract.json`` (with the inputs themselves, as JSON);
``tests/test_rllm_contract.py`` checks rollwire against it without rLLM. Nothing is downloaded here: the checkout is given.
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


def _array(value: Any) -> dict[str, Any] | None:
    """An array as shape, dtype, sha256 of its C-order bytes and its first values (None stays)."""
    import hashlib

    import numpy as np

    if value is None:
        return None
    arr = np.ascontiguousarray(value.numpy() if hasattr(value, "numpy") else value)
    return {
        "shape": list(arr.shape),
        "dtype": str(arr.dtype),
        "sha256": hashlib.sha256(arr.tobytes()).hexdigest(),
        "head": arr.reshape(-1)[:8].tolist(),
    }


def _import_verl_transform() -> Any:
    """rLLM's verl transform. Without verl installed (it needs ray, tensordict, transformers), the
    names the module imports from it are replaced: ``DataProto.from_dict`` hands back what
    rLLM built, ``pad_sequence_to_length`` is verl's (pad the last dimension). rLLM's code runs."""
    import types

    try:
        import verl.protocol  # noqa: F401
    except ImportError:
        import torch

        class DataProto:
            @staticmethod
            def from_dict(tensors: Any, non_tensors: Any = None, meta_info: Any = None) -> Any:
                return {"tensors": tensors, "non_tensors": non_tensors, "meta_info": meta_info}

        def pad_sequence_to_length(
            tensors: Any, max_seq_len: int, pad_token_id: int, left_pad: bool = False
        ) -> Any:
            if tensors.shape[-1] >= max_seq_len:
                return tensors
            n = max_seq_len - tensors.shape[-1]
            pad = (n, 0) if left_pad else (0, n)
            return torch.nn.functional.pad(tensors, pad, "constant", pad_token_id)

        for name, attrs in {
            "verl": {},
            "verl.protocol": {"DataProto": DataProto},
            "verl.utils": {},
            "verl.utils.torch_functional": {"pad_sequence_to_length": pad_sequence_to_length},
            # the transform names rLLM's VerlEngine (built on verl's server client) only in
            # annotations of functions not run here
            "rllm.engine.rollout.verl_engine": {"VerlEngine": type("VerlEngine", (), {})},
        }.items():
            mod = types.ModuleType(name)
            mod.__dict__.update(attrs)
            sys.modules[name] = mod
    import rllm.trainer.verl.transform as verl_transform

    return verl_transform


def _routing(batch_json: list[dict[str, Any]], batch: Any) -> dict[str, Any]:
    """rLLM's two readers of ``Step.routing_matrices`` on the sample batch (module docstring)."""
    from rllm.trainer.tinker.transform import trajectory_to_datums
    from rllm.trainer.verl.dataclass import AccumulatedData

    from rollwire.testing.samples import moe_rollout
    from rollwire_rllm import to_episodes
    from rollwire_rllm.routing import routing_matrices

    vt = _import_verl_transform()
    episodes = to_episodes(batch())
    moe = next(
        e for e in episodes if any(s.routing_matrices for t in e.trajectories for s in t.steps)
    )

    def rows(eps: list[Any]) -> tuple[Any, list[dict[str, Any]]]:
        acc = AccumulatedData()
        for e in eps:
            vt._process_episode(e, e.task_id, acc)
        out = [
            {
                "prompt": acc.prompts[i].tolist(),
                "response": acc.responses[i].tolist(),
                "mask": acc.traj_mask[i].tolist(),
            }
            for i in range(len(acc))
        ]
        # rLLM keeps the decoded routing of the rows that have it, unaligned unless all do
        if len(acc.routing_matrices) == len(acc):
            for row, r in zip(out, acc.routing_matrices):
                row["routing"] = _array(r)
        return acc, out

    def routed_experts(acc: Any) -> dict[str, Any]:
        p = max(len(x) for x in acc.prompts)
        r = max(len(x) for x in acc.responses)
        proto = vt._batch_tensors_and_build_data_proto(acc, 0, p, r)
        return {
            "max_prompt": p,
            "max_response": r,
            "rows_with_routing": len(acc.routing_matrices),
            "routed_experts": _array(proto["tensors"].get("routed_experts")),
        }

    all_acc, all_rows = rows(episodes)
    moe_acc, moe_rows = rows([moe])
    # a step of exactly two completion tokens: its per-token form is a list of length two
    call = moe_rollout("two").calls[0]
    p = call.prompt_ids.shape[0]
    call.completion_ids, call.logprobs = call.completion_ids[:2], call.logprobs[:2]
    call.routed_experts = call.routed_experts[: p + 1]  # type: ignore[index]
    try:
        two_tinker: Any = _array(vt._decode_routing_matrices(routing_matrices(call, "tinker")))
    except Exception as e:
        two_tinker = {"error": type(e).__name__}
    verl: dict[str, Any] = {
        "moe_episode": moe.id,
        "steps": [
            {"decoded": _array(vt._decode_routing_matrices(s.routing_matrices))}
            for t in moe.trajectories
            for s in t.steps
        ],
        "batch": {"rows": all_rows, **routed_experts(all_acc)},
        "moe": {"rows": moe_rows, **routed_experts(moe_acc)},
        "two_token_step": {
            "verl": _array(vt._decode_routing_matrices(routing_matrices(call, "verl"))),
            "tinker": two_tinker,
        },
    }
    # the Tinker path: one entry per completion token, passed on shifted by one with the inputs
    (tinker_moe,) = [e for e in to_episodes(batch(), routing_format="tinker") if e.id == moe.id]
    verl["tinker_form_read_by_verl"] = [
        _array(vt._decode_routing_matrices(s.routing_matrices))
        for t in tinker_moe.trajectories
        for s in t.steps
    ]
    datums = []
    for traj in tinker_moe.trajectories:
        for s in traj.steps:
            s.advantage = 0.0
        for d in trajectory_to_datums(traj, router_replay=True):
            datums.append(
                {
                    "model_input": [t for c in d.model_input.chunks for t in c.tokens],
                    "routing_matrices": list(d.model_input.routing_matrices),
                }
            )
    return {"verl": verl, "tinker": {"episode": moe.id, "datums": datums}}


def _rollouts_json(rollouts: list[Any]) -> list[dict[str, Any]]:
    return [json.loads(r.to_json()) for r in rollouts]


def _extra_episodes() -> dict[str, Any]:
    """rLLM's Episodes of rollouts outside the sample batch, with the options that shape them."""
    from rollwire.data.protocol import Rollout
    from rollwire.testing.samples import single_turn_rollout, versioned_rollout
    from rollwire_rllm import to_episodes

    numeric = single_turn_rollout()
    numeric.calls[0].policy_version = "12"
    cases = {
        "versions_and_credit": ([versioned_rollout()], {"step_credit": "discounted"}),
        "numeric_weight_version": ([numeric], {}),
    }
    out: dict[str, Any] = {}
    for name, (rollouts, options) in cases.items():
        stored = _rollouts_json(rollouts)
        episodes = to_episodes([Rollout.from_json(json.dumps(r)) for r in stored], **options)
        out[name] = {
            "rollouts": stored,
            "options": options,
            "episodes": [_plain(e.to_dict()) for e in episodes],
            "types": [
                {
                    "episode": type(e).__module__ + "." + type(e).__name__,
                    "task_id": e.task_id,
                    "rollout_idx": e.rollout_idx,
                    "termination_reason": type(e.termination_reason).__name__,
                    "steps": sorted(
                        {type(s).__name__ for t in e.trajectories for s in t.steps}
                        | {type(s.model_output).__name__ for t in e.trajectories for s in t.steps}
                    ),
                }
                for e in episodes
            ],
        }
    return out


def _flow_types() -> dict[str, list[str]]:
    """The fields of the rLLM types ``RollwireAgentFlow.arun`` is handed (``task``, ``config``)."""
    import dataclasses

    from rllm.types import AgentConfig, Task

    return {c.__name__: [f.name for f in dataclasses.fields(c)] for c in (AgentConfig, Task)}


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
    from rollwire_rllm import adapter, to_episodes

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
        "episode_types": sorted(
            {type(e).__module__ + "." + type(e).__name__ for e in episodes}
            | {type(e.termination_reason).__name__ for e in episodes}
            | {
                type(s.model_output).__name__
                for e in episodes
                for t in e.trajectories
                for s in t.steps
            }
        ),
        "flat_rollout_ids": [r.rollout_id for r in adapter.flatten(episodes)],
        "routing": _routing(batch_json, batch),
        "extra_episodes": _extra_episodes(),
        "flow_types": _flow_types(),
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
