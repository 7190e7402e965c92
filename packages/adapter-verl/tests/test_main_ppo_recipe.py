"""The GPU recipe ``benchmarks/gpu/verl_main_ppo.sh`` as far as a CPU runs it.

The recipe's own hydra overrides and data (``benchmarks/gpu/verl_main_ppo.py``, the one place they
are written) composed with verl 0.9.1's ``ppo_trainer`` config and checked by ``main_ppo``'s own
``validate_config``; the registry entry instantiated from that config as verl's worker does; the
vault rows read back by verl's ``RLHFDataset`` and run by verl's v1 ``AgentLoopWorkerTQ`` through
``RollwireAgentLoop`` and the vault task's LangGraph agent, against the embedded engine (the same
model folder) standing in for vLLM, found through a server manager shaped like verl's; and one
step of verl's actor on those outputs padded by verl's own worker. What stays for the GPU: Ray,
vLLM, TransferQueue, verl's weight push and its trainer's loop (docs/real-run.md).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import pathlib
import re
import types
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

pytest.importorskip("verl")
torch = pytest.importorskip("torch")

from omegaconf import OmegaConf  # noqa: E402
from verl.experimental.agent_loop.agent_loop import (  # noqa: E402
    AgentLoopOutput,
    AgentLoopWorker,
    DictConfigWrap,
    ToolListWrap,
    _agent_loop_registry,
)
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn  # noqa: E402

from rollwire_verl import agent_loop as al  # noqa: E402

pytestmark = pytest.mark.timeout(300)

ROOT = pathlib.Path(__file__).resolve().parents[3]
N = 4  # the recipe's rollout.n


def _load_recipe() -> types.ModuleType:
    path = ROOT / "benchmarks" / "gpu" / "verl_main_ppo.py"
    spec = importlib.util.spec_from_file_location("verl_main_ppo_recipe", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


recipe = _load_recipe()


@pytest.fixture
def composed(tmp_path: pathlib.Path, base_model: pathlib.Path) -> tuple[pathlib.Path, Any]:
    """The recipe's data under ``tmp_path`` and verl's config composed with its overrides."""
    recipe.write_data(tmp_path, train=8, val=2)
    return tmp_path, recipe.compose(recipe.overrides(tmp_path, str(base_model)))


def _registered(monkeypatch: pytest.MonkeyPatch, config: Any) -> Any:
    """verl's ``AgentLoopWorker.__init__``: the YAML at ``agent_loop_config_path`` into the registry;
    the entry ``default_agent_loop`` names."""
    agent = config.actor_rollout_ref.rollout.agent
    for entry in OmegaConf.load(agent.agent_loop_config_path):
        monkeypatch.setitem(_agent_loop_registry, entry.name, entry)
    return _agent_loop_registry[agent.default_agent_loop]


class _Remote:
    def __init__(self, value: Any) -> None:
        self.value = value

    def remote(self) -> Any:
        async def answer() -> Any:
            return self.value

        return answer()


def _server_manager(engine: Any) -> Any:
    """Shaped like verl 0.9.1's ``LLMServerClient``: its router lists the servers as ``ip:port``."""
    servers = _Remote([engine.url.removeprefix("http://")])
    return types.SimpleNamespace(_load_balancer=types.SimpleNamespace(get_all_servers=servers))


def _instantiate(config: Any, entry: Any, server_manager: Any, tokenizer: Any) -> Any:
    """``AgentLoopWorker._run_agent_loop``'s ``hydra.utils.instantiate`` of the entry."""
    import hydra

    return hydra.utils.instantiate(
        config=entry,
        trainer_config=DictConfigWrap(config=config),
        server_manager=server_manager,
        tokenizer=tokenizer,
        processor=None,
        hf_model_type=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data),
        tools=ToolListWrap([]),
    )


