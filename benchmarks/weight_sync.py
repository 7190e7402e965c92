"""Weight-sync benchmark: one ``WeightSync.sync`` split into pause/drain, push, verify and resume,
and the latency added to agent calls that had to wait for it; medians over N syncs in one run.

    uv run --frozen python benchmarks/weight_sync.py --backend engine --syncs 7
    # real vLLM (CPU build, dev mode) in its venv, a dense Llama built here (tiny) or a folder:
    unshare -rn bash -c 'ip link set lo up; .venv-vllm/bin/python benchmarks/weight_sync.py \
        --backend vllm --syncs 5'
    unshare -rn bash -c 'ip link set lo up; .venv-vllm/bin/python benchmarks/weight_sync.py \
        --backend vllm --model-dir ~/.cache/rollwire/models/smollm2-135m --syncs 5'

Each sync alternates between two folders (the model and a copy whose ``lm_head`` is perturbed),
so every push really changes what the server answers, and the probe verifies each one. While the
syncs run, an agent thread keeps making greedy chat calls through the gateway; a call that
arrived during a sync waited for it, and its latency is reported beside the calls that did not.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def engine_folders(tmp: Path) -> tuple[Path, Path]:
    """The engine's model as a Mixtral folder, and a perturbed copy."""
    import numpy as np

    from rollwire.engine import ModelConfig, TinyModel
    from rollwire.engine.hf_export import save_hf

    a = save_hf(TinyModel(ModelConfig(seed=0)), tmp / "a")
    model = TinyModel(ModelConfig(seed=0))
    model.w.lm_head += (
        np.random.default_rng(1).normal(0, 0.3, model.w.lm_head.shape).astype(np.float32)
    )
    return a, save_hf(model, tmp / "b")


