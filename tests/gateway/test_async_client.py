"""AsyncGatewayClient: every method once, against a real gateway."""

from __future__ import annotations

import openai
import pytest

from rollwire.agent.serving import ServerThread
from rollwire.gateway import RunningGateway
from rollwire.testing.null_backend import NullBackend
from rollwire.trainer.gateway_client import AsyncGatewayClient, GatewayAPIError

MSGS = [{"role": "user", "content": "hi"}]


async def test_every_async_method(gateway: RunningGateway) -> None:
    async with AsyncGatewayClient(gateway.url, gateway.admin_key) as c:
        h = await c.create_session(group_id="async-g", task_id="t", sampling={"max_tokens": 8})
        assert h.base_url.endswith("/v1") and h.session_id in h.complete_url
        oai = openai.AsyncOpenAI(base_url=h.base_url, api_key="x", max_retries=0)
        await oai.chat.completions.create(model="p", messages=MSGS)  # type: ignore[arg-type]
        await oai.close()

        info = await c.get_session(h.session_id)
        assert info.status == "running" and info.num_calls == 1 and info.group_id == "async-g"
        listed = await c.list_sessions(group_id="async-g", status="running", limit=10)
        assert [s.session_id for s in listed] == [h.session_id]
        (call,) = await c.calls(h.session_id)
        assert call.trainable and call.completion_ids.shape[0] > 0
        rollout = await c.rollout(h.session_id)
        assert rollout.rollout_id == h.session_id and len(rollout.calls) == 1
        rows = await c.trajectory(h.session_id, mode="per_call")
        assert len(rows) == 1

        assert await c.set_policy_version("v9") == "v9"
        assert await c.set_policy_version("v10", seq=40) == "v10"
        info = await c.set_trainer_version(41, version="t41")
        assert (info["lag"], info["trainer_version"], info["policy_seq"]) == (1, "t41", 40)
        assert (await c.staleness())["trainer_seq"] == 41
        assert (await c.set_trainer_version(None))["lag"] == 0
        assert (await c.pause())["paused"] is True
        assert (await c.pause_status())["paused"] is True
        assert (await c.resume())["paused"] is False
        assert (await c.pause(wait=True))["in_flight"] == 0
        await c.resume()

        with ServerThread(NullBackend()) as extra:
            names = {b["name"] for b in await c.add_backend(extra.url, name="async-extra")}
            assert "async-extra" in names
            assert "async-extra" in {b["name"] for b in await c.backends()}
            await c.remove_backend("async-extra")
        assert "async-extra" not in {b["name"] for b in await c.backends()}

        done = await c.complete(h.session_id, reward=0.5, metrics={"acc": 1.0}, token=h.token)
        assert done.status == "completed" and done.reward == 0.5
        waited = await c.wait(h.session_id, timeout=1)
        assert waited.terminal and waited.metrics == {"acc": 1.0}
        await c.delete_session(h.session_id)
        with pytest.raises(GatewayAPIError) as exc:
            await c.get_session(h.session_id)
        assert exc.value.status_code == 404 and exc.value.code == "session_not_found"
