"""Record what slime's real code makes of a fixed rollwire batch, for the CI contract tests.

    .venv-trl/bin/python packages/adapter-slime/ci/record_contract.py --slime SLIME_CHECKOUT

(or any Python with slime's CPU-side dependencies: torch, numpy, pyyaml, httpx, requests; missing
ones can go in a folder on ``PYTHONPATH``).

slime trains with Megatron on GPUs and imports Ray, SGLang and Megatron at module level; none of
that is needed by the code a rollwire batch goes through, so this script stubs those packages (an
import hook, for this process only) and runs slime's own functions on a CPU with torch:

* ``rollwire_slime.to_samples`` → slime's ``Sample.from_dict`` / ``to_dict``;
* the rollout side of ``RolloutManager``: ``_get_rollout_data`` (its ``rollout_id`` check and
  flattening), ``_convert_samples_to_train_data`` with the reward post-process
  ``rollwire_slime.normalize_rewards`` (``--custom-reward-post-process-path``) and with slime's
  default, and ``_split_train_data_by_dp`` (one DP rank: micro-batches by rollout id), with the
  record of which ``Sample`` fields slime reads;
* the train side, as the Megatron actor runs it on one GPU (the old policy's log-probs as its
  ``compute_log_prob`` pass would give them): ``process_rollout_data``,
  ``compute_advantages_and_returns`` (GRPO), ``get_batch`` and ``loss_function`` (the policy loss)
  per micro-batch, plain, with ``--use-tis`` and with ``--use-rollout-logprobs``, and
  ``vanilla_tis_function`` itself;
* the dynamic-sampling filter ``check_reward_nonzero_std`` on each group.

The model is the one thing made up: per micro-batch, logits that give each response token a
chosen log-probability (the old policy, then the current one), so that slime's log-prob code
reproduces them and its loss has real ratios to clip and weigh. ``torch.compile`` is disabled
(``TORCHDYNAMO_DISABLE``): the same functions, run eagerly. Writes
``packages/adapter-slime/tests/data/slime_contract.json``; ``tests/test_slime_recorded_contract.py``
checks rollwire against it without slime. Nothing is downloaded here: the checkout is given.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

from gpu_stubs import install_stubs

HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parent
ROOT = PACKAGE.parents[1]
OUT = PACKAGE / "tests" / "data" / "slime_contract.json"
#: slime's command line for the recording (its parser's defaults for everything else)
SLIME_FLAGS = [
    "--rollout-batch-size", "2",
    "--n-samples-per-prompt", "4",
    "--num-steps-per-rollout", "1",
    "--rollout-function-path", "rollwire_slime.generate_rollout",
    "--use-rollout-routing-replay",
]  # fmt: skip
#: the loss runs: extra flags on top of SLIME_FLAGS
LOSS_CASES: dict[str, list[str]] = {
    "ppo": [],
    "tis": ["--use-tis"],
    "rollout_logprobs": ["--use-rollout-logprobs"],
}
#: the arguments slime's reward post-process reads (and rollwire_slime.normalize_rewards)
REWARD_ARGS = (
    "advantage_estimator",
    "rewards_normalization",
    "grpo_std_normalization",
    "reward_key",
    "n_samples_per_prompt",
    "rollout_batch_size",
)
#: the megatron arguments slime's code reads here (Megatron's parser is not loaded)
MEGATRON_ARGS = {
    "micro_batch_size": 4,
    "use_dynamic_batch_size": False,
    "max_tokens_per_gpu": None,
    "balance_data": False,
    "balance_by_flops": False,
    "num_layers": 2,
    "moe_router_topk": 2,
    "calculate_per_token_loss": False,
}
#: the keys the actor's forward step asks ``get_batch`` for (slime's ``model.forward_step``)
BATCH_KEYS = [
    "tokens",
    "multimodal_train_inputs",
    "packed_seq_params",
    "total_lengths",
    "response_lengths",
    "loss_masks",
    "log_probs",
    "ref_log_probs",
    "values",
    "advantages",
    "returns",
    "rollout_log_probs",
    "teacher_log_probs",
    "rollout_mask_sums",
]


def _plain(value: Any) -> Any:
    """JSON-ready: enums by value, tensors and arrays as lists."""
    import enum

    if isinstance(value, enum.Enum):
        return value.value
    if hasattr(value, "tolist"):  # torch tensors, NumPy arrays and scalars
        return value.tolist()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _batch_json() -> list[dict[str, Any]]:
    """Two groups of four rollouts: single-turn, merged, forked, truncated; MoE, single-turn,
    failed, and one that never called the model. JSON, because the sample log-probs are seeded
    by ``hash()``, which differs between processes: the tests convert exactly these bytes."""
    from rollwire.data.protocol import Rollout
    from rollwire.testing import (
        failed_rollout,
        forked_rollout,
        merged_rollout,
        moe_rollout,
        single_turn_rollout,
    )

    truncated = single_turn_rollout("a3", "g0", 0.0)
    truncated.calls[0].finish_reason = "length"
    no_call = Rollout(
        rollout_id="b3", group_id="g1", task_id="g1", status="failed", error="crashed at start"
    )
    groups = {
        "g0": [
            single_turn_rollout("a0", "g0", 1.0),
            merged_rollout("a1", "g0", 0.5),
            forked_rollout("a2", "g0", -0.5),
            truncated,
        ],
        "g1": [
            moe_rollout("b0", "g1", 2.0),
            single_turn_rollout("b1", "g1", 0.0),
            failed_rollout("b2", "g1"),
            no_call,
        ],
    }
    return [
        {"group_id": gid, "task_id": gid, "rollouts": [json.loads(r.to_json()) for r in rollouts]}
        for gid, rollouts in groups.items()
    ]


def _groups(batch_json: list[dict[str, Any]]) -> list[Any]:
    from rollwire.data.protocol import Group, Rollout

    return [
        Group(
            group_id=g["group_id"],
            task_id=g["task_id"],
            rollouts=[Rollout.from_json(json.dumps(r)) for r in g["rollouts"]],
        )
        for g in batch_json
    ]


def _slime_args(extra: list[str]) -> argparse.Namespace:
    """slime's own parser on SLIME_FLAGS + extra, with what ``slime_validate_args`` derives."""
    from slime.utils.arguments import _pre_parse_mode, get_slime_extra_args_provider

    parser = argparse.ArgumentParser(allow_abbrev=False)
    get_slime_extra_args_provider()(parser)
    args = parser.parse_args(SLIME_FLAGS + extra)
    # the mode flags parse_args reads first (all at their defaults here)
    for name, value in vars(_pre_parse_mode()).items():
        setattr(args, name, value)
    for name, value in MEGATRON_ARGS.items():
        setattr(args, name, value)
    # as slime_validate_args derives them
    if args.eps_clip_high is None:
        args.eps_clip_high = args.eps_clip
    args.global_batch_size = (
        args.rollout_batch_size * args.n_samples_per_prompt // args.num_steps_per_rollout
    )
    return args


