"""WeightSync against the embedded engine: new weights pushed through the gateway, verified by
the probe, stamped on the calls after the sync; mismatches and failed pushes taken out, pushed to
again at the next sync, quarantined for good after ``max_failures``."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from rollwire.agent.serving import ServerThread, free_port
from rollwire.engine import EmbeddedEngine, EngineConfig, ModelConfig, TinyModel
from rollwire.engine.hf_export import save_hf
from rollwire.gateway import RunningGateway, serve_in_thread
from rollwire.testing.null_backend import NullBackend
from rollwire.testing.waiting import until
from rollwire.trainer.references import engine_reference
from rollwire.trainer.weight_sync import WeightSync, WeightSyncError


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("weights")
    base = TinyModel(ModelConfig(seed=0))
    a = save_hf(base, root / "a")
    changed = TinyModel(ModelConfig(seed=0))
    rng = np.random.default_rng(1)
    changed.w.lm_head += rng.normal(0, 0.5, changed.w.lm_head.shape).astype(np.float32)
    b = save_hf(changed, root / "b")
    broken = root / "broken"
    shutil.copytree(b, broken)
    (broken / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    return {"a": a, "b": b, "broken": broken}


@pytest.fixture()
def stack(folders: dict[str, Path]) -> Iterator[tuple[EmbeddedEngine, RunningGateway]]:
    cfg = EngineConfig(model_dir=folders["a"], default_max_tokens=8)
    with EmbeddedEngine(cfg) as eng, serve_in_thread(backends=[(eng.url, "vllm")]) as gw:
        yield eng, gw


def _greedy(gw: RunningGateway) -> tuple[list[float], str | None]:
    """One greedy chat call through a fresh session: its log-probs and recorded version."""
    with gw.client() as c:
        h = c.create_session(sampling={"temperature": 0.0, "max_tokens": 6})
        oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
        oai.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
        (call,) = c.calls(h.session_id)
        return [float(x) for x in call.logprobs], call.policy_version


def test_sync_serves_the_new_weights_and_stamps_the_version(
    stack: tuple[EmbeddedEngine, RunningGateway], folders: dict[str, Path]
) -> None:
    _, gw = stack
    with gw.client() as c:
        c.sync_weight_version("v0")
        sync = WeightSync(c, reference=engine_reference(folders["a"]), tolerance=1e-4)
        sync.check()  # the start-up probe: the server serves what the trainer holds
        before, v_before = _greedy(gw)
        report = sync.sync(folders["b"], "v1", reference=engine_reference(folders["b"]))
        assert [b.verified for b in report.backends] == [True]
        assert report.backends[0].max_abs_diff is not None
        assert report.backends[0].max_abs_diff <= 1e-4
        after, v_after = _greedy(gw)
        assert (v_before, v_after) == ("v0", "v1")
        assert not np.allclose(before, after, atol=1e-3)  # the weights really changed
        # the engine started on folder b answers exactly what the synced one does
        cfg = EngineConfig(model_dir=folders["b"], default_max_tokens=8)
        with EmbeddedEngine(cfg) as fresh, serve_in_thread(backends=[(fresh.url, "vllm")]) as gw2:
            fresh_lps, _ = _greedy(gw2)
        np.testing.assert_allclose(after, fresh_lps, atol=1e-5)
        # and the original folder restores the original answers exactly
        sync.sync(folders["a"], "v2", reference=engine_reference(folders["a"]))
        restored, v_restored = _greedy(gw)
        assert v_restored == "v2"
        np.testing.assert_allclose(restored, before, atol=1e-6)
        assert sync.history[-1].summary()["sync/servers_failed"] == 0.0


def test_a_mismatching_server_is_taken_out_and_named(
    stack: tuple[EmbeddedEngine, RunningGateway], folders: dict[str, Path]
) -> None:
    eng, gw = stack
    with gw.client() as c:
        c.sync_weight_version("v0")
        # the trainer believes it pushed folder a; the server loads b: the probe must disagree
        sync = WeightSync(c, reference=engine_reference(folders["a"]), tolerance=1e-4)
        with pytest.raises(WeightSyncError) as err:
            sync.sync(folders["b"], "v1")
        message = str(err.value)
        assert eng.url in message and "differ" in message and "stays paused" in message
        (backend,) = c.backends()
        assert backend["quarantined"] and "differ" in backend["quarantined"]
        assert c.get_policy_version() == "v0"  # never the new label on unverified weights
        assert c.pause_status()["paused"] is True
        c.restore_backend(backend["name"])
        assert c.backends()[0]["quarantined"] is None


def test_a_bad_folder_is_refused_and_the_old_weights_keep_serving(
    stack: tuple[EmbeddedEngine, RunningGateway], folders: dict[str, Path]
) -> None:
    _, gw = stack
    with gw.client() as c:
        before, _ = _greedy(gw)
        sync = WeightSync(c, reference=engine_reference(folders["b"]))
        with pytest.raises(WeightSyncError) as err:
            sync.sync(folders["broken"], "v1")
        assert "push failed" in str(err.value)
        name = c.backends()[0]["name"]
        c.restore_backend(name)
        c.resume()
        after, version = _greedy(gw)
        # the same weights; the second call reads the prompt's KV from the prefix cache, which
        # rounds differently from a fresh prefill in the last float32 digits
        np.testing.assert_allclose(after, before, atol=1e-5)
        assert version != "v1"


def test_a_backend_that_takes_no_weights_is_refused_before_any_step(
    stack: tuple[EmbeddedEngine, RunningGateway], folders: dict[str, Path]
) -> None:
    eng, gw = stack
    with gw.client() as c:
        c.add_backend(eng.url, kind="openai", name="hosted")
        with pytest.raises(ValueError, match=r"hosted .*openai"):
            WeightSync(c, reference=engine_reference(folders["a"])).backends()


def test_a_keep_sync_gives_the_call_in_flight_two_version_spans(
    stack: tuple[EmbeddedEngine, RunningGateway], folders: dict[str, Path]
) -> None:
    """WeightSync(mode="keep"): the gateway does not drain, the engine freezes the call in flight
    between two decode steps, swaps the weights and relabels; the call ends with two spans."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    pytest.importorskip("transformers", reason="tokens mode needs rollwire[tokens]")
    eng, gw = stack
    n = 400
    with gw.client() as c:
        c.sync_weight_version("v0")
        sync = WeightSync(c, reference=engine_reference(folders["b"]), mode="keep")
        h = c.create_session(capture="tokens")
        oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
        steps = eng.engine.scheduler.steps
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(
                lambda: oai.chat.completions.create(
                    model="policy",
                    messages=[{"role": "user", "content": "count"}],
                    max_tokens=n,
                    extra_body={"min_tokens": n},
                )
            )
            deadline = time.monotonic() + 60
            while eng.engine.scheduler.steps < steps + 5:  # the call is decoding
                assert time.monotonic() < deadline
                time.sleep(0.002)
            report = sync.sync(folders["b"], "v1")
            answer.result(timeout=120)
        assert report.backends[0].verified
        (call,) = c.calls(h.session_id)
        spans = call.version_spans()
        assert [s.version for s in spans] == ["v0", "v1"]
        done = len(call.completion_ids)  # the new weights may stop it sooner (a stop string)
        assert spans[0].start == 0 and spans[-1].end == done and spans[0].end == spans[1].start
        assert 0 < spans[0].end < done


