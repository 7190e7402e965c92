"""The entry module stays light and declares its framework (no torch or verl needed to run these)."""

from __future__ import annotations

import subprocess
import sys

from rollwire.plugins.protocols import TrainerAdapter


def test_import_does_not_load_torch_or_verl() -> None:
    code = (
        "import sys, rollwire_verl\n"
        "heavy = [m for m in ('torch', 'verl', 'tensordict') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert rollwire_verl.adapter.name == 'verl'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_adapter_declares_requirements() -> None:
    import rollwire_verl

    assert isinstance(rollwire_verl.adapter, TrainerAdapter)
    assert rollwire_verl.adapter.requires == ("verl>=0.9.1", "torch>=2.4", "tensordict")


def test_plugin_loader_finds_the_adapter() -> None:
    from rollwire.plugins import discover

    infos = {(p.kind, p.name): p for p in discover()}
    info = infos[("trainers", "verl")]
    assert info.distribution == "rollwire-verl"


def test_agent_loop_yaml_is_shipped() -> None:
    # how verl loads it (OmegaConf + hydra.utils.instantiate) is tested in test_agent_loop.py
    from pathlib import Path

    import rollwire_verl

    assert Path(rollwire_verl.AGENT_LOOP_CONFIG_PATH).is_file()
