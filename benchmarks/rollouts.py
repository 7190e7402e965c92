"""Rollout fan-out benchmark: N concurrent scripted rollouts x K model calls through one gateway.

    uv run --frozen python benchmarks/rollouts.py                      # 1,000 rollouts x 5 calls
    uv run --frozen python benchmarks/rollouts.py --rollouts 200 --calls 3

Processes: a null vLLM-shaped backend (``rollwire.testing.null_backend``, echo mode, answers
instantly) and one rollwire gateway (SQLite file store), each in its own process; this process
runs the RolloutClient and the agents through the local runner (in-process asyncio). Each agent is
an async handler with the OpenAI SDK (``async_openai_client`` sharing one connection pool) that
makes K chat calls, growing the conversation each turn, and returns a reward. Reported: wall time,
rollouts/s, model calls/s, rollouts returned vs requested, calls captured vs made over all
requested rollouts (lost calls must be 0), CPU seconds and peak RSS of the gateway and of the
client process (client + agents). Exits 1 on any lost rollout or call.

Measured on a shared 2-core VM (gateway, null backend and client on the same two cores), 1,000
rollouts x 5 calls, concurrency 1,000: 5.1-6.5 s wall, 760-980 calls/s, 0 lost calls, gateway
peak RSS ~140 MB, client peak RSS ~125 MB. With ``--sdk`` the in-process agents' OpenAI SDK
(pydantic transforms, httpx's pool) dominates: ~67 s, 75 calls/s, 56 s of client CPU -- an
agent-side cost that real deployments spread over agent processes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from _procs import Proc, cpu_seconds, free_port, peak_rss_mb

from rollwire.agent.context import async_openai_client, rollout_context, rollout_model
from rollwire.trainer.client import RolloutClient
from rollwire.trainer.runners import LocalRunner


class ScriptedAgent:
    """K chat calls per rollout, growing the conversation each turn; one HTTP pool per process.

    Default transport: aiohttp posting to the session's ``base_url`` (what any OpenAI-compatible
    client does, without SDK overhead in the measurement). ``sdk=True``: the OpenAI SDK via
    :func:`rollwire.agent.context.async_openai_client` (costs ~3 ms of client CPU per call).
    """

    def __init__(self, calls: int, sdk: bool = False) -> None:
        self.calls = calls
        self.sdk = sdk
        self.made = 0
        self._session: aiohttp.ClientSession | None = None
        self._http: httpx.AsyncClient | None = None

    async def __call__(self, payload: dict[str, Any]) -> dict[str, Any]:
        ctx = rollout_context(payload)
        assert ctx is not None
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a benchmark agent."},
            {"role": "user", "content": f"task {payload['task_id']}: say something."},
        ]
        for turn in range(self.calls):
            content = await (self._sdk_call if self.sdk else self._raw_call)(payload, ctx, messages)
            self.made += 1
            messages.append({"role": "assistant", "content": content})
            messages.append({"role": "user", "content": f"turn {turn}: go on."})
        return {"reward": 1.0, "metrics": {"turns": float(self.calls)}}

    async def _raw_call(
        self, payload: dict[str, Any], ctx: Any, messages: list[dict[str, Any]]
    ) -> str:
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1024))
        body = {"model": ctx.model, "messages": messages}
        async with self._session.post(
            f"{ctx.base_url}/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {ctx.api_key}"},
        ) as resp:
            resp.raise_for_status()
            data = await resp.json()
        return str(data["choices"][0]["message"].get("content") or "")

    async def _sdk_call(
        self, payload: dict[str, Any], ctx: Any, messages: list[dict[str, Any]]
    ) -> str:
        if self._http is None:
            self._http = httpx.AsyncClient(limits=httpx.Limits(max_connections=256), timeout=120)
        client = async_openai_client(payload, http_client=self._http)
        resp = await client.chat.completions.create(
            model=rollout_model(payload, "gpt-4o-mini"),
            messages=messages,  # type: ignore[arg-type]
        )
        return resp.choices[0].message.content or ""

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._http is not None:
            await self._http.aclose()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rollouts", type=int, default=1000)
    ap.add_argument("--calls", type=int, default=5, help="model calls per rollout")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=1000)
    ap.add_argument("--sdk", action="store_true", help="agents call through the OpenAI SDK")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="rollwire-bench-rollouts-"))
    procs: list[Proc] = []
    try:
        nport, gport, key = free_port(), free_port(), "bench-admin-key"
        procs.append(
            Proc(
                "null",
                [sys.executable, "-m", "rollwire.testing.null_backend", "--port", str(nport)],
                f"http://127.0.0.1:{nport}/health",
            )
        )
        gw = Proc(
            "gateway",
            [
                sys.executable,
                "-m",
                "rollwire.cli.gateway",
                "--port",
                str(gport),
                "--backend",
                f"http://127.0.0.1:{nport}=vllm",
                "--store",
                f"sqlite:{tmp / 'gateway.sqlite'}",
                "--admin-key",
                key,
            ],
            f"http://127.0.0.1:{gport}/health",
        )
        procs.append(gw)
        agent = ScriptedAgent(args.calls, sdk=args.sdk)
        n_tasks = max(1, args.rollouts // args.group_size)
        tasks = [{"task_id": f"t{i}"} for i in range(n_tasks)]
        client = RolloutClient(
            f"http://127.0.0.1:{gport}",
            admin_key=key,
            runner=LocalRunner(agent),
            group_size=args.group_size,
            concurrency=args.concurrency,
            deadline=600,
            sampling={"max_tokens": 16},
        )

        async def go() -> list[Any]:
            try:
                return await client.arun(tasks)
            finally:
                await agent.aclose()

        t0 = time.perf_counter()
        groups = asyncio.run(go())
        wall = time.perf_counter() - t0
        rollouts = [r for g in groups for r in g.rollouts]
        requested = n_tasks * args.group_size
        captured = sum(len(r.calls) for r in rollouts)
        # against what was asked for, not what came back: a dropped rollout is lost calls too
        expected = requested * args.calls
        short = sum(1 for r in rollouts if len(r.calls) != args.calls)
        result = {
            "rollouts_requested": requested,
            "rollouts": len(rollouts),
            "calls_per_rollout": args.calls,
            "concurrency": args.concurrency,
            "agent_transport": "openai-sdk" if args.sdk else "aiohttp",
            "completed": sum(r.status == "completed" for r in rollouts),
            "calls_made": agent.made,
            "calls_captured": captured,
            "lost_calls": expected - captured,
            "rollouts_short_of_calls": short,
            "wall_s": round(wall, 2),
            "rollouts_per_s": round(len(rollouts) / wall, 1),
            "calls_per_s": round(captured / wall, 1),
            "gateway_cpu_s": round(cpu_seconds(gw.p.pid), 1),
            "null_backend_cpu_s": round(cpu_seconds(procs[0].p.pid), 1),
            "client_cpu_s": round(sum(resource.getrusage(resource.RUSAGE_SELF)[:2]), 1),
            "gateway_peak_rss_mb": round(peak_rss_mb(gw.p.pid), 1),
            "client_peak_rss_mb": round(
                resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1
            ),
            "cpus": os.cpu_count(),
        }
        print(json.dumps(result, indent=2))
        if args.json is not None:
            args.json.write_text(json.dumps(result, indent=2) + "\n")
        lost = (
            len(rollouts) != requested
            or agent.made != captured
            or captured != expected
            or result["completed"] != requested
        )
        if lost:
            print(
                f"LOST: {requested} rollouts requested, {len(rollouts)} returned "
                f"({result['completed']} completed); {agent.made} calls made, {captured} "
                f"captured, {expected} expected",
                file=sys.stderr,
            )
            sys.exit(1)
    finally:
        for p in reversed(procs):
            p.stop()


if __name__ == "__main__":
    main()
