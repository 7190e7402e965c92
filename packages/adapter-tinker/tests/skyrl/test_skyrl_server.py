"""Two training steps through the Tinker SDK against SkyRL's real server on the CPU, on rollouts
the server's own sampler produced (SmolLM2-135M-Instruct, LoRA rank 8).

Runs in .venv-tinker (packages/adapter-tinker/ci/run-tests.sh, inside a network namespace with
only loopback). One server for the module: it takes minutes to start and to compile.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tinker import types
from transformers import AutoTokenizer

import rollwire.engine
from rollwire.data.protocol import Group, ModelCall, Rollout
from rollwire.models.smollm2 import convert_smollm2
from rollwire_tinker import TinkerConfig, TinkerTrainer, to_datums
from rollwire_tinker.skyrl import SkyRLServer

pytestmark = pytest.mark.timeout(1800)
#: every sample (rollouts, the agent's chat, the probe) decodes this many tokens: SkyRL compiles
#: its sampler per decode length (minutes each on a cold cache)
MAX_TOKENS = 6
SHIPPED = Path(rollwire.engine.__file__).parent / "hf_tokenizer"
TIMES: dict[str, float] = {}


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return convert_smollm2()


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SkyRLServer]:
    t0 = time.perf_counter()
    with SkyRLServer(model_dir, tmp_path_factory.mktemp("skyrl"), max_lora_adapters=3) as srv:
        TIMES["api_up"] = time.perf_counter() - t0
        yield srv
    print("\nSkyRL timings (s):", {k: round(v, 1) for k, v in TIMES.items()})


@pytest.fixture(scope="module")
def trainer(server: SkyRLServer, model_dir: Path) -> TinkerTrainer:
    config = TinkerConfig(
        base_model=str(model_dir), base_url=server.base_url, api_key="tml-rollwire-test",
        lora_rank=8, learning_rate=5e-3,
    )  # fmt: skip
    t0 = time.perf_counter()
    trainer = TinkerTrainer(config)
    assert trainer.training_client is not None  # engine loaded, LoRA adapter created
    TIMES["training_client"] = time.perf_counter() - t0
    return trainer


def _sample(sampler: Any, prompt: list[int], seed: int) -> Any:
    # one sample per call, every prompt in one length bucket: each new shape compiles for minutes
    params = types.SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=seed)
    t0 = time.perf_counter()
    (seq,) = sampler.sample(types.ModelInput.from_ints(prompt), 1, params).result().sequences
    TIMES.setdefault("first_sample", time.perf_counter() - t0)
    TIMES["sample"] = time.perf_counter() - t0
    return seq


def _rollouts(sampler: Any, tokenizer: Any) -> list[Group]:
    """Two 2-turn rollouts of one task: the policy samples, a tool answers (masked), it samples
    again. Rewards 1 and 0 make GRPO advantages +0.5 and -0.5."""
    prompt = tokenizer("Question: what is 2+3? Answer:").input_ids
    tool = tokenizer(" [calc: 5]").input_ids
    rollouts = []
    for i in range(2):
        first = _sample(sampler, prompt, seed=i)
        p1 = [*prompt, *first.tokens, *tool]
        second = _sample(sampler, p1, seed=10 + i)
        calls = [
            ModelCall(call_id=f"r{i}-c0", session_id=f"r{i}", index=0, prompt_ids=prompt,
                      completion_ids=first.tokens, logprobs=first.logprobs),
            ModelCall(call_id=f"r{i}-c1", session_id=f"r{i}", index=1, prompt_ids=p1,
                      completion_ids=second.tokens, logprobs=second.logprobs),
        ]  # fmt: skip
        rollouts.append(
            Rollout(
                rollout_id=f"r{i}", group_id="g", status="completed", reward=1.0 - i, calls=calls
            )
        )
    return [Group(group_id="g", rollouts=rollouts)]


def test_two_steps_swap_the_sampler_and_move_the_trained_logprobs(
    trainer: TinkerTrainer, model_dir: Path
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    base = trainer.service_client.create_sampling_client(base_model=str(model_dir))
    built = to_datums(_rollouts(base, tokenizer))
    assert len(built.datums) == 2 and built.advantages == pytest.approx({"r0": 0.5, "r1": -0.5})

    first = trainer.step(built.datums)
    TIMES.update({f"step1_{k}": v for k, v in first.seconds.items()})
    # before any update the trainer's log-probs of the sampled tokens are the sampler's: the
    # datums line each behaviour log-prob up with its own token
    assert first.metrics["logp_diff_mean"] < 0.05, first.metrics
    assert first.policy_version == "tinker-000001" and first.sampling_client is not base
    assert first.trained_tokens == sum(int(d.trained().sum()) for d in built.datums)

    trainer.config.loss_fn = "ppo"
    second = trainer.step(built.datums)
    TIMES.update({f"step2_{k}": v for k, v in second.seconds.items()})
    assert second.policy_version == "tinker-000002"
    assert trainer.sampling_client is second.sampling_client is not first.sampling_client
    # the policy moved after step 1: the same datums are now off-policy, the ratios show it
    assert second.metrics["logp_diff_mean"] > first.metrics["logp_diff_mean"]
    assert "clip_ratio" in second.metrics

    # the new sampler serves the trained weights: the rewarded rollout's sampled tokens became
    # more likely, the unrewarded one's less
    t0 = time.perf_counter()
    moved = []
    for datum in built.datums:
        full = types.ModelInput.from_ints(datum.tokens.tolist())
        scored = second.sampling_client.compute_logprobs(full).result()
        trained = datum.trained()
        # one log-prob per predicted token (the first token has none: SkyRL leaves it out,
        # hosted Tinker sends None)
        now = np.array(scored[len(scored) - trained.shape[0] :], dtype=np.float64)
        moved.append(float((now[trained] - datum.logprobs[trained]).mean()))
    TIMES["compute_logprobs"] = time.perf_counter() - t0
    assert moved[0] > 0 > moved[1], moved


def test_gateway_samples_through_the_tinker_sampler_and_a_sync_swaps_it(
    trainer: TinkerTrainer, server: SkyRLServer, model_dir: Path, tmp_path: Path
) -> None:
    """A ``tinker`` backend in tokens mode: the agent's chat call is sampled by the Tinker
    sampler; a WeightSync to a new checkpoint swaps the sampler, the probe checks it against the
    trainer's own forward pass, and the next call is stamped with the checkpoint's name."""
    import openai

    from rollwire.gateway import serve_in_thread
    from rollwire.trainer.weight_sync import WeightSync
    from rollwire_tinker import tinker_reference

    # tokens mode needs a template whose tool calls the gateway can parse (Hermes, Qwen3-Coder);
    # SmolLM2's own has no tools, so its tokenizer renders with the engine's ChatML + Hermes one
    # (the same <|im_start|>/<|im_end|> turns SmolLM2 was tuned on)
    tok_dir = tmp_path / "tokenizer"
    tok_dir.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(model_dir / name, tok_dir / name)
    shutil.copy(SHIPPED / "chat_template.jinja", tok_dir / "chat_template.jinja")
    spec = {"url": server.base_url, "kind": "tinker", "model": str(model_dir), "tokenizer": str(tok_dir), "name": "tinker"}  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    built = to_datums(_rollouts(trainer.sampling_client, tokenizer))
    with serve_in_thread(backends=[spec]) as gw, gw.client() as c:

        def chat() -> Any:
            h = c.create_session(
                capture="tokens", sampling={"temperature": 0.0, "max_tokens": MAX_TOKENS}
            )
            oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0, timeout=900)
            t0 = time.perf_counter()
            # a short system turn keeps prompt + completion in the 32-token bucket compiled above
            messages = [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
            ]
            oai.chat.completions.create(model="policy", messages=messages)  # type: ignore[arg-type]
            TIMES["gateway_chat"] = time.perf_counter() - t0
            (call,) = c.calls(h.session_id)
            return call

        first = chat()
        assert first.capture == "tokens" and len(first.completion_ids) == len(first.logprobs) > 0
        trainer.config.named_checkpoints = True
        step = trainer.step(built.datums)
        assert step.model_path and step.model_path.startswith("tinker://")
        reference = tinker_reference(trainer.training_client)
        sync = WeightSync(c, reference=reference, probe_tokens=MAX_TOKENS, tolerance=0.05)
        t0 = time.perf_counter()
        report = sync.sync(step.model_path, step.policy_version)
        TIMES["weight_sync"] = time.perf_counter() - t0
        assert [b.verified for b in report.backends] == [True], report.summary()
        after = chat()
        assert after.policy_version == step.policy_version
        assert c.backends()[0]["weight_version"] == step.policy_version
