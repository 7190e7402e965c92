"""The drop-ins stay as light as the agent side: importing them pulls no gateway, store, engine or
NumPy, and none of the packages they stand in for (an agent container need not install those)."""

from __future__ import annotations

import subprocess
import sys


def test_compat_modules_import_light() -> None:
    code = (
        "import sys\n"
        "import rollwire.compat.agentcore_rl_toolkit, rollwire.compat.bedrock_agentcore\n"
        "import rollwire.compat.sagemaker\n"
        "heavy = ['numpy', 'rollwire.gateway', 'rollwire.store', 'rollwire.engine',\n"
        "         'rollwire.trainer', 'bedrock_agentcore', 'agentcore_rl_toolkit', 'sagemaker',\n"
        "         'boto3']\n"
        "print(','.join(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "", f"imported at import time: {out.stdout.strip()}"
