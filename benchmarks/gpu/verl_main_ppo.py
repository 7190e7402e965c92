"""Helper of ``verl_main_ppo.sh``: verl's ``main_ppo`` with ``RollwireAgentLoop`` on the vault task.

    python benchmarks/gpu/verl_main_ppo.py data WORK            # train/val parquet, agent-loop YAML
    python benchmarks/gpu/verl_main_ppo.py overrides WORK MODEL  # the hydra overrides, one a line
    python benchmarks/gpu/verl_main_ppo.py compose WORK MODEL    # compose them with verl's config
    python benchmarks/gpu/verl_main_ppo.py check WORK            # pass/fail of a finished run

The overrides are written once, here (:func:`overrides`): the shell script runs ``main_ppo`` with
them and ``packages/adapter-verl/tests/test_main_ppo_recipe.py`` composes them with verl's own
``ppo_trainer`` config on the CPU. The data set is the vault task (:mod:`rollwire.envs.vault`):
each parquet row carries the task's fields (``box``, ``code``, ``prompt``, ``task_id``) at the
top level, where verl's ``RLHFDataset`` keeps them and ``RollwireAgentLoop`` hands them to the
LangGraph agent; the chat prompt verl wants is the ``messages`` column (``data.prompt_key``),
because vault's own ``prompt`` is a string the agent reads.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

#: the registry entry ``RollwireAgentLoop`` runs under, with the vault agent (local runner)
AGENT = "rollwire.envs.vault.agent_langgraph:app"
#: what ``check`` reads: verl's file logger, verl's rollout dumps, rollwire's per-step metrics
METRICS_FILE, ROLLOUT_DIR, ROLLWIRE_TB = "verl_metrics.jsonl", "rollouts", "rollwire-tb"


def write_data(work: Path, *, train: int = 64, val: int = 8, seed: int = 0) -> None:
    """``train.parquet`` (vault's training boxes) and ``val.parquet`` (held-out boxes) in verl's
    RLHF layout, and ``agent_loop.yaml`` (the shipped entry plus the vault agent's settings)."""
    import pandas as pd

    from rollwire.envs.vault import SYSTEM_PROMPT, make_tasks

    work.mkdir(parents=True, exist_ok=True)
    for name, split, n in (("train", "train", train), ("val", "heldout", val)):
        rows = [
            {
                "data_source": "rollwire/vault",
                "messages": [
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": task["prompt"]},
                ],
                **task,
                # verl's rollout dump selects reward_model; the agent computes the reward itself
                "reward_model": {"style": "rule", "ground_truth": str(task["code"])},
                "extra_info": {"index": i, "split": split},
            }
            for i, task in enumerate(make_tasks(n, split, seed=seed))
        ]
        pd.DataFrame(rows).to_parquet(work / f"{name}.parquet")
    (work / "agent_loop.yaml").write_text(agent_loop_yaml(work))


def agent_loop_yaml(work: Path) -> str:
    """The agent-loop YAML: ``rollwire_verl``'s shipped entry with the vault agent's settings.
    No ``gateway_url``/``backends``: each agent-loop worker starts an in-process gateway over the
    vLLM servers verl started (found through the server manager verl hands the loop)."""
    import rollwire_verl

    shipped = Path(rollwire_verl.AGENT_LOOP_CONFIG_PATH).read_text()
    extra = {
        "agent": AGENT,
        "runner": "local",
        "deadline": 300,
        "metrics": f"tensorboard:{work / ROLLWIRE_TB}/{{pid}}",
    }
    return shipped + "".join(f"  {k}: {json.dumps(v)}\n" for k, v in extra.items())


def overrides(
    work: Path,
    model: str,
    *,
    steps: int = 5,
    prompts: int = 4,
    n: int = 4,
    max_prompt_length: int = 1024,
    max_response_length: int = 512,
) -> list[str]:
    """The hydra overrides of ``main_ppo`` on one GPU: GRPO, verl's v1 sync trainer, vLLM in
    async mode with its Hermes tool parser, ``prompts`` x ``n`` rollouts a step."""
    batch = prompts * n
    return [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        f"data.train_files={work / 'train.parquet'}",
        f"data.val_files={work / 'val.parquet'}",
        "data.prompt_key=messages",
        f"data.train_batch_size={prompts}",
        f"data.max_prompt_length={max_prompt_length}",
        f"data.max_response_length={max_response_length}",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={model}",
        # verl's default is flash_attention_2 with packed sequences; verl[vllm] brings no flash-attn
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={batch}",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.mode=async",
        f"actor_rollout_ref.rollout.n={n}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={batch}",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={work / 'agent_loop.yaml'}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=rollwire_agent",
        # the vault agent sends OpenAI tools: vLLM must parse the model's <tool_call> blocks
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.enable_auto_tool_choice=True",
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.tool_call_parser=hermes",
        "trainer.use_v1=True",
        "trainer.v1.trainer_mode=sync",
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=1",
        f"trainer.total_training_steps={steps}",
        "trainer.logger=[console,file]",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        f"trainer.rollout_data_dir={work / ROLLOUT_DIR}",
        # verl's file logger (trainer.logger 'file') runs in the TaskRunner actor: tell it where
        f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH={work / METRICS_FILE}",
        "trainer.project_name=rollwire",
        "trainer.experiment_name=verl-main-ppo-vault",
    ]


def compose(overrides_: list[str]) -> Any:
    """verl's ``ppo_trainer`` config with ``overrides_``, composed as ``main_ppo``'s
    ``@hydra.main`` does, from the installed verl's config folder."""
    import verl.trainer.main_ppo as main_ppo
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    folder = Path(main_ppo.__file__).parent / "config"
    with initialize_config_dir(config_dir=str(folder), version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=overrides_)


def validate(config: Any) -> None:
    """What ``main_ppo.main`` checks before it starts Ray (``validate_config``)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    validate_config(
        config=config,
        use_reference_policy=need_reference_policy(config),
        use_critic=need_critic(config),
    )


# -- check ----------------------------------------------------------------------------------------


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check(work: Path, *, steps: int, rollouts_per_step: int) -> list[str]:
    """Problems with a finished run (empty: none): verl logged ``steps`` steps with rewards and an
    actor update, dumped each step's rollouts, and rollwire's gateway captured every step's calls."""
    problems: list[str] = []
    metrics_path = work / METRICS_FILE
    if not metrics_path.exists():
        return [f"no verl metrics at {metrics_path} (trainer.logger has no 'file'?)"]
    logged = {int(r["step"]): r["data"] for r in _read_jsonl(metrics_path)}
    print(f"verl: steps logged {sorted(logged)}")
    if sorted(logged) != list(range(1, steps + 1)):
        problems.append(f"verl logged steps {sorted(logged)}, expected 1..{steps}")
    for step, data in sorted(logged.items()):
        score, loss = data.get("critic/score/mean"), data.get("actor/pg_loss")
        length = data.get("response_length/mean")
        print(f"verl step {step}: score/mean {score}  pg_loss {loss}  response_length {length}")
        for key, value in (("critic/score/mean", score), ("actor/pg_loss", loss)):
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                problems.append(f"step {step}: {key} is {value!r}")
        if not isinstance(length, (int, float)) or length <= 0:
            problems.append(f"step {step}: response_length/mean is {length!r}")

    dumps = sorted((work / ROLLOUT_DIR).glob("*.jsonl"))
    print(f"verl: rollout dumps {[p.name for p in dumps]}")
    if len(dumps) != steps:
        problems.append(f"{len(dumps)} rollout dumps in {work / ROLLOUT_DIR}, expected {steps}")
    for path in dumps:
        rows = _read_jsonl(path)
        if len(rows) < rollouts_per_step:
            problems.append(f"{path.name}: {len(rows)} rollouts, expected >= {rollouts_per_step}")
        if any(not isinstance(r.get("score"), (int, float)) for r in rows):
            problems.append(f"{path.name}: a rollout without a score")

    problems += _check_rollwire(work / ROLLWIRE_TB, steps, rollouts_per_step)
    return problems


def _check_rollwire(folder: Path, steps: int, rollouts_per_step: int) -> list[str]:
    """rollwire's per-step statistics (the agent-loop workers' metrics sink): every step's
    rollouts, model calls and sampled tokens went through the gateway and were captured."""
    from rollwire.testing.tensorboard import read_scalars

    if not folder.exists():
        return [f"no rollwire metrics under {folder}: the agent loop never logged a step"]
    totals: dict[int, dict[str, float]] = {}
    for run in sorted(p for p in folder.iterdir() if p.is_dir()):  # one folder per worker pid
        for step, values in read_scalars(run).items():
            mine = totals.setdefault(step, {})
            for key in ("rollwire/rollouts/total", "rollwire/calls/total"):
                mine[key] = mine.get(key, 0.0) + values.get(key, 0.0)
            mine.setdefault("rollwire/reward/mean", values.get("rollwire/reward/mean", math.nan))
    problems = []
    # a step is logged when the next step's first rollout arrives; the last one only at the
    # worker's exit, which Ray's shutdown may cut short: it is printed, not required
    for step in range(1, steps + 1):
        got = totals.get(step, {})
        if step == steps and not got:
            print(f"rollwire step {step}: not logged (the last step is logged at worker exit)")
            continue
        rollouts, calls = got.get("rollwire/rollouts/total", 0), got.get("rollwire/calls/total", 0)
        print(
            f"rollwire step {step}: rollouts {rollouts:.0f}  captured calls {calls:.0f}  "
            f"reward/mean {got.get('rollwire/reward/mean', math.nan):.3f}"
        )
        if rollouts < rollouts_per_step:
            problems.append(f"rollwire step {step}: {rollouts:.0f} rollouts < {rollouts_per_step}")
        if calls < rollouts:
            problems.append(f"rollwire step {step}: {calls:.0f} captured calls for {rollouts:.0f}")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    d = sub.add_parser("data", help="write train/val parquet and agent_loop.yaml under WORK")
    d.add_argument("work", type=Path)
    d.add_argument("--train", type=int, default=64)
    d.add_argument("--val", type=int, default=8)
    for name in ("overrides", "compose"):
        p = sub.add_parser(name, help=f"{name} the hydra overrides of main_ppo")
        p.add_argument("work", type=Path)
        p.add_argument("model")
        p.add_argument("--steps", type=int, default=5)
        p.add_argument("--prompts", type=int, default=4)
        p.add_argument("--n", type=int, default=4)
    c = sub.add_parser("check", help="pass/fail of a finished run under WORK")
    c.add_argument("work", type=Path)
    c.add_argument("--steps", type=int, default=5)
    c.add_argument("--rollouts-per-step", type=int, default=16)
    args = ap.parse_args(argv)
    if args.command == "data":
        write_data(args.work, train=args.train, val=args.val)
        return 0
    if args.command in ("overrides", "compose"):
        ov = overrides(args.work, args.model, steps=args.steps, prompts=args.prompts, n=args.n)
        if args.command == "overrides":
            print("\n".join(ov))
            return 0
        config = compose(ov)
        validate(config)
        rollout = config.actor_rollout_ref.rollout
        print(
            f"composed and validated: rollout {rollout.name}/{rollout.mode}, agent loop "
            f"{rollout.agent.default_agent_loop} from {rollout.agent.agent_loop_config_path}, "
            f"{config.data.train_batch_size} prompts x {rollout.n}, "
            f"{config.trainer.total_training_steps} steps"
        )
        return 0
    problems = check(args.work, steps=args.steps, rollouts_per_step=args.rollouts_per_step)
    for problem in problems:
        print(f"FAIL: {problem}", file=sys.stderr)
    print("PASS" if not problems else f"FAIL: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