def _manager(args: argparse.Namespace, nested: list[list[Any]]) -> Any:
    """A ``RolloutManager`` without its servers: the attributes its ``__init__`` sets that the
    data path reads, and slime's own methods."""
    from slime.ray.rollout import RolloutManager
    from slime.utils.misc import load_function

    class Manager:
        _get_rollout_data = RolloutManager._get_rollout_data
        _post_process_rewards = RolloutManager._post_process_rewards
        _convert_samples_to_train_data = RolloutManager._convert_samples_to_train_data
        _split_train_data_by_dp = RolloutManager._split_train_data_by_dp

    manager = Manager()
    manager.args = args  # type: ignore[attr-defined]
    manager.data_source = None  # type: ignore[attr-defined]
    manager.generate_rollout = lambda *a, evaluation: nested  # type: ignore[attr-defined]
    path = args.custom_reward_post_process_path
    manager.custom_reward_post_process_func = load_function(path) if path else None  # type: ignore[attr-defined]
    manager.custom_convert_samples_to_train_data_func = None  # type: ignore[attr-defined]
    manager.train_parallel_config = {  # type: ignore[attr-defined]
        "dp_size": 1,
        "cp_size": 1,
        "vpp_size": 1,
        "microbatch_group_size_per_vp_stage": 1,
    }
    return manager


def _reading(nested: list[list[Any]], reads: set[str]) -> None:
    """Make every Sample note the dataclass fields read from it into ``reads``."""
    from slime.utils.types import Sample

    fields = set(Sample.__dataclass_fields__)

    class ReadingSample(Sample):  # type: ignore[misc, valid-type]
        def __getattribute__(self, name: str) -> Any:
            if name in fields:
                reads.add(name)
            return super().__getattribute__(name)

    for group in nested:
        for sample in group:
            sample.__class__ = ReadingSample


def _rollout_side(batch_json: list[dict[str, Any]], extra: list[str]) -> dict[str, Any]:
    """slime's rollout manager on the batch: samples, train data, the DP/micro-batch split."""
    from rollwire_slime import to_samples

    args = _slime_args(extra)
    nested = to_samples(_groups(batch_json))
    reads: set[str] = set()
    _reading(nested, reads)
    manager = _manager(args, nested)
    samples, _metrics = manager._get_rollout_data(rollout_id=0)
    train = manager._convert_samples_to_train_data(samples)
    recorded = {k: _plain(v) for k, v in train.items() if k != "rollout_routed_experts"}
    if "rollout_routed_experts" in train:
        experts = train["rollout_routed_experts"]
        recorded["rollout_routed_experts_shapes"] = [list(t.shape) for t in experts]
        recorded["rollout_routed_experts"] = [t.tolist() for t in experts]
    refs = manager._split_train_data_by_dp(train)
    return {"args": args, "train_data": recorded, "reads": sorted(reads), "refs": refs}


