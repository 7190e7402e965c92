"""Conformance suite every agent-framework adapter runs (subclass it; provide the small hooks).

    class TestStrandsAdapter(AgentAdapterConformance):
        framework_modules = ("strands",)   # must not be imported by the entry module

        @pytest.fixture
        def adapter(self): return rollwire_strands.adapter

        def production_kwargs(self, *, base_url, api_key, model):
            return {"client_args": {"base_url": base_url, "api_key": api_key}, "model_id": model}

        def model_kwargs(self, *, stream):          # optional: how to pick (non-)streaming
            return {"stream": stream}

        def run_agent(self, model, task, *, stream, payload):
            ...   # a real agent of the framework with task.tools; return its final text

The suite checks, with real HTTP: the production fallback (no ``_rollwire`` → the production
endpoint, key and model), the session wiring (base URL, token, model, sampling parameters), and
a multi-turn tool-calling rollout run the way training runs it — ``RolloutClient`` → local runner
→ ``RolloutApp`` → the framework's agent → a real gateway and the embedded engine in scripted
mode, the reward posted by the app — captured with the right rows, masks and log-probs, in every
streaming mode the framework has.

A framework whose agents finish in a protocol of their own (a final-answer tool, a field format)
sets ``script`` (the policy the engine plays) and ``recording_server`` (the stand-in endpoint) to
answer that way; ``extra_model_calls``, ``expected_rows`` and ``recorded_stream`` say, with the
reason, where its rollout differs from a plain tools loop's (tests/frameworks has examples).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pytest

from rollwire.plugins import check_requirements
from rollwire.plugins.protocols import AgentAdapter

__all__ = [
    "PRODUCTION_MODEL",
    "AgentAdapterConformance",
    "RecordedRequest",
    "RecordingServer",
    "ToolTask",
    "arithmetic_script",
    "arithmetic_task",
    "tool_schema",
]

from rollwire.testing.recording import PRODUCTION_MODEL, RecordedRequest, RecordingServer
from rollwire.testing.tools import ToolTask, arithmetic_script, arithmetic_task, tool_schema

# --------------------------------------------------------------------------------------------
# The suite.


def _session_payload(
    *, base_url: str, token: str, session_id: str, complete_url: str, sampling: Mapping[str, Any]
) -> dict[str, Any]:
    return {
        "prompt": "task",
        "_rollwire": {
            "version": 1,
            "session_id": session_id,
            "base_url": base_url,
            "api_key": token,
            "model": "policy",
            "sampling": dict(sampling),
            "complete_url": complete_url,
            "deadline": time.time() + 300,
            "group_id": "g-1",
            "task_id": "t-1",
        },
    }


@dataclass
class RolloutEnv:
    """A running embedded engine (scripted) and gateway, for the end-to-end tests."""

    engine: Any
    gateway: Any
    client: Any


class AgentAdapterConformance:
    """What any agent adapter must do; see the module docstring for the hooks to provide."""

    #: modules of the framework that the adapter's entry module must not import at import time
    framework_modules: ClassVar[tuple[str, ...]] = ()
    #: streaming modes the framework supports (``True`` = ``stream: true`` requests)
    stream_modes: ClassVar[tuple[bool, ...]] = (False, True)
    #: whether the adapter is registered under the ``rollwire.agents`` entry-point group
    registered: ClassVar[bool] = True
    #: the session's sampling parameters (one key that is not an OpenAI parameter on purpose)
    sampling: ClassVar[dict[str, Any]] = {
        "temperature": 0.7,
        "top_p": 0.95,
        "max_tokens": 200,
        "top_k": 40,
    }
    #: training rows the standard task's rollout becomes; 1 unless the framework rewrites its
    #: history between calls (override it with the reason)
    expected_rows: ClassVar[int] = 1
    #: model calls the framework's agent makes beyond a plain tools loop's (one per tool call and
    #: one to answer), e.g. a separate answer-extraction call; override it with the reason
    extra_model_calls: ClassVar[int] = 0
    #: how the gateway records the calls: streamed as the agent asked (None), or False where it
    #: answers a dialect's stream from one non-streamed backend call (Anthropic Messages)
    recorded_stream: ClassVar[bool | None] = None
    #: the stand-in endpoint of the production and session-wiring tests; a framework whose agents
    #: finish only through a protocol of their own (a final-answer tool) answers with it
    recording_server: ClassVar[type[RecordingServer]] = RecordingServer
    #: the policy the embedded engine plays in the rollout test: the standard task, answered the
    #: way the framework's agents expect a model to answer
    script: ClassVar[Callable[..., str | None]] = staticmethod(arithmetic_script)

    # -- hooks -----------------------------------------------------------------------------

    @pytest.fixture
    def adapter(self) -> AgentAdapter:
        raise NotImplementedError("subclasses provide the adapter under test")

    def production_kwargs(self, *, base_url: str, api_key: str, model: str) -> dict[str, Any]:
        """The framework's production keyword arguments for this endpoint, key and model."""
        raise NotImplementedError

    def model_kwargs(self, *, stream: bool) -> dict[str, Any]:
        """Extra keyword arguments for ``adapter.model`` that select the streaming mode."""
        return {}

    def run_agent(
        self, model: Any, task: ToolTask, *, stream: bool, payload: Mapping[str, Any]
    ) -> str:
        """Run a real agent of the framework with ``model`` and ``task.tools`` on ``task.prompt``
        (with ``task.system_prompt``) until it answers; return its final text. ``payload`` is the
        one ``model`` was built from (a plain client needs it for the model name)."""
        raise NotImplementedError

    # -- helpers -----------------------------------------------------------------------------

    def _build(
        self, adapter: AgentAdapter, payload: Mapping[str, Any], stream: bool, **kwargs: Any
    ) -> Any:
        return adapter.model(payload, **kwargs, **self.model_kwargs(stream=stream))

    @pytest.fixture(scope="class")
    def rollout_env(self) -> Iterator[RolloutEnv]:
        from rollwire.engine.config import EngineConfig
        from rollwire.engine.server import EmbeddedEngine
        from rollwire.gateway import serve_in_thread

        with (
            EmbeddedEngine(EngineConfig(scripted=self.script)) as engine,
            serve_in_thread(backends=[(engine.url, "vllm")]) as gateway,
        ):
            yield RolloutEnv(engine, gateway, gateway.client())

    # -- tests -------------------------------------------------------------------------------

    def test_declares_interface(self, adapter: AgentAdapter) -> None:
        assert isinstance(adapter, AgentAdapter)
        assert adapter.name and isinstance(adapter.name, str)
        assert adapter.requires and all(isinstance(r, str) for r in adapter.requires)
        assert check_requirements(adapter.requires) == []

    def test_registered_entry_point(self, adapter: AgentAdapter) -> None:
        if not self.registered:
            pytest.skip("this adapter is used by import, not through the rollwire.agents group")
        from rollwire.plugins import load_agent

        assert load_agent(adapter.name) is adapter

    def test_entry_module_is_light(self, adapter: AgentAdapter) -> None:
        module = type(adapter).__module__.split(".")[0]
        module = type(adapter).__module__ if module == "rollwire" else module
        code = (
            f"import sys, {module}\n"
            f"bad = [m for m in {list(self.framework_modules)!r} if m in sys.modules]\n"
            "assert not bad, bad\n"
        )
        subprocess.run([sys.executable, "-c", code], check=True, timeout=60)

    @pytest.mark.parametrize("stream", [False, True], ids=["nonstream", "stream"])
    def test_production_fallback(self, adapter: AgentAdapter, stream: bool) -> None:
        if stream not in self.stream_modes:
            pytest.skip(f"{adapter.name} has no {'streaming' if stream else 'non-streaming'} mode")
        with self.recording_server() as prod:
            kwargs = self.production_kwargs(
                base_url=prod.url + "/v1", api_key="prod-key", model=PRODUCTION_MODEL
            )
            model = self._build(adapter, {"prompt": "task"}, stream, **kwargs)
            out = self.run_agent(
                model, arithmetic_task(), stream=stream, payload={"prompt": "task"}
            )
        assert self.recording_server.reply in out
        requests = prod.chat_requests
        assert len(requests) == 1 + self.extra_model_calls, [r.path for r in prod.requests]
        for req in requests:
            assert req.path == "/v1/chat/completions"
            assert req.headers.get("authorization") == "Bearer prod-key"
            assert req.body["model"] == PRODUCTION_MODEL
            assert bool(req.body.get("stream")) is stream

    @pytest.mark.parametrize("stream", [False, True], ids=["nonstream", "stream"])
    def test_session_wiring(self, adapter: AgentAdapter, stream: bool) -> None:
        if stream not in self.stream_modes:
            pytest.skip(f"{adapter.name} has no {'streaming' if stream else 'non-streaming'} mode")
        with self.recording_server() as gw:
            payload = _session_payload(
                base_url=gw.url + "/s/tok-123/v1",
                token="tok-123",
                session_id="sess-1",
                complete_url=gw.url + "/api/sessions/sess-1/complete",
                sampling=self.sampling,
            )
            # production settings point elsewhere (nothing listens on port 9): the session wins
            kwargs = self.production_kwargs(
                base_url="http://127.0.0.1:9/v1", api_key="prod-key", model=PRODUCTION_MODEL
            )
            model = self._build(adapter, payload, stream, **kwargs)
            self.run_agent(model, arithmetic_task(), stream=stream, payload=payload)
        requests = gw.chat_requests
        assert len(requests) == 1 + self.extra_model_calls, [r.path for r in gw.requests]
        for req in requests:
            assert req.path == "/s/tok-123/v1/chat/completions"
            assert req.headers.get("authorization") == "Bearer tok-123"
            body = req.body
            assert body["model"] == "policy"
            assert bool(body.get("stream")) is stream
            assert "extra_body" not in body
            for key, value in self.sampling.items():
                got = body.get(key)
                if key == "max_tokens" and got is None:
                    got = body.get("max_completion_tokens")
                assert got == value, (
                    f"sampling parameter {key}={value!r} not sent (request: {body})"
                )

    @pytest.mark.parametrize("capture", ["passthrough", "tokens"])
    @pytest.mark.parametrize("stream", [False, True], ids=["nonstream", "stream"])
    def test_multi_turn_rollout_captured(
        self, adapter: AgentAdapter, rollout_env: RolloutEnv, stream: bool, capture: str
    ) -> None:
        if stream not in self.stream_modes:
            pytest.skip(f"{adapter.name} has no {'streaming' if stream else 'non-streaming'} mode")
        if capture == "tokens":
            pytest.importorskip("transformers", reason="tokens capture needs rollwire[tokens]")
        from rollwire.agent.app import RolloutApp
        from rollwire.trainer.client import RolloutClient
        from rollwire.trainer.runners import LocalRunner

        client = rollout_env.client
        sampling = {"temperature": 0.8, "max_tokens": 128}
        task = arithmetic_task()
        outputs: list[str] = []
        app = RolloutApp(failure_reward=-1.0)

        @app.rollout_entrypoint
        def agent(payload: dict[str, Any]) -> dict[str, Any]:
            model = self._build(adapter, payload, stream)
            out = self.run_agent(model, task, stream=stream, payload=payload)
            outputs.append(out)
            return {
                "reward": 1.0 if task.answer in out else 0.0,
                "metrics": {"tool_calls": float(len(task.calls))},
            }

        trainer = RolloutClient(
            rollout_env.gateway,
            runner=LocalRunner(app),
            group_size=1,
            sampling=sampling,
            capture=capture,  # type: ignore[arg-type]
            deadline=120,
        )
        (group,) = trainer.run([{"id": "t-1", "prompt": task.prompt}])
        (rollout,) = group.rollouts
        assert rollout.status == "completed", rollout.error

        # the agent really ran the tools and answered from their results
        assert task.calls == [("add", {"a": 2, "b": 3}), ("multiply", {"a": 5, "b": 4})]
        assert len(outputs) == 1 and task.answer in outputs[0]
        # the reward arrived through RolloutApp → complete_url, as in training
        reward = 1.0
        assert rollout.reward == reward and rollout.metrics == {"tool_calls": 2.0}
        info = client.get_session(rollout.rollout_id)
        assert info.status == "completed"
        assert info.reward == reward

        calls = client.calls(rollout.rollout_id)
        assert [c.call_id for c in calls] == [c.call_id for c in rollout.calls]
        assert len(calls) == task.expected_model_calls + self.extra_model_calls
        assert all(c.status == "ok" for c in calls)
        recorded = stream if self.recorded_stream is None else self.recorded_stream
        assert [c.stream for c in calls] == [recorded] * len(calls)
        assert all(c.sampling.get("temperature") == sampling["temperature"] for c in calls)
        assert all(len(c.completion_ids) > 0 for c in calls)

        rows = client.trajectory(rollout.rollout_id)
        assert rows, "no training rows"
        # every sampled token is in exactly one row, with mask 1 and its captured log-prob
        expected = np.concatenate([c.completion_ids for c in calls])
        masked = np.concatenate([r.response_ids[r.loss_mask == 1] for r in rows])
        np.testing.assert_array_equal(masked, expected)
        expected_lp = np.concatenate([c.logprobs for c in calls])
        got_lp = np.concatenate([r.logprobs[r.loss_mask == 1] for r in rows])
        np.testing.assert_allclose(got_lp, expected_lp, atol=1e-6)
        assert np.all(got_lp != 0.0) and np.all(got_lp <= 0.0)
        for row in rows:
            assert len(row.loss_mask) == len(row.logprobs) == len(row.input_ids) - row.prompt_len
            assert np.all(row.logprobs[row.loss_mask == 0] == 0.0)
            assert row.reward == reward
        # the agent keeps prefix continuity, so the calls merge into the expected rows
        assert len(rows) == self.expected_rows, [r.fork for r in rows]
        assert [cid for r in rows for cid in r.call_ids] == [c.call_id for c in calls]
