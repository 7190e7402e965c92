#!/usr/bin/env bash
# Build (or reuse) .venv-frameworks: eight agent frameworks, pinned to the versions
# docs/frameworks.md lists, with the editable rollwire core ([tokens] for tokens capture) and
# pytest, for tests/frameworks. They resolve together into one venv (no torch); it is kept out
# of the uv workspace venv (.venv) on purpose: ~200 packages the workspace does not need.
# Idempotent: a venv that already has every pin only gets the editable core refreshed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
VENV="${ROLLWIRE_FRAMEWORKS_VENV:-$ROOT/.venv-frameworks}"
PY="$VENV/bin/python"
export PATH="$HOME/.local/bin:$PATH"

# crewai 1.15.28 is the newest that resolves with google-adk 2.13 (crewai 1.15.30 needs
# opentelemetry-sdk>=1.45.1, ADK 2.13 caps it at 1.44)
FRAMEWORKS=(
  "pydantic-ai-slim[openai]==2.31.1"
  "smolagents==1.26.0"
  "llama-index-core==0.14.25"
  "llama-index-llms-openai-like==0.8.1"
  "dspy==3.4.1"
  "autogen-agentchat==0.7.5"
  "autogen-ext[openai]==0.7.5"
  "crewai==1.15.28"
  "google-adk==2.13.0"
  "litellm==1.110.2"
  "claude-agent-sdk==0.2.189"
)
TEST_DEPS=("pytest>=8.3" "pytest-asyncio>=0.24" "pytest-timeout>=2.3" "pytest-xdist>=3.6")

log() { printf '[setup-frameworks-venv] %s\n' "$*"; }
t0=$SECONDS

if ! command -v uv >/dev/null 2>&1; then
  python3 -m pip install --quiet --user uv
fi
if [[ ! -x "$PY" ]]; then
  log "creating $VENV"
  # 3.11 where uv finds one, else the python3 on PATH: never a Python downloaded by uv
  PYVER=3.11
  uv python find --no-python-downloads 3.11 >/dev/null 2>&1 || PYVER="$(command -v python3)"
  uv venv -q --no-python-downloads -p "$PYVER" "$VENV"
fi

pinned() {
  "$PY" - "${FRAMEWORKS[@]}" <<'PY' 2>/dev/null
import sys
from importlib import metadata
from packaging.requirements import Requirement
for spec in sys.argv[1:]:
    req = Requirement(spec)
    assert req.specifier.contains(metadata.version(req.name)), spec
import pytest, pytest_asyncio, pytest_timeout, xdist, transformers  # noqa: F401
PY
}

if pinned; then
  log "reusing $VENV (every framework at its pin)"
  uv pip install -q -p "$PY" -e "$ROOT/packages/core[tokens]"
else
  log "uv pip install ${FRAMEWORKS[*]}, rollwire (editable), pytest"
  uv pip install -q -p "$PY" -e "$ROOT/packages/core[tokens]" "${FRAMEWORKS[@]}" "${TEST_DEPS[@]}"
fi
if "$PY" -c "import torch" 2>/dev/null; then
  log "torch got into $VENV, which none of the frameworks here needs: remove the venv and rerun"
  exit 1
fi
log "done in $((SECONDS - t0)) s"
