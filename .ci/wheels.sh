#!/usr/bin/env bash
# Build every workspace wheel and install them with plain pip into a fresh venv outside the
# workspace: proves the published artefacts (not the workspace) work, extras included.
set -euo pipefail
cd "$(dirname "$0")/.."
dist=$(mktemp -d)
venv=$(mktemp -d)/venv
trap 'rm -rf "$dist" "$(dirname "$venv")"' EXIT

uv build --all-packages --wheel -o "$dist" -q
ls "$dist"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --find-links "$dist" "rollwire[strands,langgraph,slime,rllm]"
# `rollwire[verl]` brings verl + torch: install the adapter alone here (its framework check then
# reports "missing"), the verl venv of .ci/run installs the whole extra.
"$venv/bin/pip" install -q --find-links "$dist" --no-deps rollwire-verl
cd "$(dirname "$venv")"
"$venv/bin/rollwire" --version
COLUMNS=200 "$venv/bin/rollwire" plugins | tee plugins.txt
for name in strands langgraph openai slime rllm; do
  grep -E "^│ $name +│.*│ ok" plugins.txt >/dev/null || { echo "plugin $name is not ok"; exit 1; }
done
grep -E "^│ verl +│.*│ missing" plugins.txt >/dev/null || { echo "verl should report its missing framework"; exit 1; }
# The main job works from the wheels alone, outside the repository.
"$venv/bin/rollwire" demo --tasks 2 --group-size 2 --out "$(dirname "$venv")/demo" | tail -n 5
test -s "$(dirname "$venv")/demo/rollouts.jsonl"
echo "wheels OK"
