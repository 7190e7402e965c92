#!/usr/bin/env bash
# Build (or reuse) .venv-verl: a pip venv with CPU torch + verl 0.9.1 for the verl adapter tests.
# torch must never enter the uv workspace venv (.venv); this venv is separate on purpose.
# Idempotent: when the venv already imports everything the tests need, it only reinstalls the
# editable rollwire packages (cheap) and exits.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
VENV="${ROLLWIRE_VERL_VENV:-$ROOT/.venv-verl}"
PY="$VENV/bin/python"
TORCH_VERSION="${ROLLWIRE_TORCH_VERSION:-2.13.0}"
VERL_VERSION="0.9.1"

# verl goes in with --no-deps: its metadata pulls wandb, tensorboard, accelerate, ... that
# DataProto, the agent-loop module, core_algos and the PPO trainer's functions do not import. What
# they do import on CPU is listed here (the same list runs verl's actor worker and FSDP engine
# in-process for rollwire train --trainer verl), within verl 0.9.1's own pins (tensordict <=0.10,
# transformers <5.11); torchdata and peft are what verl.trainer.ppo.ray_trainer needs on import.
RUNTIME_DEPS=(
  "tensordict>=0.8,!=0.9.0,<=0.10.0" "transformers>=5.5.3,!=5.6.0,<5.11" "ray" "omegaconf"
  "hydra-core" "pillow" "codetiming" "datasets" "cachetools" "fastapi" "uvicorn" "numpy" "pandas"
  "pyarrow" "dill" "torchdata" "peft"
)
TEST_DEPS=("pytest>=8.3" "pytest-asyncio>=0.24" "pytest-timeout>=2.3" "pytest-xdist>=3.6" "hypothesis>=6.100"
  "tensorboard>=2.18")  # the metrics-sink test reads the loop's steps back with TensorBoard's reader

log() { printf '[setup-venv] %s\n' "$*"; }
t0=$SECONDS

check_imports() {
  "$PY" - <<'PY' 2>/dev/null
import torch  # noqa
from verl import DataProto  # noqa
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register  # noqa
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage  # noqa
from verl.trainer.ppo.ray_trainer import compute_advantage, compute_response_mask  # noqa
from verl.trainer.ppo.ray_trainer import apply_kl_penalty, RayPPOTrainer  # noqa
# rollwire train --trainer verl: verl's actor worker and its FSDP engine, in-process on the CPU
from verl.workers.engine_workers import ActorRolloutRefWorker  # noqa
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead  # noqa
import pytest, pytest_asyncio, pytest_timeout, xdist, hypothesis  # noqa
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa
PY
}

if [[ ! -x "$PY" ]]; then
  log "creating $VENV"
  python3 -m venv "$VENV"
fi

if check_imports; then
  log "reusing $VENV (torch + verl import fine)"
else
  CONSTRAINTS="$(mktemp)"
  trap 'rm -f "$CONSTRAINTS"' EXIT
  echo "torch==$TORCH_VERSION" >"$CONSTRAINTS"
  log "pip install torch==$TORCH_VERSION (CPU build from the configured find-links)"
  "$PY" -m pip install -q "torch==$TORCH_VERSION"
  log "pip install --no-deps verl==$VERL_VERSION"
  "$PY" -m pip install -q --no-deps "verl==$VERL_VERSION"
  log "pip install -c torch==$TORCH_VERSION ${RUNTIME_DEPS[*]} ${TEST_DEPS[*]}"
  log "(pip then lists verl dependencies left out on purpose: wandb, ...)"
  "$PY" -m pip install -q -c "$CONSTRAINTS" "${RUNTIME_DEPS[@]}" "${TEST_DEPS[@]}"
  if ! check_imports; then
    log "verl still does not import; the error:"
    "$PY" -c "from verl import DataProto; from verl.experimental.agent_loop import AgentLoopBase"
    exit 1
  fi
fi

editable_ok() {
  "$PY" - "$ROOT" <<'PY' 2>/dev/null
import sys, pathlib, rollwire, rollwire_verl, rollwire_langgraph
root = pathlib.Path(sys.argv[1]).resolve()
for mod in (rollwire, rollwire_verl, rollwire_langgraph):
    assert root in pathlib.Path(mod.__file__).resolve().parents, mod.__file__
PY
}

EDITABLES=(-e "$ROOT/packages/core" -e "$ROOT/packages/adapter-verl" -e "$ROOT/packages/agent-langgraph")
if editable_ok; then
  # an editable install's entry points (tasks, trainers, agents) are written when it is made:
  # refresh them, or a task added since stays unknown in a reused venv
  log "rollwire + rollwire-verl installed editable from $ROOT; refreshing their metadata"
  "$PY" -m pip install -q --no-deps "${EDITABLES[@]}"
else
  # agent-langgraph: the vault agent, which the main_ppo recipe's CPU checks run
  log "pip install -c torch==$TORCH_VERSION -e packages/core -e packages/adapter-verl -e packages/agent-langgraph"
  "$PY" -m pip install -q -c <(echo "torch==$TORCH_VERSION") "${EDITABLES[@]}"
fi
log "done in $((SECONDS - t0)) s: $("$PY" -c 'import torch, verl; print("torch", torch.__version__, "verl", verl.__version__)')"
