"""``benchmarks/gateway.py --backend vllm``: the gateway in front of real vLLM (CPU build).

vLLM runs from its own venv (``tests/vllm/ci/setup-venv.sh`` makes ``.venv-vllm``) and serves the
embedded engine's weights as a Mixtral folder. Requests are short real generations (a 3-message
chat, ``max_tokens`` 8, greedy), so the numbers are vLLM's own speed plus what the gateway adds:
captured calls/s and added latency, beside direct-to-vLLM, round by round. vLLM phones home, so
run the benchmark in a network namespace with only loopback up::

    unshare -rn bash -c 'ip link set lo up; uv run --frozen --offline python benchmarks/gateway.py --backend vllm'
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from _procs import Proc, free_port

ROOT = Path(__file__).resolve().parents[1]


def vllm_body() -> dict[str, Any]:
    """A short chat: vLLM really generates 8 tokens for it."""
    return {
        "model": "rollwire-tiny",  # vLLM's served name; the gateway sends it anyway
        "messages": [
            {"role": "system", "content": "You are a careful assistant."},
            {"role": "user", "content": "Tell me about the weather in Paris today, briefly."},
        ],
        "temperature": 0.0,
        "max_tokens": 8,
    }


def start_vllm(tmp: Path, python: Path) -> tuple[Proc, str]:
    """Write the Mixtral folder and start vLLM on a free port (up to 5 minutes on a busy box)."""
    from rollwire.engine import ModelConfig, TinyModel
    from rollwire.engine.hf_export import save_hf

    model = save_hf(TinyModel(ModelConfig(seed=0)), tmp / "rollwire-tiny-hf")
    port = free_port()
    argv = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", "rollwire-tiny", "--host", "127.0.0.1", "--port", str(port),
        "--enforce-eager", "--enable-scale-out", "--dtype", "float32", "--max-model-len", "2048",
        "--kv-cache-memory-bytes", str(256 * 2**20),
    ]  # fmt: skip
    env = {
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    proc = Proc("vllm", argv, f"http://127.0.0.1:{port}/health", env=env, timeout=300)
    return proc, f"http://127.0.0.1:{port}"


def vllm_phase(args: argparse.Namespace, tmp: Path, procs: list[Proc]) -> list[dict[str, Any]]:
    """Direct vs through the gateway, at each concurrency level, alternating rounds."""
    from gateway import captured_calls, compare, print_rows, rollwire_sessions, start_rollwire

    python = Path(args.vllm_python)
    if not python.exists():
        raise SystemExit(f"{python} is missing: run tests/vllm/ci/setup-venv.sh first")
    t0 = time.monotonic()
    vllm, url = start_vllm(tmp, python)
    procs.append(vllm)
    print(f"vLLM up in {time.monotonic() - t0:.0f} s at {url}")
    rw, rw_url, key = start_rollwire(tmp, url, "rollwire")
    procs.append(rw)
    targets: dict[str, dict[str, Any]] = {
        "direct": {"pid": vllm.pid, "sent": 0},  # straight to vLLM
        "rollwire": {"pid": rw.pid, "sent": 0},  # through the gateway, captured
    }
    hdr = [{"content-type": "application/json"}]

    def urls(c: int) -> dict[str, tuple[list[str], list[dict[str, str]]]]:
        return {
            "direct": ([url + "/v1/chat/completions"], hdr),
            "rollwire": (rollwire_sessions(rw_url, key, c, "bench-vllm"), hdr),
        }

    levels = [int(x) for x in args.concurrency.split(",")]
    body = json.dumps(vllm_body()).encode()
    rows = compare(targets, urls, levels, args.requests, args.rounds, body)
    time.sleep(1.0)
    captured = captured_calls(rw_url, key, "bench-vllm")
    print()
    print_rows(rows)
    print(f"\nrollwire: captured {captured} of {targets['rollwire']['sent']} sent to vLLM")
    return rows
