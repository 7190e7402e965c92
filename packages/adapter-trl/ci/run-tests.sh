#!/usr/bin/env bash
# Run the TRL adapter's tests in .venv-trl (CPU torch + TRL 1.16), with the repository's pytest
# config: the conversion and conformance tests, TRL's importance-sampling path, and the learning
# test (rollwire train on the embedded model beats its own baseline). Made by setup-venv.sh;
# these tests are never silently skipped: a missing venv fails.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
VENV="${ROLLWIRE_TRL_VENV:-$ROOT/.venv-trl}"
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "[run-trl-tests] $VENV is missing: run packages/adapter-trl/ci/setup-venv.sh first" >&2
  exit 1
fi
cd "$ROOT"
# Fail (not skip) when TRL cannot be imported: the tests importorskip it in the workspace venv.
"$VENV/bin/python" -c "import torch, trl; from trl import GRPOTrainer" || {
  echo "[run-trl-tests] TRL does not import in $VENV: rerun packages/adapter-trl/ci/setup-venv.sh" >&2
  exit 1
}
export ROLLWIRE_REQUIRE_TRL=1
exec "$VENV/bin/python" -m pytest -p no:cacheprovider --import-mode=importlib -n 0 \
  -c "$ROOT/pyproject.toml" --rootdir "$ROOT" "$ROOT/packages/adapter-trl/tests" --durations=10 "$@"
