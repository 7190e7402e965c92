"""Repository-wide pytest configuration."""

from __future__ import annotations

import importlib.util

# The verl adapter's tests need torch + verl, which the workspace venv deliberately lacks (no
# multi-GB torch in `uv sync`). They run in their own venv: packages/adapter-verl/ci/run-tests.sh,
# which .ci/run calls. Here they are left out of collection rather than skipped one by one.
collect_ignore: list[str] = []
if importlib.util.find_spec("verl") is None or importlib.util.find_spec("torch") is None:
    collect_ignore.append("packages/adapter-verl/tests")
