"""rLLM's own Tinker trainer, two or more steps on rollouts rollwire captured, synced and verified.

rollwire's one loop (``rollwire.trainer.loop.run``) with :class:`rollwire_rllm.RllmPolicyTrainer`:
SkyRL's Tinker server started here (JAX on the CPU, the dense engine model of
``rollwire train --trainer tinker``), a LoRA warm-up through it (``rollwire_tinker.warmup``), then
per step the lockbox agent rolled out through the gateway's ``tinker`` backend (tokens capture),
``rollwire_rllm.to_episodes`` → rLLM's trajectory groups, GRPO advantages, datums,
``forward_backward`` and ``optim_step`` (its code, from the checkout), rLLM's checkpoint, and the
loop's ``WeightSync`` to that sampler checkpoint, probed against the training client's forward.

    PYTHONPATH=RLLM_DEPS .venv-tinker/bin/python benchmarks/rllm_steps.py --rllm-src DIR

``DIR`` is an rLLM checkout; ``RLLM_DEPS`` a folder with rLLM's imports that a Tinker venv lacks
(packages/adapter-rllm/README.md lists them). Prints one line per step: reward, datums, loss,
verified, and how far the LoRA weights moved (read from SkyRL's sampler checkpoints).
"""

from __future__ import annotations

import argparse
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _lora_tensors(archive: Path) -> dict[str, np.ndarray]:
    """The LoRA tensors of a SkyRL sampler checkpoint (``.tar.gz`` of safetensors)."""
    from safetensors.numpy import load

    out: dict[str, np.ndarray] = {}
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.endswith(".safetensors"):
                f = tar.extractfile(member)
                assert f is not None
                for k, v in load(f.read()).items():
                    out[f"{member.name}:{k}"] = v.astype(np.float64)
    return out


def _archive(checkpoints: Path, weights: str) -> Path:
    """``tinker://MODEL/NAME`` (or ``MODEL/sampler_weights/NAME``) → SkyRL's file for it."""
    model_id, _, name = weights.removeprefix("tinker://").partition("/")
    name = name.removeprefix("sampler_weights/")
    return checkpoints / model_id / "sampler_weights" / f"{name}.tar.gz"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rllm-src", type=Path, required=True, help="an rLLM checkout")
    ap.add_argument("--out", type=Path, default=None, help="run folder (default: a temp dir)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--tasks-per-step", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--warmup-steps", type=int, default=150)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    sys.path.insert(0, str(args.rllm_src.resolve()))
    sys.path.insert(0, str(ROOT / "packages" / "adapter-rllm" / "src"))

    from rollwire.envs import lockbox
    from rollwire.trainer.loop import RunSpec, StepTrace, run
    from rollwire_rllm.policy_trainer import RllmPolicyTrainer
    from rollwire_tinker.service import tinker_service
    from rollwire_tinker.warmup import tinker_warmup

    out = args.out or Path(tempfile.mkdtemp(prefix="rllm-steps-"))
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    with tinker_service(
        out / "service",
        base_url=None,
        base_model=None,
        model=None,
        seed=args.seed,
        lora_rank=8,
        max_batch=32,
    ) as service:
        checkpoints = out / "service" / "skyrl" / "checkpoints"
        print(
            f"SkyRL's Tinker server at {service.base_url} ({time.perf_counter() - t_start:.0f} s)"
        )
        previous: dict[str, dict[str, np.ndarray]] = {}

        def warmup(training_client: Any, tokenizer: Any, spec: RunSpec) -> str:
            conversations = lockbox.warmup_conversations(
                spec.warmup_steps * 32, teacher_accuracy=spec.teacher_accuracy, seed=spec.seed
            )
            warm = tinker_warmup(
                training_client,
                tokenizer,
                conversations,
                steps=spec.warmup_steps,
                learning_rate=spec.warmup_learning_rate,
                seed=spec.seed,
            )
            return (
                f"warm-up: {warm.steps} cross_entropy steps in {warm.seconds:.0f} s, "
                f"loss {warm.losses[0]:.3f} -> {warm.loss:.3f}"
            )

        def on_step(trace: StepTrace) -> None:
            rec, stats, sync = trace.record, trace.stats, trace.sync
            now = _lora_tensors(_archive(checkpoints, trainer.export(trace.step).weights))
            before = previous.get("w")
            if before is None:
                before = _lora_tensors(_archive(checkpoints, trainer.start_weights))
            delta = float(np.sqrt(sum(np.sum((now[k] - before[k]) ** 2) for k in now)))
            norm = float(np.sqrt(sum(np.sum(v**2) for v in now.values())))
            previous["w"] = now
            verified = bool(sync.backends) and all(b.verified for b in sync.backends)
            diff = max((b.max_abs_diff or 0.0) for b in sync.backends) if sync.backends else 0.0
            print(
                f"step {trace.step}: reward {rec.reward_mean:.3f} (pass {rec.pass_rate:.3f}, "
                f"{rec.rollouts} rollouts), datums {stats.get('datums', 0):.0f}, "
                f"loss {stats.get('loss', float('nan')):.5f}, "
                f"rLLM advantages mean {stats.get('advantage/agent/mean', float('nan')):.3f} "
                f"std {stats.get('advantage/agent/std', float('nan')):.3f}, "
                f"verified {verified} (probe max |diff| {diff:.4f}), "
                f"LoRA |Δ| {delta:.3e} of |W| {norm:.3e}, "
                f"train {rec.train_s:.1f} s, sync {rec.sync_s:.1f} s"
            )
            sys.stdout.flush()

        spec = RunSpec(
            out=out / "run",
            trainer="rllm",
            steps=args.steps,
            tasks_per_step=args.tasks_per_step,
            group_size=args.group_size,
            learning_rate=args.lr,
            warmup_steps=args.warmup_steps,
            eval_every=0,
            eval_size=8,
            eval_k=1,
            save_every=args.steps,
            seed=args.seed,
            lora_rank=8,
            progress=False,
            options={
                "base_url": service.base_url,
                "base_model": service.base_model,
                "tokenizer": service.tokenizer,
            },
            on_step=on_step,
        )
        trainer = RllmPolicyTrainer(spec, warmup=warmup if args.warmup_steps else None)
        result = run(spec, trainer)
    print(
        f"done: {len(result.steps)} steps with rLLM's trainer, every sync verified: "
        f"{all(r.sync.get('sync/servers_failed', 1) == 0 for r in result.steps)}; wall "
        f"{time.perf_counter() - t_start:.0f} s; out {out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
