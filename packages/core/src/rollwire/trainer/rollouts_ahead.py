"""The next step's rollouts, rolled out in a thread while this step trains (``rollwire train
--async``): :class:`RolloutsAhead` of :mod:`rollwire.trainer.loop`."""

from __future__ import annotations

import threading
import time
from typing import Any

from rollwire.data.protocol import Group

__all__ = ["RolloutsAhead"]


class RolloutsAhead:
    """The next step's rollouts, running in a thread while this step trains (``--async``)."""

    def __init__(self, client: Any, tasks: list[dict[str, Any]]) -> None:
        self.started = time.perf_counter()
        self.groups: list[Group] | None = None
        self.error: BaseException | None = None
        self.seconds = 0.0
        self._thread = threading.Thread(target=self._run, args=(client, tasks), daemon=True)
        self._thread.start()

    def _run(self, client: Any, tasks: list[dict[str, Any]]) -> None:
        try:
            self.groups = client.run(tasks)
        except BaseException as exc:  # re-raised in the loop's thread
            self.error = exc
        self.seconds = time.perf_counter() - self.started

    def wait(self) -> list[Group]:
        """The groups, once they rolled out (an error of the thread is raised here)."""
        self._thread.join()
        if self.error is not None:
            raise self.error
        assert self.groups is not None
        return self.groups