def _wanted_log_probs(response_lengths: list[int], seed: int) -> tuple[list[Any], list[Any]]:
    """Per sample, the old policy's and the current policy's response log-probs."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    old, cur = [], []
    for n in response_lengths:
        o = -(torch.rand(n, generator=gen) * 2.5 + 0.1)
        c = o + torch.randn(n, generator=gen) * 0.25
        old.append(o)
        cur.append(c.clamp(max=-0.05))
    return old, cur


def _logits(batch: dict[str, Any], wanted: list[Any], vocab: int) -> Any:
    """``[1, T, vocab]`` logits under which each response token has the wanted log-prob (every
    other logit 0): ``x = log(p (V - 1) / (1 - p))``."""
    import torch

    logits = torch.zeros(batch["tokens"].shape[1], vocab)
    offset = 0
    for tokens, total, n, lp in zip(
        batch["unconcat_tokens"], batch["total_lengths"], batch["response_lengths"], wanted
    ):
        p = lp.double().exp()
        rows = offset + total - n - 1 + torch.arange(n)
        logits[rows, tokens[-n:]] = torch.log(p * (vocab - 1) / (1 - p)).float()
        offset += total
    return logits.unsqueeze(0)


def _micro_batches(args: Any, rollout_data: dict[str, Any], wanted: list[Any]) -> Any:
    """(batch, logits) per micro-batch, as ``get_batch`` builds it, for the wanted log-probs."""
    from slime.backends.megatron_utils.data import DataIterator, get_batch

    vocab = 128 * (max(int(t.max()) for t in rollout_data["tokens"]) // 128 + 1)
    iterator = DataIterator(rollout_data, rollout_data["micro_batch_indices"])
    for indices in rollout_data["micro_batch_indices"]:
        batch = get_batch(iterator, BATCH_KEYS, args.data_pad_size_multiplier, args.allgather_cp)
        yield indices, batch, _logits(batch, [wanted[i] for i in indices], vocab)


def _train_side(args: Any, refs: Any, seed: int = 0) -> dict[str, Any]:
    """The actor's step on one rank: log-probs of the old policy, GRPO advantages, and the loss
    of each micro-batch with its gradient per response token."""
    import torch
    from slime.backends.megatron_utils import data as megatron_data
    from slime.backends.megatron_utils import loss as megatron_loss
    from slime.utils.data import process_rollout_data

    cpu = types.SimpleNamespace(device=lambda: "cpu", current_device=lambda: "cpu")
    megatron_data.accelerator = cpu  # type: ignore[attr-defined]
    data = process_rollout_data(args, refs, 0, 1)
    received = sorted(data)
    n_mb = data["num_microbatches"]
    assert len(n_mb) == 1, f"one training step expected, got {n_mb}"
    old, cur = _wanted_log_probs(data["response_lengths"], seed)
    data["log_probs"] = [torch.empty(0)] * len(old)
    for indices, batch, logits in _micro_batches(args, data, old):
        _, res = megatron_loss.get_log_probs_and_entropy(
            logits,
            args=args,
            unconcat_tokens=batch["unconcat_tokens"],
            total_lengths=batch["total_lengths"],
            response_lengths=batch["response_lengths"],
        )
        for i, lp in zip(indices, res["log_probs"]):
            data["log_probs"][i] = lp
    megatron_loss.compute_advantages_and_returns(args, data)
    out: dict[str, Any] = {
        "rank_keys": received,
        "num_microbatches": n_mb,
        "global_batch_sizes": data["global_batch_sizes"],
        "old_log_probs": _plain(data["log_probs"]),
        "advantages": _plain(data["advantages"]),
        "micro_batches": [],
    }
    for indices, batch, logits in _micro_batches(args, data, cur):
        logits.requires_grad_(True)
        loss, _, log = megatron_loss.loss_function(
            args, batch, n_mb[0], args.global_batch_size, logits
        )
        loss.backward()
        _, res = megatron_loss.get_log_probs_and_entropy(
            logits.detach(),
            args=args,
            unconcat_tokens=batch["unconcat_tokens"],
            total_lengths=batch["total_lengths"],
            response_lengths=batch["response_lengths"],
        )
        grads, offset = [], 0
        for tokens, total, n, lp in zip(
            batch["unconcat_tokens"],
            batch["total_lengths"],
            batch["response_lengths"],
            res["log_probs"],
        ):
            rows = offset + total - n - 1 + torch.arange(n)
            # d loss / d logit[target] = d loss / d log p * (1 - p)
            grads.append(logits.grad[0, rows, tokens[-n:]] / (1 - lp.exp()))
            offset += total
        out["micro_batches"].append(
            {
                "indices": list(indices),
                "loss": loss.item(),
                "log": dict(zip(log["keys"], log["values"][1:].tolist())),
                "log_probs": _plain(res["log_probs"]),
                "dloss_dlogprob": _plain(grads),
            }
        )
    return out


def _tis_weights(args: Any, train: dict[str, Any], old: list[Any]) -> dict[str, Any]:
    """slime's ``vanilla_tis_function`` on the old policy's and rollwire's log-probs (with a unit
    loss, so the weights come back as the loss)."""
    import torch
    from slime.backends.megatron_utils.loss import vanilla_tis_function

    rollout = [torch.tensor(x, dtype=torch.float32) for x in train["rollout_log_probs"]]
    old_t = [torch.tensor(x, dtype=torch.float32) for x in old]
    weights, _, metrics = vanilla_tis_function(
        args,
        pg_loss=torch.ones(sum(len(x) for x in old)),
        train_log_probs=old_t,
        rollout_log_probs=rollout,
        loss_masks=[torch.tensor(m) for m in train["loss_masks"]],
    )
    return {"weights": weights.tolist(), "tis": metrics["tis"].tolist()}


def _dynamic_filter(batch_json: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """slime's ``check_reward_nonzero_std`` on each group of samples, and on the last three
    samples of the second group (all reward 0: a zero-std group), by flat sample index."""
    from slime.rollout.filter_hub.base_types import call_dynamic_filter
    from slime.rollout.filter_hub.dynamic_sampling_filters import check_reward_nonzero_std

    from rollwire_slime import to_samples

    args = _slime_args([])
    nested = to_samples(_groups(batch_json))
    groups = [*nested, nested[1][-3:]]
    out = []
    for group in groups:
        verdict = call_dynamic_filter(check_reward_nonzero_std, args, group)
        out.append({"indices": [s.index for s in group], "keep": bool(verdict.keep)})
        out[-1]["reason"] = verdict.reason
    return out


def _commit(checkout: Path) -> str | None:
    head = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    return head.stdout.strip() or None


def record(checkout: Path, commit: str | None = None) -> dict[str, Any]:
    """slime's inputs and outputs on the batch (module docstring)."""
    install_stubs()
    sys.path[:0] = [str(checkout.resolve()), str(PACKAGE / "src"), str(ROOT / "packages/core/src")]
    from slime.utils.types import Sample

    from rollwire_slime import to_sample_dicts, to_samples

    batch_json = _batch_json()
    out: dict[str, Any] = {
        "slime_commit": commit or _commit(checkout),
        "flags": SLIME_FLAGS,
        "megatron_args": MEGATRON_ARGS,
        "batch": batch_json,
        "sample_dicts": to_sample_dicts(_groups(batch_json)),
        "slime_samples": [
            [_plain(s.to_dict()) for s in g] for g in to_samples(_groups(batch_json))
        ],
        "slime_sample_fields": sorted(Sample.__dataclass_fields__),
        "reward_args": {},
        "rewards": {},
        "loss": {},
    }
    hook = ["--custom-reward-post-process-path", "rollwire_slime.normalize_rewards"]
    for name, extra in (("hook", hook), ("slime_default", [])):
        side = _rollout_side(batch_json, extra)
        out["rewards"][name] = side["train_data"]
        out["fields_read"] = side["reads"]  # the same in both: the default reads no more
    out["train_data"] = out["rewards"].pop("hook")
    for name in REWARD_ARGS:
        out["reward_args"][name] = getattr(side["args"], name)
    for name, extra in LOSS_CASES.items():
        side = _rollout_side(batch_json, hook + extra)
        args = side["args"]
        out["loss"][name] = {
            "flags": extra,
            "eps_clip": args.eps_clip,
            "eps_clip_high": args.eps_clip_high,
            "tis_clip": args.tis_clip,
            "tis_clip_low": args.tis_clip_low,
            "global_batch_size": args.global_batch_size,
            **_train_side(args, side["refs"]),
        }
    out["dynamic_filter"] = _dynamic_filter(batch_json)
    args = _slime_args(["--use-tis"])
    out["tis"] = _tis_weights(args, out["train_data"], out["loss"]["tis"]["old_log_probs"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--slime", type=Path, required=True, help="a slime checkout (THUDM/slime)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--commit", default=None, help="the checkout's commit (default: git's HEAD)")
    args = ap.parse_args()
    data = record(args.slime, args.commit)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    n = len(data["train_data"]["tokens"])
    print(
        f"wrote {args.out}: slime {data['slime_commit']}, {n} samples, {len(data['loss'])} losses"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
