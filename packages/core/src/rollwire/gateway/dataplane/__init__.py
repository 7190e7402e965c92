"""The data plane: one model call from the agent's request to the committed call and the response.

:mod:`.calls` (per route), :mod:`.dispatch` (pick a backend, forward, fail over),
:mod:`.relay` (streams), :mod:`.capture` (what is recorded), :mod:`.commit` (the store),
:mod:`.sessions` (a live session's state), :mod:`.sampling` (a session's sampling policy).
"""
