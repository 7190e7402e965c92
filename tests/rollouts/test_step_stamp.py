"""``StepStamp``: a trainer's step as the gateway's policy version (issue 24.5), against a real
gateway's control plane: new steps move it, repeated and older ones do not, one stamp per step."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from rollwire.gateway import RunningGateway, serve_in_thread
from rollwire.trainer.gateway_client import AsyncGatewayClient
from rollwire.trainer.step_stamp import StepStamp, stamp_client


@pytest.fixture
def gateway() -> Iterator[RunningGateway]:
    with serve_in_thread() as gw:
        yield gw


class _Counting:
    """An AsyncGatewayClient that counts the requests a stamp sends."""

    def __init__(self, client: AsyncGatewayClient) -> None:
        self.client = client
        self.requests: list[str] = []

    async def staleness(self) -> dict[str, Any]:
        self.requests.append("GET trainer_version")
        return await self.client.staleness()

    async def set_policy_version(self, version: str, *, seq: int | None = None) -> str:
        self.requests.append(f"POST policy_version {version} {seq}")
        return await self.client.set_policy_version(version, seq=seq)

    async def set_trainer_version(self, seq: int | None, version: str | None = None) -> Any:
        self.requests.append(f"POST trainer_version {seq}")
        return await self.client.set_trainer_version(seq, version)


async def test_new_steps_move_the_version_and_old_ones_do_not(gateway: RunningGateway) -> None:
    async with AsyncGatewayClient(gateway.url, gateway.admin_key) as client:
        stamp, counting = StepStamp(), _Counting(client)
        assert await stamp.astamp(counting, 0) is True
        info = await client.staleness()
        assert (info["policy_version"], info["policy_seq"], info["trainer_seq"]) == ("0", 0, 0)
        assert await stamp.astamp(counting, 3) is True
        info = await client.staleness()
        assert (info["policy_version"], info["policy_seq"], info["trainer_seq"]) == ("3", 3, 3)
        assert info["lag"] == 0
        sent = len(counting.requests)
        # this process already stamped 3, or something newer: no request at all
        assert await stamp.astamp(counting, 3) is False
        assert await stamp.astamp(counting, 1) is False
        assert len(counting.requests) == sent
        # another worker that sees step 2 late: the gateway says 3, so nothing moves back
        late = StepStamp()
        assert await late.astamp(counting, 2) is False
        assert counting.requests[sent:] == ["GET trainer_version"]
        assert (await client.staleness())["policy_version"] == "3"
        # the same step with another label (weights re-pushed within the step) moves the label
        assert await late.astamp(counting, 3, "w-3b") is True
        info = await client.staleness()
        assert (info["policy_version"], info["policy_seq"]) == ("w-3b", 3)


async def test_coroutines_meeting_a_new_step_share_one_stamp(gateway: RunningGateway) -> None:
    async with AsyncGatewayClient(gateway.url, gateway.admin_key) as client:
        stamp, counting = StepStamp(), _Counting(client)
        moved = await asyncio.gather(*(stamp.astamp(counting, 5) for _ in range(16)))
        assert moved.count(True) == 1
        assert counting.requests == [
            "GET trainer_version",
            "POST policy_version 5 5",
            "POST trainer_version 5",
        ]


async def test_an_unreachable_gateway_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stamp = StepStamp()
    async with AsyncGatewayClient("http://127.0.0.1:9", "k", timeout=2.0) as client:
        assert await stamp.astamp(client, 4) is False
        assert stamp.failed == 1 and stamp.step == 4
        assert await stamp.astamp(client, 4) is False  # once per step: not retried
    assert stamp.failed == 1
    assert "could not stamp policy version '4' (step 4)" in caplog.text
    assert await stamp.astamp(None, 7) is False  # no control plane to stamp
    with pytest.raises(ValueError, match="whole number >= 0, got -1"):
        await stamp.astamp(None, -1)


def test_stamp_client_needs_a_control_plane_url(gateway: RunningGateway) -> None:
    assert stamp_client(object()) is None
    assert stamp_client("http://gw") is None
    client = stamp_client(gateway)
    assert isinstance(client, AsyncGatewayClient) and client.url == gateway.url
