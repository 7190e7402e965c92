#!/usr/bin/env bash
# Routed experts on a GPU: vLLM (CUDA) serves the engine's weights as a Mixtral folder with
# --enable-return-routed-experts; a passthrough and a tokens-mode session go through the gateway
# and the captured routing is checked against transformers' router (check_routed_experts.py).
# On a CPU this cannot run: the flag needs vLLM's model runner v2, which needs Triton's GPU (or
# CPU, not on PyPI) backend. Target: under 10 minutes on one NVIDIA GPU.
#
#   bash benchmarks/gpu/routed_experts.sh            # from the repository root
#
# Environment: VLLM_VERSION (default 0.32.0), WORK (default /tmp/rollwire-gpu), PORT (8011).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WORK="${WORK:-/tmp/rollwire-gpu}"
VENV="$WORK/venv"
MODEL="$WORK/rollwire-tiny"
PORT="${PORT:-8011}"
VLLM_VERSION="${VLLM_VERSION:-0.32.0}"
export PATH="$HOME/.local/bin:$PATH"
t0=$SECONDS
log() { printf '[routed-experts %3ds] %s\n' "$((SECONDS - t0))" "$*"; }

command -v nvidia-smi >/dev/null || { echo "no nvidia-smi: this script needs an NVIDIA GPU" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
command -v uv >/dev/null || python3 -m pip install -q uv
mkdir -p "$WORK"

if [[ ! -x "$VENV/bin/python" ]]; then
  log "venv with vllm==$VLLM_VERSION (CUDA build from PyPI)"
  uv venv -q -p 3.11 "$VENV"
fi
uv pip install -q -p "$VENV/bin/python" "vllm==$VLLM_VERSION" -e "$ROOT/packages/core"

log "the engine's model as a Mixtral folder"
"$VENV/bin/rollwire" engine save-model "$MODEL" --format hf

log "starting vLLM with --enable-return-routed-experts"
VLLM_SERVER_DEV_MODE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 \
  "$VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$MODEL" \
  --served-model-name rollwire-tiny --host 127.0.0.1 --port "$PORT" --dtype float32 \
  --max-model-len 2048 --enable-scale-out --enable-return-routed-experts \
  --gpu-memory-utilization 0.3 >"$WORK/vllm.log" 2>&1 &
VLLM_PID=$!
trap 'kill "$VLLM_PID" 2>/dev/null; wait "$VLLM_PID" 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; then break; fi
  if ! kill -0 "$VLLM_PID" 2>/dev/null; then tail -50 "$WORK/vllm.log"; exit 1; fi
  sleep 1
done
curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || { tail -50 "$WORK/vllm.log"; exit 1; }
log "vLLM up; checking captured routing"
"$VENV/bin/python" "$ROOT/benchmarks/gpu/check_routed_experts.py" \
  --backend "http://127.0.0.1:$PORT" --model "$MODEL"
log "done"
