#!/usr/bin/env bash
# Run tests/hubs (OpenEnv, verifiers and NeMo Gym environments as rollwire tasks, and trained)
# in .venv-hubs, with the NeMo Gym servers on .venv-hubs-nemo-gym's Python, inside a network
# namespace with only loopback up. Made by setup-venv.sh; a missing venv fails (never a skip).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
VENV="${ROLLWIRE_HUBS_VENV:-$ROOT/.venv-hubs}"
NEMO_VENV="${ROLLWIRE_NEMO_GYM_VENV:-$ROOT/.venv-hubs-nemo-gym}"
for py in "$VENV/bin/python" "$NEMO_VENV/bin/python"; do
  if [[ ! -x "$py" ]]; then
    echo "[run-hubs-tests] $py is missing: run tests/hubs/ci/setup-venv.sh first" >&2
    exit 1
  fi
done
"$VENV/bin/python" -c "import torch, trl, verifiers.v1, openenv.core.mcp_client" || {
  echo "[run-hubs-tests] $VENV does not import the frameworks: rerun tests/hubs/ci/setup-venv.sh" >&2
  exit 1
}
cd "$ROOT"
export ROLLWIRE_NEMO_GYM_PYTHON="$NEMO_VENV/bin/python"
NET=(unshare --net --map-root-user --)
if ! unshare --net --map-root-user -- true 2>/dev/null; then
  echo "[run-hubs-tests] no network namespace here: running with the network, loopback-only by design" >&2
  NET=()
fi
exec "${NET[@]}" bash -c '
  ip link set lo up 2>/dev/null || true
  exec "$0" -m pytest -p no:cacheprovider --import-mode=importlib -n 0 -c "$1/pyproject.toml" \
    --rootdir "$1" "$1/tests/hubs" --durations=10 "${@:2}"
' "$VENV/bin/python" "$ROOT" "$@"
