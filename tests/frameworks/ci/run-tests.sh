#!/usr/bin/env bash
# Run tests/frameworks in .venv-frameworks, with the repository's pytest config, inside a network
# namespace with only loopback up: nothing a framework (or the Claude Code CLI the Claude Agent
# SDK drives) tries to send home can leave the machine. Made by setup-venv.sh. These tests are
# never silently skipped: a missing venv fails here.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
VENV="${ROLLWIRE_FRAMEWORKS_VENV:-$ROOT/.venv-frameworks}"
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "[run-frameworks-tests] $VENV is missing: run tests/frameworks/ci/setup-venv.sh first" >&2
  exit 1
fi
cd "$ROOT"
exec unshare --net --map-root-user -- bash -c '
  ip link set lo up
  exec "$0" -m pytest -p no:cacheprovider --import-mode=importlib -n 2 -c "$1/pyproject.toml" \
    --rootdir "$1" "$1/tests/frameworks" --durations=5 "${@:2}"
' "$VENV/bin/python" "$ROOT" "$@"
