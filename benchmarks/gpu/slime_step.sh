#!/usr/bin/env bash
# One real slime training step (Megatron + SGLang, colocated on one GPU) on rollwire's rollouts:
# slime's own train.py with rollwire_slime's hooks, Qwen2.5-0.5B-Instruct, one rollout of
# 2 prompts x 4 samples from rollwire's mixed-batch agent (clean, forked, failed, no-call), GRPO
# with --use-tis. Then slime_step.py checks slime's debug dumps: the samples rollwire handed over,
# and the actor's train data (removed rows train nothing; Megatron's log-probs of the response
# tokens agree with the ones rollwire captured from SGLang). What the CPU contract tests
# (packages/adapter-slime/tests/test_slime_recorded_contract.py) cannot run: Megatron's forward
# and backward, SGLang's generation and weight push, Ray. Target: under 15 minutes on one GPU.
#
# Run it inside slime's image (Megatron-LM, SGLang, Ray, slime's dependencies), e.g.
#   docker run --gpus all --ipc=host --shm-size=16g -v "$PWD":/rollwire -it slimerl/slime:latest
#   bash /rollwire/benchmarks/gpu/slime_step.sh
#
# Environment (what to set):
#   SLIME_DIR      a slime checkout (default /root/slime); the CI contract was recorded at the
#                  commit named in packages/adapter-slime/tests/data/slime_contract.json
#   MEGATRON_DIR   Megatron-LM for PYTHONPATH (default /root/Megatron-LM, where the image has it)
#   HF_MODEL       the HF checkpoint (default $WORK/Qwen2.5-0.5B-Instruct; this machine cannot
#                  download it: copy it there, or point at a local folder)
#   WORK           scratch (default /tmp/rollwire-slime): the torch_dist checkpoint, prompts, dumps
#   MAX_LOGPROB_DIFF  the check's bound on mean |Megatron - SGLang| log-prob (default 0.1)
#   DRY_RUN=1      print slime's command line and stop (no GPU needed)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SLIME_DIR="${SLIME_DIR:-/root/slime}"
MEGATRON_DIR="${MEGATRON_DIR:-/root/Megatron-LM}"
WORK="${WORK:-/tmp/rollwire-slime}"
HF_MODEL="${HF_MODEL:-$WORK/Qwen2.5-0.5B-Instruct}"
DIST_MODEL="$WORK/$(basename "$HF_MODEL")_torch_dist"
PYTHON="${PYTHON:-python3}"
t0=$SECONDS
log() { printf '[slime-step %3ds] %s\n' "$((SECONDS - t0))" "$*"; }

# Qwen2.5-0.5B's shape, as slime's scripts/models/qwen2.5-0.5B.sh gives it to Megatron
MODEL_ARGS=(
  --swiglu --num-layers 24 --hidden-size 896 --ffn-hidden-size 4864
  --num-attention-heads 14 --use-rotary-position-embeddings --disable-bias-linear
  --add-qkv-bias --normalization RMSNorm --norm-epsilon 1e-6 --rotary-base 1000000
  --group-query-attention --num-query-groups 2 --vocab-size 151936
)
# one rollout step of 2 prompts x 4 samples = 8 rollouts = one training step
# (--num-steps-per-rollout 1: slime's global batch is 8 rollouts, however many rows they fork into)
ROLLOUT_ARGS=(
  --prompt-data "$WORK/prompts.jsonl" --input-key prompt --label-key label
  --num-rollout 1 --rollout-batch-size 2 --n-samples-per-prompt 4 --num-steps-per-rollout 1
  --rollout-max-response-len 128 --rollout-temperature 1.0
)
# the hooks: rollwire runs the whole batch (flat [group][sample] Samples), generate serves
# evaluation, normalize_rewards counts a forked rollout once per group
ROLLWIRE_ARGS=(
  --rollout-function-path rollwire_slime.generate_rollout
  --custom-generate-function-path rollwire_slime.generate
  --custom-reward-post-process-path rollwire_slime.normalize_rewards
)
# GRPO with truncated importance sampling against rollwire's captured log-probs
GRPO_ARGS=(
  --advantage-estimator grpo --eps-clip 0.2 --eps-clip-high 0.28 --entropy-coef 0.0
  --use-tis --tis-clip 2.0 --tis-clip-low 0
)
TRAIN_ARGS=(
  --actor-num-nodes 1 --actor-num-gpus-per-node 1 --colocate
  --rollout-num-gpus-per-engine 1 --sglang-mem-fraction-static 0.4
  --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1
  --context-parallel-size 1 --expert-model-parallel-size 1 --expert-tensor-parallel-size 1
  --use-dynamic-batch-size --max-tokens-per-gpu 4096
  --optimizer adam --lr 1e-6 --lr-decay-style constant --weight-decay 0.1
  --adam-beta1 0.9 --adam-beta2 0.98
  --attention-dropout 0.0 --hidden-dropout 0.0 --accumulate-allreduce-grads-in-fp32
  --attention-softmax-in-fp32 --attention-backend flash
)
CKPT_ARGS=(
  --hf-checkpoint "$HF_MODEL" --ref-load "$DIST_MODEL"
  --save "$WORK/save" --save-interval 9999
  --save-debug-rollout-data "$WORK/dump/rollout_{rollout_id}.pt"
  --save-debug-train-data "$WORK/dump/train_{rollout_id}.pt"
)
SLIME_ARGS=("${MODEL_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${ROLLWIRE_ARGS[@]}" "${GRPO_ARGS[@]}"
  "${TRAIN_ARGS[@]}" "${CKPT_ARGS[@]}")