def test_a_server_whose_push_failed_is_pushed_to_again_at_the_next_sync(
    stack: tuple[EmbeddedEngine, RunningGateway], folders: dict[str, Path]
) -> None:
    _, gw = stack
    with gw.client() as c:
        c.sync_weight_version("v0")
        sync = WeightSync(c, reference=engine_reference(folders["b"]))
        with pytest.raises(WeightSyncError) as err:
            sync.sync(folders["broken"], "v1")  # the only server: no server verified
        (failed,) = err.value.report.backends
        assert (failed.failures, failed.quarantined) == (1, False)
        assert "the next sync pushes to it again" in str(err.value)
        (backend,) = c.backends()
        assert backend["quarantined"].startswith("unverified: failed weight sync to version 'v1'")
        assert "1 of 3" in backend["quarantined"]
        # the next sync (taking the failed one's pause over) pushes to it again and verifies it
        report = sync.sync(folders["b"], "v2")
        (entry,) = report.backends
        assert entry.retried and entry.verified and entry.failures == 0
        assert report.summary()["sync/servers_retried"] == 1.0
        assert c.backends()[0]["quarantined"] is None  # back in rotation
        assert sync.failures == {}
        _, version = _greedy(gw)
        assert version == "v2"


def test_a_server_that_fails_max_failures_syncs_in_a_row_is_quarantined_for_good(
    stack: tuple[EmbeddedEngine, RunningGateway], folders: dict[str, Path]
) -> None:
    _, gw = stack
    with gw.client() as c:
        sync = WeightSync(c, reference=engine_reference(folders["b"]), max_failures=2)
        for n in (1, 2):
            with pytest.raises(WeightSyncError) as err:
                sync.sync(folders["broken"], f"v{n}")
            assert err.value.report.backends[0].failures == n
        (last,) = err.value.report.backends
        assert last.quarantined and err.value.report.summary()["sync/servers_quarantined"] == 1.0
        assert "quarantined for good after 2 failed syncs" in str(err.value)
        (backend,) = c.backends()
        reason = backend["quarantined"]
        assert not reason.startswith("unverified: "), reason  # no sync retries it now
        assert "2 weight syncs in a row failed" in reason and "push failed" in reason
        with pytest.raises(ValueError, match="no server in rotation"):
            sync.sync(folders["b"], "v3")
        # a person restores it: the next sync pushes to it like to any other
        c.restore_backend(backend["name"])
        assert sync.sync(folders["b"], "v3").backends[0].verified


