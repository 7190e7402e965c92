"""Property-based fuzzing of request bodies (Hypothesis, bounded): the gateway never answers 5xx
to bad input, and a refused request never leaves a stored call."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollwire.agent.serving import ServerThread
from rollwire.gateway import RunningGateway, serve_in_thread
from rollwire.testing.null_backend import NullBackend

KEY = "k"
ADMIN = {"authorization": f"Bearer {KEY}"}
FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)


def _dumps(value: Any) -> bytes:
    """Standard JSON (integers of any size, as an agent's JSON library may send)."""
    return json.dumps(value).encode()


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "bogus", 3])},
    optional={
        "content": st.one_of(st.text(max_size=30), json_values),
        "tool_calls": json_values,
        "name": json_values,
    },
)
chat_keys = {
    "model": st.one_of(st.just("policy"), json_values),
    "messages": st.one_of(st.lists(message, max_size=3), json_values),
    "stream": json_values,
    "temperature": json_values,
    "top_p": json_values,
    "max_tokens": json_values,
    "max_completion_tokens": json_values,
    "n": json_values,
    "logprobs": json_values,
    "top_logprobs": json_values,
    "tools": json_values,
    "tool_choice": json_values,
    "stop": json_values,
    "seed": json_values,
    "logit_bias": json_values,
    "response_format": json_values,
    "stream_options": json_values,
}
chat_bodies = st.fixed_dictionaries({}, optional=chat_keys)  # type: ignore[arg-type]
raw_bodies = st.one_of(
    chat_bodies.map(lambda b: _dumps(b)),
    json_values.map(lambda b: _dumps(b)),
    st.binary(max_size=64),
)


@pytest.fixture(scope="module")
def gw() -> Iterator[RunningGateway]:
    with (
        ServerThread(NullBackend()) as b,
        serve_in_thread(backends=[(b.url, "vllm")], admin_key=KEY) as g,
    ):
        yield g


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30.0) as c:
        yield c


def _calls(http: httpx.Client, gw: RunningGateway, sid: str) -> int:
    r = http.get(f"{gw.url}/api/sessions/{sid}/calls", headers=ADMIN)
    return len(r.json()["calls"])


@FUZZ
@given(raw=raw_bodies, path=st.sampled_from(["/chat/completions", "/completions"]))
def test_data_plane_bodies(gw: RunningGateway, http: httpx.Client, raw: bytes, path: str) -> None:
    s = http.post(gw.url + "/api/sessions", json={}, headers=ADMIN).json()
    r = http.post(s["base_url"] + path, content=raw, headers={"content-type": "application/json"})
    # 502 only when the backend refused what the gateway forwarded (and it says so).
    assert r.status_code < 500 or (
        r.status_code == 502 and r.json()["error"]["code"] in ("upstream_error", "bad_gateway")
    ), (r.status_code, r.text)
    stored = _calls(http, gw, s["session_id"])
    if 400 <= r.status_code < 500:
        # A refused request is not a model call: nothing stored (the backend may refuse a
        # forwarded one, which is recorded as failed -- then it says so in the body).
        if stored:
            call = http.get(f"{gw.url}/api/sessions/{s['session_id']}/calls", headers=ADMIN).json()[
                "calls"
            ][0]
            assert call["status"] == "failed" and call["trainable"] is False
            assert call["error"].startswith("backend answered 4"), call["error"]
    elif r.status_code == 200:
        assert stored == 1


session_keys: dict[str, Any] = {
    "session_id": st.one_of(st.text(max_size=12), json_values),
    "group_id": json_values,
    "task_id": json_values,
    "metadata": json_values,
    "sampling": st.one_of(
        st.dictionaries(st.sampled_from(list(chat_keys)), json_values), json_values
    ),
    "sampling_policy": json_values,
    "ttl": json_values,
    "max_calls": json_values,
    "max_tokens": json_values,
    "capture": st.one_of(st.sampled_from(["passthrough", "tokens", "x"]), json_values),
    "allow_off_policy": json_values,
    "chat_template_kwargs": json_values,
    "bogus": json_values,
}


@FUZZ
@given(body=st.fixed_dictionaries({}, optional=session_keys))  # type: ignore[arg-type]
def test_session_creation_bodies(
    gw: RunningGateway, http: httpx.Client, body: dict[str, Any]
) -> None:
    before = len(http.get(gw.url + "/api/sessions", headers=ADMIN).json()["sessions"])
    r = http.post(gw.url + "/api/sessions", content=_dumps(body), headers=ADMIN)
    assert r.status_code < 500, (r.status_code, r.text)
    after = len(http.get(gw.url + "/api/sessions", headers=ADMIN).json()["sessions"])
    if r.status_code == 201:
        assert after == before + 1
        sid = r.json()["session_id"]
        # What was created can be read, called and completed through its URLs.
        assert http.get(f"{gw.url}/api/sessions/{sid}", headers=ADMIN).status_code == 200
    else:
        assert after == before, r.text


@FUZZ
@given(
    body=st.fixed_dictionaries(
        {},
        optional={  # type: ignore[arg-type]
            "status": st.one_of(st.sampled_from(["completed", "failed", "running"]), json_values),
            "reward": json_values,
            "metrics": json_values,
            "error": json_values,
        },
    )
)
def test_completion_bodies(gw: RunningGateway, http: httpx.Client, body: dict[str, Any]) -> None:
    s = http.post(gw.url + "/api/sessions", json={}, headers=ADMIN).json()
    r = http.post(s["complete_url"], content=_dumps(body), headers=ADMIN)
    assert r.status_code < 500, (r.status_code, r.text)
    rec = http.get(f"{gw.url}/api/sessions/{s['session_id']}", headers=ADMIN).json()
    if r.status_code == 200:
        assert rec["status"] != "running"
        assert rec["reward"] is None or isinstance(rec["reward"], float)
    else:
        assert rec["status"] == "running" and rec["reward"] is None
