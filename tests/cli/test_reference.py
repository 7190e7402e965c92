"""docs/cli.md is generated from the typer app; it and the environment table must not drift."""

from __future__ import annotations

import re
from pathlib import Path

from rollwire.cli.reference import main, render

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "cli.md"


def test_the_checked_in_reference_is_current() -> None:
    assert PAGE.read_text() == render(), (
        "docs/cli.md is stale: uv run python -m rollwire.cli.reference -o docs/cli.md"
    )


def test_check_mode_fails_on_a_stale_page(tmp_path: Path) -> None:
    stale = tmp_path / "cli.md"
    stale.write_text(render().replace("--max-failed", "--max-fail"))
    assert main(["--check", str(stale)]) == 1
    assert main(["-o", str(stale)]) == 0 and main(["--check", str(stale)]) == 0


def _sources() -> list[Path]:
    files = list((REPO / "packages").glob("*/src/**/*.py"))
    return files + list((REPO / "packages").glob("*/ci/*.sh"))


def test_every_environment_variable_in_the_code_is_documented() -> None:
    page = render()
    named: set[str] = set()
    for path in _sources():
        text = path.read_text()
        named |= set(re.findall(r"\bROLLWIRE_[A-Z][A-Z_]*[A-Z]\b", text))
        # the adapters also read ROLLWIRE_<KEY> for each setting key they look up
        for key in re.findall(r"\bpick\(\"(\w+)\"|_setting\(args, \"(\w+)\"", text):
            named.add("ROLLWIRE_" + "".join(key).upper())
    assert len(named) > 15
    missing = sorted(v for v in named if f"`{v}`" not in page)
    assert not missing, f"document these in rollwire.cli.reference.ENVIRONMENT: {missing}"


def test_the_readme_demo_summary_shows_routed_experts() -> None:
    readme = (REPO / "README.md").read_text()
    found = re.search(r"calls with routed experts\s+│\s+(\d+) / (\d+)", readme)
    assert found is not None, "the README's demo summary lost its routed-experts line"
    assert found.group(1) == found.group(2) != "0"
