"""A full store is a 503 naming the store and the disk: the SQLite file really runs out of space
(``sqlite:PATH?max_bytes=N`` caps it, so the writer gets SQLITE_FULL as on a full disk), nothing
of the refused call is recorded, and the gateway serves again once space is freed."""

from __future__ import annotations

from pathlib import Path

import httpx

from rollwire.agent.serving import ServerThread
from rollwire.gateway import serve_in_thread
from rollwire.testing.null_backend import NullBackend

MAX_BYTES = 256 * 1024


def _post(base: str, turn: int) -> httpx.Response:
    # ~24 KB of prompt per call: a few calls fill the capped file.
    body = {"model": "policy", "messages": [{"role": "user", "content": f"{turn} " + "x" * 24_000}]}
    return httpx.post(base + "/chat/completions", json=body, timeout=30)


def test_full_store_is_a_503_then_recovers(tmp_path: Path) -> None:
    store = f"sqlite:{tmp_path / 'small.sqlite'}?max_bytes={MAX_BYTES}"
    with (
        ServerThread(NullBackend()) as b,
        serve_in_thread(backends=[(b.url, "vllm")], admin_key="k", store=store) as gw,
        gw.client() as c,
    ):
        filler = c.create_session()
        answered = 0
        for turn in range(200):  # bounded: the cap is hit after a handful of calls
            r = _post(filler.base_url, turn)
            if r.status_code != 200:
                break
            answered += 1
        assert r.status_code == 503, r.text
        error = r.json()["error"]
        assert error["code"] == "store_unavailable"
        assert "store" in error["message"] and "disk" in error["message"], error["message"]
        assert answered > 0
        assert (tmp_path / "small.sqlite").stat().st_size <= MAX_BYTES
        # Nothing half-recorded: exactly the answered calls, all ok; the counters agree.
        calls = c.calls(filler.session_id)
        assert len(calls) == answered and all(x.status == "ok" for x in calls)
        assert [x.index for x in calls] == list(range(answered))
        assert c.get_session(filler.session_id).num_calls == answered
        # Free the space (a deleted session's pages are reused): the gateway serves again.
        c.delete_session(filler.session_id)
        again = c.create_session()
        assert _post(again.base_url, 0).status_code == 200
        assert [x.status for x in c.calls(again.session_id)] == ["ok"]
