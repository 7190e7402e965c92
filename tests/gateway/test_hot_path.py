"""Per-call shortcuts of the data plane behave as what they replace."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from rollwire.data.protocol import ModelCall
from rollwire.gateway.dataplane import capture, commit, hangups


class _Flow:
    def __init__(self) -> None:
        self.resumed = 0

    def resume_reading(self) -> None:
        self.resumed += 1


class _Cycle:
    """The part of uvicorn's request cycle the hang-up check reads."""

    def __init__(self) -> None:
        self.disconnected = False
        self.flow = _Flow()

    async def receive(self) -> dict[str, Any]:
        raise AssertionError("the connection's own flag is read: receive() is never called")


async def test_uvicorn_cycle_flag_needs_no_task_per_call() -> None:
    cycle = _Cycle()
    tasks = len(asyncio.all_tasks())
    hangup = hangups.watch(cycle.receive)
    assert len(asyncio.all_tasks()) == tasks
    assert cycle.flow.resumed == 1  # a paused transport would never see the agent go
    assert not hangup.is_set()
    cycle.disconnected = True  # what uvicorn's connection_lost does
    assert hangup.is_set()
    hangup.stop()


async def test_other_servers_get_a_watcher_on_receive() -> None:
    gone = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    hangup = hangups.watch(receive)
    await asyncio.sleep(0)
    assert not hangup.is_set()
    gone.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert hangup.is_set()
    hangup.stop()
    stopped = hangups.watch(receive)
    stopped.stop()
    await asyncio.sleep(0)
    assert not stopped.is_set()


def test_new_call_is_model_construct_with_every_field() -> None:
    fields = {"call_id": "c", "session_id": "s", "index": 0, "sampling": {"t": 1}, "stream": True}
    fast = commit.new_call(**fields)
    slow = ModelCall.model_construct(None, **{**commit._CALL_DEFAULTS, **fields})
    assert list(fast.__dict__) == list(slow.__dict__)
    for name, value in slow.__dict__.items():
        got = fast.__dict__[name]
        assert np.array_equal(got, value) if isinstance(value, np.ndarray) else got == value
    assert fast.model_fields_set == slow.model_fields_set
    assert fast.model_dump_json() == slow.model_dump_json()
    # Mutable defaults are the call's own.
    fast.flags.append("x")
    fast.request["k"] = 1
    again = commit.new_call(**fields)
    assert again.flags == [] and again.request == {}
    fast.latency_ms = 2.5  # assignment goes through pydantic as on any model
    assert fast.latency_ms == 2.5 and "latency_ms" in fast.model_fields_set


@pytest.mark.parametrize(
    "ids",
    [[1, 2, 3], [-(2**31), 0, 2**31 - 1], [1.5, True, 7], ["5"], [[1, 2], [3, 4]], (4, 5)],
)
def test_captured_ids_are_what_numpy_makes_of_them(ids: object) -> None:
    got = capture.extract({"prompt_token_ids": ids, "choices": [{"token_ids": [9]}]}).prompt_ids
    want = np.array(ids, dtype=np.int32)
    assert got.dtype == np.int32 and got.shape == want.shape and np.array_equal(got, want)
    assert got.flags.writeable
    with pytest.raises(OverflowError):
        capture.extract({"prompt_token_ids": [1, 2**31], "choices": []})


_CALLS = [
    ("/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}),
    (
        "/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True},
    ),
    ("/completions", {"prompt": "hi", "max_tokens": 8}),
    ("/responses", {"input": "hi", "max_output_tokens": 8}),
    ("/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}),
]


def test_a_served_call_leaves_no_reference_cycle(client: Any) -> None:
    """Each call's objects go when it ends (by reference count), not at the next cyclic
    collection: a request kept alive by a loop (its scope holding the connection's request
    cycle, which holds the scope) is 8 kB+ of garbage a call, piling up between collections."""
    import gc

    import httpx

    h = client.create_session()
    with httpx.Client(timeout=30) as http:
        for route, body in _CALLS:  # warm-up: first-use imports and caches
            assert http.post(h.base_url + route, json={"model": "policy", **body}).is_success
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for _ in range(3):
                for route, body in _CALLS:
                    r = http.post(h.base_url + route, json={"model": "policy", **body})
                    assert r.is_success, r.text
            gc.collect()
            leaked = [
                type(o).__module__ + "." + type(o).__qualname__
                for o in gc.garbage
                if type(o).__module__.split(".")[0] in ("rollwire", "uvicorn", "starlette")
            ]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
    assert leaked == []


def test_freed_heap_goes_back_to_the_os() -> None:
    """``malloc_trim`` (what the CLI's gateway calls every 2 s) returns freed C-heap pages: RSS
    after freeing many mid-sized blocks (numpy arrays, as the delta cache drops them) falls."""
    import gc
    from pathlib import Path

    from rollwire.gateway import process

    trim = process.malloc_trim()
    if trim is None:
        pytest.skip("this C library has no malloc_trim (not glibc): the trim is a no-op here")

    def rss_mb() -> float:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    # Below the mmap threshold (so on the heap), every other one kept: free holes, no free top.
    blocks = [np.ones(12_000, dtype=np.int32) for _ in range(4_000)]
    keep = blocks[1::2]
    del blocks
    gc.collect()
    before = rss_mb()
    trim(0)
    assert rss_mb() < before - 40, (before, rss_mb())
    assert len(keep) == 2_000