def dense_folders(tmp: Path, model_dir: Path | None) -> tuple[Path, Path]:
    """A dense Llama folder (``model_dir``, or a tiny one with the engine's tokenizer) and a
    perturbed copy, written with transformers."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if model_dir is None:
        from rollwire.engine import ModelConfig, TinyModel

        engine = TinyModel(ModelConfig(seed=0))
        tok = engine.tokenizer
        cfg = LlamaConfig(
            vocab_size=engine.config.vocab_size,
            hidden_size=128,  # head_dim 32: vLLM's CPU attention has no kernel for 16
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=2048,
            tie_word_embeddings=False,
            bos_token_id=None,
            eos_token_id=tok.eos_id,
            pad_token_id=tok.pad_id,
        )
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).float()
        tok_files = [p for p in Path(tok.folder).iterdir() if p.is_file()]
    else:
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        tok_files = [p for p in model_dir.iterdir() if "token" in p.name or p.suffix == ".jinja"]
    out = []
    for name, noise in (("a", 0.0), ("b", 0.05)):
        with torch.no_grad():
            if noise:
                gen = torch.Generator().manual_seed(1)
                w = model.lm_head.weight
                w.add_(torch.randn(w.shape, generator=gen) * noise)
        model.save_pretrained(tmp / name, safe_serialization=True)
        for f in tok_files:
            shutil.copyfile(f, tmp / name / f.name)
        out.append(tmp / name)
    return out[0], out[1]


def start_engine(folder: Path) -> tuple[Any, str]:
    from rollwire.engine import EmbeddedEngine, EngineConfig

    eng = EmbeddedEngine(EngineConfig(model_dir=folder, default_max_tokens=8))
    eng.start()
    return eng, eng.url


def start_vllm(folder: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    env = dict(os.environ)
    env.update(
        VLLM_SERVER_DEV_MODE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_CPU_OMP_THREADS_BIND="nobind",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
    )
    args = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
        "--served-model-name", "bench", "--host", "127.0.0.1", "--port", str(port),
        "--kv-cache-memory-bytes", str(512 * 2**20), "--enforce-eager", "--dtype", "float32",
        "--max-model-len", "2048",
    ]  # fmt: skip
    proc = subprocess.Popen(
        args, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited: {log.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"vLLM did not start in 600 s: {log.read_text()[-3000:]}")


class Agent(threading.Thread):
    """Greedy chat calls through the gateway, one after another, until stopped."""

    def __init__(self, gw_url: str, key: str) -> None:
        super().__init__(daemon=True)
        self.gw_url, self.key = gw_url, key
        self.stop = threading.Event()
        self.calls: list[tuple[float, float]] = []  # (start, end), monotonic

    def run(self) -> None:
        from rollwire.trainer.gateway_client import GatewayClient

        with GatewayClient(self.gw_url, self.key) as c, httpx.Client(timeout=600) as http:
            h = c.create_session(sampling={"temperature": 0.0, "max_tokens": 8})
            while not self.stop.is_set():
                t0 = time.monotonic()
                r = http.post(
                    f"{h.base_url}/chat/completions",
                    json={"model": "policy", "messages": [{"role": "user", "content": "hello"}]},
                )
                r.raise_for_status()
                self.calls.append((t0, time.monotonic()))


def run(args: argparse.Namespace) -> dict[str, Any]:
    from rollwire.gateway import serve_in_thread
    from rollwire.trainer.weight_sync import WeightSync

    tmp = Path(tempfile.mkdtemp(prefix="rollwire-sync-bench-"))
    server: Any = None
    try:
        if args.backend == "engine":
            from rollwire.trainer.references import engine_reference

            a, b = engine_folders(tmp)
            server, url = start_engine(a)
            refs = {a: engine_reference(a), b: engine_reference(b)}
        else:
            from rollwire.trainer.references import transformers_reference

            a, b = dense_folders(tmp, Path(args.model_dir).expanduser() if args.model_dir else None)
            server, url = start_vllm(a, tmp / "vllm.log")
            refs = {a: transformers_reference(a), b: transformers_reference(b)}
        with serve_in_thread(backends=[(url, "vllm")]) as gw, gw.client() as c:
            c.sync_weight_version("v0")
            sync = WeightSync(c, reference=refs[a], tolerance=args.tolerance)
            sync.check()
            agent = Agent(gw.url, gw.admin_key or "")
            agent.start()
            while len(agent.calls) < 2:
                time.sleep(0.05)
            windows: list[tuple[float, float]] = []
            for i in range(1, args.syncs + 1):
                folder = b if i % 2 else a
                t0 = time.monotonic()
                sync.sync(folder, f"v{i}", reference=refs[folder])
                windows.append((t0, time.monotonic()))
                time.sleep(args.gap)
            agent.stop.set()
            agent.join(120)
        reports = sync.history
        waited = [e - s for s, e in agent.calls if any(s < we and e > ws for ws, we in windows)]
        free = [e - s for s, e in agent.calls if not any(s < we and e > ws for ws, we in windows)]

        def med(xs: list[float]) -> float:
            return statistics.median(xs) if xs else float("nan")

        return {
            "backend": args.backend,
            "model": args.model_dir
            or ("engine MoE (tiny)" if args.backend == "engine" else "tiny dense Llama"),
            "syncs": len(reports),
            "pause_ms": 1e3 * med([r.pause_seconds for r in reports]),
            "push_ms": 1e3 * med([r.push_seconds for r in reports]),
            "verify_ms": 1e3 * med([r.verify_seconds for r in reports]),
            "resume_ms": 1e3 * med([r.resume_seconds for r in reports]),
            "total_ms": 1e3 * med([r.total_seconds for r in reports]),
            "max_probe_diff": max(b.max_abs_diff or 0.0 for r in reports for b in r.backends),
            "calls_waited": len(waited),
            "waited_call_ms": 1e3 * med(waited),
            "other_call_ms": 1e3 * med(free),
        }
    finally:
        if isinstance(server, subprocess.Popen):
            os.killpg(server.pid, 15)
            server.wait(60)
        elif server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=["engine", "vllm"], default="engine")
    ap.add_argument("--model-dir", help="a dense Hugging Face folder (vllm only)")
    ap.add_argument("--syncs", type=int, default=7)
    ap.add_argument("--gap", type=float, default=0.3, help="seconds between syncs")
    ap.add_argument("--tolerance", type=float, default=1e-3)
    args = ap.parse_args()
    result = run(args)
    print(json.dumps(result, indent=2))
    print(
        f"\n{result['backend']} ({result['model']}): sync median {result['total_ms']:.0f} ms = "
        f"pause {result['pause_ms']:.0f} + push {result['push_ms']:.0f} + verify "
        f"{result['verify_ms']:.0f} + resume {result['resume_ms']:.0f} over {result['syncs']} "
        f"syncs; calls that waited: {result['calls_waited']}, median {result['waited_call_ms']:.0f}"
        f" ms vs {result['other_call_ms']:.0f} ms for the others"
    )


if __name__ == "__main__":
    main()
