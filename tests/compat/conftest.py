"""A stand-in for ``complete_url`` (as in tests/rollouts): it records every terminal record. It
runs on 127.0.0.1 on a free port and is stopped at the end."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rollwire.testing.recording import CompleteRecorder


@pytest.fixture
def recorder() -> Iterator[CompleteRecorder]:
    rec = CompleteRecorder()
    with rec.server:
        yield rec
