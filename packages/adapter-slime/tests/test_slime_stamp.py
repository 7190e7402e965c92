"""slime's weights as the gateway's policy version (issue 24.5), driven as slime's ``train.py``
drives the hooks: ``actor_model.update_weights()`` (the updater's ``weight_version`` + 1, handed to
SGLang), then ``rollout_manager.generate(rollout_id)`` → ``generate_rollout(args, rollout_id,
data_source)``; ``eval(rollout_id)`` after the push, with the rollout id recorded in
``slime.rollout.sample_hooks`` for the per-sample ``generate``.

The embedded engine sits in the SGLang router's seat and reports its weight version on every
``/generate`` as SGLang does (``meta_info["weight_version"]``); a push is SGLang's
``/update_weight_version``. slime is not installable here: ``Sample`` and ``sample_hooks`` are
stand-ins written from slime's code (``conftest.py``, below).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rollwire.agent.context import async_openai_client
from rollwire.agent.serving import ServerThread
from rollwire.engine.server import EmbeddedEngine
from rollwire_slime import generate, generate_rollout
from rollwire_slime.hooks import HookConfig, _gateway, _stop_gateways
from rollwire_slime.stamp import served_weight_version, slime_stamp


async def agent(payload: dict[str, Any]) -> dict[str, Any]:
    client = async_openai_client(payload)
    msgs: list[Any] = [{"role": "user", "content": payload["prompt"]}]
    r = await client.chat.completions.create(model="policy", messages=msgs)
    msgs += [{"role": "assistant", "content": r.choices[0].message.content}]
    msgs += [{"role": "user", "content": "and again?"}]
    await client.chat.completions.create(model="policy", messages=msgs)
    return 1.0


@pytest.fixture
def router() -> Iterator[EmbeddedEngine]:
    with EmbeddedEngine(scripted={"rules": [{"match": ".*", "reply": "4"}]}) as engine:
        yield engine
    _stop_gateways()


@pytest.fixture
def sample_hooks(slime_types: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> Any:
    """slime's ``slime.rollout.sample_hooks``: ``RolloutManager.generate`` / ``eval`` call
    ``set_current_rollout_id(rollout_id)`` before running the rollout function."""
    mod = types.ModuleType("slime.rollout.sample_hooks")
    mod._current_rollout_id = None  # type: ignore[attr-defined]

    def set_current_rollout_id(rollout_id: int | None) -> None:
        mod._current_rollout_id = rollout_id  # type: ignore[attr-defined]

    mod.set_current_rollout_id = set_current_rollout_id  # type: ignore[attr-defined]
    parent = types.ModuleType("slime.rollout")
    parent.sample_hooks = mod  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "slime.rollout", parent)
    monkeypatch.setitem(sys.modules, "slime.rollout.sample_hooks", mod)
    return mod


def _args(router: EmbeddedEngine, **kw: Any) -> SimpleNamespace:
    return SimpleNamespace(
        sglang_router_ip="127.0.0.1",
        sglang_router_port=router.port,
        rollwire_agent=agent,
        rollwire_deadline=60,
        rollout_batch_size=2,
        n_samples_per_prompt=2,
        rollout_max_response_len=16,
        **kw,
    )


class _DataSource:
    def get_samples(self, n: int) -> list[list[SimpleNamespace]]:
        return [[_sample(2 * g + k, g) for k in range(2)] for g in range(n)]


def _sample(index: int, group_index: int) -> SimpleNamespace:
    return SimpleNamespace(index=index, group_index=group_index, prompt="2+2?", label="4")


def _push(router: EmbeddedEngine, version: str) -> None:
    """What slime's weight updater ends with: SGLang serves ``weight_version`` from now on."""
    httpx.post(
        f"{router.url}/update_weight_version", json={"new_version": version}
    ).raise_for_status()


def _gateway_version(args: Any) -> tuple[str | None, int, int | None]:
    with _gateway(HookConfig.from_args(args)).client() as c:
        info = c.staleness()
    return info["policy_version"], info["policy_seq"], info["trainer_seq"]


def _flags(args: Any, samples: list[Any]) -> set[str]:
    with _gateway(HookConfig.from_args(args)).client() as c:
        return {f for s in samples for call in c.rollout(s.session_id).calls for f in call.flags}


def _rollout(args: Any, rollout_id: int) -> list[Any]:
    out = generate_rollout(args, rollout_id, _DataSource())
    groups = out.samples if hasattr(out, "samples") else out
    return [s for g in groups for s in g]


