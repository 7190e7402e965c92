"""Loading and reloading weights: Hugging Face folders read back bit-exactly, vLLM's and SGLang's
reload, pause and cache routes on a live engine, and bad folders refused with the old weights
still serving."""

from __future__ import annotations

import asyncio
import json
import shutil
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from rollwire.engine import EmbeddedEngine, EngineConfig, ModelConfig, TinyModel
from rollwire.engine.hf_export import mixtral_tensors, save_hf, write_safetensors
from rollwire.engine.hf_import import load_hf, read_safetensors
from rollwire.engine.model import WeightsError

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]
LM_HEAD = "lm_head.weight"


# ---------------------------------------------------------------- helpers
def _wait_until(pred: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached before the deadline")
        time.sleep(0.002)


def _generate_body(n: int, rid: str | None = None, prompt: list[int] = PROMPT) -> dict[str, Any]:
    body: dict[str, Any] = {
        "token_ids": prompt,
        "sampling_params": {"max_tokens": n, "temperature": 0, "logprobs": 0, "ignore_eos": True},
    }
    if rid is not None:
        body["request_id"] = rid
    return body


def _greedy(eng: EmbeddedEngine, n: int = 12) -> tuple[list[int], list[float]]:
    """A greedy answer computed from scratch (prefix reuse would change the float rounding)."""
    assert httpx.post(eng.url + "/reset_prefix_cache", timeout=30).status_code == 200
    r = httpx.post(eng.url + "/inference/v1/generate", json=_generate_body(n), timeout=60)
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    return ch["token_ids"], [e["logprob"] for e in ch["logprobs"]["content"]]


def _rpc_reload(eng: EmbeddedEngine, path: Path | str) -> httpx.Response:
    body = {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}
    return httpx.post(eng.url + "/collective_rpc", json=body, timeout=60)


def _write_raw_safetensors(
    path: Path, tensors: dict[str, tuple[str, tuple[int, ...], bytes]]
) -> None:
    """A safetensors file with any dtype label (``write_safetensors`` writes F32 only)."""
    header: dict[str, Any] = {}
    offset, blobs = 0, []
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
        blobs.append(data)
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``orig``: the seed-0 model as a Mixtral folder; ``pert``: the same with ``lm_head``
    perturbed with NumPy (and saved with save_hf)."""
    root = tmp_path_factory.mktemp("hf")
    model = TinyModel(ModelConfig(seed=0))
    orig = save_hf(model, root / "orig")
    changed = load_hf(orig)
    rng = np.random.default_rng(1)
    changed.w.lm_head += rng.standard_normal(changed.w.lm_head.shape).astype(np.float32) * 0.3
    pert = save_hf(changed, root / "pert")
    return {"orig": orig, "pert": pert, "root": root}


@pytest.fixture(scope="module")
def live(folders: dict[str, Path]) -> Iterator[EmbeddedEngine]:
    with EmbeddedEngine(EngineConfig(model_dir=folders["orig"])) as eng:
        yield eng


@pytest.fixture
def served(live: EmbeddedEngine, folders: dict[str, Path]) -> Iterator[EmbeddedEngine]:
    """The live engine, put back on the original weights, version "0" and unpaused after."""
    yield live
    httpx.post(live.url + "/resume", timeout=30)
    assert _rpc_reload(live, folders["orig"]).status_code == 200
    httpx.post(live.url + "/update_weight_version", json={"new_version": "0"}, timeout=30)


# ---------------------------------------------------------------- reading folders
def test_engine_to_hf_to_engine_is_bit_exact(tmp_path: Path) -> None:
    model = TinyModel(ModelConfig(seed=2))
    back = TinyModel.load(save_hf(model, tmp_path / "hf"))  # --model-dir takes both formats
    assert back.w.arrays().keys() == model.w.arrays().keys()
    for name, arr in model.w.arrays().items():
        got = back.w.arrays()[name]
        assert got.dtype == arr.dtype == np.float32 and got.shape == arr.shape, name
        assert got.tobytes() == arr.tobytes(), name
    for field in ("vocab_size", "n_layers", "d_model", "n_heads", "n_experts", "top_k"):
        assert getattr(back.config, field) == getattr(model.config, field), field
    for field in ("expert_hidden", "rope_theta", "max_model_len", "norm_eps"):
        assert getattr(back.config, field) == getattr(model.config, field), field
    assert back.tokenizer.encode("hello world") == model.tokenizer.encode("hello world")
    # and back to HF again: the same bytes on disk
    save_hf(back, tmp_path / "hf2")
    assert (tmp_path / "hf2/model.safetensors").read_bytes() == (
        tmp_path / "hf/model.safetensors"
    ).read_bytes()


def test_a_model_loaded_from_a_folder_saves_its_own_weights(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    # Its tokenizer lives in the source folder: only the tokenizer's files may be copied.
    pert = load_hf(folders["pert"])
    assert pert.w.lm_head.tobytes() != load_hf(folders["orig"]).w.lm_head.tobytes()
    pert.save(tmp_path / "engine")
    assert not list((tmp_path / "engine/tokenizer").glob("*.safetensors"))
    back = TinyModel.load(tmp_path / "engine")
    assert back.w.lm_head.tobytes() == pert.w.lm_head.tobytes()


def test_half_precision_tensors_widen_exactly(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    f32 = rng.standard_normal((3, 4)).astype(np.float32)
    bf16 = (f32.view(np.uint32) >> 16).astype("<u2")  # bfloat16: the top half of a float32
    f16 = f32.astype("<f2")
    _write_raw_safetensors(
        tmp_path / "m.safetensors",
        {"a": ("BF16", (3, 4), bf16.tobytes()), "b": ("F16", (3, 4), f16.tobytes())},
    )
    got = read_safetensors(tmp_path / "m.safetensors")
    assert got["a"].dtype == np.float32 and got["b"].dtype == np.float32
    np.testing.assert_array_equal(got["a"], (bf16.astype(np.uint32) << 16).view(np.float32))
    np.testing.assert_array_equal(got["b"], f16.astype(np.float32))
    assert np.abs(got["a"] - f32).max() < 0.02  # bf16 keeps ~3 significant digits


def test_sharded_folder_with_an_index(tmp_path: Path) -> None:
    model = TinyModel(ModelConfig(seed=4))
    out = save_hf(model, tmp_path / "hf")
    tensors = mixtral_tensors(model)
    (out / "model.safetensors").unlink()
    names = sorted(tensors)
    half = len(names) // 2
    write_safetensors(out / "part-1.safetensors", {k: tensors[k] for k in names[:half]})
    write_safetensors(out / "part-2.safetensors", {k: tensors[k] for k in names[half:]})
    weight_map = {k: "part-1.safetensors" if i < half else "part-2.safetensors"
                  for i, k in enumerate(names)}  # fmt: skip
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    back = load_hf(out)
    for name, arr in model.w.arrays().items():
        assert back.w.arrays()[name].tobytes() == arr.tobytes(), name


# ---------------------------------------------------------------- bad folders
def _bad_folders(orig: Path, root: Path) -> dict[str, tuple[Path, str]]:
    """Broken copies of ``orig`` and a word each refusal must name."""
    model = load_hf(orig)
    tensors = mixtral_tensors(model)
    out: dict[str, tuple[Path, str]] = {}

    def copy(name: str) -> Path:
        dst = root / f"bad-{name}"
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(orig, dst)
        return dst

    missing = "model.layers.1.self_attn.k_proj.weight"
    d = copy("missing")
    write_safetensors(d / "model.safetensors", {k: v for k, v in tensors.items() if k != missing})
    out["missing"] = (d, missing)

    shaped = "model.layers.2.block_sparse_moe.experts.3.w2.weight"
    d = copy("shape")
    write_safetensors(
        d / "model.safetensors", {**tensors, shaped: np.ascontiguousarray(tensors[shaped].T)}
    )
    out["shape"] = (d, shaped)

    d = copy("dtype")
    raw = {k: ("F32", v.shape, v.tobytes()) for k, v in tensors.items()}
    raw["model.norm.weight"] = ("F64", (128,), np.ones(128, np.float64).tobytes())
    _write_raw_safetensors(d / "model.safetensors", raw)
    out["dtype"] = (d, "model.norm.weight")

    d = copy("config")
    (d / "config.json").unlink()
    out["config"] = (d, "config.json")

    d = copy("shape-change")
    save_hf(TinyModel(ModelConfig(d_model=64, n_heads=4)), d)
    out["shape-change"] = (d, "hidden_size")

    out["nowhere"] = (root / "does-not-exist", "does not exist")
    d = root / "bad-engine-format"
    TinyModel(ModelConfig(seed=0)).save(d)
    with np.load(d / "weights.npz") as data:
        arrays = {k: data[k] for k in data.files if k != "router"}
    np.savez(d / "weights.npz", **arrays)
    out["engine-format"] = (d, "router")
    return out


def test_bad_folders_are_refused_and_the_old_weights_keep_serving(
    served: EmbeddedEngine, folders: dict[str, Path]
) -> None:
    before = _greedy(served)
    cases = _bad_folders(folders["orig"], folders["root"])
    for case, (path, word) in cases.items():
        r = _rpc_reload(served, path)
        assert r.status_code == 400, (case, r.text)
        message = r.json()["error"]["message"]
        assert word in message and "old weights keep serving" in message, (case, message)
        s = httpx.post(served.url + "/update_weights_from_disk", json={"model_path": str(path)})
        assert s.status_code == 400, (case, s.text)
        assert s.json()["success"] is False and word in s.json()["message"], (case, s.json())
        assert _greedy(served) == before, case
    with pytest.raises(WeightsError, match="F64"):
        load_hf(cases["dtype"][0])
    assert httpx.get(served.url + "/weight_info").json() == {"weight_version": "0"}


def test_collective_rpc_refuses_what_it_cannot_run(served: EmbeddedEngine) -> None:
    url = served.url + "/collective_rpc"
    r = httpx.post(url, json={"kwargs": {}})
    assert r.status_code == 400 and "Missing 'method'" in r.json()["error"]["message"]
    r = httpx.post(url, json={"method": "update_config"})
    assert r.status_code == 400 and "'update_config'" in r.json()["error"]["message"]
    r = httpx.post(url, json={"method": "reload_weights", "kwargs": {"path": "/x"}})
    assert r.status_code == 400 and "['path']" in r.json()["error"]["message"]


# ---------------------------------------------------------------- reloads change the answers
def test_reload_changes_answers_like_a_fresh_engine_and_back(
    served: EmbeddedEngine, folders: dict[str, Path]
) -> None:
    cache = served.engine.scheduler.prefix_cache
    original = _greedy(served)
    assert len(cache) > 0  # the finished sequence is cached
    r = _rpc_reload(served, folders["pert"])
    assert r.status_code == 200 and r.json() == {"results": [None]}
    assert len(cache) == 0  # a reload drops KV computed with the old weights
    changed = _greedy(served)
    assert changed[1] != original[1]
    with EmbeddedEngine(EngineConfig(model_dir=folders["pert"])) as fresh:
        assert _greedy(fresh) == changed  # ids and log-probs, exactly
    assert _rpc_reload(served, folders["orig"]).status_code == 200
    assert _greedy(served) == original
    assert len(cache) > 0
    r = httpx.post(served.url + "/reset_prefix_cache?reset_running_requests=true")
    assert r.status_code == 200 and r.content == b"" and len(cache) == 0
    # without weights_path, reload_weights reloads what the engine started from (vLLM's rule)
    assert _rpc_reload(served, folders["pert"]).status_code == 200
    r = httpx.post(served.url + "/collective_rpc", json={"method": "reload_weights"})
    assert r.status_code == 200 and _greedy(served) == original


# ---------------------------------------------------------------- pause modes
async def _start(
    client: httpx.AsyncClient, eng: EmbeddedEngine, n: int, rid: str
) -> asyncio.Task[httpx.Response]:
    task = asyncio.create_task(
        client.post(eng.url + "/inference/v1/generate", json=_generate_body(n, rid))
    )
    sched = eng.engine.scheduler
    deadline = time.monotonic() + 30
    while not ((req := sched.find(rid)) is not None and req.output_ids):
        assert time.monotonic() < deadline, f"{rid} never started"
        await asyncio.sleep(0.002)
    return task


def test_pause_abort_aborts_in_flight_and_holds_new_requests(served: EmbeddedEngine) -> None:
    sched = served.engine.scheduler

    async def go() -> None:
        async with httpx.AsyncClient(timeout=60) as c:
            task = await _start(c, served, 4000, "long-abort")
            r = await c.post(served.url + "/pause", params={"mode": "abort"})
            assert r.status_code == 200 and r.json() == {"status": "paused"}
            ch = (await task).json()["choices"][0]
            assert ch["finish_reason"] == "abort" and 0 < len(ch["token_ids"]) < 4000
            assert len(ch["logprobs"]["content"]) == len(ch["token_ids"])
            assert (await c.get(served.url + "/is_paused")).json() == {"is_paused": True}
            held = asyncio.create_task(
                c.post(served.url + "/inference/v1/generate", json=_generate_body(3))
            )
            deadline = time.monotonic() + 30
            while sched.num_held == 0:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.002)
            assert not held.done()
            # A held request aborted during the pause ends at once, with no tokens.
            other = asyncio.create_task(
                c.post(served.url + "/inference/v1/generate", json=_generate_body(3, "held-2"))
            )
            while sched.num_held < 2:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.002)
            r = await c.post(
                served.url + "/inference/v1/abort_requests", json={"request_ids": ["held-2"]}
            )
            assert r.json() == {"aborted": 1}
            gone = (await other).json()["choices"][0]
            assert gone["finish_reason"] == "abort" and gone["token_ids"] == []
            assert sched.num_held == 1 and not held.done()
            assert (await c.post(served.url + "/resume")).json() == {"status": "resumed"}
            done = (await held).json()["choices"][0]
            assert done["finish_reason"] == "length" and len(done["token_ids"]) == 3
            assert (await c.get(served.url + "/is_paused")).json() == {"is_paused": False}

    asyncio.run(go())


def test_pause_wait_returns_once_in_flight_requests_finished(served: EmbeddedEngine) -> None:
    sched = served.engine.scheduler

    async def go() -> None:
        async with httpx.AsyncClient(timeout=60) as c:
            task = await _start(c, served, 300, "long-wait")
            assert sched.find("long-wait") is not None  # still running
            r = await c.post(served.url + "/pause", params={"mode": "wait"})
            assert r.status_code == 200 and sched.num_active == 0
            ch = (await task).json()["choices"][0]
            assert ch["finish_reason"] == "length" and len(ch["token_ids"]) == 300
            await c.post(served.url + "/resume")

    asyncio.run(go())


def test_pause_keep_freezes_and_continues_exactly(served: EmbeddedEngine) -> None:
    sched = served.engine.scheduler
    n = 150
    uninterrupted = _greedy(served, n)

    async def go() -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=60) as c:
            await c.post(served.url + "/reset_prefix_cache")
            task = await _start(c, served, n, "long-keep")
            assert (await c.post(served.url + "/pause", params={"mode": "keep"})).status_code == 200
            req = sched.find("long-keep")
            assert req is not None
            k, steps = len(req.output_ids), sched.steps
            # Two control operations run on the frozen worker's loop: it went round, idle.
            await c.post(served.url + "/reset_prefix_cache")
            await c.post(served.url + "/reset_prefix_cache")
            assert (len(req.output_ids), sched.steps) == (k, steps) and not task.done()
            await c.post(served.url + "/resume")
            return dict((await task).json()["choices"][0])

    ch = asyncio.run(go())
    assert ch["finish_reason"] == "length"
    assert ch["token_ids"] == uninterrupted[0]
    np.testing.assert_allclose(
        [e["logprob"] for e in ch["logprobs"]["content"]], uninterrupted[1], atol=1e-5
    )


def test_keep_pause_reload_and_version_give_two_spans(
    served: EmbeddedEngine, folders: dict[str, Path]
) -> None:
    sched = served.engine.scheduler
    n = 200
    original = _greedy(served, n)

    async def go() -> tuple[int, dict[str, Any]]:
        async with httpx.AsyncClient(timeout=60) as c:
            await c.post(served.url + "/reset_prefix_cache")
            task = await _start(c, served, n, "two-versions")
            assert (await c.post(served.url + "/pause", params={"mode": "keep"})).status_code == 200
            req = sched.find("two-versions")
            assert req is not None
            k = len(req.output_ids)
            body = {"method": "reload_weights", "kwargs": {"weights_path": str(folders["pert"])}}
            assert (await c.post(served.url + "/collective_rpc", json=body)).status_code == 200
            r = await c.post(served.url + "/update_weight_version", json={"new_version": "1"})
            assert r.json() == {
                "success": True,
                "message": "Weight version updated to 1",
                "new_version": "1",
            }
            assert (await c.get(served.url + "/weight_info")).json() == {"weight_version": "1"}
            assert len(req.output_ids) == k  # still frozen
            await c.post(served.url + "/resume")
            return k, (await task).json()

    k, out = asyncio.run(go())
    ch = out["choices"][0]
    assert 0 < k < n and len(ch["token_ids"]) == n
    assert ch["weight_versions"] == [
        {"version": "0", "start": 0, "end": k},
        {"version": "1", "start": k, "end": n},
    ]
    assert out["weight_version"] == "1"
    got = [e["logprob"] for e in ch["logprobs"]["content"]]
    assert ch["token_ids"][:k] == original[0][:k]
    np.testing.assert_allclose(got[:k], original[1][:k], atol=1e-5)
    assert not np.allclose(got[k:], original[1][k : len(got)], atol=1e-3)  # new weights from k on


# ---------------------------------------------------------------- SGLang
def test_sglang_update_weights_from_disk_and_flush_cache(
    served: EmbeddedEngine, folders: dict[str, Path]
) -> None:
    sched = served.engine.scheduler
    original = _greedy(served)
    with EmbeddedEngine(EngineConfig(model_dir=folders["pert"])) as fresh:
        changed = _greedy(fresh)

    async def go() -> None:
        async with httpx.AsyncClient(timeout=60) as c:
            # Not paused: SGLang waits for the request in flight, which ends on the old weights.
            task = await _start(c, served, 200, "sg-inflight")
            body = {"model_path": str(folders["pert"]), "weight_version": "7"}
            r = await c.post(served.url + "/update_weights_from_disk", json=body)
            assert r.status_code == 200, r.text
            assert r.json() == {
                "success": True,
                "message": "Succeeded to update model weights. Weight version updated to 7.",
                "num_paused_requests": 0,
            }
            ch = (await task).json()["choices"][0]
            assert ch["finish_reason"] == "length" and len(ch["token_ids"]) == 200
            assert ch["weight_versions"] == [{"version": "0", "start": 0, "end": 200}]
            assert not sched.paused

    asyncio.run(go())
    assert httpx.get(served.url + "/get_weight_version").json() == {"weight_version": "7"}
    assert _greedy(served) == changed
    g = httpx.post(
        served.url + "/generate",
        json={"input_ids": PROMPT, "return_logprob": True,
              "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}},
    ).json()  # fmt: skip
    assert g["output_ids"] == changed[0] and g["meta_info"]["weight_version"] == "7"
    assert len(sched.prefix_cache) > 0
    for method in ("GET", "POST"):
        r = httpx.request(method, served.url + "/flush_cache")
        assert r.status_code == 200 and r.text.startswith("Cache flushed.")
        assert len(sched.prefix_cache) == 0
    assert _rpc_reload(served, folders["orig"]).status_code == 200
    assert _greedy(served) == original


def test_sglang_reload_during_an_in_place_pause(
    served: EmbeddedEngine, folders: dict[str, Path]
) -> None:
    async def go() -> tuple[dict[str, Any], dict[str, Any]]:
        async with httpx.AsyncClient(timeout=60) as c:
            task = await _start(c, served, 200, "sg-paused")
            r = await c.post(served.url + "/pause_generation", json={"mode": "in_place"})
            assert r.status_code == 200
            body = {"model_path": str(folders["pert"]), "weight_version": "8"}
            update = (await c.post(served.url + "/update_weights_from_disk", json=body)).json()
            assert served.engine.scheduler.paused and not task.done()
            await c.post(served.url + "/continue_generation")
            return update, (await task).json()["choices"][0]

    update, ch = asyncio.run(go())
    assert update["success"] is True and update["num_paused_requests"] == 1
    [first, second] = ch["weight_versions"]  # the swap and the version move together
    assert (first["version"], first["start"], second["version"], second["end"]) == (
        "0",
        0,
        "8",
        200,
    )
    assert first["end"] == second["start"] > 0
