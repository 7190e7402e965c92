"""Hand-made rollouts with known shapes, shared by adapter tests (no gateway, no engine)."""

from __future__ import annotations

import numpy as np

from rollwire.data.protocol import Group, ModelCall, Rollout, VersionSpan

__all__ = [
    "failed_rollout",
    "forked_rollout",
    "merged_rollout",
    "moe_rollout",
    "sample_batch",
    "side_call_rollout",
    "single_turn_rollout",
    "versioned_rollout",
]

LAYERS, TOP_K, EXPERTS = 2, 2, 4


def _ids(start: int, n: int) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.int32)


def _lp(n: int, seed: int) -> np.ndarray:
    return -np.random.default_rng(seed).uniform(0.05, 3.0, n).astype(np.float32)


def _call(rid: str, i: int, prompt: np.ndarray, completion: np.ndarray, **kw: object) -> ModelCall:
    return ModelCall(
        call_id=f"{rid}-c{i}",
        session_id=rid,
        index=i,
        prompt_ids=prompt,
        completion_ids=completion,
        logprobs=_lp(completion.shape[0], hash((rid, i)) % 2**32),
        finish_reason="stop",
        request={"messages": [{"role": "user", "content": f"turn {i}"}]},
        **kw,  # type: ignore[arg-type]
    )


def single_turn_rollout(
    rid: str = "r-single", group_id: str = "g0", reward: float = 1.0
) -> Rollout:
    """One call: 10 prompt tokens, 5 sampled tokens."""
    call = _call(rid, 0, _ids(100, 10), _ids(500, 5))
    return Rollout(
        rollout_id=rid,
        group_id=group_id,
        task_id=group_id,
        status="completed",
        reward=reward,
        metrics={"turns": 1.0},
        calls=[call],
    )


def _three_calls(rid: str) -> list[ModelCall]:
    p0, c0 = _ids(100, 8), _ids(600, 4)
    p1 = np.concatenate([p0, c0, _ids(700, 3)])
    c1 = _ids(800, 5)
    p2 = np.concatenate([p1, c1, _ids(900, 2)])
    c2 = _ids(1000, 3)
    return [_call(rid, 0, p0, c0), _call(rid, 1, p1, c1), _call(rid, 2, p2, c2)]


def side_call_rollout(
    rid: str = "r-side", group_id: str = "g-side", reward: float = 1.0
) -> Rollout:
    """A main turn, a side call mid-rollout (another conversation: a router, a summariser) with a
    one-token answer, then the final answer continuing the main turn: two rows, the main one
    opened first."""
    p0, c0 = _ids(100, 8), _ids(600, 4)
    side_prompt, side = _ids(3000, 6), _ids(3100, 1)
    p2 = np.concatenate([p0, c0, _ids(700, 3)])
    c2 = _ids(800, 5)
    calls = [_call(rid, 0, p0, c0), _call(rid, 1, side_prompt, side), _call(rid, 2, p2, c2)]
    return Rollout(
        rollout_id=rid,
        group_id=group_id,
        task_id=group_id,
        status="completed",
        reward=reward,
        metrics={"turns": 3.0},
        calls=calls,
    )


def merged_rollout(rid: str = "r-merged", group_id: str = "g0", reward: float = 0.5) -> Rollout:
    """Three calls, each prompt extending the last: one row of 8 prompt + 17 response tokens."""
    return Rollout(
        rollout_id=rid,
        group_id=group_id,
        task_id=group_id,
        status="completed",
        reward=reward,
        metrics={"turns": 3.0},
        calls=_three_calls(rid),
    )


def forked_rollout(rid: str = "r-forked", group_id: str = "g0", reward: float = -0.5) -> Rollout:
    """Three calls; the third prompt rewrites a sampled token of the first: two rows."""
    calls = _three_calls(rid)
    p2 = calls[2].prompt_ids.copy()
    p2[9] = 4242  # inside call 0's completion: history was edited
    calls[2] = _call(rid, 2, p2, calls[2].completion_ids)
    return Rollout(
        rollout_id=rid,
        group_id=group_id,
        task_id=group_id,
        status="completed",
        reward=reward,
        metrics={"turns": 3.0},
        calls=calls,
    )


def failed_rollout(rid: str = "r-failed", group_id: str = "g1") -> Rollout:
    """One good call, then the agent raised: status failed, no reward."""
    call = _call(rid, 0, _ids(100, 6), _ids(500, 4))
    return Rollout(
        rollout_id=rid,
        group_id=group_id,
        task_id=group_id,
        status="failed",
        reward=None,
        error="RuntimeError: tool crashed",
        calls=[call],
    )


def moe_rollout(rid: str = "r-moe", group_id: str = "g1", reward: float = 2.0) -> Rollout:
    """Two merged calls with routed experts ``[prompt+completion-1, 2 layers, top-2]``."""
    rng = np.random.default_rng(7)
    p0, c0 = _ids(100, 6), _ids(600, 3)
    p1 = np.concatenate([p0, c0, _ids(700, 2)])
    c1 = _ids(800, 4)
    full = p1.shape[0] + c1.shape[0]
    experts = rng.integers(0, EXPERTS, size=(full - 1, LAYERS, TOP_K)).astype(np.int16)
    calls = [
        _call(rid, 0, p0, c0, routed_experts=experts[: p0.shape[0] + c0.shape[0] - 1]),
        _call(rid, 1, p1, c1, routed_experts=experts),
    ]
    return Rollout(
        rollout_id=rid,
        group_id=group_id,
        task_id=group_id,
        status="completed",
        reward=reward,
        calls=calls,
    )


def versioned_rollout(
    rid: str = "r-versioned", group_id: str = "g2", reward: float = 1.0
) -> Rollout:
    """:func:`merged_rollout`'s three calls across two weight syncs with ``keep`` pauses: call 0
    is version 1, call 1 switches 1 → 2 after 2 tokens, call 2 switches 2 → 3 after 1; step
    rewards 0.25, 0.5, 1.0 (one row; versions 1, 2, 3)."""
    c0, c1, c2 = _three_calls(rid)
    c0.policy_version = "1"
    c1.policy_version = "2"
    c1.weight_versions = [
        VersionSpan(version="1", start=0, end=2),
        VersionSpan(version="2", start=2, end=5),
    ]
    c2.policy_version = "3"
    c2.weight_versions = [
        VersionSpan(version="2", start=0, end=1),
        VersionSpan(version="3", start=1, end=3),
    ]
    for call, step in zip((c0, c1, c2), (0.25, 0.5, 1.0)):
        call.capture = "tokens"
        call.step_reward = step
    return Rollout(
        rollout_id=rid,
        group_id=group_id,
        task_id=group_id,
        status="completed",
        reward=reward,
        metrics={f"step_reward/{i}": v for i, v in enumerate((0.25, 0.5, 1.0))},
        calls=[c0, c1, c2],
        capture="tokens",
    )


def sample_batch() -> list[Group]:
    """Two task groups covering single-turn, merged, forked, failed and MoE rollouts."""
    g0 = [
        single_turn_rollout("a0", "g0", 1.0),
        merged_rollout("a1", "g0", 0.5),
        forked_rollout("a2", "g0", -0.5),
    ]
    g1 = [
        moe_rollout("b0", "g1", 2.0),
        single_turn_rollout("b1", "g1", 0.0),
        failed_rollout("b2", "g1"),
    ]
    return [
        Group(group_id="g0", task_id="g0", rollouts=g0),
        Group(group_id="g1", task_id="g1", rollouts=g1),
    ]
