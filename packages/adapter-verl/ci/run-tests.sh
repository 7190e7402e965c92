#!/usr/bin/env bash
# Run the verl adapter's tests in .venv-verl (CPU torch + verl), with the repository's pytest
# config. Made by setup-venv.sh; these tests are never silently skipped: a missing venv fails.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
VENV="${ROLLWIRE_VERL_VENV:-$ROOT/.venv-verl}"
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "[run-tests] $VENV is missing: run packages/adapter-verl/ci/setup-venv.sh first" >&2
  exit 1
fi
cd "$ROOT"
# Fail (not skip) when verl cannot be imported: the tests importorskip it for the workspace venv.
"$VENV/bin/python" -c "import torch, verl; from verl import DataProto"
exec "$VENV/bin/python" -m pytest -p no:cacheprovider --import-mode=importlib -n 0 \
  -c "$ROOT/pyproject.toml" --rootdir "$ROOT" "$ROOT/packages/adapter-verl/tests" "$@"