if [[ "${DRY_RUN:-0}" == 1 ]]; then
  printf '%q ' "$PYTHON" "$SLIME_DIR/train.py" "${SLIME_ARGS[@]}"
  echo
  exit 0
fi

command -v nvidia-smi >/dev/null || { echo "no nvidia-smi: this script needs an NVIDIA GPU" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
[[ -f "$SLIME_DIR/train.py" ]] || { echo "no slime checkout at SLIME_DIR=$SLIME_DIR" >&2; exit 2; }
[[ -f "$HF_MODEL/config.json" ]] || { echo "no HF checkpoint at HF_MODEL=$HF_MODEL" >&2; exit 2; }
mkdir -p "$WORK/dump"
rm -f "$WORK"/dump/*.pt

log "rollwire into slime's environment (pytest: rollwire.testing's mixed-batch agent)"
"$PYTHON" -m pip install -q -e "$ROOT/packages/core" -e "$ROOT/packages/adapter-slime" pytest
"$PYTHON" "$ROOT/benchmarks/gpu/slime_step.py" prompts "$WORK/prompts.jsonl" --n 8

if [[ ! -d "$DIST_MODEL" ]]; then
  log "converting $HF_MODEL to Megatron's torch_dist"
  (cd "$SLIME_DIR" && PYTHONPATH="$MEGATRON_DIR" "$PYTHON" tools/convert_hf_to_torch_dist.py \
    "${MODEL_ARGS[@]}" --hf-checkpoint "$HF_MODEL" --save "$DIST_MODEL")
fi

log "one slime step (ray job; the hooks run in slime's rollout actor)"
ray stop --force >/dev/null 2>&1 || true
ray start --head --node-ip-address 127.0.0.1 --num-gpus 1 --disable-usage-stats >/dev/null
trap 'ray stop --force >/dev/null 2>&1 || true' EXIT
# ROLLWIRE_* reach the rollout actor through the job's runtime env; the gateway starts in-process
# over slime's SGLang router, in tokens mode with --hf-checkpoint's tokenizer
RUNTIME_ENV=$(cat <<EOF
{"env_vars": {
  "PYTHONPATH": "$MEGATRON_DIR:$SLIME_DIR:$ROOT/benchmarks/gpu",
  "CUDA_DEVICE_MAX_CONNECTIONS": "1",
  "ROLLWIRE_AGENT": "slime_step:agent",
  "ROLLWIRE_CAPTURE": "tokens",
  "ROLLWIRE_DEADLINE": "300"
}}
EOF
)
ray job submit --address=http://127.0.0.1:8265 --runtime-env-json="$RUNTIME_ENV" \
  -- "$PYTHON" "$SLIME_DIR/train.py" "${SLIME_ARGS[@]}" 2>&1 | tee "$WORK/train.log"

log "checking slime's dumps"
"$PYTHON" "$ROOT/benchmarks/gpu/slime_step.py" check \
  --rollout "$WORK/dump/rollout_0.pt" --train "$WORK/dump/train_0.pt" \
  --max-logprob-diff "${MAX_LOGPROB_DIFF:-0.1}"
grep -E "train/(pg_loss|tis|ois|train_rollout_logprob_abs_diff)" "$WORK/train.log" | tail -5 || true
log "done"
