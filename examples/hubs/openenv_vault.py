"""The vault task as an OpenEnv environment: an ``MCPEnvironment`` with two MCP tools
(``read_code``, ``open_box``), reset with the task's box and code, and a rubric that scores each
step: 0.1 for the first ``read_code`` call and 0.1 more for reading the task's box, 1.0 for
opening the box, which ends the episode. Serve it (``openenv-core``) with
``python openenv_vault.py --port 8001``.
"""

from __future__ import annotations

import argparse
from typing import Any

from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Action, Observation, State
from openenv.core.rubrics.base import Rubric

from rollwire.envs.vault.game import Vault

__all__ = ["VaultEnvironment", "VaultRubric", "main"]

#: the reward for calling ``read_code``, and again for reading the task's box with it
READ_REWARD = 0.1


class VaultRubric(Rubric):
    """Per-step reward: what a ``read_code`` step adds to the episode's reading score (0.1 for
    a read, 0.1 for the task's box), 1.0 for the step that opens the box."""

    def __init__(self, env: VaultEnvironment) -> None:
        super().__init__()
        self._env = env

    def forward(self, action: Any, observation: Any) -> float:
        vault = self._env.vault
        if not isinstance(action, CallToolAction) or vault is None:
            return 0.0
        if action.tool_name == "open_box":
            return vault.reward()
        if action.tool_name != "read_code":
            return 0.0
        before = self._env.reads
        box = str(action.arguments.get("box", "")).strip().upper()
        self._env.reads = (True, before[1] or box == vault.box)
        return READ_REWARD * (sum(self._env.reads) - sum(before))


class VaultEnvironment(MCPEnvironment):
    """One vault episode per session: ``reset(box=..., code=...)``, then tool calls."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("vault")
        self.vault: Vault | None = None
        #: (read a code, read the task's box's code) so far in the episode
        self.reads = (False, False)

        @mcp.tool
        def read_code(box: str) -> str:
            """Read the code of a locked box."""
            return self._require().read_code(box)

        @mcp.tool
        def open_box(box: str, code: str) -> str:
            """Open a locked box with its code."""
            return self._require().open_box(box, code)

        super().__init__(mcp)
        self.rubric = VaultRubric(self)
        self._state = State(episode_id=None, step_count=0)

    def _require(self) -> Vault:
        if self.vault is None:
            raise RuntimeError("reset the environment (with box and code) before calling tools")
        return self.vault

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        box: str = "A",
        code: int = 0,
        **kwargs: Any,
    ) -> Observation:
        """A new episode for ``box`` holding ``code``; ``episode_id`` names it in the state."""
        self.vault = Vault(str(box).upper(), int(code))
        self.reads = (False, False)
        self._state = State(episode_id=episode_id, step_count=0)
        return Observation(done=False, reward=0.0, metadata={"box": self.vault.box})

    def _step_impl(
        self, action: Action, timeout_s: float | None = None, **kwargs: Any
    ) -> Observation:
        return Observation(done=False, reward=0.0, metadata={"error": "use the MCP tools"})

    def _scored(self, action: Action, observation: Observation) -> Observation:
        self._state.step_count += 1
        if isinstance(observation, CallToolObservation):
            observation.reward = self._apply_rubric(action, observation)
            observation.done = self.vault is not None and self.vault.opened
        return observation

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return self._scored(action, super().step(action, timeout_s=timeout_s, **kwargs))

    async def step_async(
        self, action: Action, timeout_s: float | None = None, **kwargs: Any
    ) -> Observation:
        observation = await super().step_async(action, timeout_s=timeout_s, **kwargs)
        return self._scored(action, observation)

    @property
    def state(self) -> State:
        return self._state


def main(argv: list[str] | None = None) -> None:
    """Serve the environment (HTTP ``/reset`` ``/step`` ``/state``, WebSocket ``/ws``, ``/mcp``)."""
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args(argv)
    app = create_app(VaultEnvironment, CallToolAction, CallToolObservation, max_concurrent_envs=64)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
