#!/usr/bin/env bash
# Build (or reuse) the venvs of tests/hubs, the environment standards as rollwire tasks:
# - .venv-hubs (Python 3.11): CPU torch + TRL 1.16 (rollwire train), verifiers and openenv-core,
#   the editable rollwire core and TRL adapter, pytest;
# - .venv-hubs-nemo-gym (Python 3.12, which nemo-gym needs): nemo-gym and the editable rollwire
#   core, for the NeMo Gym servers of examples/hubs/nemo_gym_vault.py (no torch).
# verifiers needs openai < 3 and nemo-gym Python >= 3.12, so neither goes into .venv-trl. torch
# never enters the workspace venv. Idempotent: venvs that import everything only get the
# editable rollwire packages refreshed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
VENV="${ROLLWIRE_HUBS_VENV:-$ROOT/.venv-hubs}"
NEMO_VENV="${ROLLWIRE_NEMO_GYM_VENV:-$ROOT/.venv-hubs-nemo-gym}"
TORCH_VERSION="${ROLLWIRE_TORCH_VERSION:-2.13.0}"
VERIFIERS_VERSION="0.4.0"
OPENENV_VERSION="0.3.0"
NEMO_GYM_VERSION="0.4.0"
export PATH="$HOME/.local/bin:$PATH"

log() { printf '[setup-hubs-venv] %s\n' "$*"; }
t0=$SECONDS

if ! command -v uv >/dev/null 2>&1; then
  python3 -m pip install --quiet --user uv
fi

check_hubs() {
  "$VENV/bin/python" - "$VERIFIERS_VERSION" "$OPENENV_VERSION" <<'PY' 2>/dev/null
import sys
import torch, trl, safetensors  # noqa
import verifiers.v1, openenv.core.mcp_client, fastmcp  # noqa
import pytest, pytest_asyncio, pytest_timeout, xdist  # noqa
import rollwire, rollwire_trl  # noqa
from importlib import metadata
assert torch.__version__.endswith("+cpu"), torch.__version__
assert trl.__version__.startswith("1.16"), trl.__version__
assert metadata.version("verifiers") == sys.argv[1], metadata.version("verifiers")
assert metadata.version("openenv-core") == sys.argv[2], metadata.version("openenv-core")
PY
}

check_nemo() {
  "$NEMO_VENV/bin/python" - "$NEMO_GYM_VERSION" <<'PY' 2>/dev/null
import sys
import nemo_gym.base_resources_server, nemo_gym.base_responses_api_agent  # noqa
import rollwire.envs.vault  # noqa
from importlib import metadata
assert metadata.version("nemo-gym") == sys.argv[1], metadata.version("nemo-gym")
PY
}

# -- .venv-hubs -------------------------------------------------------------------------------
if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating $VENV"
  # 3.11 where uv finds one (the CPU torch wheel on disk is cp311), never a downloaded Python
  PYVER=3.11
  uv python find --no-python-downloads 3.11 >/dev/null 2>&1 || PYVER="$(command -v python3)"
  uv venv -q --no-python-downloads -p "$PYVER" "$VENV"
fi
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
# keeps every resolver step on the CPU wheel (trl -> accelerate -> torch would pull CUDA's)
echo "torch==$TORCH_VERSION+cpu" >"$CONSTRAINTS"
FIND_LINKS=()
[[ -n "${PIP_FIND_LINKS:-}" ]] && FIND_LINKS=(--find-links "$PIP_FIND_LINKS")
INDEX=()
[[ -z "${PIP_FIND_LINKS:-}" ]] && INDEX=(--extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match)
EDITABLES=(-e "$ROOT/packages/core" -e "$ROOT/packages/adapter-trl")
if check_hubs; then
  log "reusing $VENV"
  uv pip install -q -p "$VENV/bin/python" -c "$CONSTRAINTS" "${FIND_LINKS[@]}" "${INDEX[@]}" "${EDITABLES[@]}"
else
  log "uv pip install torch==$TORCH_VERSION+cpu, trl 1.16, verifiers==$VERIFIERS_VERSION, openenv-core==$OPENENV_VERSION, rollwire (editable), pytest"
  uv pip install -q -p "$VENV/bin/python" -c "$CONSTRAINTS" "${FIND_LINKS[@]}" "${INDEX[@]}" \
    "torch==$TORCH_VERSION+cpu" "trl>=1.16,<1.17" "transformers>=4.56" "peft>=0.13" \
    "verifiers==$VERIFIERS_VERSION" "openenv-core==$OPENENV_VERSION" "${EDITABLES[@]}" \
    "pytest>=8.3" "pytest-asyncio>=0.24" "pytest-timeout>=2.3" "pytest-xdist>=3.6" "hypothesis>=6.100"
  check_hubs || { log "$VENV does not import everything:"; "$VENV/bin/python" -c "import torch, trl, verifiers.v1, openenv.core.mcp_client, rollwire_trl"; exit 1; }
fi

# -- .venv-hubs-nemo-gym ----------------------------------------------------------------------
if [[ ! -x "$NEMO_VENV/bin/python" ]]; then
  log "creating $NEMO_VENV (Python 3.12: nemo-gym needs >= 3.12)"
  PY312="$(uv python find --no-python-downloads 3.12 2>/dev/null || true)"
  [[ -z "$PY312" && -x "$HOME/.pyenv/versions/3.12.1/bin/python3.12" ]] && PY312="$HOME/.pyenv/versions/3.12.1/bin/python3.12"
  if [[ -z "$PY312" ]]; then
    log "no Python 3.12 on this machine (uv python find 3.12): NeMo Gym cannot be installed"
    exit 1
  fi
  uv venv -q --no-python-downloads -p "$PY312" "$NEMO_VENV"
fi
if check_nemo; then
  log "reusing $NEMO_VENV"
  uv pip install -q -p "$NEMO_VENV/bin/python" -e "$ROOT/packages/core"
else
  log "uv pip install nemo-gym==$NEMO_GYM_VERSION, rollwire (editable) into $NEMO_VENV"
  uv pip install -q -p "$NEMO_VENV/bin/python" "nemo-gym==$NEMO_GYM_VERSION" -e "$ROOT/packages/core"
  check_nemo || { log "$NEMO_VENV does not import NeMo Gym:"; "$NEMO_VENV/bin/python" -c "import nemo_gym.base_resources_server"; exit 1; }
fi
log "done in $((SECONDS - t0)) s: verifiers $VERIFIERS_VERSION, openenv-core $OPENENV_VERSION, nemo-gym $NEMO_GYM_VERSION"
