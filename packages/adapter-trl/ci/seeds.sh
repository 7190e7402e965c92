#!/usr/bin/env bash
# The seed-to-seed spread behind test_learning.py's margin: `rollwire train` in the test's
# configuration for each seed given (default 0 1 2 3), then baseline, final and lift per seed.
# Usage: bash packages/adapter-trl/ci/seeds.sh [SEED ...]   (about one test run per seed)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
VENV="${ROLLWIRE_TRL_VENV:-$ROOT/.venv-trl}"
OUT="${ROLLWIRE_SEEDS_OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
SEEDS=("$@")
[[ ${#SEEDS[@]} -eq 0 ]] && SEEDS=(0 1 2 3)
for seed in "${SEEDS[@]}"; do
  echo "[seeds] seed $seed -> $OUT/seed-$seed"
  "$VENV/bin/rollwire" train --out "$OUT/seed-$seed" --seed "$seed" --steps "${ROLLWIRE_SEEDS_STEPS:-40}" --eval-size 32 \
    --eval-k 4 --eval-every 0 --threads 1 --no-progress >"$OUT/seed-$seed.log" 2>&1
done
"$VENV/bin/python" - "$OUT" "${SEEDS[@]}" <<'PY'
import json, sys
out, seeds = sys.argv[1], sys.argv[2:]
print(f"{'seed':>4}  {'baseline':>22}  {'after':>22}  {'lift':>6}")
for s in seeds:
    r = json.load(open(f"{out}/seed-{s}/summary.json"))
    b, f = r["baseline"], r["final"]
    fmt = lambda e: f"{e['pass_at_1']:.3f} [{e['pass_at_1_low']:.3f},{e['pass_at_1_high']:.3f}]"
    print(f"{s:>4}  {fmt(b):>22}  {fmt(f):>22}  {f['pass_at_1'] - b['pass_at_1']:+.3f}")
PY
