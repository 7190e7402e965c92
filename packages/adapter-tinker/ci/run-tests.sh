#!/usr/bin/env bash
# Run the Tinker adapter's tests and the SmolLM2 conversion's in .venv-tinker (made by
# setup-venv.sh), including two training steps against SkyRL's real server. Everything runs in a
# network namespace with only loopback up: the server, the engine and the SDK cannot reach out.
# These tests are never silently skipped: a missing venv fails.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
VENV="${ROLLWIRE_TINKER_VENV:-$ROOT/.venv-tinker}"
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "[run-tests] $VENV is missing: run packages/adapter-tinker/ci/setup-venv.sh first" >&2
  exit 1
fi
cd "$ROOT"
# XLA's compiled programs are kept between runs (the first sample compiles for minutes on 2 cores)
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-$HOME/.cache/rollwire/jax}"
export JAX_PLATFORMS=cpu HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
# the converted SmolLM2 folder is cached here once per machine (minutes the first time)
export ROLLWIRE_MODELS_DIR="${ROLLWIRE_MODELS_DIR:-$HOME/.cache/rollwire/models}"
"$VENV/bin/python" -c "import typing, typing_extensions; typing.TypedDict = typing_extensions.TypedDict; import skyrl.tinker.api, tinker, torch"
"$VENV/bin/python" -c "from rollwire.models.smollm2 import convert_smollm2; print('[run-tests] model:', convert_smollm2())"

PYTEST=("$VENV/bin/python" -m pytest -p no:cacheprovider --import-mode=importlib -n 0 -s
  -c "$ROOT/pyproject.toml" --rootdir "$ROOT"
  "$ROOT/tests/models" "$ROOT/packages/adapter-tinker/tests" "$@")
if unshare --net true 2>/dev/null; then
  NETNS=(unshare --net)
elif unshare --net --map-root-user true 2>/dev/null; then
  NETNS=(unshare --net --map-root-user)
else
  echo "[run-tests] cannot make a network namespace (unshare --net): refusing to run SkyRL with network" >&2
  exit 1
fi
exec "${NETNS[@]}" bash -c 'ip link set lo up && exec "$@"' bash "${PYTEST[@]}"