def test_with_one_of_two_servers_down_the_sync_succeeds_on_the_other_and_names_it(
    folders: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    cfg = EngineConfig(model_dir=folders["a"], default_max_tokens=8)
    port = free_port()  # the second server: nothing listens there yet
    down = f"http://127.0.0.1:{port}"
    with (
        EmbeddedEngine(cfg) as up,
        serve_in_thread(backends=[(up.url, "vllm"), (down, "vllm")]) as gw,
        gw.client() as c,
    ):
        c.sync_weight_version("v0", servers=[up.url])
        sync = WeightSync(c, reference=engine_reference(folders["b"]))
        with caplog.at_level(logging.WARNING, logger="rollwire.weight_sync"):
            report = sync.sync(folders["b"], "v1")  # no WeightSyncError: one server verified
        ok, failed = report.backends
        assert ok.verified and ok.url == up.url
        assert not failed.verified and failed.url == down and "push failed" in str(failed.error)
        assert [b.url for b in report.failed] == [down] and failed.failures == 1
        summary = report.summary()
        assert (summary["sync/servers_verified"], summary["sync/servers_failed"]) == (1.0, 1.0)
        assert report.resumed and c.get_policy_version() == "v1"
        warned = [r.getMessage() for r in caplog.records if r.name == "rollwire.weight_sync"]
        assert any(down in m and "1 of 2 servers failed" in m for m in warned), warned
        reasons = {b["url"]: b["quarantined"] for b in c.backends()}
        assert reasons[up.url] is None and reasons[down].startswith("unverified: ")
        _, version = _greedy(gw)  # served by the verified server
        assert version == "v1"
        # the server comes up: the next sync pushes to it again and both are in rotation
        with EmbeddedEngine(cfg, port=port):
            report = sync.sync(folders["b"], "v2")
            assert [(b.verified, b.retried) for b in report.backends] == [
                (True, False),
                (True, True),
            ]
            assert [b["quarantined"] for b in c.backends()] == [None, None]


def test_a_drain_that_times_out_names_what_it_waited_for_and_resumes(
    folders: dict[str, Path],
) -> None:
    with (
        ServerThread(NullBackend(delay=3.0)) as slow,
        serve_in_thread(backends=[(slow.url, "vllm")]) as gw,
        gw.client() as c,
    ):
        h = c.create_session(session_id="the-slow-call")
        body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
        answer: list[httpx.Response] = []
        call = threading.Thread(
            target=lambda: answer.append(
                httpx.post(f"{h.base_url}/chat/completions", json=body, timeout=60)
            )
        )
        call.start()
        until("the call is in flight", lambda: c.pause_status()["in_flight"] == 1, 30)
        sync = WeightSync(c, verify=False, pause_timeout=0.5)
        with pytest.raises(WeightSyncError) as err:
            sync.sync(folders["b"], "v1")
        message = str(err.value)
        assert "waited 0.5 s (pause_timeout)" in message, message
        assert "1 calls in flight (sessions the-slow-call)" in message
        assert "pause_timeout=" in message and "mode='keep'" in message
        assert "nothing was pushed" in message and "resumed" in message
        assert err.value.report.resumed and c.pause_status()["paused"] is False
        assert c.get_policy_version() != "v1"
        call.join(60)
        assert answer and answer[0].status_code == 200


def test_a_relative_weights_path_reaches_a_server_in_another_folder_absolute(
    folders: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine runs in its own process and working folder; the trainer pushes ``b`` relative
    to its own: the server is sent the absolute path, loads it and is verified."""
    elsewhere = tmp_path / "engine-cwd"
    elsewhere.mkdir()
    port = free_port()
    argv = [sys.executable, "-c", "from rollwire.cli import main; main()", "engine", "serve"]
    argv += ["--port", str(port), "--model-dir", str(folders["a"])]
    proc = subprocess.Popen(
        argv, cwd=elsewhere, env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else proc.returncode
            try:
                return httpx.get(f"{url}/health", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        until("the engine answers /health", ready, 180, interval=0.1)
        monkeypatch.chdir(folders["b"].parent)
        with serve_in_thread(backends=[(url, "vllm")]) as gw, gw.client() as c:
            sync = WeightSync(c, reference=engine_reference(folders["b"]))
            report = sync.sync("b", "v1")  # relative to this process's folder, not the engine's
            assert report.backends[0].verified, report.backends[0].error
            _, version = _greedy(gw)
            assert version == "v1"
    finally:
        proc.kill()
        proc.wait(30)
        if proc.stderr is not None:
            proc.stderr.close()