def test_the_recipes_overrides_compose_with_verls_ppo_trainer_config(
    composed: tuple[pathlib.Path, Any], base_model: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hydra.errors import ConfigCompositionException
    from verl.utils.config import omega_conf_to_dataclass

    work, config = composed
    recipe.validate(config)  # main_ppo.main's own check, before Ray
    rollout = config.actor_rollout_ref.rollout
    assert (rollout.name, rollout.mode, rollout.n, rollout.tensor_model_parallel_size) == (
        "vllm",
        "async",
        N,
        1,
    )
    assert config.trainer.use_v1 and config.trainer.v1.trainer_mode == "sync"
    assert (config.trainer.n_gpus_per_node, config.trainer.total_training_steps) == (1, 5)
    assert list(config.trainer.logger) == ["console", "file"]
    assert config.algorithm.adv_estimator == "grpo" and config.data.prompt_key == "messages"
    # the vLLM server verl builds gets the tool parser the vault agent needs
    assert dict(rollout.engine_kwargs.vllm) == {
        "enable_auto_tool_choice": True,
        "tool_call_parser": "hermes",
    }
    env = config.ray_kwargs.ray_init.runtime_env.env_vars
    assert str(work / recipe.METRICS_FILE) == env.VERL_FILE_LOGGER_PATH
    assert config.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    # verl's RolloutConfig as its rollout worker builds it: lengths resolved from data.*
    rc = omega_conf_to_dataclass(rollout)
    assert (rc.prompt_length, rc.response_length) == (1024, 512)
    assert rc.agent.default_agent_loop == al.AGENT_NAME
    assert rc.agent.agent_loop_config_path == str(work / "agent_loop.yaml")

    entry = _registered(monkeypatch, config)
    loop = _instantiate(config, entry, server_manager=None, tokenizer=None)
    assert type(loop) is al.RollwireAgentLoop
    s = loop.settings
    assert (s.agent, s.runner, s.gateway_url, s.backends) == (recipe.AGENT, "local", None, ())
    assert s.deadline == 300 and s.metrics == f"tensorboard:{work / recipe.ROLLWIRE_TB}/{{pid}}"
    assert loop.model == str(base_model)  # the name verl's vLLM serves: model.path
    assert int(loop.rollout_config.response_length) == 512

    # composition is strict: a misspelt key in the recipe would fail here, not on the GPU
    with pytest.raises(ConfigCompositionException):
        recipe.compose([*recipe.overrides(work, "m"), "actor_rollout_ref.rollout.agent.nope=1"])


def test_docs_show_the_recipes_command() -> None:
    """docs/real-run.md shows main_ppo's command as the recipe writes it (one source of truth)."""
    import shlex

    text = (ROOT / "docs" / "real-run.md").read_text()
    block = re.search(r"```bash\n(python -m verl\.trainer\.main_ppo .*?)```", text, re.S)
    assert block is not None, "no main_ppo command in docs/real-run.md"
    shown = shlex.split(block.group(1).replace("\\\n", " "))[3:]
    assert shown == recipe.overrides(pathlib.Path("$WORK/data"), "$MODEL")


# -- the vault agent through verl's v1 worker, the embedded engine standing in for vLLM -----------

#: per open_box call: the code the scripted policy types (None: the one read_code returned)
WRONG_CODES: list[str | None] = []


def _call(name: str, arguments: dict[str, str]) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


def _vault_policy(messages: list[dict[str, Any]], tools: Any) -> str:
    """The tool calls a trained policy makes: read the box's code, open the box with it."""
    assert [t["function"]["name"] for t in tools or []] == ["read_code", "open_box"]
    if messages[-1]["role"] == "user":
        box = re.search(r"Open box (\w)\.", str(messages[-1]["content"]))
        assert box is not None, messages
        return _call("read_code", {"box": box.group(1)})
    read = re.search(r"Box (\w)'s code is (\d+)\.", str(messages[-1]["content"]))
    assert read is not None, messages
    code = WRONG_CODES.pop(0) if WRONG_CODES else None
    return _call("open_box", {"box": read.group(1), "code": code or read.group(2)})


@pytest.fixture
def engine(base_model: pathlib.Path) -> Iterator[Any]:
    """The embedded engine serving the recipe's model folder, scripted to the vault policy."""
    pytest.importorskip(
        "langgraph",
        reason="the vault agent is written with LangGraph: install packages/agent-langgraph in "
        "the verl venv (packages/adapter-verl/ci/setup-venv.sh)",
    )
    from rollwire.engine import EmbeddedEngine, EngineConfig

    WRONG_CODES.clear()
    with EmbeddedEngine(EngineConfig(model_dir=base_model, scripted=_vault_policy)) as e:
        yield e


@pytest.fixture
def tokenizer(base_model: pathlib.Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(base_model)


def _v1_worker(
    monkeypatch: pytest.MonkeyPatch,
    tq_worker: tuple[Any, Any],
    config: Any,
    llm_client: Any,
    tokenizer: Any,
) -> tuple[Any, Any]:
    """verl 0.9.1's ``AgentLoopWorkerTQ`` (``tq_worker``) on the composed config, given what
    ``__init__`` sets."""
    w, fake = tq_worker
    w.config = config
    w.rollout_config = config.actor_rollout_ref.rollout
    _registered(monkeypatch, config)
    w.llm_client, w.processor, w.tools, w.hf_model_type = llm_client, None, [], None
    w.dataset_cls = RLHFDataset
    w.tokenizer = tokenizer
    w.reward_loop_worker_handles, w.distillation_enabled = None, False
    w.background_tasks = set()
    return w, fake


def _rows(work: pathlib.Path, config: Any, tokenizer: Any, n: int) -> list[dict[str, Any]]:
    """The first ``n`` rows of the recipe's train.parquet, as verl's ``RLHFDataset`` gives them."""
    dataset = RLHFDataset(str(work / "train.parquet"), tokenizer, config.data)
    return [dataset[i] for i in range(n)]


async def test_verls_v1_worker_runs_the_vault_agent_on_the_recipes_rows(
    composed: tuple[pathlib.Path, Any],
    engine: Any,
    tokenizer: Any,
    monkeypatch: pytest.MonkeyPatch,
    tq_worker: tuple[Any, Any],
) -> None:
    from rollwire.metrics_sinks.step_logger import close_shared_loggers

    work, config = composed
    rows = _rows(work, config, tokenizer, 2)
    assert all(isinstance(r["prompt"], str) and r["box"] in r["prompt"] for r in rows)
    worker, fake = _v1_worker(monkeypatch, tq_worker, config, _server_manager(engine), tokenizer)
    batch_dict = collate_fn(rows)  # what verl's dataloader hands the v1 trainer
    batch_dict["uid"] = [str(uuid.uuid4()) for _ in rows]
    batch = tu.get_tensordict(batch_dict)
    tu.assign_non_tensor_data(batch, "global_steps", 1)
    try:
        await worker.generate_sequences(batch)
        while worker.background_tasks:
            await asyncio.wait(set(worker.background_tasks))
    finally:
        await al.aclose_resources()
        close_shared_loggers()  # the worker's exit: rollwire logs the step
    assert len(fake.puts) == len(rows) * N  # one output per rollout: no fork
    for put in fake.puts:
        fields = put["fields"]
        mask = fields["response_mask"][0]
        # opened with the code read_code returned: the row's box and code reached the agent
        assert float(fields["rm_scores"][0].sum()) == 1.0
        info = fields["extra_fields"][0]["reward_extra_info"]
        assert info["solved"] == 1.0 and info["reads"] == 1.0 and info["turns"] == 2.0
        assert int(mask.sum()) > 0 and int((mask == 0).sum()) > 0  # tool result: context only
        assert fields["box"][0] in "ABCDEFGHIJKLM" and put["tags"][0]["max_global_steps"] == 0
    # rollwire's per-step statistics, as the recipe's check reads them after the GPU run
    folder = work / recipe.ROLLWIRE_TB
    assert recipe._check_rollwire(folder, steps=1, rollouts_per_step=len(rows) * N) == []
    problems = recipe._check_rollwire(folder, steps=2, rollouts_per_step=len(rows) * N + 1)
    assert problems and "rollouts < 9" in problems[0]


async def test_one_verl_actor_step_on_the_agent_loops_outputs(
    composed: tuple[pathlib.Path, Any],
    engine: Any,
    tokenizer: Any,
    base_model: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The vault outputs padded by verl's worker, GRPO advantages from verl, then verl's actor
    (the recipe's model folder) scores them as the engine did and takes one PPO step."""
    from verl import DataProto
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.core_algos import AdvantageEstimator
    from verl.trainer.ppo.ray_trainer import compute_advantage

    from rollwire_verl.actor import ActorSettings, VerlActor

    work, config = composed
    loop = _instantiate(
        config, _registered(monkeypatch, config), _server_manager(engine), tokenizer
    )
    rows = _rows(work, config, tokenizer, 2)
    # in each group of two, the first rollout opens its box and the second types a wrong code
    WRONG_CODES.extend([None, "000", None, "000"])
    outs: list[AgentLoopOutput] = []
    uids: list[str] = []
    try:
        for row in rows:
            uid = str(uuid.uuid4())
            for session in range(2):
                out = await loop.run(
                    {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True},
                    **row,
                    uid=uid,
                    session_id=session,
                    global_steps=1,
                )
                assert isinstance(out, AgentLoopOutput)
                outs.append(out)
                uids.append(uid)
    finally:
        await al.aclose_resources()
    assert [o.reward_score for o in outs] == [1.0, 0.0, 1.0, 0.0]

    rc = config.actor_rollout_ref.rollout
    worker = object.__new__(AgentLoopWorker)  # verl's padding to prompt/response_length
    worker.reward_loop_worker_handles, worker.distillation_enabled = None, False
    worker.processor, worker.mm_processor_kwargs, worker.tokenizer = None, {}, tokenizer
    worker.rollout_config = types.SimpleNamespace(
        prompt_length=int(rc.prompt_length), response_length=int(rc.response_length)
    )
    internals = [await worker._agent_loop_postprocess(o, False, **rows[0]) for o in outs]
    data: DataProto = worker._postprocess(internals, input_non_tensor_batch=None)
    data.non_tensor_batch["uid"] = np.array(uids, dtype=object)
    data.batch["token_level_rewards"] = data.batch["rm_scores"]
    compute_advantage(data, AdvantageEstimator.GRPO, config=AlgoConfig())
    b = data.batch
    assert b["prompts"].shape[1] == 1024 and b["responses"].shape[1] == 512
    tensors = {k: b[k].numpy() for k in b.keys()}  # noqa: SIM118 (a TensorDict)

    actor = VerlActor(base_model, ActorSettings(learning_rate=1e-3))
    try:
        old = actor.log_probs(tensors, temperature=1.0)
        mask = tensors["response_mask"].astype(bool)
        # verl's actor scores the captured tokens as the server that sampled them did
        gap = np.abs(old - tensors["rollout_log_probs"])[mask]
        assert mask.sum() > 0 and float(gap.max()) < 1e-3, float(gap.max())
        before = {k: v.clone() for k, v in actor.state_dict().items()}
        stats = actor.update(tensors, old, temperature=1.0)
        after = actor.state_dict()
    finally:
        actor.close()
    assert stats["grad_norm"] > 0 and np.isfinite(stats["loss"])
    assert any(not torch.equal(before[k], after[k]) for k in before)
