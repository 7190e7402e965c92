"""WeightSync's adapter path against real engines over loopback HTTP: each version's LoRA adapter
loaded as ``policy@<version>``, verified by a probe that names it, the gateway's calls served by
it and captured with its version, the versions ``max_staleness`` no longer allows unloaded, every
gateway on the store routing alike; an adapter that never arrived (the load answers success, the
base keeps answering) is caught and its server taken out of rotation."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rollwire.engine import EmbeddedEngine, EngineConfig, FaultConfig, ModelConfig, TinyModel
from rollwire.engine.hf_export import save_hf
from rollwire.gateway import RunningGateway, serve_in_thread
from rollwire.testing.calls import greedy_call, served_models
from rollwire.testing.lora_adapters import merged_folder, random_adapter
from rollwire.testing.redis_server import RedisServer
from rollwire.testing.store import redis_server
from rollwire.trainer.references import engine_reference
from rollwire.trainer.weight_sync import WeightSync, WeightSyncError

__all__ = ["redis_server"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora-sync")
    base = save_hf(TinyModel(ModelConfig(seed=0)), root / "base")
    out = {"base": base}
    for v in (1, 2, 3):
        out[f"a{v}"] = random_adapter(base, root / f"adapter-{v}", seed=v)
        out[f"m{v}"] = merged_folder(base, out[f"a{v}"], root / f"merged-{v}")
    return out


@pytest.fixture()
def stack(folders: dict[str, Path]) -> Iterator[tuple[EmbeddedEngine, RunningGateway]]:
    cfg = EngineConfig(model_dir=folders["base"], default_max_tokens=8)
    with EmbeddedEngine(cfg) as eng, serve_in_thread(backends=[(eng.url, "vllm")]) as gw:
        yield eng, gw


def test_each_adapter_is_verified_served_and_the_stale_ones_unloaded(
    stack: tuple[EmbeddedEngine, RunningGateway], folders: dict[str, Path]
) -> None:
    eng, gw = stack
    with gw.client() as c:
        sync = WeightSync(c, reference=engine_reference(folders["base"]), tolerance=1e-4,
                          max_staleness=1)  # fmt: skip
        sync.sync(folders["base"], "0", seq=0)  # the base, as the loop starts
        for v in (1, 2, 3):
            ref = engine_reference(folders[f"m{v}"])
            report = sync.sync(folders[f"a{v}"], str(v), reference=ref, seq=v, kind="adapter")
            (entry,) = report.backends
            assert entry.verified and entry.max_abs_diff is not None and entry.max_abs_diff < 1e-4
            assert report.adapter == f"policy@{v}" and report.kind == "adapter"
            summary = report.summary()
            assert summary["sync/adapter"] == 1.0 and summary["sync/load_s"] > 0.0
            assert summary["sync/load_s"] + summary["sync/transfer_s"] == pytest.approx(
                report.push_seconds
            )
            prompt, completion, lps, version = greedy_call(gw)
            assert version == str(v)  # the adapter's version, captured with the call
            expected = ref(prompt, completion)  # the call was served by that adapter
            np.testing.assert_allclose(lps, expected, atol=1e-4)
        # max_staleness 1: versions 2 and 3 stay loaded, version 1 was unloaded
        assert served_models(eng.url) == ["rollwire-tiny", "policy@2", "policy@3"]
        (backend,) = c.backends()
        assert backend["adapter"] == "policy@3" and backend["model"] == "policy@3"
        assert [(a["name"], a["seq"]) for a in backend["adapters"]] == [
            ("policy@2", 2),
            ("policy@3", 3),
        ]
        # a full sync makes the folder the policy again: calls name the base
        sync.sync(folders["m3"], "4", reference=engine_reference(folders["m3"]), seq=4)
        assert c.backends()[0]["adapter"] is None
        assert greedy_call(gw)[3] == "4"


def test_a_retried_version_is_loaded_afresh_and_max_staleness_0_keeps_one(
    stack: tuple[EmbeddedEngine, RunningGateway], folders: dict[str, Path]
) -> None:
    eng, gw = stack
    with gw.client() as c:
        sync = WeightSync(c, reference=engine_reference(folders["m1"]), tolerance=1e-4)
        sync.sync(folders["a1"], "1", kind="adapter")  # seq: one more than the gateway's
        again = sync.sync(folders["a1"], "1", kind="adapter")  # the same version again
        assert "sync/probe_before_max_abs_diff" not in again.summary()  # off by default
        sync.probe_before = True
        report = sync.sync(
            folders["a2"], "2", reference=engine_reference(folders["m2"]), kind="adapter"
        )
        (entry,) = report.backends
        assert entry.verified and entry.max_abs_diff is not None and entry.max_abs_diff < 1e-4
        # before the push the server served adapter 1, which the new reference is far from
        assert entry.before_max_abs_diff is not None and entry.before_max_abs_diff > 1e-2
        assert report.summary()["sync/probe_before_max_abs_diff"] == entry.before_max_abs_diff
        assert served_models(eng.url) == ["rollwire-tiny", "policy@2"]
        assert c.staleness()["policy_seq"] == 2


def test_an_adapter_that_never_arrived_is_caught_and_its_server_taken_out(
    folders: dict[str, Path],
) -> None:
    """Two servers pushed to at once; one answers the load with success and keeps serving the
    base: the probe under the adapter's name disagrees, that server is out of rotation, the
    other serves the new version."""
    good_cfg = EngineConfig(model_dir=folders["base"], default_max_tokens=8)
    bad_cfg = EngineConfig(
        model_dir=folders["base"], default_max_tokens=8, faults=FaultConfig(ignore_lora_loads=True)
    )
    with (
        EmbeddedEngine(good_cfg) as good,
        EmbeddedEngine(bad_cfg) as bad,
        serve_in_thread(backends=[(good.url, "vllm"), (bad.url, "vllm")]) as gw,
        gw.client() as c,
    ):
        ref = engine_reference(folders["m1"])
        sync = WeightSync(c, reference=ref, tolerance=1e-4)
        report = sync.sync(folders["a1"], "1", kind="adapter")
        (failed,) = report.failed
        assert failed.url == bad.url and failed.pushed and "differ" in (failed.error or "")
        assert served_models(bad.url) == ["rollwire-tiny", "policy@1"]  # it said it loaded it
        reasons = {b["url"]: b["quarantined"] for b in c.backends()}
        assert reasons[good.url] is None
        assert reasons[bad.url].startswith("unverified: failed weight sync to version '1'")
        for _ in range(3):  # every call goes to the verified server, under the adapter
            assert greedy_call(gw)[3] == "1"
        # the only server left never gets the adapter: the sync fails, nothing is stamped
        c.remove_backend(next(b["name"] for b in c.backends() if b["url"] == good.url))
        with pytest.raises(WeightSyncError, match="differ"):
            WeightSync(c, reference=ref, tolerance=1e-4).sync(folders["a2"], "2", kind="adapter")
        assert c.get_policy_version() == "1"


def test_every_gateway_on_the_store_routes_calls_to_the_adapter(
    redis_server: RedisServer, folders: dict[str, Path]
) -> None:
    """The sync runs through one gateway; the other, on the same Redis store, resumes already
    naming the adapter (it reads the adapters after the pause), and a restarted one remembers."""
    store = f"{redis_server.url}?prefix=lora{uuid.uuid4().hex[:8]}:"
    cfg = EngineConfig(model_dir=folders["base"], default_max_tokens=8)

    def gateway(url: str) -> RunningGateway:
        return serve_in_thread(
            backends=[(url, "vllm")], store=store, admin_key="k", shared_state_interval=0.1
        )

    with EmbeddedEngine(cfg) as eng, gateway(eng.url) as first, gateway(eng.url) as second:
        ref = engine_reference(folders["m1"])
        with first.client() as c:
            WeightSync(c, reference=ref, tolerance=1e-4).sync(folders["a1"], "1", kind="adapter")
        prompt, completion, lps, version = greedy_call(second)  # at once: no wait for a poll
        assert version == "1"
        np.testing.assert_allclose(lps, ref(prompt, completion), atol=1e-4)
        with gateway(eng.url) as third, third.client() as c3:
            assert c3.backends()[0]["adapter"] == "policy@1"
