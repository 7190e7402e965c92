"""Ray runner: each rollout is a Ray task that imports the agent app and runs its entrypoint.

Install with ``pip install "rollwire[ray]"``; Ray is imported when the runner is built. Every
worker must be able to import ``module:app`` (ship it in the image or a Ray ``runtime_env``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import aiohttp

from rollwire.agent.context import rollout_context
from rollwire.trainer.runners.base import RunnerError

__all__ = ["RayRunner"]

log = logging.getLogger(__name__)


def _run_in_worker(app_path: str, payload: dict[str, Any], session_id: str) -> str:
    # Runs inside a Ray worker: the whole rollout, terminal record included, happens here.
    from rollwire.agent.app import load_app

    app = load_app(app_path)

    async def _go() -> None:
        try:
            await app.run_rollout(payload, session_id)
        finally:
            await app.shutdown()

    asyncio.run(_go())
    return session_id


class RayRunner:
    """Submits one Ray task per rollout (``num_cpus`` each) that runs ``app_path``'s entrypoint.

    ``address=None`` joins ``RAY_ADDRESS`` if set, else starts a local Ray; ``init_kwargs`` go to
    ``ray.init`` (e.g. ``num_cpus=2``). The driver's ``sys.path`` is passed to workers so
    examples importable here are importable there. Each task is watched: when it dies (a worker
    crash, an import error) the session is completed ``failed`` with ``failure_reward`` at once,
    instead of the trainer waiting out the deadline.
    """

    def __init__(
        self,
        app_path: str,
        address: str | None = None,
        *,
        num_cpus: float = 0.5,
        init_kwargs: Mapping[str, Any] | None = None,
        failure_reward: float = 0.0,
    ) -> None:
        try:
            import ray
        except ImportError as exc:
            raise ImportError(
                'the Ray runner needs ray; install it with: pip install "rollwire[ray]"'
            ) from exc
        self._ray = ray
        self.app_path = app_path
        self.failure_reward = failure_reward
        self._started_ray = False
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {
                "address": address,
                "ignore_reinit_error": True,
                "log_to_driver": False,
            }
            kwargs.update(init_kwargs or {})
            env = dict(kwargs.pop("runtime_env", None) or {})
            env_vars = dict(env.get("env_vars") or {})
            paths = [p for p in sys.path if p and os.path.isdir(p)]
            env_vars.setdefault("PYTHONPATH", os.pathsep.join(paths))
            env["env_vars"] = env_vars
            kwargs["runtime_env"] = env
            ray.init(**kwargs)
            self._started_ray = True
        self._remote = ray.remote(num_cpus=num_cpus, max_retries=0)(_run_in_worker)
        self._refs: dict[str, Any] = {}
        self._watchers: dict[str, asyncio.Task[None]] = {}

    async def invoke(self, payload: Mapping[str, Any], session_id: str) -> None:
        """Submit the rollout as a Ray task; returns once submitted."""
        try:
            ref = self._remote.remote(self.app_path, dict(payload), session_id)
        except Exception as exc:
            raise RunnerError(
                f"could not submit the rollout to Ray: {type(exc).__name__}: {exc}"
            ) from exc
        self._refs[session_id] = ref
        self._watchers[session_id] = asyncio.get_running_loop().create_task(
            self._watch(session_id, ref, dict(payload)), name=f"ray-watch-{session_id}"
        )

    async def _watch(self, session_id: str, ref: Any, payload: dict[str, Any]) -> None:
        """Wait for the task; when it died, complete the session ``failed`` with the session's own
        token (the app never got to post, so the gateway holds nothing for it yet)."""
        try:
            await asyncio.wrap_future(ref.future())
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = f"the Ray task of this rollout died: {type(exc).__name__}: {exc}"
        log.warning("rollout %s: %s", session_id, error)
        rc = rollout_context(payload)
        if rc is None:
            return
        body = {"status": "failed", "reward": self.failure_reward, "error": error[:2000]}
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
                http.post(
                    rc.complete_url, json=body, headers={"Authorization": f"Bearer {rc.api_key}"}
                ) as resp,
            ):
                if resp.status >= 300 and resp.status != 409:  # 409: the app reported first
                    log.warning("rollout %s: the gateway answered %s", session_id, resp.status)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            log.warning("rollout %s: could not record the dead task: %s", session_id, exc)

    async def release(self, session_id: str) -> None:
        """Forget a finished rollout's task (its watcher has logged a crash, if any)."""
        self._refs.pop(session_id, None)
        watcher = self._watchers.pop(session_id, None)
        if watcher is not None and not watcher.done():
            watcher.cancel()

    async def drain(self, session_ids: Iterable[str] | None = None) -> None:
        """End of a run: stop watching its sessions (``None``: all of this event loop's; watchers
        are bound to the run's loop). Other runs' watchers are left alone; Ray stays up."""
        loop = asyncio.get_running_loop()
        if session_ids is None:
            session_ids = [s for s, w in self._watchers.items() if w.get_loop() is loop]
        watchers = [w for s in set(session_ids) if (w := self._watchers.pop(s, None)) is not None]
        for watcher in watchers:
            if watcher.get_loop() is loop:
                watcher.cancel()
            else:
                with contextlib.suppress(RuntimeError):  # its loop is closed
                    watcher.get_loop().call_soon_threadsafe(watcher.cancel)
        await asyncio.gather(*(w for w in watchers if w.get_loop() is loop), return_exceptions=True)

    async def aclose(self) -> None:
        """Cancel tasks still running; shut Ray down when this runner started it."""
        await self.drain(list(self._watchers))
        for ref in self._refs.values():
            try:
                self._ray.cancel(ref)
            except Exception:
                pass
        self._refs.clear()
        if self._started_ray:
            self._ray.shutdown()
            self._started_ray = False
