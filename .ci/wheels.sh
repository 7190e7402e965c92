#!/usr/bin/env bash
# The install a newcomer does, from built artefacts: build every workspace package (sdist + wheel),
# `twine check` them (what PyPI would refuse), install `rollwire[strands]` with plain pip into a
# fresh venv outside the workspace, and run `rollwire demo --agent strands` from an empty folder.
# Then the other extras, and `rollwire plugins --json` says what each adapter can do there.
set -euo pipefail
cd "$(dirname "$0")/.."
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
dist="$scratch/dist"
venv="$scratch/venv"
empty="$scratch/empty"
mkdir -p "$empty"

uv build --all-packages -o "$dist" -q
ls "$dist"
uvx --quiet twine check --strict "$dist"/*

python3 -m venv "$venv"
"$venv/bin/pip" install -q --find-links "$dist" "rollwire[strands]"
cd "$empty"
"$venv/bin/rollwire" --version
# The Strands agent ships inside the installed packages: no repository, no examples/ folder here.
"$venv/bin/rollwire" demo --agent strands --tasks 2 --group-size 2 --out demo | tee demo.txt | tail -n 14
test -s demo/rollouts.jsonl
grep -E "rollouts +│ +4 in 2 groups \(completed 4\)" demo.txt >/dev/null \
  || { echo "every strands demo rollout should complete"; exit 1; }

"$venv/bin/pip" install -q --find-links "$dist" "rollwire[langgraph,slime,rllm]"
# `rollwire[verl]` brings verl + torch: install the adapter alone here (its framework check then
# reports "missing"); the verl venv of .ci/run installs the whole extra.
"$venv/bin/pip" install -q --find-links "$dist" --no-deps rollwire-verl
"$venv/bin/rollwire" plugins --json > plugins.json
"$venv/bin/python" - plugins.json <<'EOF'
import json, sys

state = {p["name"]: p["state"] for p in json.load(open(sys.argv[1]))}
want = {"strands": "ok", "langgraph": "ok", "openai": "ok", "slime": "export only",
        "rllm": "export only", "verl": "missing"}
wrong = {k: (state.get(k), v) for k, v in want.items() if state.get(k) != v}
assert not wrong, f"plugin states (got, want): {wrong}"
assert not any(k.startswith("fixture-") for k in state), state
print("plugins:", state)
EOF
"$venv/bin/rollwire" demo --tasks 2 --group-size 2 --out demo-openai > demo-openai.txt
test -s demo-openai/rollouts.jsonl
grep -E "calls with routed experts +│ +([0-9]+) / \1 " demo-openai.txt >/dev/null \
  || { cat demo-openai.txt; echo "the demo's calls should all carry routed experts"; exit 1; }
grep -E "export for (slime|rllm)" demo-openai.txt
echo "wheels OK"
