"""Plugin discovery through entry points, proved with the test-only rollwire-fixture-plugin."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

import rollwire_fixture_plugin
from rollwire.cli import app
from rollwire.plugins import PluginError, check_requirements, discover, load_trainer
from rollwire.testing import TrainerAdapterConformance


def _by_name() -> dict[str, object]:
    return {p.name: p for p in discover("trainers")}


def test_import_rollwire_loads_no_adapter() -> None:
    code = (
        "import sys, rollwire, rollwire.plugins, rollwire.data.protocol, rollwire.data.trajectory;"
        "bad=[m for m in sys.modules if m.startswith(('rollwire_', 'verl', 'torch', 'strands',"
        " 'langchain', 'langgraph', 'ray', 'transformers'))]; print(bad); assert not bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_discovery_and_status() -> None:
    found = _by_name()
    ok, missing, old = found["fixture-ok"], found["fixture-missing"], found["fixture-old"]
    assert ok.status == "ok" and ok.distribution == "rollwire-fixture-plugin"  # type: ignore[attr-defined]
    assert missing.status == "missing"  # type: ignore[attr-defined]
    assert "rollwire-no-such-framework is not installed" in missing.detail  # type: ignore[attr-defined]
    assert 'pip install "rollwire[fixture-missing]"' in missing.detail  # type: ignore[attr-defined]
    assert old.status == "incompatible"  # type: ignore[attr-defined]
    assert "numpy" in old.detail and "<1.0 is required" in old.detail  # type: ignore[attr-defined]
    assert "pip install" not in old.detail  # type: ignore[attr-defined]


def test_load_ok_and_missing() -> None:
    assert load_trainer("fixture-ok") is rollwire_fixture_plugin.ok_adapter
    with pytest.raises(PluginError, match=r'pip install "rollwire\[fixture-missing\]"'):
        load_trainer("fixture-missing")
    with pytest.raises(
        PluginError, match=r"no trainer plugin named 'nope'.*installed: .*fixture-ok"
    ):
        load_trainer("nope")


def test_disable_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLWIRE_DISABLED_PLUGINS", "fixture-ok, fixture-old")
    found = _by_name()
    assert found["fixture-ok"].status == "disabled"  # type: ignore[attr-defined]
    assert found["fixture-old"].status == "disabled"  # type: ignore[attr-defined]
    with pytest.raises(PluginError, match="disabled"):
        load_trainer("fixture-ok")


def test_duplicate_names_are_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib import metadata

    import rollwire.plugins.registry as plugins

    real = list(metadata.entry_points(group="rollwire.trainers"))
    ok = next(ep for ep in real if ep.name == "fixture-ok")
    other_dist = next(ep for ep in real if ep.name == "verl").dist

    class FakeEP:
        name, value, group, dist = ok.name, ok.value, ok.group, other_dist

    monkeypatch.setattr(plugins.metadata, "entry_points", lambda group: [ok, FakeEP()])
    with pytest.raises(PluginError, match="rollwire-fixture-plugin and rollwire-verl"):
        discover("trainers")


def test_check_requirements() -> None:
    assert check_requirements(["numpy>=1"]) == []
    assert "invalid requirement" in check_requirements(["not a req!!"])[0]
    assert check_requirements(["numpy>=1; python_version < '3'"]) == []


def test_cli_plugins_and_version() -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and "rollwire 0.1.0" in res.output
    res = runner.invoke(app, ["plugins"], env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    assert "fixture-ok" in res.output and "fixture-missing" in res.output
    assert "rollwire[fixture-missing]" in res.output


class TestFixtureAdapterConformance(TrainerAdapterConformance):
    """The conformance suite on the fixture plugin: proves the suite itself runs."""

    @pytest.fixture
    def adapter(self):  # type: ignore[no-untyped-def]
        return rollwire_fixture_plugin.ok_adapter
