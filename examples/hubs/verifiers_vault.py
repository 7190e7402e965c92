"""The vault task as a Prime Intellect verifiers (``verifiers.v1``) taskset: a ``vf.Toolset`` with
two MCP tools (``read_code``, ``open_box``) reading and writing the rollout's ``vf.State``, a
``vf.Task`` with three ``@vf.reward`` scores (calling ``read_code``, weight 0.1; reading the
task's box with it, weight 0.1; opening the box, weight 1), and a stop after four turns.

The taskset also brings its harness (verifiers takes a taskset module's own ``Harness`` as its
default): verifiers' chat program, the one its ``null`` harness runs, run here with this
interpreter instead of an environment ``uv`` builds from the network, so a rollout needs nothing
but the packages already installed. Taskset id: ``verifiers_vault`` (this module on the path).
"""

from __future__ import annotations

import hashlib
import random
import sys
from typing import Any

import verifiers.v1 as vf
from verifiers.v1.harnesses.null.harness import NullHarness
from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE, launch_chat_program

from rollwire.envs.vault.game import SPLITS, SYSTEM_PROMPT, Vault, task_prompt

__all__ = ["VaultHarness", "VaultTaskset"]


class VaultState(vf.State):
    """The rollout's box (set by the task), and what the tools did to it."""

    box: str = ""
    code: int = 0
    reads: int = 0
    read_right_box: bool = False
    opened: bool = False


class VaultToolset(vf.Toolset[vf.ToolsetConfig, VaultState]):
    """The two tools, over the rollout's state (one server per rollout)."""

    TOOL_PREFIX = None  # the tools are offered bare: read_code, open_box

    def _vault(self) -> Vault:
        return Vault(self.state.box, self.state.code, reads=self.state.reads)

    @vf.tool
    async def read_code(self, box: str) -> str:
        """Read the code of a locked box."""
        vault = self._vault()
        said = vault.read_code(box)
        self.state.reads = vault.reads
        self.state.read_right_box = self.state.read_right_box or box.strip().upper() == vault.box
        return said

    @vf.tool
    async def open_box(self, box: str, code: str) -> str:
        """Open a locked box with its code."""
        vault = self._vault()
        said = vault.open_box(box, code)
        self.state.opened = self.state.opened or vault.opened
        return said


class VaultTaskData(vf.TaskData):
    """One task: the box and its code (the prompt names the box)."""

    box: str
    code: int


class VaultTaskConfig(vf.TaskConfig):
    """The tools run one server per rollout (their state is the rollout's)."""

    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class VaultTask(vf.Task[VaultTaskData, VaultState, VaultTaskConfig]):
    """Open the box: the state is seeded in ``setup``, the reward read from it."""

    @classmethod
    def toolsets(cls, config: VaultTaskConfig) -> list[vf.Toolset]:
        return [VaultToolset(config.tools)]

    async def setup(self, trace: vf.Trace, runtime: Any) -> None:
        trace.state.box = self.data.box
        trace.state.code = self.data.code

    @vf.stop
    async def out_of_turns(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 4

    @vf.reward(weight=0.1)
    async def read_code(self, trace: vf.Trace) -> float:
        return float(trace.state.reads > 0)

    @vf.reward(weight=0.1)
    async def read_right_box(self, trace: vf.Trace) -> float:
        return float(trace.state.read_right_box)

    @vf.reward(weight=1.0)
    async def opened(self, trace: vf.Trace) -> float:
        return float(trace.state.opened)

    @vf.metric
    async def reads(self, trace: vf.Trace) -> float:
        return float(trace.state.reads)


class VaultTasksetConfig(vf.TasksetConfig):
    """``split`` (train: boxes A-M, heldout: N-Z), how many tasks, and their seed."""

    split: str = "train"
    num_tasks: int = 64
    seed: int = 0
    task: VaultTaskConfig = VaultTaskConfig()


class VaultTaskset(vf.Taskset[VaultTask, VaultTasksetConfig]):
    """Seeded vault tasks; ``key`` is the task's index, the rollwire task's ``task_key``."""

    def load(self) -> list[VaultTask]:
        rng = random.Random(f"vault-{self.config.split}-{self.config.seed}")
        boxes = SPLITS[self.config.split]
        tasks = []
        for i in range(self.config.num_tasks):
            box = rng.choice(boxes)
            data = VaultTaskData(
                idx=i,
                prompt=task_prompt(box),
                system_prompt=SYSTEM_PROMPT,
                box=box,
                code=rng.randrange(100, 1000),
            )
            tasks.append(VaultTask(data, self.config.task))
        return tasks


class _ThisInterpreter:
    """A runtime whose PEP 723 scripts run on this interpreter (its packages are installed)."""

    def __init__(self, runtime: Any) -> None:
        self._runtime = runtime

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)

    async def prepare_uv_script(self, script: str | bytes, env: Any = None, **_: Any) -> list[str]:
        data = script.encode() if isinstance(script, str) else script
        path = f"vf-chat-{hashlib.sha256(data).hexdigest()[:16]}.py"
        await self._runtime.write(path, data)
        return [sys.executable, path]


class VaultHarness(NullHarness):
    """verifiers' chat program (the ``null`` harness's), on this interpreter, offline."""

    async def setup(self, runtime: Any) -> None:
        return None

    async def launch(  # type: ignore[override]
        self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None
    ):
        system_prompt, prompt = self.resolve_prompt(data)
        extra = (
            [f"--tool-interception-url={tool_interception_url}"] if tool_interception_url else []
        )
        return await launch_chat_program(
            CHAT_PROGRAM_SOURCE, self.config, ctx, trace, _ThisInterpreter(runtime), endpoint,
            secret, mcp_urls, system_prompt, prompt, extra_args=extra,
        )  # fmt: skip


if __name__ == "__main__":  # verifiers starts the tool server as `python -m verifiers_vault`
    VaultToolset.run()
