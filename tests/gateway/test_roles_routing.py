"""One policy per role at the gateway: each role's LoRA adapter is pushed as ``<role>@<version>``
and verified by a probe through that adapter; a call asking for ``model=<role>`` is served by the
role's newest adapter and captured with the request's model as the role."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from rollwire.engine import EmbeddedEngine, EngineConfig, ModelConfig, TinyModel
from rollwire.engine.hf_export import save_hf
from rollwire.gateway import RunningGateway, serve_in_thread
from rollwire.gateway.backends.pool import Backend
from rollwire.testing.lora_adapters import merged_folder, random_adapter
from rollwire.trainer.references import engine_reference
from rollwire.trainer.weight_sync import WeightSync

ROLES = ("planner", "executor")


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("roles")
    base = save_hf(TinyModel(ModelConfig(seed=0)), root / "base")
    out = {"base": base}
    for seed, role in enumerate(ROLES, start=1):
        for v in (1, 2):
            adapter = random_adapter(base, root / f"{role}-{v}", seed=10 * seed + v)
            out[f"{role}{v}"] = adapter
            out[f"{role}{v}-merged"] = merged_folder(base, adapter, root / f"{role}-{v}-merged")
    return out


@pytest.fixture()
def stack(folders: dict[str, Path]) -> Iterator[RunningGateway]:
    cfg = EngineConfig(model_dir=folders["base"], default_max_tokens=8)
    with EmbeddedEngine(cfg) as eng, serve_in_thread(backends=[(eng.url, "vllm")]) as gw:
        yield gw


def test_each_role_is_verified_through_its_adapter_and_serves_its_calls(
    stack: RunningGateway, folders: dict[str, Path]
) -> None:
    gw = stack
    with gw.client() as c:
        WeightSync(c, reference=engine_reference(folders["base"])).sync(folders["base"], "0", seq=0)
        for v in (1, 2):
            for role in ROLES:
                sync = WeightSync(c, reference=engine_reference(folders[f"{role}{v}-merged"]),
                                  tolerance=1e-4, policy=role)  # fmt: skip
                report = sync.sync(folders[f"{role}{v}"], str(v), seq=v, kind="adapter")
                (entry,) = report.backends
                # the probe went through this role's adapter: it matches this role's weights
                assert entry.verified and entry.max_abs_diff is not None, entry
                assert report.adapter == f"{role}@{v}"
        (backend,) = c.backends()
        assert sorted(a["name"] for a in backend["adapters"]) == ["executor@2", "planner@2"]
        h = c.create_session(sampling={"temperature": 0.0, "max_tokens": 4})
        oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
        for role in ROLES:
            answer = oai.chat.completions.create(
                model=role, messages=[{"role": "user", "content": "hi"}]
            )
            assert answer.model == f"{role}@2"
        calls = c.calls(h.session_id)
        assert [call.request["model"] for call in calls] == list(ROLES)
        assert [call.policy_version for call in calls] == ["2", "2"]


def test_a_request_names_its_roles_newest_adapter_else_the_backends_model() -> None:
    backend = Backend(name="b", url="http://x", pinned_model="base")
    assert backend.model_for("planner") == "base"
    backend.adapters = [
        {"name": "planner@1", "version": "1", "seq": 1},
        {"name": "executor@1", "version": "1", "seq": 1},
        {"name": "planner@2", "version": "2", "seq": 2},
    ]
    backend.adapter = "planner@2"
    assert backend.model_for("planner") == "planner@2"
    assert backend.model_for("executor") == "executor@1"
    assert backend.model_for("plan") == "planner@2"  # no role of that name: the backend's model
    assert backend.model_for(None) == "planner@2"
