#!/usr/bin/env bash
# Run the real-vLLM test group (tests/vllm) in .venv-vllm, with the repository's pytest config,
# inside a network namespace with only loopback up (vLLM and transformers phone home otherwise).
# Made by setup-venv.sh. These tests are never silently skipped: a missing venv fails here.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
VENV="${ROLLWIRE_VLLM_VENV:-$ROOT/.venv-vllm}"
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "[run-vllm-tests] $VENV is missing: run tests/vllm/ci/setup-venv.sh first" >&2
  exit 1
fi
cd "$ROOT"
"$VENV/bin/python" -c "import torch, vllm" 2>/dev/null || {
  echo "[run-vllm-tests] vllm does not import in $VENV: rerun tests/vllm/ci/setup-venv.sh" >&2
  exit 1
}
export ROLLWIRE_VLLM_ARTIFACTS="${ROLLWIRE_VLLM_ARTIFACTS:-$ROOT/.venv-vllm-artifacts}"
exec unshare --net --map-root-user -- bash -c '
  ip link set lo up
  exec "$0" -m pytest -p no:cacheprovider --import-mode=importlib -n 0 -c "$1/pyproject.toml" \
    --rootdir "$1" "$1/tests/vllm" --durations=10 "${@:2}"
' "$VENV/bin/python" "$ROOT" "$@"
