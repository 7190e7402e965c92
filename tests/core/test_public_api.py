"""The package root re-exports the public API lazily: agent containers import little."""

from __future__ import annotations

import subprocess
import sys

import rollwire


def test_every_export_resolves() -> None:
    assert set(rollwire.__all__) == {*rollwire._EXPORTS, "__version__"}
    for name in rollwire.__all__:
        assert getattr(rollwire, name) is not None


def test_agent_side_import_is_light() -> None:
    code = (
        "import sys, rollwire; rollwire.RolloutApp; rollwire.openai_client;"
        "heavy=[m for m in ('numpy','rollwire.gateway','rollwire.engine','rollwire.store')"
        " if m in sys.modules]; print(heavy); assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