def test_each_rollout_stamps_what_sglang_serves(
    router: EmbeddedEngine, sample_hooks: Any, caplog: pytest.LogCaptureFixture
) -> None:
    args = _args(router)
    _push(router, "1")  # train.py: update_weights() before the loop
    first = _rollout(args, 0)
    assert _gateway_version(args) == ("1", 0, 0)
    assert {v for s in first for v in s.weight_versions} == {"1"}
    _push(router, "2")  # after rollout 0's training
    second = _rollout(args, 1)
    assert _gateway_version(args) == ("2", 1, 1)
    # slime's own field: one entry per generation (two calls per rollout here)
    assert [s.weight_versions for s in second] == [["2", "2"]] * 4
    assert [s.metadata["rollwire"]["weight_versions"] for s in second] == [["2"]] * 4
    # the gateway agrees with SGLang: no call is flagged as sampled by unexpected weights
    assert "policy_version_mismatch" not in _flags(args, first + second)

    assert "could not read" not in caplog.text


async def test_evaluation_moves_the_label_and_stale_rollouts_are_ignored(
    router: EmbeddedEngine, sample_hooks: Any
) -> None:
    args = _args(router)
    _push(router, "1")
    sample_hooks.set_current_rollout_id(0)
    (s,) = await generate(args, _sample(0, 0), {"max_new_tokens": 16})
    assert _gateway_version(args) == ("1", 0, 0) and s.weight_versions == ["1", "1"]
    _push(router, "2")
    sample_hooks.set_current_rollout_id(0)  # eval(0) after rollout 0's push
    (e,) = await generate(args, _sample(1, 0), {"max_new_tokens": 16}, evaluation=True)
    assert _gateway_version(args) == ("2", 0, 0) and e.weight_versions == ["2", "2"]
    sample_hooks.set_current_rollout_id(1)
    await generate(args, _sample(2, 0), {"max_new_tokens": 16})
    assert _gateway_version(args) == ("2", 1, 1)
    stamp = slime_stamp(_gateway(HookConfig.from_args(args)))
    moved = stamp.stamp.moved
    # more samples of rollout 1: no new read, no new stamp
    for i in range(3):
        await generate(args, _sample(3 + i, 0), {"max_new_tokens": 16})
    assert stamp.stamp.moved == moved and stamp.last == (1, False)
    # a late hook call for rollout 0 (older): read, but the gateway does not move back
    sample_hooks.set_current_rollout_id(0)
    await generate(args, _sample(7, 0), {"max_new_tokens": 16})
    assert _gateway_version(args) == ("2", 1, 1) and stamp.stamp.moved == moved


async def test_stamping_off_and_without_a_rollout_id(
    router: EmbeddedEngine, sample_hooks: Any
) -> None:
    _push(router, "5")
    args = _args(router, rollwire_stamp_version="false")
    sample_hooks.set_current_rollout_id(4)
    (s,) = await generate(args, _sample(0, 0), {"max_new_tokens": 16})
    sample_hooks.set_current_rollout_id(None)  # outside RolloutManager.generate: no step known
    (t,) = await generate(_args(router), _sample(1, 0), {"max_new_tokens": 16})
    assert _gateway_version(args) == (None, 0, None)
    # SGLang's word is still recorded on every call
    assert s.weight_versions == t.weight_versions == ["5", "5"]
    with pytest.raises(ValueError, match="ROLLWIRE_STAMP_VERSION must be true or false"):
        HookConfig.from_args(SimpleNamespace(), {"ROLLWIRE_STAMP_VERSION": "maybe"})


def _router_app(workers: list[str], with_workers: bool = True) -> Starlette:
    """The part of SGLang's router slime's rollout reads: ``GET /workers``."""

    async def listed(request: Request) -> JSONResponse:
        return JSONResponse({"workers": [{"id": f"w{i}", "url": u} for i, u in enumerate(workers)]})

    return Starlette(routes=[Route("/workers", listed)] if with_workers else [])


async def test_served_version_asks_every_worker_the_router_lists(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with (
        EmbeddedEngine(scripted={"rules": [{"match": ".*", "reply": "x"}]}) as a,
        EmbeddedEngine(scripted={"rules": [{"match": ".*", "reply": "x"}]}) as b,
    ):
        _push(a, "12")
        _push(b, "11")  # one engine missed a push: the oldest is what a call may report
        with ServerThread(_router_app([a.url, b.url])) as router:
            assert await served_weight_version(router.url) == "11"
        assert "serve different weight versions ['11', '12']" in caplog.text
        _push(b, "12")
        with ServerThread(_router_app([a.url, b.url])) as router:
            assert await served_weight_version(router.url) == "12"
        # a router without /workers (or a single engine in its seat) is asked itself
        assert await served_weight_version(a.url) == "12"
        _push(a, "default")  # what SGLang reports before anyone set a version
        assert await served_weight_version(a.url) is None
    assert await served_weight_version("http://127.0.0.1:9", timeout=2.0) is None
